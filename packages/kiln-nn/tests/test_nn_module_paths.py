"""Every ``torch.nn.modules.<submodule>`` has a ``kiln.nn.modules.<submodule>`` from which every public class
PyTorch defines there imports (the same class kiln.nn exports), unless kiln leaves it out for the reason given
here."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
import torch.nn.modules

import kiln.nn as nn

# (submodule, name) -> why kiln leaves it out
LEFT_OUT = {
    ("batchnorm", "SyncBatchNorm"): "kiln-distributed provides it (kiln.distributed)",
}
# public functions PyTorch's submodules list in __all__ that kiln does not have
LEFT_OUT_FUNCTIONS = {
    ("module", name): "global hooks for every module are not built: kiln's Module runs its own hooks only"
    for name in (
        "register_module_forward_pre_hook",
        "register_module_forward_hook",
        "register_module_full_backward_pre_hook",
        "register_module_backward_hook",
        "register_module_full_backward_hook",
        "register_module_buffer_registration_hook",
        "register_module_module_registration_hook",
        "register_module_parameter_registration_hook",
    )
}

SUBMODULES = sorted(m.name for m in pkgutil.iter_modules(torch.nn.modules.__path__) if not m.name.startswith("_"))


def _torch_public(sub: str) -> tuple[list[str], list[str]]:
    """PyTorch's public classes defined in ``torch.nn.modules.<sub>`` and the functions its ``__all__`` lists."""
    mod = importlib.import_module(f"torch.nn.modules.{sub}")
    classes = [
        n for n, v in vars(mod).items() if inspect.isclass(v) and v.__module__ == mod.__name__ and not n.startswith("_")
    ]
    functions = [n for n in getattr(mod, "__all__", []) if inspect.isfunction(getattr(mod, n))]
    return classes, functions


def test_every_torch_submodule_is_listed():
    assert len(SUBMODULES) >= 26 and "pooling" in SUBMODULES and "linear_cross_entropy_options" in SUBMODULES


@pytest.mark.parametrize("sub", SUBMODULES)
def test_submodule_has_torchs_classes(sub):
    kmod = importlib.import_module(f"kiln.nn.modules.{sub}")
    assert kmod.__doc__, f"kiln.nn.modules.{sub} has no docstring"
    classes, functions = _torch_public(sub)
    missing = []
    for name in classes:
        if (sub, name) in LEFT_OUT:
            assert not hasattr(kmod, name), f"{sub}.{name} exists: drop it from LEFT_OUT"
            continue
        kcls = getattr(kmod, name, None)
        if kcls is None:
            missing.append(name)
            continue
        assert inspect.isclass(kcls) and kcls.__doc__
        if name in nn.__all__:  # the same class as kiln.nn's
            assert getattr(nn, name) is kcls
    for name in functions:
        if (sub, name) not in LEFT_OUT_FUNCTIONS:
            assert callable(getattr(kmod, name, None)), f"{sub}.{name}"
    assert not missing, f"kiln.nn.modules.{sub} lacks {missing}"
    # what PyTorch lists in the submodule's __all__, kiln lists in its own (re-export modules included)
    expected = {n for n in getattr(importlib.import_module(f"torch.nn.modules.{sub}"), "__all__", [])}
    expected -= {n for (s, n) in {**LEFT_OUT, **LEFT_OUT_FUNCTIONS} if s == sub}
    assert expected <= set(getattr(kmod, "__all__", [])), expected - set(getattr(kmod, "__all__", []))


def test_kiln_nn_exports_every_layer_once():
    assert len(nn.__all__) == len(set(nn.__all__))
    assert len(nn.modules.__all__) == len(set(nn.modules.__all__))
    for name in ("MultiheadAttention", "AvgPool3d", "LazyBatchNorm1d", "Container", "LinearCrossEntropyOptions"):
        assert name in nn.__all__


def test_linear_module_holds_non_dynamically_quantizable_linear():
    from kiln.nn.modules.activation import MultiheadAttention
    from kiln.nn.modules.linear import NonDynamicallyQuantizableLinear

    m = MultiheadAttention(4, 2)
    assert type(m.out_proj) is NonDynamicallyQuantizableLinear
    assert repr(m).replace("kiln.", "torch.") == repr(torch.nn.MultiheadAttention(4, 2))
