"""The real-kernel corpus: programs of real Triton kernels whose traces are recorded with
`pagecast collect --interpret` (docs/workloads-triton.md).

    pagecast datasets make liger -o liger.pctrace --scale 0.5 --seed 1

Each entry names a program module (run as `python -m MODULE --scale S --seed N --buffers B`
under the collector, in a subprocess) and the kernels whose footprint depends on data, not
on arguments (`irregular`). This module imports neither torch nor triton; the programs do.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from pagecast import trace as T
from pagecast.errors import InputError, PagecastError, UsageError
from pagecast.jsonfile import write_json_atomic
from pagecast.outputs import remove_path

# Bumped whenever a corpus program changes what it runs (sizes, kernels, call order), and
# written into each trace's manifest: a kept trace is reused only if made by the same revision.
REVISION = 6   # 2: the serving corpus keeps its model fixed across scales; 3: its prefill attention;
# 4: its KV pool sized as a deployed engine's (4096 pages); 5: its page tables as wide as the longest context;
# 6: serving-vllm's fused MoE launches its down projection too
CATEGORY = "triton"
PKG = "pagecast.datasets.corpus"


@dataclass(frozen=True)
class CorpusWorkload:
    name: str
    module: str                       # the program, run with python -m
    buffers: str                      # fresh | preallocated
    description: str
    irregular: tuple[str, ...] = ()   # kernels whose pages follow index values (data-dependent)
    needs: tuple[str, ...] = ("torch", "triton")
    category: str = field(default=CATEGORY)

    @property
    def summary(self) -> str:
        return self.description.split(". ")[0]

    def as_dict(self) -> dict:
        return {"name": self.name, "category": self.category, "description": self.description,
                "summary": self.summary, "source": "collect --interpret", "buffers": self.buffers,
                "irregular_kernels": list(self.irregular), "revision": REVISION}


_LIGER = ("Liger-Kernel's Triton ops forward and backward (RMSNorm, LayerNorm, SwiGLU, GeGLU, RoPE, "
          "cross-entropy, fused linear cross-entropy, softmax, group norm, KL divergence, JSD), shapes drawn per call")
_TUT = ("Kernels after Triton's tutorials (vector add, fused softmax, tiled matmul, low-memory dropout, layer norm "
        "forward and backward, fused attention), shapes drawn per call")
_SERVING = ("A serving engine's decode loop over sglang's and flashinfer's Triton kernels: vocab-parallel embedding, "
            "batch indices and positions from an append indptr, KV-cache writes through a -1-padded slot mapping, "
            "kv_indices from a request-to-page table, split-KV decode attention over indptr/indices, the prefill "
            "chunks' attention over a block table (unified attention), MoE alignment and fused MoE; requests arrive "
            "and finish, chunked prefill, pages freed and reused")
SERVING_KERNELS = ("_vocab_parallel_embedding_kernel", "get_batch_indices_positions_kernel", "reshape_and_cache_flash",
                   "create_flashinfer_kv_indices_triton", "_fwd_kernel_stage1", "_fwd_kernel_stage2",
                   "scatter_ragged_to_page_table_kernel", "unified_attention_3d_mtp_kernel",
                   "_moe_align_small_numel_kernel", "fused_moe_kernel")
_SERVING_VLLM = ("A serving engine's step loop over vLLM's Triton kernels: positions and sequence lengths through "
                 "a request-state mapping, KV-cache writes through a -1-padded slot mapping, unified attention over "
                 "a persistent block table in batch order, fused MoE's gate/up and down projections through a sorted "
                 "token order or, for sparse batches, straight from the router's top-k; the same scheduler as serving")
SERVING_VLLM_KERNELS = ("_prepare_pos_seq_lens_kernel", "reshape_and_cache_kernel_flash", "kernel_unified_attention",
                        "fused_moe_kernel")
_SERVING_VLLM_ROCM = ("serving-vllm's step loop with vLLM's ROCm attention backend's Triton path: a head-major KV "
                      "cache written through the -1-padded slot mapping, prefix prefill attention that skips decoding "
                      "requests and paged decode attention that skips prefill chunks, both over the block table")
SERVING_VLLM_ROCM_KERNELS = ("_prepare_pos_seq_lens_kernel", "reshape_and_cache_kernel_flash", "_fwd_kernel",
                             "kernel_paged_attention_2d", "fused_moe_kernel")
_DD = ("Data-dependent kernels: an embedding gather and a scatter-add with atomics over random indices, shapes "
       "drawn per call")

CORPUS: dict[str, CorpusWorkload] = {w.name: w for w in (
    CorpusWorkload("liger", f"{PKG}.liger", "fresh", f"{_LIGER}. Fresh tensors per call.",
                   needs=("torch", "triton", "liger_kernel")),
    CorpusWorkload("liger-prealloc", f"{PKG}.liger", "preallocated",
                   f"{_LIGER}. Inputs are prefixes of buffers allocated once at their largest size.",
                   needs=("torch", "triton", "liger_kernel")),
    CorpusWorkload("tutorials", f"{PKG}.tutorials", "fresh", f"{_TUT}. Fresh tensors per call."),
    CorpusWorkload("tutorials-prealloc", f"{PKG}.tutorials", "preallocated",
                   f"{_TUT}. Every tensor is a prefix of a buffer allocated once at its "
                   "largest size."),
    CorpusWorkload("data-dependent", f"{PKG}.data_dependent", "fresh", f"{_DD}.",
                   irregular=("embedding_gather_kernel", "scatter_add_kernel")),
    CorpusWorkload("serving", f"{PKG}.serving", "preallocated", f"{_SERVING}.", irregular=SERVING_KERNELS,
                   needs=("torch", "triton", "sglang", "flashinfer")),
    CorpusWorkload("serving-vllm", f"{PKG}.serving_vllm", "preallocated", f"{_SERVING_VLLM}.",
                   irregular=SERVING_VLLM_KERNELS, needs=("torch", "triton", "vllm")),
    CorpusWorkload("serving-vllm-rocm", f"{PKG}.serving_vllm_rocm", "preallocated", f"{_SERVING_VLLM_ROCM}.",
                   irregular=SERVING_VLLM_ROCM_KERNELS, needs=("torch", "triton", "vllm")),
)}

# what `needs` lacks, as pip would install it (the engines --no-deps: their requirements pull CUDA builds)
INSTALL_HINTS = {"liger_kernel": "pip install --no-deps liger-kernel==0.8.5 packaging",
                 "sglang": "pip install --no-deps sglang==0.5.23",
                 "flashinfer": "pip install --no-deps flashinfer-python==0.7.2.post1",
                 "vllm": "pip install --no-deps vllm==0.34.0"}


def get(name: str) -> CorpusWorkload:
    w = CORPUS.get(name)
    if w is None:
        raise UsageError(f"unknown corpus workload {name!r}; known: {', '.join(sorted(CORPUS))}")
    return w


def program_argv(w: CorpusWorkload, scale: float, seed: int) -> list[str]:
    return ["python", "-m", w.module, "--scale", f"{scale:g}", "--seed", str(int(seed)), "--buffers", w.buffers]


def make_trace(name: str, out: str | Path, *, scale: float = 1.0, seed: int = 0, mode: str = "full",
               driver_prefetch: bool = True, force: bool = False, drop: float = 0.0,
               allocator: str = "direct", progress=None) -> Path:
    """Record corpus workload `name` with `pagecast collect --interpret` (in a subprocess) into `out`."""
    w = get(name)
    if mode != "full":
        raise UsageError(f"{name} is recorded under Triton's interpreter, which gives full-mode traces only")
    missing = [m for m in w.needs if importlib.util.find_spec(m) is None]
    if missing:
        hints = [INSTALL_HINTS[m] for m in missing if m in INSTALL_HINTS]
        hint = f" ({'; '.join(hints)})" if hints else ""
        raise InputError(f"{name} needs {', '.join(missing)}{hint}; install pagecast[interpret] "
                         "(a CPU torch first)")
    out = Path(out)
    T.check_output_dir(out, force)   # the recording replaces it only once it is whole
    prog = program_argv(w, scale, seed)
    cmd = [sys.executable, "-m", "pagecast.cli", "collect", "--interpret", "-o", str(out), "--seed", str(int(seed)),
           *(["--force"] if force else []),
           "--drop", repr(float(drop)), "--allocator", allocator, *([] if driver_prefetch else ["--no-driver-prefetch"]),
           "--", *prog]
    p = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        try:   # a partial recording (the program failed, a signal): no dataset; the old output is gone too
            if T.read_manifest(out).get("complete") is False:
                remove_path(out)
        except PagecastError:
            pass
        lines = [x for x in p.stderr.strip().splitlines() if x.strip()]
        raise InputError(f"recording {name} failed (exit {p.returncode}): {lines[-1] if lines else 'no message'}")
    manifest = T.read_manifest(out)
    manifest["workload"] = {"name": name, "argv": ["pagecast", "datasets", "make", name, "-o", str(out), "--scale",
                                                   f"{scale:g}", "--seed", str(int(seed)),
                                                   *(["--drop", f"{drop:g}"] if drop else [])],
                            "program": prog, "scale": float(scale), "seed": int(seed), "category": CATEGORY,
                            "revision": REVISION, "drop": float(drop)}
    write_json_atomic(out / T.MANIFEST, manifest)
    if progress is not None:
        progress(1)
    return out
