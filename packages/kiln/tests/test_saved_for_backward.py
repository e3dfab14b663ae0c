"""What autograd saves for backward, against PyTorch: an in-place write to a tensor after an op used it
raises the version-counter error exactly when PyTorch's does.

PyTorch saves an input only when the gradient of an input that requires grad reads it (``a * b`` with
only ``a`` requiring grad saves ``b``; ``2 * b`` saves nothing of ``b``). kiln reads the same fact off
each backward formula (:func:`kiln.autograd.graph._read_guards`). The audit runs every op that
kiln-testing can call, in float64: for each floating tensor argument ``i`` (alone requiring grad, a
non-leaf so that it can be written in place) and each tensor argument ``j``, the op runs, ``j`` is written
in place, and backward runs; kiln's outcome (gradients, or the in-place error) must be PyTorch's. A
write that PyTorch catches and kiln does not would be a wrong gradient accepted silently; the other way
round, valid PyTorch code rejected.
"""

from __future__ import annotations

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln
from kiln._dispatch import OPS

kiln_testing = pytest.importorskip("kiln_testing")
from kiln_testing._specs import DEVICE, Ctx, T, _apply_layout, spec_for  # noqa: E402

_INPLACE_ERROR = "modified by an inplace operation"


def test_reproducers_from_the_report():
    """Each of these is valid PyTorch: only a value that no needed gradient reads is written."""
    cases = {"b * 2": (lambda b: b * 2, 2.0), "2 * b": (lambda b: 2 * b, 2.0), "b / 2": (lambda b: b / 2, 0.5)}
    for name, (fn, slope) in cases.items():
        for L in (kiln, torch):
            a = L.ones(3, requires_grad=True)
            b = a * 1
            c = fn(b)
            b.add_(1)
            c.sum().backward()
            assert a.grad.tolist() == [slope] * 3, name
    for L in (kiln, torch):
        a = L.ones(3, requires_grad=True)
        b = a * 1
        b[1] = b[0] * 2
        b.sum().backward()
        assert a.grad.tolist() == [3.0, 0.0, 1.0]
        a = L.ones(3, requires_grad=True)
        b = a * 1
        b[1:] = b[:-1] * 2
        b.sum().backward()
        assert a.grad.tolist() == [3.0, 2.0, 0.0]


def test_every_saved_output_is_freed_after_backward():
    """A multi-output op's non-differentiable outputs that backward reads (dropout's noise, a recurrent
    layer's workspace) are freed with the rest after backward, not kept as long as the graph lives."""
    x = kiln.ones(64, requires_grad=True)
    y = kiln.dropout(x, 0.5, True)
    result = y.grad_fn.saved["result"]
    assert len(result) == 2 and all(r.data is not None for r in result)
    y.sum().backward()
    assert all(r.data is None for r in result)


def test_a_needed_input_is_still_checked():
    """``b * b`` reads ``b`` for its gradient: the write is caught, as PyTorch catches it."""
    a = kiln.ones(3, requires_grad=True)
    b = a * 1
    c = b * b
    b.add_(1)
    with pytest.raises(RuntimeError, match=_INPLACE_ERROR):
        c.sum().backward()


def test_guards_read_off_formulas():
    from kiln.autograd.graph import _read_guards

    def f(grad, input, other, result, needs_input_grad):
        gi = grad * other if needs_input_grad[0] else None
        if needs_input_grad[1] or needs_input_grad[2]:
            go = grad * input
        else:
            go = None
        return gi, go, needs_input_grad[2] and result

    assert _read_guards(f, ["input", "other", "result"]) == {
        "other": frozenset({0}),
        "input": frozenset({1, 2}),
        "result": frozenset({2}),
    }

    def g(grad, input, other, needs_input_grad):
        return grad * other * input if needs_input_grad[0] else None, input  # input read unguarded

    assert _read_guards(g, ["input", "other"]) == {"other": frozenset({0}), "input": None}


# ---------------------------------------------------------------------------------------- the audit


def _torch_fn(name: str):
    for owner in (torch, torch.nn.functional, torch.special, torch.linalg):
        fn = getattr(owner, name, None)
        if callable(fn):
            return fn
    return None


