"""The recorder code written out per op (``kiln.autograd._record_code``) makes the node the generic recorder
makes, for every op with a backward and every case of its spec: same class, edges, layout, saved entries
(what is saved, at which version, as output or input), flags and outputs' history."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.autograd import graph
from kiln.autograd.graph import SavedTensor
from kiln.backend import ops
from kiln_testing._runner import _build, _flat
from kiln_testing._specs import Ctx, spec_for

_OPS = ops()


def _describe_value(v, leaves: list) -> object:
    if isinstance(v, SavedTensor):
        data = v.data
        where = next((k for k, leaf in enumerate(leaves) if leaf is data), None)
        return ("saved", v.version, v.is_output, v.output_nr, v.freed, tuple(data.shape), data.dtype, where)
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple(_describe_value(x, leaves) for x in v))
    if isinstance(v, kiln.Tensor):
        return ("tensor", tuple(v.shape), v.dtype)
    return ("value", repr(v))


def _describe(node, leaves: list) -> tuple:
    """Everything a recorder sets on a node, with leaves named by position (two builds have two sets)."""

    def edge(e):
        n, nr = e
        if n is None:
            return None
        if isinstance(n, graph.AccumulateGrad):
            return ("leaf", next((k for k, leaf in enumerate(leaves) if leaf is n.variable), None), nr)
        return (n.name(), nr)

    return (
        node.name(),
        tuple(edge(e) for e in node.next_functions),
        None if node.layout is None else [list(x) if isinstance(x, list) else x for x in node.layout],
        node.wants,
        [tuple(m) for m in node.input_meta],
        node.n_out,
        node.output_meta,
        node.freed,
        node.op,
        node._node_hooks,
        {k: _describe_value(v, leaves) for k, v in node.saved.items()},
        list(node.saved),
        tuple(node.seqs),
    )


def _recorded(opdef, case, recorder) -> list:
    """Run ``case`` with ``recorder`` as the op's recorder; the description of every output's history."""
    public_globals = opdef.public.__globals__
    needs = opdef._backward_needs
    kept = public_globals.get("_record"), needs.recorder
    public_globals["_record"] = needs.recorder = recorder
    try:
        args, kwargs, built = _build(case, kiln.device("cpu"), grad=True)
        leaves = [leaf for leaf, _ in built]
        views = [a for a in (*args, *kwargs.values()) if isinstance(a, kiln.Tensor)]
        out = opdef.public(*args, **kwargs)
    finally:
        public_globals["_record"], needs.recorder = kept
    described = []
    for o in _flat(out):
        if isinstance(o, kiln.Tensor):
            node = o._grad_fn
            d = None if node is None or not hasattr(node, "op") else _describe(node, leaves + views)
            described.append((o.requires_grad, o._output_nr, d))
            if d is not None and node.n_out == 1:
                described.append(_gradients(node, o))
    return described


def _gradients(node, out) -> list:
    """The node's gradients for a random output gradient, from its own ``apply``, from the generic one and from
    its ``_apply_and_release`` (the engine's call when the graph is not kept; last, as it frees the saved
    tensors): all must give what the generic gives, values included, and the last must free what was saved."""
    g = kiln.from_numpy(np.random.default_rng(5).standard_normal(tuple(out.shape))).to(out.dtype)
    found = []
    for apply in (graph.OpNode.apply, graph.OpNode.apply_generic, type(node)._apply_and_release):
        try:
            with kiln.no_grad():
                grads = apply(node, (g,))
        except Exception as exc:  # noqa: BLE001 - all must raise alike
            found.append(("raised", type(exc).__name__, str(exc)))
            continue
        found.append([None if r is None else (tuple(r.shape), r.dtype, r.detach().numpy().tolist()) for r in grads])
    assert found[0] == found[1], "the node's apply and the generic apply differ"
    assert found[2] == found[1], "the node's _apply_and_release and the generic apply differ"
    if found[2][0] != "raised":
        saved = [v for v in node.saved.values() if isinstance(v, graph.SavedTensor)]
        assert node.freed and all(v.freed and v.data is None for v in saved), "_apply_and_release freed nothing"
    return found[0]


def _ops_with_backward() -> list[str]:
    return [name for name, opdef in _OPS.items() if opdef._backward_needs is not None and spec_for(opdef) is not None]


@pytest.mark.parametrize("name", _ops_with_backward())
def test_generated_recorder_makes_the_generic_node(name):
    opdef = _OPS[name]
    generated = graph.recorder(opdef)
    cases = [c for c in spec_for(opdef).cases(Ctx(name, kiln.float64, (kiln.float64, kiln.int64, kiln.bool))) if c.grad]
    compared = 0
    for case in cases:
        try:
            expected = _recorded(opdef, case, graph.record_generic)
        except Exception:  # noqa: BLE001 - an invalid case: the forward checks cover its error
            continue
        assert _recorded(opdef, case, generated) == expected, case.label
        compared += 1
    if generated is not graph.record_generic:
        assert compared or not cases, f"no case of {name} ran"


def test_recorder_falls_back_for_a_list_and_a_tensor_among_numbers():
    """A list where one tensor goes, and a tensor where the formula saves a number, take the generic path."""
    opdef = _OPS["sum"]
    x = kiln.randn(3, 4, dtype=kiln.float64, requires_grad=True)
    node = x.sum(dim=(0, 1)).grad_fn
    assert node.saved["dim"] == (0, 1)
    rec = graph.recorder(_OPS["mul"])
    assert rec is not graph.record_generic
    y = kiln.mul(x, 2.0)  # a number where a tensor may go: the layout skips it
    assert y.grad_fn.layout == [0, None] and len(y.grad_fn.next_functions) == 1
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full((3, 4), 2.0))
    assert graph.recorder(opdef) is not graph.record_generic


def test_a_node_name_has_one_class_and_the_anomaly_traceback_ends_at_the_caller():
    """The generated and the generic recorder make nodes of one class per node name (as PyTorch has), and
    anomaly mode's forward traceback ends at the line that called the op, whichever path recorded it (the
    generated recorder, its hand-over to the generic one, the dispatcher under a dispatch mode)."""
    from kiln._modes import DispatchMode

    x = kiln.randn(3, requires_grad=True)
    a = kiln.add(x, x)
    b = kiln.add(x, x, alpha=kiln.tensor(2.0))  # a tensor where the formula saves a number: the generic recorder
    assert type(a.grad_fn) is type(b.grad_fn)
    assert type(kiln.mul(x, x).grad_fn) is graph._NODE_CLASSES["MulBackward0"]

    class Seen(DispatchMode):
        level = "post_autograd"

    kiln.autograd.set_detect_anomaly(True)
    try:
        made = [
            kiln.add(x, x),  # line: generated
            kiln.add(x, x, alpha=kiln.tensor(2.0)),  # line: generic
        ]
        with Seen():
            made.append(kiln.cos(x))  # line: dispatcher
    finally:
        kiln.autograd.set_detect_anomaly(False)
    for t, mark in zip(made, ("generated", "generic", "dispatcher")):
        last = t.grad_fn.metadata["traceback_"][-1]
        assert __file__ in last and f"# line: {mark}" in last, last
