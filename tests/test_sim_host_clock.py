"""The simulator's host clock for a runtime's launch callbacks (sim/timing.py, `Groups.host_s`): the
host runs them asynchronously to the GPU, so their time delays a kernel only where the GPU would
otherwise wait for the launch; `host_ahead` bounds how far ahead the host may run."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pagecast.replay.costs import load_profile
from pagecast.replay.plan.groups import Groups
from pagecast.replay.sim import kernels as K
from pagecast.replay.sim.timing import run_timing


def _run(comp, host, ahead=0, profile=None):
    n = len(comp)
    g = Groups.empty(n)
    g.host_s = None if host is None else np.asarray(host, np.float64)
    g.host_ahead = ahead
    prof = profile or load_profile("msched-rtx5080")
    return run_timing(np.zeros((n, K.N_COUNTERS), np.int64), np.asarray(comp, np.float64), 65536, g, prof)


def test_a_host_ahead_of_the_gpu_costs_nothing():
    """Long kernels first, then short ones: the host, 3 us a callback, runs ahead during the long
    kernels and the short ones never wait; one launch ahead at most, every short kernel waits."""
    comp = [100e-6] * 10 + [1e-6] * 20
    host = [3e-6] * 30
    free = _run(comp, None)[1][-1]
    assert free == pytest.approx(sum(comp))
    assert _run(comp, host)[1][-1] == pytest.approx(free + 3e-6)   # the first callback alone
    serial = _run(comp, host, ahead=1)[1][-1]
    # each short kernel after the first waits for its callback, begun as the kernel before it started
    assert serial == pytest.approx(3e-6 + 10 * 100e-6 + 19 * 3e-6 + 1e-6)


def test_a_host_slower_than_the_gpu_sets_the_pace():
    """Callbacks longer than every kernel: the run takes at least the host's total, whatever the bound."""
    comp = [1e-6] * 50
    host = [4e-6] * 50
    for ahead in (0, 1, 8):
        end = _run(comp, host, ahead)[1]
        assert end[-1] == pytest.approx(50 * 4e-6 + 1e-6)
        assert np.all(np.diff(end) >= 4e-6 - 1e-12)


def test_the_profiles_host_launch_s_still_charges_every_run():
    """Without a runtime's own callback times the profile's host_launch_s is a kernel's least time."""
    prof = dataclasses.replace(load_profile("msched-rtx5080"), host_launch_s=5e-6)
    assert _run([1e-6] * 4, None, profile=prof)[1][-1] == pytest.approx(4 * 5e-6)
