"""The core's side of autocast: regions and their per-thread state, the error that names kiln-amp when
it is missing, and composites (functions written in ops with a policy of their own) under a
pre-autograd mode. What autocast casts is kiln-amp's, tested there."""

from __future__ import annotations

import pytest

import kiln
import kiln.backend as kb
from kiln import _plugins


@pytest.fixture
def without_kiln_amp(monkeypatch):
    _plugins.load()
    monkeypatch.setattr(_plugins, "_modes", {k: v for k, v in _plugins._modes.items() if k != "autocast"})


def test_autocast_names_the_package_to_install(without_kiln_amp):
    with pytest.raises(ModuleNotFoundError, match="pip install kiln-amp"):
        kiln.autocast("cpu")
    with pytest.raises(ModuleNotFoundError, match="pip install kiln-amp"):
        kiln.set_autocast_enabled("cpu", True)
    assert not kiln.is_autocast_enabled("cpu")
    with kiln.autocast("cpu", enabled=False):  # a disabled region needs nothing
        assert (kiln.ones(2, 2) @ kiln.ones(2, 2)).dtype is kiln.float32
    assert not kiln.is_autocast_enabled("cpu")


def test_state_without_a_region():
    assert kiln.get_autocast_dtype("cpu") is kiln.bfloat16
    assert kiln.get_autocast_dtype("cuda") is kiln.float16
    assert kiln.is_autocast_available("cpu") and kiln.is_autocast_available("cuda")
    assert not kiln.is_autocast_available("tpu")
    kiln.set_autocast_dtype("cpu", kiln.float16)
    try:
        assert kiln.get_autocast_dtype("cpu") is kiln.float16
    finally:
        kiln.set_autocast_dtype("cpu", kiln.bfloat16)
    with pytest.raises(TypeError, match="dtype"):
        kiln.set_autocast_dtype("cpu", "float16")
    assert kiln.is_autocast_cache_enabled()
    assert kiln.autocast_increment_nesting() == 1 and kiln.autocast_decrement_nesting() == 0
    kiln.clear_autocast_cache()


class _SeeComposites(kb.DispatchMode):
    level = "pre_autograd"

    def __init__(self):
        self.composites, self.ops = [], []

    def dispatch(self, op, args, redispatch):
        self.ops.append(op.name)
        return redispatch(op, args)

    def dispatch_composite(self, composite, args, kwargs, redispatch):
        self.composites.append((composite.name, composite.autocast, sorted(kwargs)))
        return redispatch(composite, args, kwargs)


def test_a_composite_goes_through_the_modes_and_its_ops_do_not():
    from kiln import nn_functional as F

    x, y = kiln.rand(3), kiln.rand(3)
    mode = _SeeComposites()
    with mode:
        loss = F.mse_loss(x, y, reduction="sum")
        kiln.exp(x)
    assert mode.composites == [("mse_loss", "fp32", ["reduction"])]
    assert mode.ops == ["exp"]  # mse_loss's own ops ran below the mode
    assert abs(loss.item() - float(((x - y) ** 2).sum())) < 1e-6


def test_composites_are_listed_with_their_policies():
    found = kb.composites()
    assert found["mse_loss"].autocast == "fp32" and found["trace"].autocast == "fp32"
    assert found["reflection_and_replication_pad"].autocast == "fp32"
    assert all(c.autocast in kb.AUTOCAST_POLICIES for c in found.values())
    with pytest.raises(ValueError, match="autocast must be one of"):
        kb.composite(autocast="fp64")(lambda x: x)
    with pytest.raises(ValueError, match="already defined"):
        kb.composite(autocast="fp32", name="mse_loss")(lambda x: x)


def test_op_policies_are_the_known_ones():
    for name, opdef in kb.ops().items():
        assert opdef.autocast is None or opdef.autocast in kb.AUTOCAST_POLICIES, name
    assert kb.op("matmul").autocast == "lower"
    assert kb.op("exp").autocast == "fp32_float16"
    assert kb.op("_binary_cross_entropy").autocast == "banned_float16"
    assert kb.op("cat").autocast == "promote"


def test_gradient_scaling_ops_reject_bad_arguments():
    unscale, update = kb.op("_amp_non_finite_check_and_unscale_"), kb.op("_amp_update_scale_")
    flag, inv = kiln.zeros(()), kiln.ones(())
    with pytest.raises(RuntimeError, match="floating point"):
        unscale(kiln.ones(3, dtype=kiln.int64), flag, inv)
    with pytest.raises(RuntimeError, match="found_inf must be a 1-element tensor"):
        unscale(kiln.ones(3), kiln.zeros(2), inv)
    with pytest.raises(RuntimeError, match="inv_scale must be a float tensor"):
        unscale(kiln.ones(3), flag, kiln.ones((), dtype=kiln.float64))
    with pytest.raises(TypeError, match="found_inf must be a Tensor"):
        unscale(kiln.ones(3), 0.0, inv)
    scale, tracker = kiln.ones(()), kiln.zeros((), dtype=kiln.int32)
    with pytest.raises(RuntimeError, match="growth_tracker must be a 1-element int32 tensor"):
        update(scale, kiln.zeros(()), flag, 2.0, 0.5, 10)
    with pytest.raises(RuntimeError, match="growth_interval must be a positive int"):
        update(scale, tracker, flag, 2.0, 0.5, 0)
    with pytest.raises(RuntimeError, match="current_scale must be a float tensor"):
        update(kiln.ones((), dtype=kiln.float16), tracker, flag, 2.0, 0.5, 10)
    assert scale.item() == 1.0 and tracker.item() == 0  # nothing written by a rejected call


def test_a_region_used_as_a_decorator_may_recurse():
    pytest.importorskip("kiln.amp")
    region = kiln.autocast("cpu")

    @region
    def depth(n):
        assert kiln.is_autocast_enabled("cpu")
        return 0 if n == 0 else 1 + depth(n - 1)

    assert depth(3) == 3 and not kiln.is_autocast_enabled("cpu")
