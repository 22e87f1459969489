"""How `collect --interpret` stops: a write error inside a launch hook, or a signal.

Both reach the workload as a `BaseException`, which its own `except Exception` does not catch;
from then on the hooks record nothing new. `hook` wraps the recorder's hook methods: it does
nothing once a write failed, and a signal that arrives while pagecast's own hook code runs takes
effect when that code returns, so a launch is either recorded whole or marked partial
(docs/collect.md, "Keeping what was collected").
"""

from __future__ import annotations

import functools


class WriteFailed(BaseException):
    """Writing the trace failed inside a launch hook (a full disk): collection stops.

    A BaseException, so that the workload's own `except Exception` does not swallow it; from then
    on the hooks record nothing, whatever the workload does with it."""


class Interrupted(BaseException):
    """SIGTERM or SIGINT while the workload ran: collection stops, the partial trace is kept.

    Raised where the workload runs, never inside pagecast's own hook code (deferred to the hook's
    end there), so a launch is either recorded whole or marked partial."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def hook(method):
    """A recorder hook: does nothing once a write failed; a signal that arrives inside it takes
    effect when it returns (the trace's buffers are never left half-updated)."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if self.failed is not None:
            return None
        self.busy += 1
        try:
            return method(self, *args, **kwargs)
        finally:
            self.busy -= 1
            if self.busy == 0 and self.pending_signal is not None:
                signum, self.pending_signal = self.pending_signal, None
                raise Interrupted(signum)
    return wrapper
