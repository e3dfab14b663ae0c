"""``Fold`` and ``Unfold`` under PyTorch's module path (``torch.nn.modules.fold``); they live in
:mod:`kiln.nn.modules.distance`."""

from kiln.nn.modules.distance import Fold, Unfold

__all__ = ["Fold", "Unfold"]
