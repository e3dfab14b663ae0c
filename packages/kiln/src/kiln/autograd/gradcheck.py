"""``gradcheck`` and ``gradgradcheck``: analytical gradients against float64 finite differences."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from kiln._tensor import Tensor

__all__ = ["gradcheck", "gradgradcheck", "GradcheckError"]


class GradcheckError(RuntimeError):
    """Raised by :func:`gradcheck` when analytical and numerical gradients disagree."""


# PyTorch's gradcheck options that change nothing for kiln's dense, real, reverse-mode check
_ACCEPTED_OPTIONS = {
    "nondet_tol",
    "check_undefined_grad",
    "check_grad_dtypes",
    "check_batched_grad",
    "check_batched_forward_grad",
    "check_forward_ad",
    "check_backward_ad",
    "fast_mode",
    "masked",
    "gen_non_contig_grad_outputs",
}


def _check_options(options: dict) -> None:
    unknown = sorted(set(options) - _ACCEPTED_OPTIONS)
    if unknown:
        raise TypeError(f"gradcheck() got unexpected keyword arguments {unknown}")
    if options.get("check_forward_ad") or options.get("check_batched_grad") or options.get("fast_mode"):
        raise NotImplementedError("kiln's gradcheck checks reverse mode only (no forward AD, batching or fast mode)")


def _as_tuple(x) -> tuple:
    if isinstance(x, list):
        return tuple(x)
    return x if isinstance(x, tuple) else (x,)


def _numerical_jacobian(fn, inputs, idx, eps) -> list[np.ndarray]:
    """Central differences: one (numel(out), numel(input)) matrix per floating output.

    ``fn`` runs with grad mode as the caller has it: gradgradcheck's function computes gradients.
    """
    x = inputs[idx]
    values = x.detach()  # shares storage with the input: perturb in place, then restore
    n = x.numel()
    base = _float_outs(fn(*inputs))
    jac = [np.zeros((o.numel(), n)) for o in base]
    for j in range(n):
        where = tuple(int(i) for i in np.unravel_index(j, x._shape)) if x._shape else ()
        orig = float(values[where].item()) if where else float(values.item())
        _set(values, where, orig + eps)
        plus = [o.detach().double().cpu().numpy().reshape(-1).copy() for o in _float_outs(fn(*inputs))]
        _set(values, where, orig - eps)
        minus = [o.detach().double().cpu().numpy().reshape(-1).copy() for o in _float_outs(fn(*inputs))]
        _set(values, where, orig)
        if len(plus) != len(jac):
            raise GradcheckError("the function returned a different number of outputs when its input changed")
        for k in range(len(jac)):
            jac[k][:, j] = (plus[k] - minus[k]) / (2 * eps)
    return jac


def _float_outs(outs) -> list:
    return [o for o in _as_tuple(outs) if isinstance(o, Tensor) and o._dtype.is_floating_point]


def _set(t: Tensor, idx: tuple, value: float) -> None:
    from kiln.autograd.grad_mode import no_grad

    with no_grad():
        if idx:
            t[idx] = value
        else:
            t.fill_(value)


def _analytical_jacobian(fn, inputs, idx) -> list[np.ndarray]:
    """Rows by reverse mode: one vector-Jacobian product per output element."""
    from kiln._ops.creation import zeros_like
    from kiln.autograd import grad

    outs = _float_outs(fn(*inputs))
    x = inputs[idx]
    jac = []
    for o in outs:
        m = np.zeros((o.numel(), x.numel()))
        if o._requires_grad:
            for r in range(o.numel()):
                go = zeros_like(o)
                go.view(-1)[r] = 1.0
                (g,) = grad(o, x, go, retain_graph=True, allow_unused=True)
                if g is not None:
                    m[r, :] = g.double().cpu().numpy().reshape(-1)  # any device: read on the host
        jac.append(m)
    return jac


def gradcheck(
    func: Callable[..., Tensor | Sequence[Tensor]],
    inputs: Tensor | Sequence,
    *,
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    raise_exception: bool = True,
    **torch_options,
) -> bool:
    """Check analytical gradients of ``func`` at ``inputs`` against finite differences.

    Inputs that require grad should be float64. Returns True, or raises :class:`GradcheckError`
    (returns False when ``raise_exception=False``).
    """
    _check_options(torch_options)
    inputs = _as_tuple(inputs)
    tensor_idx = [i for i, t in enumerate(inputs) if isinstance(t, Tensor) and t.requires_grad]
    if not tensor_idx:
        raise ValueError(
            "gradcheck expects at least one input tensor to require gradient, but none of them have requires_grad=True."
        )
    for i in tensor_idx:
        if inputs[i]._dtype.name != "float64":
            import warnings

            warnings.warn(
                f"Input #{i} requires gradient and is not a double precision floating point. "
                "This check will likely fail if all the inputs are not of double precision floating point.",
                stacklevel=2,
            )
    for i in tensor_idx:
        analytical = _analytical_jacobian(func, inputs, i)
        numerical = _numerical_jacobian(func, inputs, i, eps)
        for k, (a, n) in enumerate(zip(analytical, numerical)):
            if not np.allclose(a, n, rtol=rtol, atol=atol):
                msg = f"Jacobian mismatch for output {k} with respect to input {i},\nnumerical:{n}\nanalytical:{a}\n"
                if raise_exception:
                    raise GradcheckError(msg)
                return False
    return True


def gradgradcheck(
    func: Callable[..., Tensor | Sequence[Tensor]],
    inputs: Tensor | Sequence,
    grad_outputs: Tensor | Sequence | None = None,
    *,
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    raise_exception: bool = True,
    seed: int = 0,
    **torch_options,
) -> bool:
    """Check second derivatives: :func:`gradcheck` of the function computing ``func``'s gradients."""
    from kiln._ops.creation import tensor
    from kiln.autograd import grad

    _check_options(torch_options)
    inputs = _as_tuple(inputs)
    outs = _float_outs(func(*inputs))
    rng = np.random.default_rng(seed)
    if grad_outputs is None:
        grad_outputs = tuple(tensor(rng.standard_normal(o._shape), dtype=o._dtype, requires_grad=True) for o in outs)
    else:
        grad_outputs = _as_tuple(grad_outputs)
    diff_idx = [i for i, t in enumerate(inputs) if isinstance(t, Tensor) and t.requires_grad]
    n_in = len(inputs)

    def first_grads(*args):
        ins, gos = args[:n_in], args[n_in:]
        o = [x for x in _float_outs(func(*ins)) if x._requires_grad]
        gs = grad(o, [ins[i] for i in diff_idx], gos[: len(o)], create_graph=True, allow_unused=True)
        return tuple(g for g in gs if g is not None)

    return gradcheck(
        first_grads, inputs + tuple(grad_outputs), eps=eps, atol=atol, rtol=rtol, raise_exception=raise_exception
    )
