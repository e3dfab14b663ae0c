"""Patterns: short sequences of ops that a device's code generator computes in one kernel.

Cross entropy is traced as four ops — ``_log_softmax`` then ``_nll_loss`` forward, ``_nll_loss_backward``
then ``_log_softmax_backward_data`` backward — each a kernel call over a small (batch, classes) tensor, with
a Python-level cost that dominates in a compiled training step. A code generator that has the attribute

* ``log_softmax_nll(x, target, ignore_index, reduction) -> (log_probs, loss)`` computes the forward pair,
* ``log_softmax_nll_backward(grad, log_probs, target, ignore_index, reduction) -> grad_input`` the backward
  pair,

for a 2-D float32/float64 C-contiguous ``x`` (log-softmax over dim 1), a 1-D target, no class weights and
reduction ``"sum"`` or ``"mean"``; its result must be the two ops' (an out-of-range target raises their
error). The forward call takes the place of the ``_nll_loss`` node, the backward call that of
``_log_softmax_backward_data``; a pair is matched only when nothing between its two nodes writes a tensor
or reads the value the call would make later.
"""

from __future__ import annotations

from collections.abc import Callable

import kiln
from kiln.compile._graph import Graph, Node, Value, contiguous_strides

__all__ = ["lower"]

_FLOAT = (kiln.float32, kiln.float64)


def lower(graph: Graph, names, codegens: dict[str, Callable], taken: set[int]) -> dict[int, str | None]:
    """The node positions the patterns replace (the call at the pair's second node, None at the first), skipping
    positions already in ``taken`` (fused groups)."""
    nodes = graph.nodes
    readers: dict[int, list[int]] = {}
    for pos, node in enumerate(nodes):
        for v in node.values_read():
            readers.setdefault(v.index, []).append(pos)
    returned = {v.index for v in graph.outputs}
    out: dict[int, str | None] = {}
    for first, node in enumerate(nodes):
        if node.kind != "op" or first in taken or node.op.name not in ("_log_softmax", "_nll_loss_backward"):
            continue
        (made,) = node.outputs
        later = [p for p in readers.get(made.index, []) if p > first]
        if not later:
            continue
        second = later[0]
        pair = nodes[second]
        if pair.kind != "op" or second in taken or second in out or not _quiet_between(nodes, first, second):
            continue  # (a guard, or a .grad or .data assignment, reads it first)
        codegen = codegens.get(made.device.type)
        if node.op.name == "_log_softmax":
            line = _forward(node, pair, made, codegen, names)
        elif made.index in returned or len(later) > 1:  # the nll gradient is read by the pair alone
            continue
        else:
            line = _backward(node, pair, made, codegen, names)
        if line is not None:
            out[first], out[second] = None, line
    return out


def _quiet_between(nodes: list[Node], first: int, second: int) -> bool:
    """Whether the nodes strictly between ``first`` and ``second`` are ops that write nothing (the pair's
    call, made at ``second``, then reads what the first node read)."""
    return all(n.kind == "op" and not n.written for n in nodes[first + 1 : second])


def _rows(x: Value, dim) -> bool:
    """Whether ``x`` is a C-contiguous 2-D float tensor and ``dim`` its last dim."""
    return (
        len(x.shape) == 2
        and type(dim) is int
        and dim in (1, -1)
        and x.dtype in _FLOAT
        and x.stride == contiguous_strides(x.shape)
    )


def _nll_args(args: tuple, log_probs: Value, target_at: int) -> str | None:
    """The call's last arguments, ``target, ignore_index, reduction``, from nll arguments ``args`` (target at
    ``target_at``) that the fused kernels take: no weight, a 1-D int64 target of the batch's size, "sum" or
    "mean"; else None."""
    if len(args) != target_at + 4:
        return None
    target, weight, ignore_index, reduction = args[target_at:]
    if weight is not None or type(ignore_index) is not int or reduction not in ("sum", "mean"):
        return None
    if not isinstance(target, Value) or target.dtype is not kiln.int64 or target.shape != log_probs.shape[:1]:
        return None
    return f"{target.name}, {ignore_index}, {reduction!r}"


def _forward(node: Node, pair: Node, made: Value, codegen, names) -> str | None:
    """``log_probs, loss = log_softmax_nll(...)`` for ``_log_softmax(x, dim)`` then ``_nll_loss`` of it."""
    kernel = getattr(codegen, "log_softmax_nll", None)
    if kernel is None or pair.op.name != "_nll_loss" or len(node.args) != 2 or pair.args[0] is not made:
        return None
    x, dim = node.args
    if not isinstance(x, Value) or not _rows(x, dim) or made.dtype != x.dtype or made.stride != x.stride:
        return None
    nll = _nll_args(pair.args, made, 1)
    (loss,) = pair.outputs
    return None if nll is None else f"{made.name}, {loss.name} = {names.const(kernel)}({x.name}, {nll})"


def _backward(node: Node, pair: Node, made: Value, codegen, names) -> str | None:
    """``grad_input = log_softmax_nll_backward(...)`` for ``_nll_loss_backward`` then
    ``_log_softmax_backward_data`` of its gradient."""
    kernel = getattr(codegen, "log_softmax_nll_backward", None)
    if kernel is None or pair.op.name != "_log_softmax_backward_data" or len(pair.args) != 3:
        return None
    grad_out, log_probs, dim = pair.args
    if grad_out is not made or not isinstance(log_probs, Value) or not _rows(log_probs, dim):
        return None
    grad = node.args[0]
    if not isinstance(grad, Value) or grad.shape != () or grad.dtype != log_probs.dtype:
        return None
    if made.shape != log_probs.shape or pair.outputs[0].dtype != log_probs.dtype:
        return None
    nll = _nll_args(node.args, log_probs, 2)
    (grad_input,) = pair.outputs
    return None if nll is None else f"{grad_input.name} = {names.const(kernel)}({grad.name}, {log_probs.name}, {nll})"
