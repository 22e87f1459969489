"""The parameter buffer `collect --interpret` records: Triton 3.9's signature rules."""

from __future__ import annotations

import os
import struct

os.environ["TRITON_INTERPRET"] = "1"   # before any @triton.jit below

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from hypothesis import given, settings
from hypothesis import strategies as st

from pagecast.collect.interpret_args import ArgPacker, UnsupportedLaunch, check_triton_version
from pagecast.errors import InputError


@triton.jit
def k_mixed(x_ptr, n, scale, flag, y_ptr, big, BLOCK: tl.constexpr):
    pass


@triton.jit
def k_ints(a, b, c, d):
    pass


@triton.jit(do_not_specialize=["one"])
def k_dns(x_ptr, one, other_one):
    pass


@triton.jit
def k_annot(x_ptr, n: tl.int64, f: tl.float64, h: tl.float16):
    pass


@triton.jit
def k_tuple(t, x_ptr):
    pass


def _packer(kernel):
    return ArgPacker(kernel.fn, kernel.kwargs.get("do_not_specialize"),
                     kernel.kwargs.get("do_not_specialize_on_alignment"))


def _fake_address(t):
    return 0x7F40_0000_0000 + (t.data_ptr() - t.untyped_storage().data_ptr())


def _slots(p):
    return [(n, o, s) for n, o, s in zip(p.names, p.offsets, p.sizes)]


def test_layout_of_mixed_arguments():
    x, y = torch.zeros(8), torch.zeros(8)[2:]
    p = _packer(k_mixed).pack((x, 100, 0.5, True, y, 2 ** 40), {"BLOCK": 64, "num_warps": 8}, _fake_address)
    # pointer 8 | i32 4 | fp32 4 | u1 1 (+7 pad) | pointer 8 | i64 8 | two scratch pointers
    assert _slots(p) == [("x_ptr", 0, 8), ("n", 8, 4), ("scale", 12, 4), ("flag", 16, 1), ("y_ptr", 24, 8),
                         ("big", 32, 8), ("global_scratch", 40, 8), ("profile_scratch", 48, 8)]
    d = p.data
    assert len(d) == 56
    assert struct.unpack_from("<Q", d, 0)[0] == 0x7F40_0000_0000
    assert struct.unpack_from("<Q", d, 24)[0] == 0x7F40_0000_0000 + 8   # a view two floats in
    assert struct.unpack_from("<i", d, 8)[0] == 100
    assert struct.unpack_from("<f", d, 12)[0] == 0.5
    assert d[16] == 1
    assert struct.unpack_from("<q", d, 32)[0] == 2 ** 40
    assert d[40:56] == b"\0" * 16
    assert p.pointers == [(0, 0x7F40_0000_0000), (24, 0x7F40_0000_0008)]


def test_integer_specialization():
    # 1 becomes a constexpr and leaves the buffer; 0 stays; past 2^31 is i64; past 2^63 u64
    p = _packer(k_ints).pack((1, 0, 2 ** 31, 2 ** 63), {}, _fake_address)
    assert _slots(p)[:3] == [("b", 0, 4), ("c", 8, 8), ("d", 16, 8)]
    assert struct.unpack_from("<q", p.data, 8)[0] == 2 ** 31
    assert struct.unpack_from("<Q", p.data, 16)[0] == 2 ** 63
    p = _packer(k_ints).pack((-2 ** 31, -2 ** 31 - 1, 2 ** 31 - 1, None), {}, _fake_address)
    assert [s for _, _, s in _slots(p)] == [4, 8, 4, 8, 8]    # None vanishes too


def test_do_not_specialize_keeps_a_one():
    p = _packer(k_dns).pack((torch.zeros(4), 1, 1), {}, _fake_address)
    assert [n for n in p.names] == ["x_ptr", "one", "global_scratch", "profile_scratch"]
    assert struct.unpack_from("<i", p.data, 8)[0] == 1


def test_annotations_fix_the_type():
    p = _packer(k_annot).pack((torch.zeros(4), 3, 1.5, 0.25), {}, _fake_address)
    assert _slots(p)[:4] == [("x_ptr", 0, 8), ("n", 8, 8), ("f", 16, 8), ("h", 24, 2)]
    assert struct.unpack_from("<d", p.data, 16)[0] == 1.5
    assert np.frombuffer(p.data[24:26], np.float16)[0] == 0.25


def test_tuples_are_flattened():
    x = torch.zeros(4)
    p = _packer(k_tuple).pack(((7, x, 1), x), {}, _fake_address)
    assert p.names[:3] == ["t[0]", "t[1]", "x_ptr"]
    assert _slots(p)[:3] == [("t[0]", 0, 4), ("t[1]", 8, 8), ("x_ptr", 16, 8)]


def test_tensor_descriptor_is_refused():
    from triton.tools.tensor_descriptor import TensorDescriptor
    x = torch.zeros(16, 16)
    desc = TensorDescriptor.from_tensor(x, [16, 16])
    with pytest.raises(UnsupportedLaunch, match="tensor descriptors are not supported"):
        _packer(k_tuple).pack((desc, x), {}, _fake_address)


def test_version_pin():
    check_triton_version(triton.__version__)
    check_triton_version("3.9.7")
    for v in ("3.8.0", "3.10.0", "2.3.1", "garbage"):
        with pytest.raises(InputError, match="Triton 3.9"):
            check_triton_version(v)


_ARG = st.one_of(st.integers(-2 ** 63, 2 ** 64 - 1), st.booleans(), st.floats(allow_nan=False, width=32),
                 st.none(), st.just("tensor"))


@triton.jit
def k_six(a, b, c, d, e, f):
    pass


@settings(max_examples=200, deadline=None)
@given(st.lists(_ARG, min_size=6, max_size=6))
def test_any_arguments_pack_as_triton_types_them(vals):
    """Every slot is at its natural alignment, in order, and reads back as Triton's type for it."""
    from triton.runtime.jit import mangle_type
    tensors = {i: torch.zeros(3) for i, v in enumerate(vals) if v == "tensor"}
    args = tuple(tensors.get(i, v) for i, v in enumerate(vals))
    p = _packer(k_six).pack(args, {}, _fake_address)
    expect = []
    for name, v in zip("abcdef", args):
        if v is None or (type(v) is int and v == 1):
            continue
        ty = mangle_type(v, True)
        expect.append((name, ty, v))
    assert p.names == [e[0] for e in expect] + ["global_scratch", "profile_scratch"]
    end = 0
    for (name, ty, v), off, size in zip(expect, p.offsets, p.sizes):
        assert off % size == 0 and off >= end
        end = off + size
        raw = p.data[off:off + size]
        if ty.startswith("*"):
            assert size == 8 and struct.unpack("<Q", raw)[0] == 0x7F40_0000_0000
        elif ty == "fp32":
            assert size == 4 and struct.unpack("<f", raw)[0] == np.float32(v)
        elif ty == "u1":
            assert size == 1 and raw[0] == int(v)
        else:
            fmt = {"i32": "<i", "i64": "<q", "u64": "<Q"}[ty]
            assert struct.calcsize(fmt) == size and struct.unpack(fmt, raw)[0] == v
    assert p.offsets[-1] % 8 == 0 and len(p.data) == p.offsets[-1] + 8
