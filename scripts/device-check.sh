#!/usr/bin/env bash
# pagecast device check: every GPU check, on any machine with an NVIDIA GPU (a CUDA 13 driver,
# Python >= 3.10 with pip, CuPy, PyTorch and cuda-bindings; no network needed).
#
#   bash scripts/device-check.sh --dry-run   # any machine, no GPU: the plan with each step's
#                                            # budget and the total, every step walked with its
#                                            # GPU part stubbed, the report rendered
#   bash scripts/device-check.sh             # on the GPU machine: the first command, <= 540 s
#   bash scripts/device-check.sh --second    # then, if wanted: what the first could not reach, the
#                                            # collection tests (those that passed on an H200 first)
#   bash scripts/device-check.sh --third     # then: what the second could not reach, the rest of the
#                                            # collection tests, the other stages' GPU tests
#   bash scripts/device-check.sh --plan      # the plan alone
#
# The first command installs the CUPTI wheels (below) into a virtual environment and pagecast
# into it, then runs the replay validation (scripts/gpu_validation.py): calibrate; llm_decode,
# spmv_cg and jacobi2d at a scale of at least 1 GiB of managed memory (each checked against the
# free memory: never oversubscribed; the capacity is emulated), 200% with demand, template and
# oracle, five interleaved repeats, the no-runner and 100% baselines, the simulator beside each
# run; then writes the report. Each step has a device-time budget, runs in its own process group
# under that limit, and records met, missed or not reached; a failure never stops the rest.
#
# Output, in --out DIR (default $DEVICE_CHECK_OUT, else ./device-check-out/): device-check.md (the
# report, also printed), device-check.log, steps.json, env.txt, collect-metrics.jsonl, gpu-validation.md,
# collected-traces.tar.gz (the traces the collection tests made: real GPU traces to read back anywhere).
#
# Nothing here allocates more managed memory than the GPU has free: every workload checks its
# plan against cudaMemGetInfo, and `pagecast collect` refuses managed allocations past the free
# memory (the tests never pass --allow-oversubscription).
#
# Wheels to carry (download them on a machine with pip and network, in the repository root;
# .whl/ is git-ignored, about 40 MB in all). nvidia-cuda-cupti is tagged manylinux_2_25, hence
# that platform. cuda-pathfinder is carried because cupti-python finds libcupti through it and
# versions before 1.4.1 know no "cupti":
#   P="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
#      --platform manylinux_2_25_x86_64 --platform manylinux_2_24_x86_64 \
#      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
#   python3 -m pip download $P -d .whl cupti-python==13.4.0 pyelftools nvidia-cuda-cupti==13.5.25 \
#       'cuda-pathfinder>=1.4.1'
#   python3 -m pip download $P -d .whl/fallback cupti-python==13.0.1 'nvidia-cuda-cupti~=13.0.0'
# Whatever else the machine lacks (the install step names it: pytest, hypothesis, one of pagecast's
# requirements) goes, with its dependencies, into .whl/extra/ (the same flags, less --no-deps).
# Then copy the repository (with .whl/) to the GPU machine and run the commands above there.
set -u
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
exec python3 "$ROOT/scripts/device_check.py" "$@"
