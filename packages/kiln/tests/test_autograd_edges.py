"""Autograd corner cases found in review, each checked against torch: the same code runs with
``L = kiln`` and ``L = torch`` and must give the same values or the same exception type and message."""

from __future__ import annotations

import textwrap

import pytest
import torch

import kiln

CASES = {
    "in-place through .data on a leaf": "p = L.ones(3, requires_grad=True); p.data.mul_(0.5); r = p.tolist()",
    "in-place on a detached alias": (
        "x = L.ones(3, requires_grad=True); w = L.ones(3, requires_grad=True); y = x * 2\n"
        "y.detach().mul_(w); y.sum().backward(); r = x.grad.tolist()"
    ),
    "leaf hook with backward(inputs=)": (
        "a = L.ones(3, requires_grad=True); a.register_hook(lambda g: g * 10)\n"
        "(a * 2).sum().backward(inputs=[a]); r = a.grad.tolist()"
    ),
    "retain_grad with backward(inputs=)": (
        "a = L.ones(3, requires_grad=True); b = a * 2; b.retain_grad()\n"
        "(b * b).sum().backward(inputs=[b]); r = b.grad.tolist()"
    ),
    "retain_grad on a stale view": (
        "a = L.ones(3, requires_grad=True); b = a * 1; v = b[0:2]; b.mul_(2); v.retain_grad()\n"
        "(v * 3).sum().backward(); r = (v.grad.tolist(), a.grad.tolist())"
    ),
    "view made under no_grad written in grad mode": (
        "a = L.ones(3, requires_grad=True); b = a * 1\n"
        "with L.no_grad():\n    v = b[0:2]\n"
        "v.mul_(2); b.sum().backward(); r = a.grad.tolist()"
    ),
    "retain_grad then in-place": (
        "x = L.ones(3, requires_grad=True); y = x * 2; y.retain_grad(); y.mul_(3)\n"
        "y.sum().backward(); r = (y.grad.tolist(), x.grad.tolist())"
    ),
    "max() of a tensor with NaN": (
        "x = L.tensor([1.0, float('nan'), 2.0], requires_grad=True); x.max().backward(); r = x.grad.tolist()"
    ),
    "max() with ties": "x = L.tensor([3.0, 1.0, 3.0], requires_grad=True); x.max().backward(); r = x.grad.tolist()",
    "maximum with NaN": (
        "a = L.tensor([1.0, float('nan')], requires_grad=True); b = L.tensor([2.0, 1.0], requires_grad=True)\n"
        "L.maximum(a, b).sum().backward(); r = (a.grad.tolist(), b.grad.tolist())"
    ),
    "minimum with a tie": (
        "a = L.tensor([1.0, 2.0], requires_grad=True); b = L.tensor([1.0, 1.0], requires_grad=True)\n"
        "L.minimum(a, b).sum().backward(); r = (a.grad.tolist(), b.grad.tolist())"
    ),
    "write into a view, infinite upstream gradient elsewhere": (
        "x = L.tensor([1.0, 2.0], requires_grad=True); b = x.clone(); b[0:1].fill_(1.0)\n"
        "(b * L.tensor([float('inf'), 1.0])).sum().backward(); r = x.grad.tolist()"
    ),
    "inference_mode(False) inside no_grad": (
        "with L.no_grad():\n    with L.inference_mode(False):\n        r = L.is_grad_enabled()"
    ),
    "to(dtype, non_blocking) does not copy": "t = L.ones(2); r = t.to(L.float32, True) is t",
    "numpy bool scalar operand": "import numpy as np; r = (L.ones(2) * np.True_).tolist()",
}


def _run(code: str, lib):
    ns = {"L": lib}
    try:
        exec(textwrap.dedent(code), ns)  # noqa: S102 - test snippets written above
    except Exception as exc:  # noqa: BLE001 - the outcome compared is the exception itself
        return (type(exc).__name__, str(exc).replace("torch.", "kiln."))
    return ns["r"]


@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch(name):
    assert _run(CASES[name], kiln) == _run(CASES[name], torch)


def test_manual_seed_through_device_module_reaches_random_tensors():
    from kiln.random import default_generator

    assert default_generator("cuda") is default_generator("cuda:0")
