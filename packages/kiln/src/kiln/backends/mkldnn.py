"""``kiln.backends.mkldnn``: oneDNN's switch. kiln's CPU kernels are its own (Numba), not oneDNN's."""

__all__ = ["enabled", "is_available"]

enabled = True
"""Whether oneDNN may be used (it never is in kiln)."""


def is_available() -> bool:
    """False: kiln does not use oneDNN."""
    return False
