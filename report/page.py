"""One self-contained HTML page: sections, tables and matplotlib figures embedded as data.

Figures are embedded as `<img src="data:image/svg+xml;base64,...">` (vector
plots) or `data:image/png;base64,...` (dense rasters such as fault scatters),
so the page needs no network at view time and no two inline SVGs can clash on
element ids. Every figure carries a title, axis labels with units (set by the
caller) and one sentence saying what to look for.
"""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from pagecast import __version__

# Okabe-Ito-like qualitative palette, then tab20 extras: readable, colour-blind friendly first.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000",
           "#8C564B", "#7F7F7F", "#17BECF", "#BCBD22", "#AEC7E8", "#FFBB78", "#98DF8A", "#FF9896"]
OTHER_COLOUR = "#B0B0B0"

FIG_W = 10.0   # inches: 1000 px at 100 dpi, fits a laptop screen beside nothing else
DPI = 100


def setup_matplotlib():
    """Import pyplot with the Agg backend and deterministic SVG output."""
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    matplotlib.rcParams.update({
        "svg.fonttype": "none",         # text stays text: smaller files, searchable
        "svg.hashsalt": "pagecast",     # deterministic ids
        "figure.dpi": DPI,
        "savefig.dpi": DPI,
        "font.size": 10,
        "axes.titlesize": 12,
        "axes.titleweight": "bold",
        "axes.grid": True,
        "grid.alpha": 0.3,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "legend.fontsize": 8,
        "legend.framealpha": 0.85,
    })
    return plt


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def short(name: str, n: int = 48) -> str:
    """A long (mangled) kernel name cut to n characters for labels."""
    s = str(name)
    return s if len(s) <= n else s[: n - 1] + "…"


@dataclass
class Figure:
    title: str
    look: str          # one sentence: what to look for
    src: str           # data: URI
    kind: str          # "svg" or "png"
    note: str = ""     # e.g. "binned: 2.1 M faults in 800 x 500 cells"


def figure(fig, title: str, look: str, *, raster: bool = False, note: str = "") -> Figure:
    """Render a matplotlib figure to an embedded image and close it."""
    import matplotlib.pyplot as plt
    buf = io.BytesIO()
    if raster:
        fig.savefig(buf, format="png", bbox_inches="tight", metadata={"Software": None})
        mime, kind = "image/png", "png"
    else:
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None})
        mime, kind = "image/svg+xml", "svg"
    plt.close(fig)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return Figure(title, look, f"data:{mime};base64,{data}", kind, note)


@dataclass
class Section:
    title: str
    intro: str = ""
    blocks: list[str] = field(default_factory=list)
    anchor: str = ""

    def add_figure(self, f: Figure) -> None:
        note = f'<p class="note">{esc(f.note)}</p>' if f.note else ""
        self.blocks.append(
            f'<figure class="plot" data-kind="{f.kind}">'
            f'<h3>{esc(f.title)}</h3>'
            f'<p class="look"><b>What to look for:</b> {esc(f.look)}</p>'
            f'<img alt="{esc(f.title)}" src="{f.src}">'
            f'{note}</figure>')

    def add_numbers(self, items: Sequence[tuple[str, Any]]) -> None:
        cells = "".join(f'<div class="num"><div class="v">{esc(v)}</div><div class="k">{esc(k)}</div></div>'
                        for k, v in items)
        self.blocks.append(f'<div class="numbers">{cells}</div>')

    def add_table(self, header: Sequence[str], rows: Iterable[Sequence[Any]], *, caption: str = "",
                  numeric: Sequence[bool] | None = None, code_cols: Sequence[int] = ()) -> None:
        numeric = list(numeric) if numeric is not None else [False] * len(header)
        head = "".join(f'<th class="{"r" if numeric[i] else ""}">{esc(h)}</th>' for i, h in enumerate(header))
        body = []
        for r in rows:
            tds = []
            for i, v in enumerate(r):
                cls = "r" if numeric[i] else ""
                txt = f"<code>{esc(v)}</code>" if i in code_cols else esc(v)
                tds.append(f'<td class="{cls}">{txt}</td>')
            body.append("<tr>" + "".join(tds) + "</tr>")
        cap = f"<caption>{esc(caption)}</caption>" if caption else ""
        self.blocks.append(f'<div class="tablewrap"><table>{cap}<thead><tr>{head}</tr></thead>'
                           f'<tbody>{"".join(body)}</tbody></table></div>')

    def add_text(self, text: str, cls: str = "") -> None:
        self.blocks.append(f'<p class="{cls}">{esc(text)}</p>')

    def add_html(self, raw: str) -> None:
        self.blocks.append(raw)


CSS = """
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:0;
 color:#1d232a;background:#f5f6f8;line-height:1.45}
header{background:#16324f;color:#fff;padding:18px 28px}
header h1{margin:0;font-size:22px}
header .sub{opacity:.85;font-size:13px;margin-top:4px;word-break:break-all}
nav{padding:8px 28px;background:#e8ecf1;font-size:13px;position:sticky;top:0;z-index:2}
nav a{margin-right:16px;color:#16324f;text-decoration:none}
main{max-width:1120px;margin:0 auto;padding:12px 24px 40px}
section{background:#fff;border-radius:8px;box-shadow:0 1px 3px rgba(0,0,0,.08);padding:14px 22px;margin:18px 0}
section h2{margin:4px 0 8px;font-size:18px;color:#16324f}
section > p{margin:4px 0 10px}
figure.plot{margin:14px 0 22px}
figure.plot h3{margin:0 0 2px;font-size:15px}
figure.plot img{max-width:100%;height:auto;display:block;margin-top:6px}
p.look{margin:0;font-size:13px;color:#333}
p.note,.note{font-size:12px;color:#666;margin:2px 0}
.numbers{display:flex;flex-wrap:wrap;gap:10px;margin:8px 0}
.num{background:#f0f3f7;border-radius:6px;padding:8px 12px;min-width:130px}
.num .v{font-size:18px;font-weight:600;font-variant-numeric:tabular-nums}
.num .k{font-size:12px;color:#555}
.tablewrap{overflow-x:auto;margin:8px 0 14px}
table{border-collapse:collapse;font-size:13px;width:100%}
caption{text-align:left;font-weight:600;padding:4px 0}
th,td{border-bottom:1px solid #e3e6ea;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f0f3f7}
td.r,th.r{text-align:right;font-variant-numeric:tabular-nums}
td code{font-size:12px;word-break:break-all}
.warn{color:#a33;font-weight:600}
footer{font-size:12px;color:#777;text-align:center;padding:10px}
"""


def render_page(title: str, subtitle: str, sections: list[Section], *, kind: str) -> str:
    nav = []
    body = []
    for i, s in enumerate(sections):
        anchor = s.anchor or f"s{i}"
        nav.append(f'<a href="#{esc(anchor)}">{esc(s.title)}</a>')
        intro = f"<p>{esc(s.intro)}</p>" if s.intro else ""
        body.append(f'<section id="{esc(anchor)}"><h2>{esc(s.title)}</h2>{intro}{"".join(s.blocks)}</section>')
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="generator" content="pagecast {esc(__version__)}">'
        f'<meta name="pagecast-report" content="{esc(kind)}">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head>\n<body>"
        f'<header><h1>{esc(title)}</h1><div class="sub">{esc(subtitle)}</div></header>'
        f'<nav>{"".join(nav)}</nav>'
        f'<main>{"".join(body)}</main>'
        f"<footer>pagecast {esc(__version__)} report · self-contained: plots are embedded, "
        "nothing is loaded from the network</footer>"
        "</body></html>\n")
