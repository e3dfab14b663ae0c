"""``kiln.backends.mkl``: Intel MKL, which kiln's kernels do not call (NumPy's BLAS serves matmul)."""

__all__ = ["is_available"]


def is_available() -> bool:
    """False: kiln does not link MKL itself."""
    return False
