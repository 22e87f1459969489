"""Replay: prefetch plans, the UVM simulator, the GPU runner and cost profiles."""
