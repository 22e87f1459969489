"""pagecast: learn which pages GPU kernels touch from their launch arguments,
plan unified-memory prefetches, and measure what they buy."""

__version__ = "0.1.0"
PRODUCER = f"pagecast {__version__}"
