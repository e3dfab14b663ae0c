"""kiln.autograd: reverse-mode automatic differentiation (``torch.autograd``'s API)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln._device import CPU
from kiln._lazy import first_call
from kiln._state import modes_away
from kiln._tensor import Tensor, _numel, from_array
from kiln.autograd import functional as functional  # kiln.autograd.functional after `import kiln`, as in torch
from kiln.autograd.anomaly_mode import (
    detect_anomaly,
    is_anomaly_check_nan_enabled,
    is_anomaly_enabled,
    set_detect_anomaly,
)
from kiln.autograd.engine import run_backward
from kiln.autograd.function import Function, FunctionCtx, once_differentiable
from kiln.autograd.grad_mode import (
    enable_grad,
    enforce_grad_layout_policy,
    inference_mode,
    is_grad_enabled,
    is_inference_mode_enabled,
    no_grad,
    set_grad_enabled,
    set_multithreading_enabled,
)
from kiln.autograd.gradcheck import GradcheckError, gradcheck, gradgradcheck
from kiln.autograd.graph import Node, _edge, gradient_edge
from kiln.autograd.variable import Variable, variable

__all__ = [
    "backward",
    "grad",
    "Function",
    "FunctionCtx",
    "once_differentiable",
    "Node",
    "no_grad",
    "enable_grad",
    "set_grad_enabled",
    "inference_mode",
    "is_grad_enabled",
    "is_inference_mode_enabled",
    "set_multithreading_enabled",
    "enforce_grad_layout_policy",
    "Variable",
    "variable",
    "detect_anomaly",
    "set_detect_anomaly",
    "is_anomaly_enabled",
    "is_anomaly_check_nan_enabled",
    "gradcheck",
    "gradgradcheck",
    "GradcheckError",
]


def _as_tuple(x) -> tuple:
    if x is None:
        return ()
    if isinstance(x, Tensor):
        return (x,)
    return tuple(x)


_ones_like = first_call(globals(), "kiln._ops.creation", "ones_like", "_ones_like")  # kiln._ops imports this package


_UNIT: dict = {}  # dtype -> a 0-d NumPy 1 of it, copied for each implicit gradient


def _implicit_grad(out: Tensor) -> Tensor:
    """``ones_like(out)``, the gradient an implicit ``backward()`` starts from (``out`` has one element): a
    plain CPU tensor's made directly, at a sixth of the dispatched op's cost, while no thread has a dispatch
    mode (a tracer must see the op: ``kiln.compile`` traces a training step's backward); else by the op."""
    d = out._dtype
    if not modes_away[0] and out.__class__ is Tensor and out._device is CPU and d._np is not None:
        unit = _UNIT.get(d)
        if unit is None:
            unit = _UNIT[d] = np.ones((), d._np)
        return from_array(unit.reshape(out._shape).copy(), d)
    return _ones_like(out)


def _make_roots(outputs: tuple, grad_outputs: tuple, create_graph: bool) -> list:
    if grad_outputs and len(grad_outputs) != len(outputs):
        raise RuntimeError(
            f"Mismatch in number of gradients: got {len(grad_outputs)} gradients for {len(outputs)} outputs"
        )
    roots = []
    for i, out in enumerate(outputs):
        if not isinstance(out, Tensor):
            raise TypeError(f"outputs must be Tensors, got {type(out).__name__}")
        g = grad_outputs[i] if grad_outputs else None
        if not (out._requires_grad or out.requires_grad):  # (the slot first: the property is for a stale view)
            raise RuntimeError(f"element {i} of tensors does not require grad and does not have a grad_fn")
        if g is None:
            if _numel(out._shape) != 1:
                raise RuntimeError("grad can be implicitly created only for scalar outputs")
            if not out._dtype.is_floating_point:
                raise RuntimeError(f"grad can be implicitly created only for real scalar outputs but got {out._dtype}")
            g = _implicit_grad(out)
        else:
            if not isinstance(g, Tensor):
                raise TypeError(f"grad_outputs must be Tensors or None, got {type(g).__name__}")
            if g._shape != out._shape:
                raise RuntimeError(
                    f"Mismatch in shape: grad_output[{i}] has a shape of {g.shape} and output[{i}] has a shape "
                    f"of {out.shape}."
                )
            if g._device is not out._device:
                raise RuntimeError(
                    f"Mismatch in device: grad_output[{i}] is on {g.device} and output[{i}] is on {out.device}."
                )
            if not create_graph:
                g = g.detach()
        node, nr = _edge(out)  # (gradient_edge, a frame less)
        roots.append((node, nr, g))
    return roots


def backward(
    tensors: Tensor | Sequence[Tensor],
    grad_tensors: Tensor | Sequence[Tensor | None] | None = None,
    retain_graph: bool | None = None,
    create_graph: bool = False,
    grad_variables: Tensor | Sequence[Tensor | None] | None = None,
    inputs: Tensor | Sequence[Tensor] | None = None,
) -> None:
    """Accumulate gradients of ``tensors`` into the ``.grad`` of graph leaves (or of ``inputs``).

    ``grad_variables`` is the deprecated name of ``grad_tensors`` (a ``FutureWarning``; both at once raise).
    """
    if grad_variables is not None:
        import warnings

        warnings.warn("`grad_variables` is deprecated. Use `grad_tensors` instead.", FutureWarning, stacklevel=2)
        if grad_tensors is not None:
            raise RuntimeError(
                "`grad_tensors` and `grad_variables` (deprecated) arguments both passed to `backward()`. Please "
                "only use `grad_tensors`."
            )
        grad_tensors = grad_variables
    outputs = (tensors,) if tensors.__class__ is Tensor else _as_tuple(tensors)  # (the usual call, without one)
    grads = () if grad_tensors is None else _as_tuple(grad_tensors)
    if retain_graph is None:
        retain_graph = create_graph
    inputs_t = _as_tuple(inputs) if inputs is not None else None
    if inputs_t is not None and len(inputs_t) == 0:
        raise RuntimeError("`inputs` argument to `backward()` cannot be empty.")
    roots = _make_roots(outputs, grads, create_graph)
    run_backward(roots, retain_graph, create_graph, inputs_t, True)


def grad(
    outputs: Tensor | Sequence[Tensor],
    inputs: Tensor | Sequence[Tensor],
    grad_outputs: Tensor | Sequence[Tensor | None] | None = None,
    retain_graph: bool | None = None,
    create_graph: bool = False,
    only_inputs: bool = True,
    allow_unused: bool | None = None,
    is_grads_batched: bool = False,
    materialize_grads: bool = False,
) -> tuple[Tensor | None, ...]:
    """Gradients of ``outputs`` with respect to ``inputs``, returned (``.grad`` is left untouched).

    ``only_inputs`` is deprecated and ignored (a warning unless True). ``is_grads_batched=True`` reads the
    first dim of every ``grad_outputs`` tensor as a batch and returns a batch of vector-Jacobian products
    (PyTorch computes them with vmap; kiln runs one backward per batch entry).
    """
    if not only_inputs:
        import warnings

        warnings.warn(
            "only_inputs argument is deprecated and is ignored now (defaults to True). To accumulate gradient for "
            "other parts of the graph, please use kiln.autograd.backward.",
            FutureWarning,
            stacklevel=2,
        )
    if is_grads_batched:
        return _batched_grad(outputs, inputs, grad_outputs, retain_graph, create_graph, allow_unused, materialize_grads)
    outs = _as_tuple(outputs)
    ins = _as_tuple(inputs)
    if materialize_grads and allow_unused is False:
        raise ValueError(
            "Expected allow_unused to be True or not passed when materialize_grads=True, but got: allow_unused=False."
        )
    if allow_unused is None:
        allow_unused = materialize_grads
    for t in ins:
        if not isinstance(t, Tensor):
            raise TypeError(f"inputs must be Tensors, got {type(t).__name__}")
        if not t.requires_grad:
            raise RuntimeError("One of the differentiated Tensors does not require grad")
    if retain_graph is None:
        retain_graph = create_graph
    roots = _make_roots(outs, _as_tuple(grad_outputs), create_graph)
    result = run_backward(roots, retain_graph, create_graph, inputs=ins, accumulate=False)
    final = []
    for i, (t, g) in enumerate(zip(ins, result)):
        if g is None:
            if materialize_grads:
                from kiln._ops.creation import zeros_like

                g = zeros_like(t)
            elif not allow_unused:
                raise RuntimeError(
                    f"The differentiated Tensor at index {i} appears to not have been used in the graph. Set "
                    "allow_unused=True if this is the desired behavior."
                )
        elif not create_graph:
            g = g.detach()
        final.append(g)
    return tuple(final)


def _batched_grad(outputs, inputs, grad_outputs, retain_graph, create_graph, allow_unused, materialize_grads):
    """``grad(..., is_grads_batched=True)``: one backward per entry of the batch dim of ``grad_outputs``, the
    results stacked along a new first dim."""
    from kiln._ops.shape import stack

    batches = _as_tuple(grad_outputs)
    sizes = {g.shape[0] for g in batches if g is not None}
    if not batches or len(sizes) != 1:
        raise RuntimeError("is_grads_batched=True needs grad_outputs, every one with the same batch size (dim 0)")
    (count,) = sizes
    keep = create_graph if retain_graph is None else retain_graph
    per_entry = []
    for i in range(count):
        entry = tuple(None if g is None else g[i] for g in batches)
        per_entry.append(
            grad(
                outputs,
                inputs,
                entry,
                retain_graph=True if i < count - 1 else keep,
                create_graph=create_graph,
                allow_unused=allow_unused,
                materialize_grads=materialize_grads,
            )
        )
    return tuple(
        None if per_entry[0][j] is None else stack([g[j] for g in per_entry]) for j in range(len(per_entry[0]))
    )