def _to_torch(value):
    if isinstance(value, kiln.dtype):
        return U.K2T[value]
    if value is DEVICE:
        return "cpu"
    if isinstance(value, (list, tuple)):
        return type(value)(_to_torch(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_torch(v) for k, v in value.items()}
    return value


def _run(L, name, case, grad_at: int, write_at: int | None):
    """The op on ``L`` (kiln or torch) with only tensor ``grad_at`` requiring grad, tensor ``write_at``
    (unless None) given new values in place after the call, then backward: ("ok", the gradient) or
    ("error",) for the in-place error; None when no output is differentiable."""
    tensors = case.tensors()
    made: dict[int, tuple] = {}

    def build(value):
        if isinstance(value, T):
            k = next(i for i, t in enumerate(tensors) if t is value)
            if k not in made:
                if L is kiln:
                    leaf = kiln.tensor(value.base, dtype=value.dtype)
                else:
                    leaf = torch.tensor(value.base, dtype=U.K2T[value.dtype])
                src = leaf
                if k == grad_at:
                    leaf.requires_grad_(True)
                    src = leaf * 1  # a non-leaf: it may be written in place
                made[k] = (leaf, src, _apply_layout(src, value.layout, value.shape))
            return made[k][2]
        if isinstance(value, (list, tuple)):
            return type(value)(build(v) for v in value)
        if L is torch:
            return _to_torch(value)
        return kiln.device("cpu") if value is DEVICE else value

    args = [build(a) for a in case.args]
    kwargs = {k: build(v) for k, v in case.kwargs.items()}
    fn = OPS[name].public if L is kiln else _torch_fn(name)
    out = fn(*args, **kwargs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    diff = [o for o in outs if isinstance(o, L.Tensor) and o.requires_grad]
    if not diff:
        return None
    loss = sum((o.double() * 1).sum() for o in diff)
    if write_at is not None:
        with L.no_grad():  # new values (the same set for integers: indices stay in range)
            src = made[write_at][1]
            flipped = src.flip(list(range(src.dim())))
            src.copy_(flipped + 0.25 if src.dtype.is_floating_point else flipped)
    try:
        loss.backward()
    except RuntimeError as exc:
        if _INPLACE_ERROR in str(exc):
            return ("error",)
        raise
    g = made[grad_at][0].grad
    return ("ok", None if g is None else np.asarray(g.detach().cpu().numpy() if L is torch else g.numpy()))


def _audit_cases():
    """(op name, case, grad_at, write_at) for every op kiln-testing can call and PyTorch has by name."""
    out = []
    for name in sorted(OPS):
        spec = spec_for(OPS[name])
        if spec is None or spec.view or _torch_fn(name) is None:
            continue
        cases = spec.cases(Ctx(name, kiln.float64, (kiln.float64, kiln.int64, kiln.bool)))
        for case in cases:
            if not case.grad or case.inplace is not None:
                continue
            tensors = case.tensors()
            if any(t.on == "cpu" for t in tensors):
                continue
            for i, t in enumerate(tensors):
                if not (t.grad and t.dtype.is_floating_point):
                    continue
                for j in range(len(tensors)):
                    out.append((name, case, i, j))
            break  # the op's first case with gradients: the saved set depends on the op, not the layout
    return out


_AUDIT = _audit_cases()


def test_audit_covers_the_op_surface():
    assert len({name for name, *_ in _AUDIT}) >= 100


@pytest.mark.parametrize(
    "name,case,grad_at,write_at", _AUDIT, ids=[f"{n}-{c.label}-grad{i}-write{j}" for n, c, i, j in _AUDIT]
)
def test_inplace_write_after_use_matches_torch(name, case, grad_at, write_at):
    """Never rejected where PyTorch accepts; never a gradient computed from the new values (kiln may
    accept a write that PyTorch rejects where its formula does not read what was written: the gradient
    must then be the true one)."""
    try:
        truth = _run(torch, name, case, grad_at, None)
        expected = _run(torch, name, case, grad_at, write_at)
    except Exception as exc:  # noqa: BLE001 - torch cannot run the kiln-testing call: nothing to compare
        pytest.skip(f"torch.{name} does not take this call: {type(exc).__name__}")
    got = _run(kiln, name, case, grad_at, write_at)
    if truth is None:
        return
    if expected[0] == "ok":
        assert got[0] == "ok", f"{name}: kiln rejects a write that PyTorch accepts"
    if got[0] == "ok" and truth[1] is not None:
        assert got[1] is not None, f"{name}: no gradient"
        np.testing.assert_allclose(got[1], truth[1], rtol=1e-7, atol=1e-9, err_msg=f"{name}: a wrong gradient")
