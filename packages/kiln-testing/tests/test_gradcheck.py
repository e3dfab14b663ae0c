"""kiln.testing.gradcheck: accepts device tensors, and catches a wrong backward on the device."""

from __future__ import annotations

import pytest

import kiln
from kiln.testing import GradcheckError, gradcheck, gradgradcheck


def test_cpu_inputs_use_the_core_check():
    x = kiln.tensor([0.5, -1.5, 2.0], dtype=kiln.float64, requires_grad=True)
    assert gradcheck(lambda x: (x * x).sum(), (x,))


def test_device_inputs(toydev):
    x = kiln.tensor([0.5, -1.5, 2.0, 3.0], dtype=kiln.float64, device=toydev, requires_grad=True)
    y = kiln.tensor([1.0, 2.0, -0.5, 0.25], dtype=kiln.float64, device=toydev, requires_grad=True)
    assert gradcheck(lambda a, b: kiln.relu(a + b) + a, (x, y))
    assert gradcheck(lambda a, b: kiln.relu(a + b) + a, [x, y])


def test_device_function_really_runs_on_the_device(toydev):
    seen = []

    def f(a):
        seen.append(a.device.type)
        return kiln.relu(a)

    x = kiln.tensor([0.5, -1.5], dtype=kiln.float64, device=toydev, requires_grad=True)
    assert gradcheck(f, (x,))
    assert set(seen) == {"toydev"}


def test_wrong_backward_on_the_device_is_caught(toydev):
    class Doubled(kiln.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return kiln.relu(x)

        @staticmethod
        def backward(ctx, grad):
            return grad + grad  # wrong: relu's gradient is grad where x > 0, else 0

    x = kiln.tensor([0.5, -1.5, 2.0], dtype=kiln.float64, device=toydev, requires_grad=True)
    with pytest.raises(GradcheckError, match="Jacobian mismatch"):
        gradcheck(Doubled.apply, (x,))
    assert gradcheck(Doubled.apply, (x,), raise_exception=False) is False


def test_gradgradcheck_on_a_device(toydev, cpu_fallback):  # relu's double backward needs gt, where
    x = kiln.tensor([0.5, -1.5, 2.0], dtype=kiln.float64, device=toydev, requires_grad=True)
    assert gradgradcheck(lambda a: kiln.relu(a) + a, (x,))


def test_inputs_on_two_devices_are_refused(toydev):
    a = kiln.ones(2, dtype=kiln.float64, device=f"{toydev}:0", requires_grad=True)
    b = kiln.ones(2, dtype=kiln.float64, device=f"{toydev}:1", requires_grad=True)
    with pytest.raises(ValueError, match="several devices"):
        gradcheck(lambda a, b: a + b.to(a.device), (a, b))
