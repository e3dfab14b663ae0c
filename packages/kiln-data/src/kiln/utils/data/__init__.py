"""``kiln.utils.data``: the ``torch.utils.data`` path to :mod:`kiln.data`.

Installed by the ``kiln-data`` distribution. Every public name is :mod:`kiln.data`'s own object
(``__all__`` is the same list), so ``import kiln as torch`` programs find ``torch.utils.data.DataLoader``;
the submodules PyTorch code imports from (``dataloader``, ``dataset``, ``sampler``, ``distributed``)
exist here too.
"""

from kiln.data import *  # noqa: F403
from kiln.data import __all__ as _data_all
from kiln.utils.data import dataloader, dataset, distributed, sampler

__all__ = list(_data_all)
