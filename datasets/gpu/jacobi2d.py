"""jacobi2d on a GPU: weighted-Jacobi smoothing in a multigrid V-cycle (CuPy, managed memory).

Mirrors the `jacobi2d` workload model (datasets/scientific.py): two buffers
per level of (ny + 2) rows with a halo row above and below, sweep / halo /
restrict / prolong kernels with the model's parameter lists, and a residual
reduced to one number per cycle. `--scale S` multiplies the grid's area by S.

    python -m pagecast.datasets.gpu.jacobi2d --scale 1
"""

from __future__ import annotations

import numpy as np

from .common import REDUCE_SUM, Gpu, cdiv, f32, i32, parse_args, round_to

CODE = r"""
extern "C" __global__ void jacobi2d_sweep(float* out, const float* in, int nx, int ny, float omega) {
    int i = blockIdx.x * blockDim.x + threadIdx.x, j = blockIdx.y * blockDim.y + threadIdx.y;
    if (i >= nx || j >= ny) return;
    // `in` and `out` point at the first interior row; rows -1 and ny are the halo
    float c = in[(long)j * nx + i];
    float l = in[(long)j * nx + (i + nx - 1) % nx], r = in[(long)j * nx + (i + 1) % nx];
    float u = in[(long)(j - 1) * nx + i], d = in[(long)(j + 1) * nx + i];
    out[(long)j * nx + i] = (1.0f - omega) * c + omega * 0.25f * (l + r + u + d);
}

extern "C" __global__ void jacobi2d_halo(float* u, int nx, int ny) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nx) return;
    // periodic in y: row ny (the last interior row) into row 0, row 1 into row ny + 1
    u[i] = u[(long)ny * nx + i];
    u[(long)(ny + 1) * nx + i] = u[(long)nx + i];
}

extern "C" __global__ void jacobi2d_restrict(float* coarse, const float* fine, int nxc, int nyc) {
    int i = blockIdx.x * blockDim.x + threadIdx.x, j = blockIdx.y * blockDim.y + threadIdx.y;
    if (i >= nxc || j >= nyc) return;
    long nxf = 2L * nxc;
    const float* f = fine + (2L * j) * nxf + 2L * i;
    coarse[(long)j * nxc + i] = 0.25f * (f[0] + f[1] + f[nxf] + f[nxf + 1]);
}

extern "C" __global__ void jacobi2d_prolong(float* fine, const float* coarse, int nxc, int nyc) {
    int i = blockIdx.x * blockDim.x + threadIdx.x, j = blockIdx.y * blockDim.y + threadIdx.y;
    long nxf = 2L * nxc;
    if (i >= nxf || j >= 2 * nyc) return;
    fine[(long)j * nxf + i] += coarse[(long)(j / 2) * nxc + i / 2];
}

extern "C" __global__ void jacobi2d_residual(const float* u, float* partial, int nx, int ny) {
    __shared__ float s[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x, j = blockIdx.y * blockDim.y + threadIdx.y;
    int t = threadIdx.y * blockDim.x + threadIdx.x;
    float v = 0.0f;
    if (i < nx && j < ny) {
        float c = u[(long)j * nx + i];
        float avg = 0.25f * (u[(long)j * nx + (i + nx - 1) % nx] + u[(long)j * nx + (i + 1) % nx] +
                             u[(long)(j - 1) * nx + i] + u[(long)(j + 1) * nx + i]);
        v = (c - avg) * (c - avg);
    }
    s[t] = v;
    __syncthreads();
    for (int w = 128; w > 0; w >>= 1) {
        if (t < w) s[t] += s[t + w];
        __syncthreads();
    }
    if (t == 0) partial[blockIdx.y * gridDim.x + blockIdx.x] = s[0];
}

""" + REDUCE_SUM
KERNELS = ["jacobi2d_sweep", "jacobi2d_halo", "jacobi2d_restrict", "jacobi2d_prolong", "jacobi2d_residual",
           "reduce_sum"]
LEVELS = 4
CYCLES = 3


def plan(scale: float) -> tuple[list[tuple[int, int]], int]:
    side = round_to(1024 * np.sqrt(scale), 256, 256)
    dims = [(side >> l, side >> l) for l in range(LEVELS)]
    nbytes = sum(2 * 4 * nx * (ny + 2) for nx, ny in dims) + 4 * (side // 32) * (side // 8) + 4096
    return dims, nbytes


def main(argv=None) -> None:
    a = parse_args("jacobi2d", __doc__.splitlines()[0], argv)
    dims, nbytes = plan(a.scale)
    g = Gpu("jacobi2d", nbytes)
    K = g.module(CODE, KERNELS)
    rng = np.random.default_rng(a.seed)
    bufs = []
    for nx, ny in dims:
        pair = []
        for _ in range(2):
            host = rng.standard_normal(nx * (ny + 2)).astype(np.float32)
            pair.append(g.array(host))
        bufs.append(pair)
    nx0, ny0 = dims[0]
    gx0, gy0 = cdiv(nx0, 32), cdiv(ny0, 8)
    partial = g.empty(gx0 * gy0, np.float32)
    scalars = g.empty(1024, np.float32)
    omega = f32(0.8)

    def sweep(l, src):
        nx, ny = dims[l]
        u_in, u_out = bufs[l][src], bufs[l][1 - src]
        g.launch(K["jacobi2d_sweep"], (cdiv(nx, 32), cdiv(ny, 8)), (32, 8),
                 (u_out[nx:], u_in[nx:], i32(nx), i32(ny), omega))

    def halo(l, k):
        nx, ny = dims[l]
        g.launch(K["jacobi2d_halo"], (cdiv(nx, 256),), (256,), (bufs[l][k], i32(nx), i32(ny)))

    def smooth(l):
        sweep(l, 0)
        halo(l, 1)
        sweep(l, 1)
        halo(l, 0)

    residuals = []
    for _ in range(CYCLES):
        for l in range(LEVELS - 1):
            smooth(l)
            (nxf, _), (nxc, nyc) = dims[l], dims[l + 1]
            g.launch(K["jacobi2d_restrict"], (cdiv(nxc, 32), cdiv(nyc, 8)), (32, 8),
                     (bufs[l + 1][0][nxc:], bufs[l][0][nxf:], i32(nxc), i32(nyc)))
        smooth(LEVELS - 1)
        for l in range(LEVELS - 2, -1, -1):
            (nxf, nyf), (nxc, nyc) = dims[l], dims[l + 1]
            g.launch(K["jacobi2d_prolong"], (cdiv(nxf, 32), cdiv(nyf, 8)), (32, 8),
                     (bufs[l][0][nxf:], bufs[l + 1][0][nxc:], i32(nxc), i32(nyc)))
            smooth(l)
        g.launch(K["jacobi2d_residual"], (gx0, gy0), (32, 8), (bufs[0][0][nx0:], partial, i32(nx0), i32(ny0)))
        g.launch(K["reduce_sum"], (1,), (1024,), (partial, scalars, i32(gx0 * gy0)))
        residuals.append(float(scalars[:1].get()[0]))
    g.done(f"{nx0}x{ny0} grid, residual {residuals[0]:.4g} -> {residuals[-1]:.4g}")


if __name__ == "__main__":
    main()
