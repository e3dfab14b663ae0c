"""``kiln.autograd.functional``: Jacobians, Hessians and their products with vectors, as functions.

``torch.autograd.functional``'s API: :func:`vjp`, :func:`jvp`, :func:`jacobian`, :func:`hessian`,
:func:`vhp` and :func:`hvp` take a Python function of tensors and the point at which to differentiate
it, and return what they compute with PyTorch's nesting (a single tensor where the function takes or
returns a single tensor, tuples where it takes or returns tuples).

Everything is built on :func:`kiln.autograd.grad` (reverse mode). kiln has neither forward-mode AD nor
``vmap``, so:

* :func:`jvp` and :func:`hvp` use the double-backward trick, as PyTorch's versions do;
* ``vectorize=True`` is accepted and computes the same result as ``vectorize=False``, one
  :func:`kiln.autograd.grad` call per row of the Jacobian (PyTorch batches those calls through vmap);
  it keeps PyTorch's rule that ``strict=True`` and ``vectorize=True`` are not allowed together;
* ``strategy="forward-mode"`` (``outer_jacobian_strategy`` for :func:`hessian`) raises the error PyTorch
  raises for an unsupported combination (``create_graph=True``, ``strict=True``, ``vectorize=False``),
  and otherwise ``NotImplementedError``, as it needs forward-mode AD.

Two corner cases differ from PyTorch 2.x on purpose: :func:`jacobian` of a function with an output of no
elements returns the empty block (PyTorch fails inside ``stack``), and its ``strict=True,
create_graph=True`` error for a Jacobian independent of an input names that input (PyTorch's message
names the output's index there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kiln._tensor import Tensor
from kiln.autograd.grad_mode import enable_grad, is_grad_enabled, set_grad_enabled

__all__ = ["vjp", "jvp", "jacobian", "hessian", "hvp", "vhp"]

_STRATEGIES = ("forward-mode", "reverse-mode")
_INPUT_IS = "the input to the user-provided function is"  # for the message when v is omitted


# kiln.autograd is first imported while kiln._ops is still loading (the dispatcher reads autograd.graph
# as each op is defined), so the ops this module calls are imported when it runs, not when it loads.


def _zeros_like(t: Tensor, requires_grad: bool = False) -> Tensor:
    from kiln._ops.creation import zeros_like

    return zeros_like(t, requires_grad=requires_grad)


def _stack(tensors: list[Tensor]) -> Tensor:
    from kiln._ops.shape import stack

    return stack(tensors, 0)


# ---------------------------------------------------------------------------------------- tuples


def _tupled(value: Any, what: str, fn: str) -> tuple[bool, tuple[Tensor, ...]]:
    """(whether ``value`` was a tuple, ``value`` as a tuple of Tensors), or PyTorch's TypeError.

    Only a ``tuple`` counts as several tensors: a list is one (wrong) value, as in PyTorch.
    """
    was_tuple = isinstance(value, tuple)
    items = value if was_tuple else (value,)
    for index, item in enumerate(items):
        if not isinstance(item, Tensor):
            where = f"value at index {index}" if was_tuple else f"given {what}"
            raise TypeError(
                f"The {what} given to {fn} must be either a Tensor or a tuple of Tensors but the {where} has type "
                f"{type(item)}."
            )
    return was_tuple, items


def _untuple(result: tuple, was_tuple: bool) -> Any:
    """``result`` as the caller's structure: the tuple, or its only element."""
    return result if was_tuple else result[0]


def _untuple2(result: tuple, outer_was_tuple: bool, inner_was_tuple: bool) -> Any:
    """A tuple of tuples (outer: outputs, inner: inputs) as the caller's structure."""
    if not inner_was_tuple:
        result = tuple(row[0] for row in result)
    return result if outer_was_tuple else result[0]


# ---------------------------------------------------------------------------------------- graph plumbing


def _fresh(tensors: tuple[Tensor, ...], create_graph: bool, need_graph: bool) -> tuple[Tensor, ...]:
    """New Tensor objects for ``tensors``, so the function's own captures of them are told apart.

    Under ``create_graph`` a tensor that requires grad stays connected to its graph (through a view), so
    the results can be differentiated with respect to it; anything else is detached and requires grad
    exactly when ``need_graph``.
    """
    out = []
    for t in tensors:
        if create_graph and t.requires_grad:
            out.append(t.view_as(t))
        else:
            out.append(t.detach().requires_grad_(need_graph))
    return tuple(out)


