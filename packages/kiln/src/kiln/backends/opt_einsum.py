"""``kiln.backends.opt_einsum``: contraction-order search for ``einsum``. kiln's reference ``einsum``
contracts all operands in one NumPy call without a contraction-order search, so setting ``strategy`` has
no effect."""

__all__ = ["enabled", "is_available", "strategy"]

enabled = False
"""Whether an optimised contraction order is searched for (never, in kiln)."""
strategy = None
"""The search strategy (``"auto"``, ``"greedy"``, ``"optimal"`` in PyTorch); unused."""


def is_available() -> bool:
    """False: kiln has no contraction-order optimiser."""
    return False
