"""``torch.nn.modules.utils``: ``consume_prefix_in_state_dict_if_present``, and ``factory_kwargs`` (which
:mod:`kiln.nn` exports, as ``torch.nn`` does). The tuple helpers ``_single``/``_pair``/``_triple``/``_ntuple``
are PyTorch's private names, re-exported from ``kiln.nn.modules._utils``."""

from __future__ import annotations

from typing import Any

from kiln.nn.modules._utils import _ntuple, _pair, _reverse_repeat_tuple, _single, _triple  # noqa: F401

__all__ = ["consume_prefix_in_state_dict_if_present"]


def consume_prefix_in_state_dict_if_present(state_dict: dict[str, Any], prefix: str) -> None:
    """Strip ``prefix`` from the keys of ``state_dict`` (and of its ``_metadata``) in place, where present:
    a ``DataParallel`` model's state dict (``"module."``) then loads into the bare model."""
    for key in list(state_dict.keys()):
        if key.startswith(prefix):
            state_dict[key[len(prefix) :]] = state_dict.pop(key)
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is None:
        return
    for key in list(metadata.keys()):
        # "" is the wrapper itself; the wrapped model's entry is "module" (the prefix without its dot)
        if key and (key == prefix.replace(".", "") or key.startswith(prefix)):
            metadata[key[len(prefix) :]] = metadata.pop(key)


def factory_kwargs(kwargs: dict | None) -> dict:
    """The factory keywords (``device``, ``dtype``, ``memory_format``) of ``kwargs``, merged with its
    ``factory_kwargs`` entry, for a module to pass to ``kiln.empty`` and friends (``torch.nn.factory_kwargs``).

    An unknown keyword, or one given both ways, raises ``TypeError``.
    """
    if kwargs is None:
        return {}
    simple = {"device", "dtype", "memory_format"}
    expected = simple | {"factory_kwargs"}
    if not kwargs.keys() <= expected:
        raise TypeError(f"unexpected kwargs {kwargs.keys() - expected}")
    out = dict(kwargs.get("factory_kwargs", {}))
    for key in simple:
        if key in kwargs:
            if key in out:
                raise TypeError(f"{key} specified twice, in **kwargs and in factory_kwargs")
            out[key] = kwargs[key]
    return out
