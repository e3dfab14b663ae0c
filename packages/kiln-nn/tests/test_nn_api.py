"""Every layer class kiln.nn exports beyond the core Module machinery exists in torch.nn with the same
constructor parameter names, order and defaults."""

from __future__ import annotations

import inspect

import pytest
import torch

import kiln.nn as nn
from kiln.nn import modules

NEW_MODULES = [
    "activation",
    "attention",
    "conv",
    "distance",
    "dropout",
    "loss",
    "normalization",
    "padding",
    "pixelshuffle",
    "pooling",
    "rnn",
    "sparse",
    "transformer",
]
NAMES = sorted({n for m in NEW_MODULES for n in getattr(modules, m).__all__} - {"NonDynamicallyQuantizableLinear"})


def _params(cls):
    sig = inspect.signature(cls.__init__)
    out = []
    for p in list(sig.parameters.values())[1:]:
        default = p.default
        if callable(default) and not isinstance(default, type):
            default = default.__name__  # F.relu in kiln vs torch: compare by name
        elif isinstance(default, torch.Tensor):
            default = "tensor"
        out.append((p.name, p.kind, default))
    return out


@pytest.mark.parametrize("name", NAMES)
def test_constructor_signature_matches_torch(name):
    kcls, tcls = getattr(nn, name), getattr(torch.nn, name)
    assert kcls.__doc__, f"{name} has no docstring"
    assert _params(kcls) == _params(tcls)


def test_exports_are_complete():
    for name in NAMES:
        assert name in nn.__all__ and name in modules.__all__
