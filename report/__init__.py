"""Self-contained HTML reports for traces, model evaluations and replay results."""
