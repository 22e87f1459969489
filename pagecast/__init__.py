"""pagecast: learn which pages GPU kernels touch from their launch arguments,
plan unified-memory prefetches, and measure what they buy."""

__version__ = "0.1.0"
PRODUCER = f"pagecast {__version__}"


def __getattr__(name):
    # Lazy: `import pagecast` stays light; pagecast.prefetching loads the GPU engine on first use.
    if name == "prefetching":
        from pagecast.replay.gpu.prefetching import prefetching

        return prefetching
    raise AttributeError(f"module 'pagecast' has no attribute {name!r}")
