"""``kiln.utils``: PyTorch's ``torch.utils`` paths.

Like :mod:`kiln` itself, this package is extensible: other distributions contribute
``kiln/utils/<name>/`` directories (pkgutil-style), so each submodule lives where its code lives:

- :mod:`kiln.utils.checkpoint` (the core): activation checkpointing, ``checkpoint`` and
  ``checkpoint_sequential``.
- :mod:`kiln.utils.tensorboard` (the core; needs the ``tensorboard`` package, the core's ``tensorboard``
  extra): ``SummaryWriter``, event files for TensorBoard.
- :mod:`kiln.utils.data` (the ``kiln-data`` distribution): the ``torch.utils.data`` path to
  :mod:`kiln.data` (``DataLoader``, ``Dataset``, samplers), the same objects.

Submodules are imported on first attribute access, so ``import kiln as torch`` programs can write
``torch.utils.data.DataLoader`` and ``torch.utils.checkpoint.checkpoint``.
"""

import importlib as _importlib
import pkgutil as _pkgutil

# Feature distributions (kiln-data, ...) contribute kiln/utils/<name>/ directories.
__path__ = _pkgutil.extend_path(__path__, __name__)

# submodule -> the distribution that provides it, for a clear error when it is not installed
_PROVIDERS = {"checkpoint": "kiln", "tensorboard": "kiln", "data": "kiln-data"}


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return _importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
        dist = _PROVIDERS.get(name)
        if dist is not None:
            raise ModuleNotFoundError(
                f"kiln.utils.{name} is provided by the {dist!r} distribution, which is not installed: "
                f"pip install {dist}",
                name=e.name,
            ) from None
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
