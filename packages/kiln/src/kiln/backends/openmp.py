"""``kiln.backends.openmp``: kiln-cpu runs its kernels on its own thread pool (Numba's threading layer),
not through OpenMP."""

__all__ = ["is_available"]


def is_available() -> bool:
    """False: kiln does not use OpenMP (``kiln.set_num_threads`` sizes kiln-cpu's pool)."""
    return False
