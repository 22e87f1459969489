"""Real CuPy workloads on managed memory, mirroring the workload models."""
