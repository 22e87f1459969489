"""The replay request (replay/request.py): one typed record, validated once, carried as JSON.

Round trips (request -> JSON -> request), malformed JSON and field values (one line, exit 2 through
the CLI and through the GPU child), the GPU child given its job as a JSON file rather than flags, and
no policy names spelled out in the replay command or the simulator's sweep."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagecast.cli import main
from pagecast.errors import UsageError
from pagecast.replay.gpu import backend as G
from pagecast.replay.gpu import child as C
from pagecast.replay.plan.adaptive import FALLBACKS as SIM_FALLBACKS
from pagecast.replay.policies import POLICIES, online_names
from pagecast.replay.request import GPU_FALLBACKS, OVERSUB_OF, SPANS, ReplayRequest
from pagecast.replay.policies.base import VICTIM_ORDERS

from cuda_standin import FakeCuda

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)
units = st.integers(9, 30).map(lambda k: 1 << k)


@st.composite
def requests(draw, backend=None):
    """Valid requests of either backend, every field drawn."""
    backend = backend or draw(st.sampled_from(("sim", "gpu")))
    gpu = backend == "gpu"
    pool = online_names() if gpu else list(POLICIES)
    policies = tuple(draw(st.lists(st.sampled_from(pool), min_size=1, max_size=len(pool), unique=True)))
    model = draw(names)   # template and runner need one
    if gpu:
        needs_trace = any(POLICIES[p].needs_relocator for p in policies)
        traces = tuple(draw(st.lists(names, min_size=1 if needs_trace else 0, max_size=1)))
    else:
        traces = tuple(draw(st.lists(names, min_size=1, max_size=3)))
    levels = draw(st.sampled_from(("capacity", "oversub") + (("none",) if gpu else ())))
    if levels == "oversub" and gpu and not traces:
        levels = "capacity"
    capacity = tuple(draw(st.lists(st.integers(1, 1 << 60), min_size=1, max_size=4))) if levels == "capacity" else None
    oversub = tuple(draw(st.lists(st.floats(1e-3, 1e3), min_size=1, max_size=4))) if levels == "oversub" else None
    gran = draw(st.none() | units)
    ev = draw(st.none() | units.filter(lambda u: gran is None or u >= gran))
    return ReplayRequest(
        backend=backend, policies=policies, traces=traces, capacity=capacity, oversub=oversub,
        oversub_of=draw(st.sampled_from(OVERSUB_OF)), model=model,
        plan=None if gpu or len(traces) != 1 else draw(st.none() | names),
        feedback=draw(st.booleans()), fallback=draw(st.none() | st.sampled_from(GPU_FALLBACKS if gpu else SIM_FALLBACKS)),
        repeat=draw(st.integers(1, 50)), costs=draw(names), granularity=gran, eviction_unit=ev,
        eviction=draw(st.sampled_from(VICTIM_ORDERS)), driver_prefetch=draw(st.booleans()),
        timeslice_ms=draw(st.floats(0, 1e4)), span=draw(st.sampled_from(SPANS)),
        workload=tuple(draw(st.lists(names, min_size=1, max_size=4))) if gpu else (),
        allow_oversubscription=draw(st.booleans()))


@SETTINGS
@given(requests())
def test_a_request_survives_json(req):
    back = ReplayRequest.from_json(req.to_json())
    assert back == req
    assert back.to_json() == req.to_json()
    assert json.loads(req.to_json())["format"] == "pagecast.replay-request/1"


@SETTINGS
@given(requests(backend="gpu"), st.data())
def test_a_child_job_survives_json(req, data):
    cap = data.draw(st.none() | st.integers(1, 1 << 40))
    job = C.ChildJob(request=req.one_run(req.policies[0], cap), result=data.draw(names),
                     timeline=data.draw(st.booleans()), feedback_every=data.draw(st.integers(1, 10_000)))
    back = C.ChildJob.from_json(job.to_json())
    assert back == job and back.policy == req.policies[0] and back.capacity == cap


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                        max_size=3),
                           max_leaves=6)


def _one_line_usage_error(fn):
    with pytest.raises(UsageError) as ei:
        fn()
    msg = str(ei.value)
    assert msg and "\n" not in msg and ei.value.exit_code == 2
    return msg


@SETTINGS
@given(requests(), st.data())
def test_a_field_with_a_bad_value_is_one_line(req, data):
    """Any field replaced by any JSON value: either a valid request or one line (never another error)."""
    d = req.to_dict()
    key = data.draw(st.sampled_from(sorted(d)))
    d[key] = data.draw(json_values)
    text = json.dumps(d)
    try:
        back = ReplayRequest.from_json(text)
    except UsageError as e:
        assert "\n" not in str(e) and e.exit_code == 2
    else:
        assert ReplayRequest.from_json(back.to_json()) == back


@SETTINGS
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_malformed_json_is_one_line(raw):
    try:
        ReplayRequest.from_json(raw)
    except UsageError as e:
        assert "\n" not in str(e)
    else:
        pytest.fail("bytes that are not a request were taken")   # no random bytes carry the format tag


@pytest.mark.parametrize("change,needle", [
    ({"format": "something/2"}, "format must be"),
    ({"colour": "blue"}, "unknown field 'colour'"),
    ({"policies": "demand"}, "policies must be a list of strings"),
    ({"capacity": [0]}, "--capacity must be > 0"),
    ({"capacity": [True]}, "capacity must be a list of integers"),
    ({"oversub": [2.0]}, "exactly one of --capacity"),
    ({"capacity": None, "oversub": [-1]}, "--oversub must be a positive number"),
    ({"granularity": 3000}, "--granularity must be a power of two"),
    ({"granularity": 1 << 20, "eviction_unit": 1 << 16}, "--eviction-unit must not be smaller"),
    ({"eviction": "random"}, "--eviction must be one of driver, fifo, lru"),
    ({"span": "page"}, "--span must be one of"),
    ({"policies": ["belady"]}, "unknown policy 'belady'"),
    ({"policies": ["template"], "model": None}, "needs --model MODEL or --plan PLAN"),
    ({"traces": []}, "needs at least one TRACE"),
    ({"repeat": 0}, "--repeat must be >= 1"),
    ({"jobs": 0}, "--jobs must be at least 1"),
    ({"timeslice_ms": -1}, "--timeslice must be >= 0"),
    ({"workload": ["python", "x.py"]}, "needs --backend gpu"),
    ({"backend": "tpu"}, "--backend must be one of sim, gpu"),
    ({"capacity": None, "oversub": [10 ** 400]}, "numbers a float holds"),
    ({"timeslice_ms": 10 ** 400}, "numbers a float holds"),
    ({"capacity": [10 ** 400]}, "more than the simulator handles"),
    ({"granularity": 10 ** 400}, "--granularity must be a power of two"),
])
def test_each_bad_field_names_itself(change, needle):
    d = ReplayRequest(policies=("demand",), traces=("t",), capacity=(1 << 30,)).to_dict()
    d.update(change)
    msg = _one_line_usage_error(lambda: ReplayRequest.from_json(json.dumps(d)))
    assert needle in msg, msg


def test_the_gpu_backend_checks_what_it_runs():
    base = dict(backend="gpu", workload=("python", "w.py"))
    for kw, needle in (({"policies": ("swap",)}, "not available on the GPU backend"),
                       ({"policies": ("template",)}, "needs --model"),
                       ({"policies": ("oracle",)}, "full-mode trace"),
                       ({"policies": ("demand",), "oversub": (2.0,), "oversub_of": "touched"},
                        "--oversub-of touched needs a trace"),
                       ({"policies": ("demand",), "traces": ("a", "b")}, "at most one trace"),
                       ({"policies": ("demand",), "workload": ()}, "after '--'")):
        assert needle in _one_line_usage_error(lambda: ReplayRequest(**{**base, **kw}))


# ---- through the CLI: flags parsed into the request, one line and exit 2 -----------------------------

flag_values = st.text(st.characters(codec="ascii", exclude_characters=",\x00"), min_size=1, max_size=8) | \
    st.integers(-5, 1 << 62).map(str) | st.floats(allow_nan=True, allow_infinity=True).map(str)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(("--capacity", "--oversub", "--granularity", "--eviction-unit", "--timeslice",
                        "--repeat", "--policy", "--costs")), flag_values)
def test_any_flag_value_is_a_run_or_one_line(flag, value):
    """Whatever a flag says, `pagecast replay` never shows a traceback: the request refuses the value
    in one line, or it stands and the (missing) trace is the one line."""
    import io
    from contextlib import redirect_stderr, redirect_stdout
    argv = ["replay", "/nonexistent/t.pctrace", "--policy", "demand"]
    if flag == "--policy":
        argv[3] = value
    if flag != "--capacity" and flag != "--oversub":
        argv += ["--oversub", "2"]
    if flag != "--policy":
        argv += [flag, value]
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        code = main(argv)
    lines = [x for x in err.getvalue().splitlines() if x.strip() and "warning" not in x]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err.getvalue(), err.getvalue()


def test_the_command_and_the_library_build_the_same_request():
    """What `pagecast replay` parses is the record a script would build."""
    from pagecast.replay.commands import replay_request
    args = Namespace(policy="demand,template", capacity="1GiB,2GiB", oversub=None, backend="sim", model="m.json",
                     plan=None, feedback=True, span="block", repeat=1, costs="pcie4", eviction="lru",
                     no_driver_prefetch=True, timeslice=2.5, granularity="4KiB", eviction_unit=None,
                     traces=["a.pctrace"], oversub_of="touched", workload=[], allow_oversubscription=False,
                     placement="auto", choose_on=4096, jobs=2)
    assert replay_request(args) == ReplayRequest(
        policies=("demand", "template"), traces=("a.pctrace",), capacity=(1 << 30, 2 << 30), model="m.json",
        feedback=True, span="block", costs="pcie4", eviction="lru", driver_prefetch=False, timeslice_ms=2.5,
        granularity=4096, oversub_of="touched", placement="auto", choose_on=4096, jobs=2)


# ---- the GPU child takes JSON, not flags -----------------------------------------------------------

def test_the_gpu_child_is_given_its_job_as_json_not_flags(tmp_path, monkeypatch):
    import pagecast.replay.gpu.driver as CI

    req = ReplayRequest(backend="gpu", policies=("demand", "alloc"), capacity=(64 << 20, 128 << 20), repeat=2,
                        model=None, feedback=True, workload=("python", "-m", "pkg.work", "--policy", "x", "--"))
    seen = []

    def child(cmd):
        seen.append((list(cmd), Path(cmd[-1]).read_text()))
        job = C.read_job(cmd[cmd.index(G.CHILD) + 1:])
        Path(job.result).write_text(json.dumps({"policy": job.policy, "time_s": 1.0, "faults": 0, "htod_bytes": 0,
                                                "dtoh_bytes": 0, "warnings": []}))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(CI, "open_cuda", lambda device=0: FakeCuda())
    monkeypatch.setattr(G, "_run_child", child)
    rows, _ = G.run_gpu_replay(req)
    assert len(seen) == 2 * 2 * 2 and len(rows) == 4
    jobs = []
    for cmd, text in seen:
        assert cmd[:3] == [sys.executable, "-m", G.CHILD] and len(cmd) == 4   # one argument: the job's file
        assert not any(a.startswith("--") for a in cmd)                       # no flags, no workload in argv
        jobs.append(C.ChildJob.from_json(text))
    # repeats interleaved at each capacity: demand, alloc, demand, alloc
    assert [(j.policy, j.capacity) for j in jobs] == [(p, c) for c in (64 << 20, 128 << 20)
                                                      for _ in range(2) for p in ("demand", "alloc")]
    for j in jobs:
        assert j.request == req.one_run(j.policy, j.capacity) and j.request.workload == req.workload
        assert j.request.feedback is True and j.request.repeat == 1
    assert [j.timeline for j in jobs] == [True, True, False, False] * 2   # the first repeat reports the timeline


def test_a_bad_job_file_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "job.json"
    for text in ("{not json", "[]", json.dumps({"request": {"format": "pagecast.replay-request/1"}, "result": "r"}),
                 json.dumps({"request": ReplayRequest(policies=("demand",), traces=("t",),
                                                      capacity=(1,)).to_dict(), "result": "r"})):
        bad.write_text(text)
        assert C.child_main([str(bad)]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert C.child_main(["--policy", "demand", "--", "python", "w.py"]) == 2   # flags are no longer taken
    assert "JOB.json" in capsys.readouterr().err


def test_the_child_module_refuses_a_bad_job_in_one_line(tmp_path):
    """The real `python -m pagecast.replay.gpu.child`, as the runner starts it."""
    bad = tmp_path / "job.json"
    bad.write_text('{"request": {"format": "pagecast.replay-request/1", "policies": ["demand"], "repeat": "x"}}')
    r = subprocess.run([sys.executable, "-m", G.CHILD, str(bad)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr


# ---- the policy names live in the registry ---------------------------------------------------------

@pytest.mark.parametrize("path", ["replay/commands.py", "replay/sim/sweep.py", "replay/request.py",
                                  "replay/gpu/backend.py", "replay/gpu/child.py"])
def test_no_policy_name_is_spelled_out(path):
    """Policies are looked up in the registry by their attributes; no `p == "oracle"` switch."""
    tree = ast.parse((ROOT / path).read_text())
    found = [(n.lineno, n.value) for n in ast.walk(tree)
             if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in POLICIES]
    assert found == [], found
