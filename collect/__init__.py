"""Collection: run a Python GPU workload under CUPTI and write a trace."""