def _released(tensors: tuple, create_graph: bool) -> tuple:
    """``tensors`` (tensors or nested tuples of them) detached, unless the caller asked for a graph."""
    if create_graph:
        return tensors
    return tuple(t.detach() if isinstance(t, Tensor) else _released(t, create_graph) for t in tensors)


def _grad(
    outputs: tuple[Tensor | None, ...],
    inputs: tuple[Tensor, ...],
    grad_outputs: tuple[Tensor | None, ...] | None = None,
    create_graph: bool = False,
    retain_graph: bool | None = None,
) -> tuple[Tensor | None, ...]:
    """:func:`kiln.autograd.grad` over the outputs that are tensors requiring grad (the others, and the
    inputs they alone reach, contribute None); unused inputs give None."""
    from kiln.autograd import grad  # the package imports this module: read it at call time

    if grad_outputs is None:
        grad_outputs = (None,) * len(outputs)
    pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if o is not None and o.requires_grad]
    if not pairs:
        return (None,) * len(inputs)
    return grad(
        tuple(o for o, _ in pairs),
        inputs,
        tuple(g for _, g in pairs),
        retain_graph=retain_graph,
        create_graph=create_graph,
        allow_unused=True,
    )


def _check_v(v: tuple[Tensor, ...], refs: tuple[Tensor, ...], refs_were_tuple: bool) -> None:
    """``v`` must match ``refs`` in length and in each tensor's size (PyTorch's messages)."""
    if len(v) != len(refs):
        if refs_were_tuple:
            raise RuntimeError(f"v is a tuple of invalid length: should be {len(refs)} but got {len(v)}.")
        raise RuntimeError("The given v should contain a single Tensor.")
    for index, (vi, ref) in enumerate(zip(v, refs)):
        if vi.size() != ref.size():
            prefix = f"Entry {index} in " if refs_were_tuple else ""
            raise RuntimeError(f"{prefix}v has invalid size: should be {ref.size()} but got {vi.size()}.")


def _vectors(
    v: Any, fn: str, refs: tuple[Tensor, ...], refs_were_tuple: bool, create_graph: bool, subject: str
) -> tuple[Tensor, ...] | None:
    """``v`` as a checked tuple paired with ``refs`` (fresh, see :func:`_fresh`), or None when it is omitted,
    which PyTorch allows only when ``refs`` is one one-element tensor (``subject``: what ``refs`` are)."""
    if v is None:
        if len(refs) != 1 or refs[0].numel() != 1:
            raise RuntimeError(f"The vector v can only be None if {subject} a single Tensor with a single element.")
        return None
    _, vs = _tupled(v, "v", fn)
    vs = _fresh(vs, create_graph, need_graph=False)
    _check_v(vs, refs, refs_were_tuple)
    return vs


def _strict_check(tensors: tuple[Tensor | None, ...], kind: str, strict: bool) -> None:
    """Under ``strict``, every tensor of ``tensors`` must exist and require grad; ``kind`` words the error."""
    if not strict:
        return
    for i, t in enumerate(tensors):
        if t is None:  # a gradient that autograd did not produce
            raise RuntimeError(
                f"The output of the user-provided function is independent of input {i}. This is not allowed in "
                "strict mode."
            )
        if t.requires_grad:
            continue
        if kind == "outputs":
            raise RuntimeError(
                f"Output {i} of the user-provided function does not require gradients. The outputs must be "
                "computed in a differentiable manner from the input when running in strict mode."
            )
        if kind == "grad_inputs":
            raise RuntimeError(
                f"The gradient with respect to input {i} is independent of the inputs of the user-provided "
                "function. This is not allowed in strict mode."
            )
        if kind == "jacobian":
            raise RuntimeError(
                "While computing the hessian, found that the jacobian of the user-provided function with respect "
                f"to input {i} is independent of the input. This is not allowed in strict mode. You should ensure "
                "that your function is twice differentiable and that the jacobian depends on the inputs (this "
                "would be violated by a linear function for example)."
            )
        raise RuntimeError(  # kind == "hessian"
            f"The hessian of the user-provided function with respect to input {i} is independent of the input. "
            "This is not allowed in strict mode. You should ensure that your function is thrice differentiable "
            "and that the hessian depends on the inputs."
        )


