"""Calling a numba kernel without its dispatcher, where the call itself is the cost.

A numba dispatcher works out the types of its arguments at every call (about 0.1 us each,
0.3-0.45 us for three on the development machines) before it runs the compiled code. The
per-launch kernels of the GPU runner are called with arguments of one fixed type each (an int64
state array, the parameter bytes, ints): `entry_point(kernel, *example)` compiles the kernel for
the example's types (or loads it from numba's cache) and returns the compiled function's own
CPython entry (`Dispatcher.overloads[signature].entry_point`), which unboxes the arguments as
that signature says and checks nothing else, at 0.15-0.2 us a call (docs/performance.md). The
caller must pass exactly those types; tests compare it with the dispatcher.

Where numba's internals differ from what this expects, the dispatcher itself is returned.
"""

from __future__ import annotations

from typing import Callable

import numba


def entry_point(kernel, *example) -> Callable:
    """`kernel`'s compiled entry for the types of `example` (see the module doc)."""
    kernel(*example)
    try:
        sig = tuple(numba.typeof(a) for a in example)
        fn = kernel.overloads[sig].entry_point
    except (AttributeError, KeyError, TypeError):
        return kernel
    return fn if callable(fn) else kernel
