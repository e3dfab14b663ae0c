"""``torch.utils.data.dataset``: the dataset classes and ``random_split``, from :mod:`kiln.data`."""

from kiln.data.dataset import *  # noqa: F403
from kiln.data.dataset import __all__  # noqa: F401
