"""Workload models (synthetic traces with truth) and GPU workloads."""