# why a missing gradient is an error under strict, per the backward pass that found it
_MISSING = {
    "back": "The output of the user-provided function is independent of input {i}. This is not allowed in strict mode.",
    "back_trick": "The gradient with respect to the input is independent of entry {i} in the grad_outputs when "
    "using the double backward trick to compute forward mode gradients. This is not allowed in strict mode.",
    "double_back": "The jacobian of the user-provided function is independent of input {i}. This is not allowed "
    "in strict mode.",
    "double_back_trick": "The hessian of the user-provided function is independent of entry {i} in the "
    "grad_jacobian. This is not allowed in strict mode as it prevents from using the double backward trick to "
    "replace forward mode AD.",
}


def _zeros_for_missing(
    grads: tuple[Tensor | None, ...], refs: tuple[Tensor, ...], strict: bool, create_graph: bool, stage: str
) -> tuple[Tensor, ...]:
    """``grads`` with each None replaced by zeros shaped like ``refs[i]`` (under ``strict``: an error)."""
    out = []
    for i, g in enumerate(grads):
        if g is None:
            if strict:
                raise RuntimeError(_MISSING[stage].format(i=i))
            g = _zeros_like(refs[i])
        elif strict and create_graph and not g.requires_grad:
            what = "hessian" if stage.startswith("double") else "jacobian"
            raise RuntimeError(
                f"The {what} of the user-provided function is independent of input {i}. This is not allowed in "
                "strict mode when create_graph=True."
            )
        out.append(g)
    return tuple(out)


def _single_element_function(fn: str, func: Callable, outputs: Any, strict: bool) -> Tensor:
    """The one-element tensor ``func`` returned (hessian, vhp, hvp accept nothing else)."""
    was_tuple, outs = _tupled(outputs, "outputs of the user-provided function", fn)
    _strict_check(outs, "outputs", strict)
    if was_tuple:
        raise RuntimeError(f"The function given to {fn} should return a single Tensor")
    if outs[0].numel() != 1:
        raise RuntimeError(f"The Tensor returned by the function given to {fn} should contain a single element")
    return outs[0]


# ---------------------------------------------------------------------------------------- vector products


def vjp(
    func: Callable[..., Tensor | tuple[Tensor, ...]],
    inputs: Tensor | tuple[Tensor, ...],
    v: Tensor | tuple[Tensor, ...] | None = None,
    create_graph: bool = False,
    strict: bool = False,
) -> tuple[Tensor | tuple[Tensor, ...], Tensor | tuple[Tensor, ...]]:
    """The vector-Jacobian product ``v^T J`` of ``func`` at ``inputs``: ``(func(*inputs), vjp)``.

    ``v`` has the shape of ``func``'s output (a tuple when ``func`` returns a tuple); it may be omitted
    when ``func`` returns a single one-element tensor. The product has the shape of ``inputs`` (a tuple
    when ``inputs`` is one). With ``create_graph=True`` both results are differentiable (with respect
    to ``inputs`` and ``v``, where those require grad); otherwise they are detached. With
    ``strict=True`` an input on which no output depends is an error; otherwise its product is zeros.

    >>> x = kiln.tensor([1.0, 2.0, 3.0])
    >>> kiln.autograd.functional.vjp(lambda x: x**2, x, kiln.ones(3))
    (tensor([1., 4., 9.]), tensor([2., 4., 6.]))
    """
    with enable_grad():
        inputs_were_tuple, ins = _tupled(inputs, "inputs", "vjp")
        ins = _fresh(ins, create_graph, need_graph=True)
        outputs_were_tuple, outs = _tupled(func(*ins), "outputs of the user-provided function", "vjp")
        _strict_check(outs, "outputs", strict)
        vs = _vectors(v, "vjp", outs, outputs_were_tuple, create_graph, "the user-provided function returns")
    with set_grad_enabled(True if create_graph else is_grad_enabled()):
        grads = _grad(outs, ins, vs, create_graph=create_graph)
        products = _zeros_for_missing(grads, ins, strict, create_graph, "back")
    return (
        _untuple(_released(outs, create_graph), outputs_were_tuple),
        _untuple(_released(products, create_graph), inputs_were_tuple),
    )


