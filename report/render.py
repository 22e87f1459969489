"""`write_report(input_path, out_html, *, model=None, force=False) -> Path`.

Dispatches on what INPUT is:
- a trace directory (pagecast.trace.is_trace) -> the trace report;
- a trace and a model (`model=`) -> the model-evaluation report;
- replay results (pagecast.replay.results_io.is_results) -> the replay report.
Anything else, or a trace with no launches, raises an InputError (one line, exit 2).
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

from pagecast.replay.results_io import is_results

from pagecast import trace as T
from pagecast.console import progress
from pagecast.errors import InputError, UsageError
from pagecast.outputs import check_output_file, write_file

from .model_report import model_sections
from .page import Section, render_page
from .replay_report import replay_sections
from .trace_report import trace_sections


def _is_results(path: Path) -> bool:
    try:
        return bool(is_results(path))
    except Exception:
        return False


def detect_kind(input_path: str | os.PathLike, model: str | os.PathLike | None = None) -> str:
    """'trace', 'model' or 'replay'; raises InputError for anything else."""
    p = Path(input_path)
    if not p.exists():
        raise InputError(f"{p}: no such file or directory")
    if T.is_trace(p):
        return "model" if model is not None else "trace"
    if _is_results(p):
        if model is not None:
            raise InputError(f"{p}: replay results take no --model (give a trace with --model)")
        return "replay"
    raise InputError(f"{p}: not a pagecast trace directory or replay results file; "
                     "report reads a trace (*.pctrace), a trace with --model, or RESULTS.parquet")


def _read_trace(p: Path) -> T.Trace:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", T.TraceWarning)
        trace = T.read_trace(p)
    for w in caught:  # incompleteness is said in the report and on stderr, once
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return trace.require_launches("report")


def build_html(input_path: str | os.PathLike, *, model: str | os.PathLike | None = None) -> tuple[str, str]:
    """(html, kind) for an input; the pure part of write_report."""
    p = Path(input_path)
    kind = detect_kind(p, model)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if kind == "trace":
        trace = _read_trace(p)
        sections = trace_sections(trace)
        title = f"pagecast trace report: {trace.name}"
        sub = f"{p}  ·  {trace.n_launches:,} launches  ·  made {stamp}"
    elif kind == "model":
        trace = _read_trace(p).require_argument_bytes("a model report")
        sections = model_sections(Path(model), trace)
        title = f"pagecast model report: {Path(model).name} on {trace.name}"
        sub = f"model {model}  ·  trace {p}  ·  made {stamp}"
    else:
        sections, label = replay_sections(p)
        title = f"pagecast replay report: {label}"
        sub = f"{p}  ·  made {stamp}"
    return render_page(title, sub, sections, kind=kind), kind


def _same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except (OSError, RuntimeError):  # a symlink loop: not a file we could overwrite or read
        return False


def write_report(input_path: str | os.PathLike, out_html: str | os.PathLike, *,
                 model: str | os.PathLike | None = None, force: bool = False) -> Path:
    """Write one self-contained HTML report for a trace, a trace + model, or replay results."""
    out = Path(out_html)
    if _same_file(out, input_path) or (model is not None and _same_file(out, model)):
        raise UsageError(f"{out}: the report would overwrite its own input; choose another -o")
    check_output_file(out, force, "report.html")
    if model is not None and not Path(model).exists():
        raise InputError(f"{model}: no such model file")
    with progress("report: reading and plotting", None):
        doc, _ = build_html(input_path, model=model)
    return write_file(out, lambda tmp: tmp.write_text(doc, encoding="utf-8"), force=force, example="report.html")


__all__ = ["write_report", "build_html", "detect_kind", "Section"]
