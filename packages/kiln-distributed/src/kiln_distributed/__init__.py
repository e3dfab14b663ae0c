"""kiln-distributed's own modules: the engines behind ``kiln.distributed``'s backends and its plugin."""

__version__ = "0.1.0"
