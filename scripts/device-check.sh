#!/usr/bin/env bash
# pagecast device check: every GPU check in one script, for a machine with an NVIDIA GPU,
# a CUDA 13 driver, Python 3.12 with PyTorch, CuPy, cuda-bindings and the CUPTI native
# library, and no network. Writes a short markdown report to $OUT/device-check.md (and
# stdout); aims to finish in under 8 minutes (the replay checks at the end have their own).
#
# What it does
#   1. installs what the machine lacks from wheels carried in .whl/ (cupti-python and its
#      needs) into /tmp/site, and pagecast itself (editable, no deps, offline); checks that
#      CUPTI answers (subscribe/unsubscribe, a timestamp); if the first set fails, tries
#      .whl/fallback/ (the CUDA 13.0 pair), then cupti-python alone over the machine's own
#      nvidia-cuda-cupti; records which one worked;
#   2. runs `pytest -m gpu` (tests/test_collect_gpu.py first probes the CUPTI facts the collector
#      relies on in one short process (callback data, CUkernel handles, one clock, fault
#      records), then collects each GPU workload in full
#      mode at two scales, fits on one and evaluates on the other (recall >= 99% against
#      the observed footprints), collects a plain PyTorch MLP with --managed torch,
#      measures natural-mode overhead against no collection, kills a collection with
#      SIGTERM halfway and reads the partial trace back, and checks that a managed
#      allocation past the limit is refused); the tests append their measurements to
#      $OUT/collect-metrics.jsonl;
#   3. runs the replay engineer's scripts/gpu_validation.py if it is there (HOOK below);
#   4. writes the report.
#
# Nothing here allocates more managed memory than the GPU has free: every workload checks
# its plan against cudaMemGetInfo, and `pagecast collect` refuses managed allocations past
# the free memory (the tests never pass --allow-oversubscription).
#
# Wheels to carry (download them on a machine with pip and network, in the repo root;
# .whl/ is git-ignored). nvidia-cuda-cupti is tagged manylinux_2_25, hence that platform:
#   P="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
#      --platform manylinux_2_25_x86_64 --platform manylinux_2_24_x86_64 \
#      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
#   python3 -m pip download $P -d .whl cupti-python==13.4.0 pyelftools nvidia-cuda-cupti==13.5.25
#   python3 -m pip download $P -d .whl/fallback cupti-python==13.0.1 'nvidia-cuda-cupti~=13.0.0'
# (about 19 MB and 20 MB). Then, with the device tool:
#   run(command="bash scripts/device-check.sh", carry=[".whl"], timeout_s=600)
# or in two calls while the machine is warm (ONLY=collect,other, then ONLY=validation).
#
# Status: written without a GPU; it has NOT yet been run on one (see docs/gpu-validation.md).

set -u
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/device-check-out}"
mkdir -p "$OUT"
LOG="$OUT/device-check.log"
METRICS="$OUT/collect-metrics.jsonl"
REPORT="$OUT/device-check.md"
: > "$LOG"
: > "$METRICS"
export PYTHONUNBUFFERED=1
PY=python3
START=$(date +%s)
STEPS=()