def jvp(
    func: Callable[..., Tensor | tuple[Tensor, ...]],
    inputs: Tensor | tuple[Tensor, ...],
    v: Tensor | tuple[Tensor, ...] | None = None,
    create_graph: bool = False,
    strict: bool = False,
) -> tuple[Tensor | tuple[Tensor, ...], Tensor | tuple[Tensor, ...]]:
    """The Jacobian-vector product ``J v`` of ``func`` at ``inputs``: ``(func(*inputs), jvp)``.

    ``v`` has the shape of ``inputs`` (a tuple when ``inputs`` is one); it may be omitted when the input
    is a single one-element tensor. The product has the shape of ``func``'s output. kiln has no
    forward-mode AD: like PyTorch's ``autograd.functional.jvp``, this differentiates the backward pass
    (made with zero ``grad_outputs`` that require grad) with respect to those ``grad_outputs``, which
    needs every op on the path to have a differentiable backward (kiln's are). ``create_graph`` and
    ``strict`` as in :func:`vjp`.

    >>> x = kiln.tensor([1.0, 2.0, 3.0])
    >>> kiln.autograd.functional.jvp(lambda x: x**2, x, kiln.tensor([1.0, 0.0, -1.0]))
    (tensor([1., 4., 9.]), tensor([ 2.,  0., -6.]))
    """
    with enable_grad():
        inputs_were_tuple, ins = _tupled(inputs, "inputs", "jvp")
        ins = _fresh(ins, create_graph, need_graph=True)
        vs = _vectors(v, "jvp", ins, inputs_were_tuple, create_graph, _INPUT_IS)
        outputs_were_tuple, outs = _tupled(func(*ins), "outputs of the user-provided function", "jvp")
        _strict_check(outs, "outputs", strict)
        # The backward pass is linear in its grad_outputs, so their value never reaches the result: zeros
        # (finite, unlike empty memory) that require grad make it differentiable with respect to them.
        dummies = tuple(_zeros_like(o, requires_grad=True) for o in outs)
        grad_inputs = _grad(outs, ins, dummies, create_graph=True)
        _strict_check(grad_inputs, "grad_inputs", strict)
    with set_grad_enabled(True if create_graph else is_grad_enabled()):
        grads = _grad(grad_inputs, dummies, vs, create_graph=create_graph)
        products = _zeros_for_missing(grads, outs, strict, create_graph, "back_trick")
    return (
        _untuple(_released(outs, create_graph), outputs_were_tuple),
        _untuple(_released(products, create_graph), outputs_were_tuple),
    )


# ---------------------------------------------------------------------------------------- jacobian / hessian


def _forward_mode(func: Callable, inputs: Any, create_graph: bool, strict: bool, vectorize: bool) -> Any:
    """``strategy="forward-mode"``: PyTorch's errors for what it does not support, then kiln's."""
    if create_graph:
        raise NotImplementedError(
            'kiln.autograd.functional.jacobian: `create_graph=True` and `strategy="forward-mode"` are not '
            'supported together (yet). Please either set `create_graph=False` or `strategy="reverse-mode"`.'
        )
    if strict:
        raise RuntimeError(
            'kiln.autograd.functional.jacobian: `strict=True` and `strategy="forward-mode"` are not supported '
            'together (yet). Please either set `strict=False` or `strategy="reverse-mode"`.'
        )
    _tupled(inputs, "inputs", "jacobian")
    if not vectorize:
        # PyTorch's message, word for word (its two string pieces join without a space)
        raise NotImplementedError(
            "Computing Jacobian using forward-AD or forward-over-reverse Hessian isonly implemented for "
            "`vectorize=True`."
        )
    raise NotImplementedError(
        'kiln.autograd.functional.jacobian: `strategy="forward-mode"` needs forward-mode AD (dual tensors) and '
        'vmap, which kiln does not have. Use `strategy="reverse-mode"` (the default), which computes the same '
        "Jacobian."
    )


