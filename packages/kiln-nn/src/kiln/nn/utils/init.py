"""``skip_init`` (``torch.nn.utils.init``): build a module without initialising its parameters."""

from __future__ import annotations

import inspect

__all__ = ["skip_init"]


def skip_init(module_cls, *args, **kwargs):
    """``module_cls(*args, **kwargs)`` with its parameters and buffers left uninitialised: the
    :mod:`kiln.nn.init` functions its constructor calls fill nothing and draw no random numbers (PyTorch
    builds the module on the ``meta`` device instead, which kiln does not have). The module must take a
    ``device`` argument, as PyTorch requires; ``device`` defaults to ``"cpu"``.

    Values are whatever the allocation held: load a state dict or initialise them before use.
    """
    if "device" not in inspect.signature(module_cls).parameters:
        raise RuntimeError("Module must support a 'device' arg to skip initialization")
    from kiln.nn.init import _SKIP

    kwargs["device"] = kwargs.pop("device", "cpu")
    before = getattr(_SKIP, "active", False)
    _SKIP.active = True
    try:
        return module_cls(*args, **kwargs)
    finally:
        _SKIP.active = before
