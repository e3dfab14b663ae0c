"""Autograd's modes and tensor flags against PyTorch: no_grad, enable_grad, set_grad_enabled,
inference_mode, detach, requires_grad_, retain_grad, anomaly mode."""

# ruff: noqa: B023 - lambdas made inside loops are called within the same iteration

from __future__ import annotations

import warnings

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln


def leaves(values, dtype=kiln.float64):
    """(kiln, torch) leaves requiring grad with the same values."""
    return U.both(np.asarray(values, dtype=np.float64), dtype=dtype, requires_grad=True)


# ---------------------------------------------------------------------------------------- grad modes


def test_no_grad_context_and_decorators():
    kx, tx = leaves([1.0])
    with kiln.no_grad():
        assert not kiln.is_grad_enabled()
        ky = kx * 2
    with torch.no_grad():
        ty = tx * 2
    assert ky.requires_grad == ty.requires_grad is False and ky.grad_fn is None
    assert kiln.is_grad_enabled()

    @kiln.no_grad()
    def f(a):
        return a * 2

    @kiln.no_grad
    def g(a):
        return a * 3

    assert f(kx).requires_grad is False and g(kx).requires_grad is False
    assert kiln.is_grad_enabled()
    assert (kx * 2).requires_grad


def test_enable_grad_inside_no_grad():
    kx, _ = leaves([1.0])
    with kiln.no_grad():
        with kiln.enable_grad():
            assert kiln.is_grad_enabled()
            y = kx * 2
        assert not kiln.is_grad_enabled()
        z = kx * 2

        @kiln.enable_grad()
        def f(a):
            return a * 2

        w = f(kx)
    assert y.requires_grad and not z.requires_grad and w.requires_grad


def test_set_grad_enabled_forms():
    kx, tx = leaves([1.0])
    # as a context manager
    with kiln.set_grad_enabled(False):
        assert not kiln.is_grad_enabled()
        assert not (kx * 2).requires_grad
        with kiln.set_grad_enabled(True):
            assert (kx * 2).requires_grad
        assert not kiln.is_grad_enabled()
    assert kiln.is_grad_enabled()
    # as a function call (takes effect at once)
    kiln.set_grad_enabled(False)
    torch.set_grad_enabled(False)
    try:
        assert not kiln.is_grad_enabled()
        assert (kx * 2).requires_grad == (tx * 2).requires_grad is False
    finally:
        kiln.set_grad_enabled(True)
        torch.set_grad_enabled(True)
    assert kiln.is_grad_enabled()

    # as a decorator
    @kiln.set_grad_enabled(False)
    def f(a):
        return a * 2

    assert kiln.is_grad_enabled(), "decorating must not change the grad mode"
    assert not f(kx).requires_grad
    assert kiln.is_grad_enabled()


def test_no_grad_restores_state_on_exception():
    with pytest.raises(ValueError), kiln.no_grad():
        raise ValueError
    assert kiln.is_grad_enabled()


def test_inference_mode():
    kx, tx = leaves([1.0, 2.0])
    with kiln.inference_mode():
        assert kiln.is_inference_mode_enabled() and not kiln.is_grad_enabled()
        ky = kx * 2
    with torch.inference_mode():
        ty = tx * 2
    assert ky.requires_grad == ty.requires_grad is False
    assert ky.is_inference() == ty.is_inference() is True
    assert kx.is_inference() == tx.is_inference() is False
    assert not kiln.is_inference_mode_enabled()
    U.assert_same_error(lambda: ky.add_(1), lambda: ty.add_(1))
    U.assert_same_error(lambda: (ky * kx).sum().backward(), lambda: (ty * tx).sum().backward())

    @kiln.inference_mode()
    def f(a):
        return a * 2

    assert f(kx).is_inference()
    with kiln.inference_mode(False):
        assert not (kx * 2).is_inference()


# ---------------------------------------------------------------------------------------- detach / requires_grad_ / retain_grad


def test_detach_shares_storage_and_version():
    kx, tx = leaves([1.0, 2.0, 3.0])
    ky, ty = kx * 2, tx * 2
    kd, td = ky.detach(), ty.detach()
    assert kd.requires_grad == td.requires_grad is False
    assert kd.is_leaf and kd.grad_fn is None
    kd[0] = 10.0
    td[0] = 10.0
    U.assert_close(ky, ty)
    assert ky._version == ty._version
    assert kd.data_ptr() == ky.data_ptr()
    # data
    U.assert_close(kx.data, tx.data)
    assert kx.data.requires_grad is False


def test_detach_then_inplace_triggers_version_check():
    kx, tx = leaves([1.0, 2.0])
    ky, ty = kx.exp(), tx.exp()  # exp saves its result
    ky.detach().add_(1)
    ty.detach().add_(1)
    U.assert_same_error(lambda: ky.sum().backward(), lambda: ty.sum().backward())


def test_requires_grad_():
    k, t = U.both(np.ones(2, np.float32))
    assert k.requires_grad_() is k
    t.requires_grad_()
    assert k.requires_grad and k.is_leaf
    k.requires_grad_(False)
    assert not k.requires_grad
    k.requires_grad = True
    assert k.requires_grad
    ky, ty = k * 2, t * 2
    U.assert_same_error(lambda: ky.requires_grad_(False), lambda: ty.requires_grad_(False))
    assert ky.requires_grad_(True) is ky
    U.assert_same_error(lambda: kiln.tensor([1, 2]).requires_grad_(), lambda: torch.tensor([1, 2]).requires_grad_())


def test_retain_grad():
    kx, tx = leaves([1.0, 2.0])
    res = {}
    for name, x in (("k", kx), ("t", tx)):
        h = x * 3
        h.retain_grad()
        h2 = x * 4  # not retained
        (h * h2).sum().backward()
        res[name] = (h, h2)
    U.assert_close(res["k"][0].grad, res["t"][0].grad)
    assert res["k"][0].retains_grad and not res["k"][1].retains_grad
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns on .grad of a non-leaf
        assert res["k"][1].grad is None and res["t"][1].grad is None
    U.assert_close(kx.grad, tx.grad)
    kn, tn = U.both(np.ones(2, np.float32))
    U.assert_same_error(lambda: (kn * 2).retain_grad(), lambda: (tn * 2).retain_grad())


# ---------------------------------------------------------------------------------------- anomaly mode


def test_detect_anomaly_raises_on_nan_in_backward():
    for mode in ("context", "set"):
        kx, tx = leaves([0.0, 1.0])

        def run(lib, x):
            if mode == "context":
                with lib.autograd.detect_anomaly():
                    (x.sqrt() * 0).sum().backward()
            else:
                lib.autograd.set_detect_anomaly(True)
                try:
                    (x.sqrt() * 0).sum().backward()
                finally:
                    lib.autograd.set_detect_anomaly(False)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            info = U.assert_same_error(lambda: run(kiln, kx), lambda: run(torch, tx))
        assert "returned nan values" in str(info.value)
        assert not kiln.autograd.is_anomaly_enabled()


def test_without_anomaly_nan_gradients_pass_silently():
    kx, tx = leaves([0.0, 1.0])
    (kx.sqrt() * 0).sum().backward()
    (tx.sqrt() * 0).sum().backward()
    U.assert_close(kx.grad, tx.grad)


def test_anomaly_mode_flags():
    with kiln.autograd.detect_anomaly():
        assert kiln.autograd.is_anomaly_enabled()
    assert not kiln.autograd.is_anomaly_enabled()
    with kiln.autograd.set_detect_anomaly(True):
        assert kiln.autograd.is_anomaly_enabled()
    assert not kiln.autograd.is_anomaly_enabled()
