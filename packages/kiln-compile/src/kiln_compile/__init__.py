"""kiln-compile's distribution package: its version and its plugin module (the API is ``kiln.compile``)."""

__version__ = "0.1.0"