def jacobian(
    func: Callable[..., Tensor | tuple[Tensor, ...]],
    inputs: Tensor | tuple[Tensor, ...],
    create_graph: bool = False,
    strict: bool = False,
    vectorize: bool = False,
    strategy: str = "reverse-mode",
) -> Tensor | tuple[Tensor, ...] | tuple[tuple[Tensor, ...], ...]:
    """The Jacobian of ``func`` at ``inputs``.

    With a single input and a single output the result is one tensor of shape
    ``output.shape + input.shape``; when either is a tuple, a tuple of such tensors (over the one that
    is); when both are, ``J[i][j]`` is the Jacobian of output ``i`` with respect to input ``j``. Each
    block has its input's dtype and device. With ``create_graph=True`` the result is differentiable
    (with respect to ``inputs`` that require grad); with ``strict=True`` an input on which an output
    does not depend is an error instead of a block of zeros.

    ``vectorize`` is accepted for PyTorch compatibility: kiln has no vmap, so ``vectorize=True`` computes
    the same result as ``vectorize=False``, one :func:`kiln.autograd.grad` call per element of the
    outputs (PyTorch's rule that it cannot be combined with ``strict=True`` still applies).
    ``strategy="forward-mode"`` needs forward-mode AD, which kiln does not have: it raises PyTorch's error
    for the combinations PyTorch rejects and ``NotImplementedError`` otherwise.

    >>> x = kiln.tensor([1.0, 2.0])
    >>> kiln.autograd.functional.jacobian(lambda x: x**2, x)
    tensor([[2., 0.],
            [0., 4.]])
    >>> kiln.autograd.functional.jacobian(lambda x, y: x * y, (x, kiln.tensor([3.0, 4.0])))
    (tensor([[3., 0.],
            [0., 4.]]), tensor([[1., 0.],
            [0., 2.]]))
    """
    if strategy not in _STRATEGIES:
        raise AssertionError(
            'Expected strategy to be either "forward-mode" or "reverse-mode". Hint: If your function has more '
            'outputs than inputs, "forward-mode" tends to be more performant. Otherwise, prefer to use '
            '"reverse-mode".'
        )
    if strategy == "forward-mode":
        return _forward_mode(func, inputs, create_graph, strict, vectorize)

    with enable_grad():
        inputs_were_tuple, ins = _tupled(inputs, "inputs", "jacobian")
        ins = _fresh(ins, create_graph, need_graph=True)
        outputs_were_tuple, outs = _tupled(func(*ins), "outputs of the user-provided function", "jacobian")
        _strict_check(outs, "outputs", strict)
        if vectorize and strict:
            raise RuntimeError(
                "kiln.autograd.functional.jacobian: `strict=True` and `vectorized=True` are not supported "
                "together. Please either set `strict=False` or `vectorize=False`."
            )
        # vectorize=True takes the same path: kiln has no vmap to batch the rows' grad calls.
        blocks = []
        for i, out in enumerate(outs):
            rows: list[list[Tensor]] = [[] for _ in ins]
            flat = out.reshape(-1)
            for k in range(out.numel()):
                row = _grad((flat[k],), ins, retain_graph=True, create_graph=create_graph)
                for j, (g, inp) in enumerate(zip(row, ins)):
                    if g is None:
                        if strict:
                            raise RuntimeError(
                                f"Output {i} of the user-provided function is independent of input {j}. This is "
                                "not allowed in strict mode."
                            )
                        g = _zeros_like(inp)
                    elif strict and create_graph and not g.requires_grad:
                        raise RuntimeError(
                            f"The jacobian of the user-provided function is independent of input {j}. This is "
                            "not allowed in strict mode when create_graph=True."
                        )
                    rows[j].append(g)
            block = []
            for j, inp in enumerate(ins):
                shape = tuple(out.shape) + tuple(inp.shape)
                if rows[j]:
                    block.append(_stack(rows[j]).view(shape))
                else:  # an empty output: an empty Jacobian block
                    block.append(inp.new_zeros(shape))
            blocks.append(tuple(block))
        return _untuple2(_released(tuple(blocks), create_graph), outputs_were_tuple, inputs_were_tuple)


def hessian(
    func: Callable[..., Tensor],
    inputs: Tensor | tuple[Tensor, ...],
    create_graph: bool = False,
    strict: bool = False,
    vectorize: bool = False,
    outer_jacobian_strategy: str = "reverse-mode",
) -> Tensor | tuple[tuple[Tensor, ...], ...]:
    """The Hessian of the scalar function ``func`` (it returns a one-element tensor) at ``inputs``.

    With a single input the result is one tensor of shape ``input.shape + input.shape``; with a tuple of
    inputs, a tuple of tuples where ``H[i][j]`` (shape ``inputs[i].shape + inputs[j].shape``) holds the
    second derivatives with respect to inputs ``i`` and ``j``. It is the Jacobian of the Jacobian, both
    in reverse mode; ``create_graph``, ``strict`` and ``vectorize`` as in :func:`jacobian`.
    ``outer_jacobian_strategy="forward-mode"`` needs forward-mode AD, which kiln does not have (see
    :func:`jacobian`'s ``strategy``).

    >>> x = kiln.tensor([1.0, 2.0])
    >>> kiln.autograd.functional.hessian(lambda x: (x**3).sum(), x)
    tensor([[ 6.,  0.],
            [ 0., 12.]])
    """
    inputs_were_tuple, ins = _tupled(inputs, "inputs", "hessian")
    if outer_jacobian_strategy not in _STRATEGIES:
        raise AssertionError('Expected strategy to be either "forward-mode" or "reverse-mode".')

    def scalar(*args: Tensor) -> Tensor:
        return _single_element_function("hessian", func, func(*args), strict).squeeze()

    def gradient(*args: Tensor) -> tuple[Tensor, ...]:
        jac = jacobian(scalar, args, create_graph=True)
        _strict_check(jac, "jacobian", strict)
        return jac

    result = jacobian(
        gradient, ins, create_graph=create_graph, strict=strict, vectorize=vectorize, strategy=outer_jacobian_strategy
    )
    return _untuple2(result, inputs_were_tuple, inputs_were_tuple)


