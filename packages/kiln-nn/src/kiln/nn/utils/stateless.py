"""``kiln.nn.utils.stateless``: PyTorch's older path to :func:`kiln.func.functional_call`."""

from kiln.func import functional_call

__all__ = ["functional_call"]
