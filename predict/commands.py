"""Subcommands of this stage, registered in pagecast.cli: fit, predict, evaluate."""

from __future__ import annotations

import argparse
from pathlib import Path

from pagecast.command import Command
from pagecast.units import count_arg

FALLBACK_HELP = ("what to predict for irregular and unseen kernels: allocation (the whole allocation), "
                 "history (what the kernel touched there before; default) or none (demand paging)")


def _fallback(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fallback", default="history", choices=["allocation", "history", "none"], help=FALLBACK_HELP)


def _read(path):
    from pagecast.trace import read_trace
    return read_trace(path)


def _read_launches(path, what: str):
    """A trace that has launches; an empty one is bad input (one line, exit 2)."""
    return _read(path).require_launches(what).require_argument_bytes(what)


class FitCommand(Command):
    name = "fit"
    writes = ("a JSON model", (".json",))
    help = "learn per-kernel templates (launch arguments -> pages) from traces"
    description = ("Learn, for every kernel, how the pages it touches follow from its launch arguments.\n"
                   "Give several traces of the same program (different scales or inputs): a template must\n"
                   "hold in all of them. Learns only from launches, allocations, faults and migrations;\n"
                   "--from truth learns from the exact footprints of traces with truth instead.\n\n"
                   "  pagecast fit small.pctrace large.pctrace -o model.json\n"
                   "  pagecast fit a.pctrace -o model.json --feedback run-with-predictions.pctrace")

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("traces", nargs="+", metavar="TRACE", help="trace directories to learn from")
        p.add_argument("-o", "--output", required=True, metavar="MODEL", help="model file to write (JSON)")
        p.add_argument("--feedback", nargs="+", default=[], metavar="TRACE",
                       help="traces recorded while running with this model's predictions: their faults are"
                            " misses that refine the model")
        p.add_argument("--from", dest="source", choices=("faults", "truth"), default="faults",
                       help="learn from fault and migration records (default), or from the truth table's exact "
                            "footprints (traces of collect --interpret or datasets make)")
        p.add_argument("--force", action="store_true", help="overwrite MODEL")
        p.add_argument("--json", action="store_true", help="print a JSON summary of the model on stdout")

    def run(self, args: argparse.Namespace) -> int:
        from rich.markup import escape

        from pagecast import console
        from pagecast import trace as T
        from pagecast.errors import OutputExistsError, UsageError

        from .feedback import feedback_from_trace
        from .fit import fit_model
        from .model_io import save_model

        out = Path(args.output)
        if out.exists() and not args.force:
            raise OutputExistsError(out)
        if args.source == "truth":   # before reading: a trace without truth is one line, not its warnings
            for t in args.traces:
                if (Path(t) / T.MANIFEST).is_file() and not (Path(t) / T.TRUTH).is_dir():
                    raise UsageError(f"{t} has no truth table ({T.TRUTH}/); fit --from truth needs traces with "
                                     "truth (pagecast collect --interpret, pagecast datasets make), or fit from "
                                     "its faults without --from truth")
        traces = [_read(t).require_argument_bytes("fitting templates") for t in args.traces]
        if args.source == "truth":
            from .truth_obs import truth_observations
            traces = [truth_observations(t) for t in traces]
        n_kernels = len({k for t in traces for k in t.launches.column(T.KERNEL).unique().to_pylist()}) \
            if traces else 0
        with console.progress("fitting templates", n_kernels) as bar:
            model = fit_model(traces, progress=bar)
        for t in model.traces:
            t["from"] = args.source
        changed = 0
        for f in args.feedback:
            changed += feedback_from_trace(model, _read(f).require_argument_bytes("feedback"))
        save_model(model, out, force=args.force)
        s = model.summary()
        if args.json:
            console.emit_json({"model": str(out), **s, "feedback_changes": changed})
        else:
            by = ", ".join(f"{v} {k}" for k, v in s["kernels_by_class"].items() if v)
            lost = [f"{t.path.name} {t.manifest['dropped_records']:,}" for t in traces
                    if isinstance(t.manifest.get("dropped_records"), int) and t.manifest["dropped_records"] > 0]
            console.info(f"{s['kernels']} kernels: {by}" + (f"; feedback changed the model {changed} times"
                                                              if args.feedback else "")
                         + (f"; {s['unexplained_launches']:,} launch footprints left unexplained"
                            if s["unexplained_launches"] else "")
                         + (f" (records dropped: {', '.join(lost)})" if lost else ""))
            for t in (t for t in model.traces if 'loss' in t):   # the record-loss rate the fit used, and its source
                console.info(f"{Path(t['path']).name}: record loss {100 * t['loss']:.2f}% ({t['loss_source']})")
            loose = sorted(n for n, k in model.kernels.items() if k.pinned is not None and not k.pinned.pinned)
            if loose:
                from pagecast.demangle import base_name
                lines = [escape(f"  {base_name(n)}: {model.kernels[n].pinned.text()}"
                                + (f". To pin it down: {a}" if (a := model.kernels[n].pinned.advice()) else ""))
                         for n in loose[:5]]
                console.info(f"{len(loose)} of {len(model.kernels)} kernels' templates are not pinned down by these "
                             "profiles (their predictions are a guess beyond the arguments these profiles saw):\n"
                             + "\n".join(lines)
                             + ("\n  ... (pagecast report shows all)" if len(loose) > 5 else ""))
        console.wrote(out, "model", next_after_fit(out, traces))
        return 0


def next_after_fit(model_path, traces) -> str:
    """The next commands after `fit`: evaluate (and plan) on a trace the model was *not* fitted on;
    a score on the training trace says how well the model remembers, not how well it predicts.
    For traces `datasets make` wrote, the command that makes a held-out one (the next seed)."""
    test = "TEST.pctrace"
    wl = [t.manifest.get("workload") or {} for t in traces]
    names = {w.get("name") for w in wl}
    seeds = [w.get("seed") for w in wl]
    make = ""
    if traces and all(t.manifest.get("source") == "synthetic" for t in traces) and len(names) == 1 \
            and None not in names and all(isinstance(x, int) and not isinstance(x, bool) for x in seeds):
        scale = wl[0].get("scale")
        sc = f" --scale {scale:g}" if isinstance(scale, (int, float)) and not isinstance(scale, bool) else ""
        make = f"pagecast datasets make {names.pop()}{sc} --seed {max(seeds) + 1} -o {test}   then   "
    return (f"{make}pagecast evaluate {model_path} {test}   or   pagecast plan {model_path} {test} --oversub 2 -o plan"
            f"   ({test}: a run the model was not fitted on)")


class PredictCommand(Command):
    name = "predict"
    writes = ("Parquet", (".parquet", ".pq"))
    help = "predicted page ranges of every launch of a trace (Parquet)"
    description = ("Write one row per merged predicted range: launch_id, address, bytes, template.\n\n"
                   "  pagecast predict model.json run.pctrace -o predicted.parquet")

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("model", metavar="MODEL")
        p.add_argument("trace", metavar="TRACE")
        p.add_argument("-o", "--output", required=True, metavar="OUT.parquet")
        _fallback(p)
        p.add_argument("--force", action="store_true", help="overwrite OUT")
        p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")

    def run(self, args: argparse.Namespace) -> int:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        from pagecast import console
        from pagecast import trace as T
        from pagecast.outputs import check_output_file, write_file

        from .model_io import load_model
        from .predictor import predict_ranges

        out = check_output_file(args.output, args.force, "predicted.parquet")
        model = load_model(args.model)
        trace = _read_launches(args.trace, "predict")
        table = predict_ranges(model, trace, args.fallback)
        write_file(out, lambda tmp: pq.write_table(table, tmp, compression="zstd"), force=args.force,
                   example="predicted.parquet")
        total = int(pc.sum(table.column(T.BYTES)).as_py() or 0)
        if args.json:
            console.emit_json({"output": str(out), "rows": table.num_rows, "launches": trace.n_launches,
                               "predicted_bytes": total})
        console.wrote(out, f"{table.num_rows:,} predicted ranges", f"pagecast evaluate {args.model} {args.trace}")
        return 0


class EvaluateCommand(Command):
    name = "evaluate"
    help = "precision and recall of a model's predictions against a trace's footprints"
    description = ("Compare predicted pages with the trace's footprints (truth where it has it, else the\n"
                   "observed faults), per kernel and overall, beside the allocation baseline.\n\n"
                   "  pagecast evaluate model.json test.pctrace [--json]\n\n"
                   "With --kernel NAME, also where that kernel's predictions miss: its predicted and\n"
                   "touched pages split by the buffer (the parameters pointing into it) they lie in.")

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("model", metavar="MODEL")
        p.add_argument("trace", metavar="TRACE")
        p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
        p.add_argument("--top", type=count_arg, default=30, help="kernels shown in the table (default 30)")
        p.add_argument("--kernel", metavar="NAME",
                       help="also split this kernel's pages by buffer: which of its regions over-predict or miss")
        _fallback(p)

    def run(self, args: argparse.Namespace) -> int:
        from pagecast import console
        from pagecast.demangle import base_name, resolve
        from pagecast.units import format_size

        from .evaluate import evaluate
        from .model_io import load_model

        model = load_model(args.model)
        if args.kernel is not None:   # a demangled name (as the table shows it) names its symbol
            args.kernel = resolve(args.kernel, model.kernels) or args.kernel
        trace = _read_launches(args.trace, "evaluate")
        doc = evaluate(model, trace, args.fallback, args.kernel)
        check_unseen(doc, args.model, args.trace)
        if args.json:
            console.emit_json(doc)
            return 0
        t = console.table(f"{trace.path.name}: predictions of {Path(args.model).name} "
                          f"(footprints from {doc['footprint_source']}, fallback {args.fallback})",
                          EVALUATE_CAPTION + FALLBACK_WORDS.get(args.fallback, ""))
        console.add_name_column(t)
        for c in ("templates", "launches", "precision", "recall", "predicted", "footprint", "alloc.\nprec."):
            t.add_column(c, justify="left" if c == "templates" else "right", no_wrap=c != "templates")
        for k in doc["kernels"][:args.top]:
            t.add_row(console.name_cell(base_name(k["kernel"])), ", ".join(k["templates"]), f"{k['launches']:,}",
                      _pct(k["precision"]), _pct(k["recall"]), format_size(k["predicted_bytes"]),
                      format_size(k["footprint_bytes"]), _pct(k["baseline_precision"]))
        out = console.stdout()
        out.print(t)
        if len(doc["kernels"]) > args.top:
            out.print(f"[dim]... {len(doc['kernels']) - args.top} more kernels (--top)[/dim]")
        o, b, d, u = doc["overall"], doc["baseline"], doc["determined"], doc["unseen"]
        out.print(f"[bold]model[/bold]       precision {_pct(o['precision'])}  recall {_pct(o['recall'])}"
                  f"  predicted {format_size(o['predicted_bytes'])} of {format_size(o['footprint_bytes'])}"
                  f"  ({o['launches']:,} launches)")
        if "precision_at_most" in o:
            out.print(f"  precision between {_pct(o['precision'])} and {_pct(o['precision_at_most'])} (the faults show part"
                      " of what launches touched; prefetch and eviction records bound the rest)")
        out.print(f"  argument-determined kernels: precision {_pct(d['precision'])}  recall {_pct(d['recall'])}"
                  f"  ({d['launches']:,} launches)")
        x = doc["indexed"]
        if x["launches"]:
            out.print(f"  index-determined kernels (indexed): precision {_pct(x['precision'])}  recall"
                      f" {_pct(x['recall'])}  ({x['launches']:,} launches)")
            xv = x.get("values", {})
            odd = [f"{xv[k]:,} {what}" for k, what in (("no_values", "without values (fallback)"),
                                                       ("short_values", "values past their row"),
                                                       ("outside_values", "values outside the allocation"),
                                                       ("sentinel_values", "negative values (select nothing)"))
                   if xv.get(k)]
            if odd:
                out.print("  indexed regions: " + ", ".join(odd))
        out.print(f"  unexplained: {_launches(o['unexplained_in_fit'])} of the fitting traces (lost or odd records),"
                  f" {_launches(o['launches_with_misses'])} here with a fault outside the prediction")
        if u["launches"]:
            out.print(f"  unseen kernels ({len(u['kernels'])}, by fallback {u['fallback']}): precision "
                      f"{_pct(u['precision'])}  recall {_pct(u['recall'])}  ({u['launches']:,} launches)")
        out.print(f"[bold]allocation baseline[/bold]  precision {_pct(b['precision'])}"
                  + (f" (at most {_pct(b['precision_at_most'])})" if "precision_at_most" in b else "")
                  + f"  recall {_pct(b['recall'])}  predicted {format_size(b['predicted_bytes'])}")
        if "buffers" in doc:
            out.print(_buffer_table(doc["buffers"]))
        return 0


# Above this share of a trace's launches by kernels the model was not fitted on, `evaluate` refuses:
# the scores would be the fallback's (history, allocation, none), not the model's, under the
# model's name. From WARN_UNSEEN on it warns.
MAX_UNSEEN = 0.5
WARN_UNSEEN = 0.1


def check_unseen(doc: dict, model_path, trace_path) -> None:
    """Refuse (one line, exit 2) an evaluation whose launches are mostly of kernels the model does not
    know (a model of another program); warn where a sizeable share is."""
    from pagecast import console
    from pagecast.errors import UsageError

    n, u = doc["overall"]["launches"], doc["unseen"]["launches"]
    if not n or not u:
        return
    share = u / n
    kernels = len(doc["unseen"]["kernels"])
    what = (f"{share:.0%} of {trace_path}'s launches ({kernels} of {len(doc['kernels'])} kernels) are of kernels"
            f" {model_path} was not fitted on")
    if share > MAX_UNSEEN:
        raise UsageError(f"{what}: their scores would be the fallback's ({doc['unseen']['fallback']}), not the "
                         "model's; is it a model of another program? Fit one on traces of this program")
    if share >= WARN_UNSEEN:
        console.warn(f"{what}: the scores include the fallback's ({doc['unseen']['fallback']}) for them (the "
                     "'unseen kernels' line); fit on traces that run them")


EVALUATE_CAPTION = ("Per kernel, over its launches in this trace: precision, the share of predicted pages the "
                    "launch touched; recall, the share of touched pages predicted (both: higher is better, 100% "
                    "exact). predicted / footprint: bytes predicted / touched, summed over launches. templates: "
                    "the classes of its fitted templates (docs/template-model.md). alloc. prec.: the baseline's "
                    "precision, predicting every allocation the launch's pointers point into, whole (its recall "
                    "is about 100%). Kernels by their demangled names, without parameters (--json keeps the "
                    "symbols; --kernel takes either).")
FALLBACK_WORDS = {
    "history": " fallback history: irregular kernels, and kernels the model was not fitted on, are predicted "
               "to touch what they touched before in this trace (--fallback).",
    "allocation": " fallback allocation: irregular kernels, and kernels the model was not fitted on, are "
                  "predicted to touch the allocations their pointers point into, whole (--fallback).",
    "none": " fallback none: irregular kernels, and kernels the model was not fitted on, are predicted to "
            "touch nothing: demand paging (--fallback).",
}


def _buffer_table(bd: dict):
    """evaluate --kernel's table: the kernel's pages by buffer, the most over-predicted first."""
    from rich.markup import escape

    from pagecast import console
    from pagecast.demangle import demangle
    from pagecast.units import format_size
    t = console.table(f"{escape(demangle(bd['kernel']))}: pages by buffer over {bd['launches']:,} launches",
                      "parameters: the arguments that point into the buffer; template: its predicted ranges "
                      "(p0, p1, ...: the launch's arguments). precision: the share of predicted pages the launch "
                      "touched; recall: the share of touched pages predicted (higher is better). "
                      "over-predicted: predicted, not touched; missed: touched, not predicted (lower is better).")
    t.add_column("parameters", justify="left")
    t.add_column("template", justify="left", overflow="fold", min_width=12)
    for c in ("precision", "recall", "predicted", "footprint", "over-\npredicted", "missed"):
        t.add_column(c, justify="right", no_wrap=True)
    for r in bd["rows"]:
        t.add_row(r["words"], escape("\n".join(r["templates"])) or "-", _pct(r["precision"]), _pct(r["recall"]),
                  format_size(r["predicted_bytes"]), format_size(r["footprint_bytes"]),
                  format_size(r["false_bytes"]), format_size(r["missed_bytes"]))
    return t


def _launches(n: int) -> str:
    return f"{n:,} launch" + ("" if n == 1 else "es")


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.2f}%"


COMMANDS: list[Command] = [FitCommand(), PredictCommand(), EvaluateCommand()]