def _hessian_product_setup(
    fn: str, func: Callable, inputs: Any, v: Any, create_graph: bool, strict: bool
) -> tuple[bool, tuple[Tensor, ...], tuple[Tensor, ...] | None, Tensor, tuple[Tensor | None, ...]]:
    """What vhp and hvp share (to be run under enable_grad): checked inputs and v, the one-element output
    and the gradient, made with a graph."""
    inputs_were_tuple, ins = _tupled(inputs, "inputs", fn)
    ins = _fresh(ins, create_graph, need_graph=True)
    vs = _vectors(v, fn, ins, inputs_were_tuple, create_graph, _INPUT_IS)
    out = _single_element_function(fn, func, func(*ins), strict)
    jac = _grad((out,), ins, create_graph=True)
    _strict_check(jac, "jacobian", strict)
    return inputs_were_tuple, ins, vs, out, jac


def vhp(
    func: Callable[..., Tensor],
    inputs: Tensor | tuple[Tensor, ...],
    v: Tensor | tuple[Tensor, ...] | None = None,
    create_graph: bool = False,
    strict: bool = False,
) -> tuple[Tensor, Tensor | tuple[Tensor, ...]]:
    """The vector-Hessian product ``v^T H`` of the scalar ``func`` at ``inputs``: ``(func(*inputs), vhp)``.

    ``func`` returns a one-element tensor; ``v`` and the product have the shape of ``inputs`` (``v`` may
    be omitted when the input is a single one-element tensor). Computed as the vector-Jacobian product
    of the gradient, two backward passes. ``create_graph`` and ``strict`` as in :func:`vjp`.

    >>> x = kiln.tensor([1.0, 2.0])
    >>> kiln.autograd.functional.vhp(lambda x: (x**3).sum(), x, kiln.ones(2))
    (tensor(9.), tensor([ 6., 12.]))
    """
    with enable_grad():
        inputs_were_tuple, ins, vs, out, jac = _hessian_product_setup("vhp", func, inputs, v, create_graph, strict)
    with set_grad_enabled(True if create_graph else is_grad_enabled()):
        grads = _grad(jac, ins, vs, create_graph=create_graph)
        products = _zeros_for_missing(grads, ins, strict, create_graph, "double_back")
    return _released((out,), create_graph)[0], _untuple(_released(products, create_graph), inputs_were_tuple)


def hvp(
    func: Callable[..., Tensor],
    inputs: Tensor | tuple[Tensor, ...],
    v: Tensor | tuple[Tensor, ...] | None = None,
    create_graph: bool = False,
    strict: bool = False,
) -> tuple[Tensor, Tensor | tuple[Tensor, ...]]:
    """The Hessian-vector product ``H v`` of the scalar ``func`` at ``inputs``: ``(func(*inputs), hvp)``.

    Arguments as in :func:`vhp`. Computed with the double-backward trick (three backward passes), as in
    PyTorch, so it is slower than :func:`vhp`; for a twice continuously differentiable function the
    Hessian is symmetric and both give the same values.

    >>> x = kiln.tensor([1.0, 2.0])
    >>> kiln.autograd.functional.hvp(lambda x: (x**3).sum(), x, kiln.tensor([1.0, -1.0]))
    (tensor(9.), tensor([  6., -12.]))
    """
    with enable_grad():
        inputs_were_tuple, ins, vs, out, jac = _hessian_product_setup("hvp", func, inputs, v, create_graph, strict)
        dummies = tuple(_zeros_like(t, requires_grad=True) for t in ins)
        double_back = _grad(jac, ins, dummies, create_graph=True)
        _strict_check(jac, "hessian", strict)
    with set_grad_enabled(True if create_graph else is_grad_enabled()):
        grads = _grad(double_back, dummies, vs, create_graph=create_graph)
        products = _zeros_for_missing(grads, ins, strict, create_graph, "double_back_trick")
    return _released((out,), create_graph)[0], _untuple(_released(products, create_graph), inputs_were_tuple)