log() { echo "[$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
step() { STEPS+=("$1|$2"); log "step: $1 -> $2"; }

# ---- 1. install --------------------------------------------------------------------
probe='from cupti import cupti; s = cupti.subscribe(lambda *a: None, None); cupti.unsubscribe(s); cupti.get_timestamp(); import importlib.metadata as m; print("cupti-python", m.version("cupti-python"), "nvidia-cuda-cupti", m.version("nvidia-cuda-cupti"))'
CUPTI_SET="none"
try_set() {  # $1: label, $2: target dir, rest: wheels
  local label="$1" target="$2"; shift 2
  [ "$#" -gt 0 ] || return 1
  rm -rf "$target"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$target" "$@" >>"$LOG" 2>&1 || return 1
  if PYTHONPATH="$target" timeout 60 $PY -c "$probe" >>"$LOG" 2>&1; then
    export PYTHONPATH="$target"
    CUPTI_SET="$label"
    return 0
  fi
  return 1
}
shopt -s nullglob
MAIN_WHEELS=(.whl/*.whl)
FALLBACK_WHEELS=(.whl/fallback/*.whl)
ONLY_CUPTI=(.whl/cupti_python-*.whl .whl/pyelftools-*.whl)
if try_set "cupti-python 13.4 + carried nvidia-cuda-cupti" /tmp/site "${MAIN_WHEELS[@]}"; then :
elif try_set "fallback (.whl/fallback)" /tmp/site-fallback "${FALLBACK_WHEELS[@]}" .whl/pyelftools-*.whl; then :
elif try_set "cupti-python 13.4 over the machine's nvidia-cuda-cupti" /tmp/site-own "${ONLY_CUPTI[@]}"; then :
elif timeout 60 $PY -c "$probe" >>"$LOG" 2>&1; then CUPTI_SET="already installed"
fi
step "cupti-python" "$CUPTI_SET"
if $PY -m pip install -q --no-index --no-deps --no-build-isolation -e . >>"$LOG" 2>&1; then
  step "pagecast editable install" "ok"
else
  # No build backend offline (an old setuptools without `wheel` cannot build an editable
  # wheel): lay the package out as setuptools' package-dir mapping does, with links, and
  # put it on PYTHONPATH. Everything below runs `python -m pagecast.cli`, so this is enough.
  SRC=/tmp/pagecast-src
  rm -rf "$SRC" && mkdir -p "$SRC/pagecast"
  for f in "$ROOT"/pagecast/*; do ln -s "$f" "$SRC/pagecast/"; done
  for d in collect datasets predict replay report; do ln -s "$ROOT/$d" "$SRC/pagecast/$d"; done
  export PYTHONPATH="$SRC${PYTHONPATH:+:$PYTHONPATH}"
  if $PY -c 'import pagecast.cli, pagecast.collect.collector, pagecast.datasets.gpu.jacobi2d, pagecast.replay.gpu.backend' >>"$LOG" 2>&1; then
    step "pagecast editable install" "failed (see log); using a linked source tree on PYTHONPATH ($SRC)"
  else
    step "pagecast editable install" "FAILED, and the linked source tree does not import either (see log)"
  fi
fi

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,memory.total,memory.free,driver_version --format=csv,noheader 2>&1 | head -2
  $PY -c 'import sys, cupy, torch; print("python", sys.version.split()[0], "cupy", cupy.__version__, "torch", torch.__version__)' 2>&1
  echo "uvm_perf_prefetch_enable: $(cat /sys/module/nvidia_uvm/parameters/uvm_perf_prefetch_enable 2>/dev/null || echo unreadable)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt" | tee -a "$LOG"

# Which parts run: ONLY=collect,other,validation (the default: all three, in that order). A
# session whose device time cannot hold all of them in one 10-minute command runs them in two
# calls while the machine is warm, e.g. ONLY=collect,other then ONLY=validation.
ONLY=",${ONLY:-collect,other,validation},"
wants() { case "$ONLY" in *",$1,"*) return 0 ;; esac; return 1; }

# ---- 2. pytest -m gpu ----------------------------------------------------------------
export PAGECAST_DEVICE_REPORT="$METRICS"
if wants collect; then
  log "pytest -m gpu (collect tests first)"
  timeout 330 $PY -m pytest -m gpu -q -rs -p no:cacheprovider tests/test_collect_gpu.py >"$OUT/pytest-collect.txt" 2>&1
  rc=$?
  step "pytest -m gpu tests/test_collect_gpu.py" "exit $rc ($(tail -1 "$OUT/pytest-collect.txt"))"
fi
if wants other; then
  timeout 150 $PY -m pytest -m gpu -q -rs -p no:cacheprovider --continue-on-collection-errors tests \
    --ignore=tests/test_collect_gpu.py >"$OUT/pytest-other.txt" 2>&1
  rc=$?
  step "pytest -m gpu (other stages)" "exit $rc ($(tail -1 "$OUT/pytest-other.txt"))"
fi

# ---- 3. HOOK: the GPU replay engineer's checks (runs if present) ----------------------
# The device tool ends a command after 10 minutes: whatever time is left, less a margin for
# the report, goes to the replay checks (at most GPU_VALIDATION_TIMEOUT seconds).
if wants validation && [ -f scripts/gpu_validation.py ]; then
  left=$(( ${DEVICE_CHECK_BUDGET:-570} - ($(date +%s) - START) - 20 ))
  want=${GPU_VALIDATION_TIMEOUT:-420}
  [ "$want" -lt "$left" ] || want=$left
  if [ "$want" -ge 60 ]; then
    log "scripts/gpu_validation.py (timeout ${want}s)"
    timeout "$want" $PY scripts/gpu_validation.py "$OUT/gpu-validation.md" --workdir /tmp/pcval >>"$LOG" 2>&1
    step "scripts/gpu_validation.py" "exit $? (timeout ${want}s)"
  else
    step "scripts/gpu_validation.py" "skipped: only ${left}s left of the device check's budget"
  fi
fi

# ---- 4. report ------------------------------------------------------------------------
STEPS_TEXT="$(printf '%s\n' "${STEPS[@]}")" $PY - "$METRICS" "$OUT/env.txt" "$REPORT" <<'EOF'
import json, os, sys
metrics, env, report = sys.argv[1:4]
rows = [json.loads(l) for l in open(metrics) if l.strip()]
lines = ["# pagecast device check", "", "```", open(env).read().strip(), "```", "", "## Steps", ""]
for s in os.environ.get("STEPS_TEXT", "").splitlines():
    name, _, res = s.partition("|")
    lines.append(f"- {name}: {res}")
fit = [r for r in rows if r["test"] == "collect-fit-evaluate"]
if fit:
    lines += ["", "## Collect, fit at one scale, evaluate at another (full mode)", "",
              "| workload | recall | precision | launches (fit/eval) | faults (fit/eval) | attributed | dropped | callback us/launch | evict+sync us/launch | wall s | worst kernels |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in fit:
        t = r["traces"]
        a, b = t[str(r["fit_scale"])], t[str(r["eval_scale"])]
        lines.append(f"| {r['workload']} | {r['recall']:.4f} | {r['precision']:.4f} | {a['launches']}/{b['launches']} | "
                     f"{a['faults']}/{b['faults']} | {b['faults_attributed']:.3f} | {a['dropped']}/{b['dropped']} | "
                     f"{b['callback_us']} | {b['evict_sync_us']} | {a['wall_s']}/{b['wall_s']} | {r['worst_kernels']} |")
for r in rows:
    if r["test"] == "collect-overhead":
        lines += ["", "## Collection overhead (natural mode vs no collection)", "",
                  f"- {r['workload']} --scale 1: {r['plain_wall_s']} s plain, {r['natural_wall_s']} s collected "
                  f"(natural), {r['launches']} launches: {r['per_launch_wall_us']} us per launch of wall time "
                  "(includes CUPTI start-up and the trace write)",
                  f"- the tool's own line: `{r['tool_line']}`"]
    elif r["test"] == "collect-managed-torch":
        lines += ["", "## PyTorch MLP with --managed torch", "",
                  f"- {r['launches']} launches, {r['faults']} faults, {r['allocations']} allocations, "
                  f"allocator {r['allocator']}, {r['launches_without_args']} launches without arguments"]
    elif r["test"] == "collect-sigterm":
        lines += ["", "## SIGTERM halfway", "",
                  f"- exit code {r['exit_code']}, partial trace read back: {r['launches']} launches, "
                  f"{r['faults']} faults, complete={r['complete']}"]
    elif r["test"] == "collect-cupti-facts":
        o = r.get("obs") or {}
        keys = ("hook", "cuFuncGetParamCount(CUkernel cast)", "cuFuncGetParamInfo(CUkernel cast, 1)",
                "cuKernelGetParamCount(CUkernel)", "cuFuncIsLoaded before launch", "uvm_counters", "um_kinds",
                "faults", "dropped", "torch_calls", "errors")
        lines += ["", "## CUPTI facts the collector relies on (tests/test_collect_gpu.py probe)", "",
                  f"- probe exit code {r['exit_code']}"] + [f"- {k}: `{o.get(k)}`" for k in keys]
    elif r["test"] == "collect-refuse-oversubscription":
        lines += ["", "## Managed allocation past the limit", "", f"- exit code {r['exit_code']}: {r['message']}"]
seen = [r for r in rows if r["test"] == "runner-observed"]
if seen:
    lines += ["", "## Driver behaviour the GPU runner relies on (observed)", ""]
    lines += [f"- {r['what']}: {r['value']}" for r in seen]
if not rows:
    lines += ["", "No measurements were recorded (see pytest-collect.txt and device-check.log)."]
open(report, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
log "done in $(( $(date +%s) - START )) s; report: $REPORT"
