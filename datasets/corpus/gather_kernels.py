"""Data-dependent Triton kernels: which rows they touch depends on index values, not on the
launch arguments (an embedding gather, and a scatter-add with atomics, as in an embedding's
backward pass or a sparse update). A template cannot predict them; the fitter should call
them `irregular`.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def embedding_gather_kernel(idx_ptr, table_ptr, out_ptr, n_idx, dim, table_stride, out_stride,
                            BLOCK_D: tl.constexpr):
    i = tl.program_id(0)
    row = tl.load(idx_ptr + i).to(tl.int64)
    for d0 in range(0, dim, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        m = cols < dim
        v = tl.load(table_ptr + row * table_stride + cols, mask=m)
        tl.store(out_ptr + i * out_stride + cols, v, mask=m)


@triton.jit
def scatter_add_kernel(idx_ptr, src_ptr, out_ptr, n, dim, src_stride, out_stride, BLOCK_D: tl.constexpr):
    i = tl.program_id(0)
    row = tl.load(idx_ptr + i).to(tl.int64)
    for d0 in range(0, dim, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        m = cols < dim
        v = tl.load(src_ptr + i * src_stride + cols, mask=m)
        tl.atomic_add(out_ptr + row * out_stride + cols, v, mask=m)


def embedding_gather(idx, table, out):
    n, dim = out.shape
    embedding_gather_kernel[(n,)](idx, table, out, n, dim, table.stride(0), out.stride(0),
                                  BLOCK_D=min(1024, triton.next_power_of_2(dim)))
    return out


def scatter_add(idx, src, out):
    n, dim = src.shape
    scatter_add_kernel[(n,)](idx, src, out, n, dim, src.stride(0), out.stride(0),
                             BLOCK_D=min(1024, triton.next_power_of_2(dim)))
    return out
