"""Open a report in a real headless browser (Debian `chromium`): check it renders, take screenshots.

Used by the end-to-end test and by scripts/report_screenshots.py. Each call
starts chromium with a fresh profile directory and no network services.
"""

from __future__ import annotations

import html as _html
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--mute-audio"]

_PROBE_HEAD = ("<script>window.__pcErrors=[];window.addEventListener('error',function(e){var t=e.target;"
               "window.__pcErrors.push(t&&t.tagName?('resource '+t.tagName+' failed to load'):String(e.message));},"
               "true);</script>")
_PROBE_TAIL = ("<script>window.addEventListener('load',function(){var out=[];"
               "document.querySelectorAll('figure.plot img').forEach(function(i){var r=i.getBoundingClientRect();"
               "out.push({title:i.alt,nw:i.naturalWidth,nh:i.naturalHeight,w:r.width,h:r.height,ok:i.complete});});"
               "var p=document.createElement('pre');p.id='pc-check';p.textContent=JSON.stringify({imgs:out,"
               "errors:window.__pcErrors,figures:document.querySelectorAll('figure.plot').length,"
               "width:document.documentElement.scrollWidth,height:document.documentElement.scrollHeight,"
               "viewport:window.innerWidth});document.body.appendChild(p);});</script>")


def find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    exe = find_chromium()
    if exe is None:
        raise RuntimeError("chromium is not installed")
    with tempfile.TemporaryDirectory(prefix="pagecast-chromium-") as profile:
        return subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout)


def probe(html_path: str | Path, *, width: int = 1366, height: int = 900, timeout: float = 90) -> dict:
    """Load a copy of the page with a probe script; return what it saw after `load`:
    {imgs: [{title, nw, nh, w, h, ok}], errors: [...], figures, width, height, viewport}."""
    html_path = Path(html_path)
    src = html_path.read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="pagecast-probe-") as tmp:
        copy = Path(tmp) / html_path.name
        copy.write_text(src.replace("<head>", "<head>" + _PROBE_HEAD, 1)
                        .replace("</body>", _PROBE_TAIL + "</body>", 1), encoding="utf-8")
        r = _run([f"--window-size={width},{height}", "--virtual-time-budget=10000", "--dump-dom",
                  copy.resolve().as_uri()], timeout)
    m = re.search(r'<pre id="pc-check">(.*?)</pre>', r.stdout, flags=re.S)
    if not m:
        raise RuntimeError(f"the probe did not run in chromium (exit {r.returncode}): {r.stderr.strip()[-400:]}")
    return json.loads(_html.unescape(m.group(1)))


def screenshot(html_path: str | Path, png: str | Path, *, width: int = 1400, max_height: int = 6000,
               colors: int | None = 256, timeout: float = 90) -> Path:
    """A full-page PNG screenshot (height from the page itself), palette-quantized to keep it small."""
    html_path, png = Path(html_path), Path(png)
    height = min(int(probe(html_path, width=width)["height"]) + 10, max_height)
    png.parent.mkdir(parents=True, exist_ok=True)
    r = _run([f"--window-size={width},{height}", "--virtual-time-budget=10000",
              f"--screenshot={png.resolve()}", html_path.resolve().as_uri()], timeout)
    if not png.exists():
        raise RuntimeError(f"chromium wrote no screenshot (exit {r.returncode}): {r.stderr.strip()[-400:]}")
    if colors:
        from PIL import Image
        with Image.open(png) as im:
            q = im.convert("RGB").quantize(colors=colors, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        q.save(png, optimize=True)
    return png
