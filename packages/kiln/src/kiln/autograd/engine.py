"""The backward engine: gradients flow from the roots through the recorded nodes in reverse order of
recording (a node runs once every edge into it has delivered), are captured for ``autograd.grad`` or
accumulated into leaves, and the callbacks queued during the pass run at its end."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from heapq import heappop, heappush
from itertools import count

from kiln._state import anomaly, set_grad_mode
from kiln._tensor import Tensor
from kiln.autograd.accumulate import _accumulate_into_leaf, _sole_owner
from kiln.autograd.graph import AccumulateGrad, Node, _edge, _run_tensor_hooks

_final_callbacks = threading.local()  # .stack: one list of callbacks per backward pass running in this thread


def queue_callback(callback: Callable[[], None]) -> None:
    """Run ``callback()`` when the backward pass running in this thread finishes (PyTorch's
    ``Variable._execution_engine.queue_callback``): how DistributedDataParallel waits for its last
    gradient all-reduces. Callbacks run in the order queued, after every gradient is accumulated, and
    may queue more; only valid during a backward pass."""
    stack = getattr(_final_callbacks, "stack", None)
    if not stack:
        raise RuntimeError("Final callbacks can only be installed during backward pass.")
    stack[-1].append(callback)


def run_backward(
    roots: Sequence[tuple[Node, int, Tensor]],
    keep_graph: bool,
    create_graph: bool,
    inputs: Sequence[Tensor] | None = None,
    accumulate: bool = True,
) -> list:
    """Propagate gradients from ``roots``; with ``inputs``, return their gradients (and accumulate
    only into them when ``accumulate``). Callbacks queued with :func:`queue_callback` during the pass
    run at its end."""
    stack = getattr(_final_callbacks, "stack", None)
    if stack is None:
        stack = _final_callbacks.stack = []
    callbacks: list[Callable[[], None]] = []
    stack.append(callbacks)
    try:
        captured = _propagate(roots, keep_graph, create_graph, inputs, accumulate)
    finally:
        stack.pop()
    i = 0
    while i < len(callbacks):  # a callback may queue another
        stack.append(callbacks)
        try:
            callbacks[i]()
        finally:
            stack.pop()
        i += 1
    return captured


def _propagate(
    roots: Sequence[tuple[Node, int, Tensor]],
    keep_graph: bool,
    create_graph: bool,
    inputs: Sequence[Tensor] | None,
    accumulate: bool,
) -> list:
    # Targets: where gradients are captured instead of flowing on.
    capture: dict[tuple[int, int], int] = {}
    captured: list = []
    if inputs is not None:
        captured = [None] * len(inputs)
        for k, t in enumerate(inputs):
            node, nr = _edge(t)
            if node is None:
                continue
            capture[(id(node), nr)] = k
    # Dependencies: how many edges reach each node. A node is in ``deps`` once met (the roots with 0), so
    # ``deps`` is also the walk's set of nodes seen.
    roots_nodes = [roots[0][0]] if len(roots) == 1 else list(dict.fromkeys(r[0] for r in roots))
    deps: dict[Node, int] = dict.fromkeys(roots_nodes, 0)
    stack = list(roots_nodes)
    while stack:
        for nxt, _ in stack.pop().next_functions:
            if nxt is not None:
                if nxt in deps:
                    deps[nxt] += 1
                else:
                    deps[nxt] = 1
                    stack.append(nxt)
    needed: set | None = None
    if inputs is not None:  # only the nodes that lead to an input run, and count only the edges among them
        needed, deps = _pruned(deps, capture)

    # Ready nodes run latest-recorded first; leaves (sequence number inf) as soon as ready, in the order they
    # became ready (the counter, which also keeps the heap from comparing nodes)
    buffers: dict[Node, list] = {}
    heap: list = []
    counter = count()
    for node, nr, g in roots:
        buf = buffers.get(node)
        if buf is None:
            buf = buffers[node] = [None] * max(node.n_out, nr + 1)
        buf[nr] = g if buf[nr] is None else buf[nr] + g
    if len(buffers) == 1:  # one root node: nothing reaches it (the graph has no cycle)
        node = roots[0][0]
    else:
        node = None  # the next node to run when it is the only one ready (a chain's nodes, a lone root)
        for root in buffers:
            if not deps.get(root, 0):
                heappush(heap, (-root._seq, next(counter), root))

    prev = set_grad_mode(bool(create_graph))
    try:
        while True:
            if node is None:
                if not heap:
                    break
                node = heappop(heap)[2]
            grads = buffers.pop(node)
            hooks = node._node_hooks
            if hooks is not None and hooks.tensor_pre:
                for nr, fns in hooks.tensor_pre.items():
                    if nr < len(grads) and grads[nr] is not None and fns:
                        grads[nr] = _run_tensor_hooks(fns, grads[nr])
            if capture:
                _capture(node, grads, capture, captured)
            if node.__class__ is AccumulateGrad:
                if inputs is None:
                    if grads[0] is not None:
                        leaf = node.variable  # (a gradient is taken without a copy only as the leaf's first)
                        owned = not create_graph and leaf._grad is None and _sole_owner(leaf, grads)
                        _accumulate_into_leaf(leaf, grads[0], create_graph, owned=owned)
                elif accumulate:
                    k = capture.get((id(node), 0))
                    if k is not None and captured[k] is not None:  # hooks already ran when it was captured
                        _accumulate_into_leaf(node.variable, captured[k], create_graph, run_hooks=False)
                node = None
                continue
            if needed is not None and node not in needed:
                node = None
                continue
            if hooks is None and len(grads) == 1 and grads[0] is not None and not anomaly["enabled"]:
                outs = node.apply((grads[0],)) if keep_graph else node._apply_and_release((grads[0],))
            else:
                outs = _apply(node, grads) if hooks is None else _apply_with_hooks(node, grads, hooks)
                if not keep_graph:
                    node.release()
            ready = None  # a node this one made ready, while it is the only node ready
            for (nxt, nr), g in zip(node.next_functions, outs):
                if nxt is None or (needed is not None and nxt not in needed):
                    continue
                buf = buffers.get(nxt)
                if buf is None:  # the first gradient to reach nxt
                    if nr == 0 and nxt.n_out == 1:
                        buffers[nxt] = [g]
                    else:
                        buf = buffers[nxt] = [None] * max(nxt.n_out, nr + 1)
                        buf[nr] = g
                else:
                    if nr >= len(buf):
                        buf.extend([None] * (nr + 1 - len(buf)))
                    if g is not None:
                        buf[nr] = g if buf[nr] is None else buf[nr] + g
                left = deps[nxt] - 1
                deps[nxt] = left
                if not left:
                    if ready is None and not heap:
                        ready = nxt
                    else:  # several ready: the heap orders them (the one held out first, as it became ready first)
                        if ready is not None:
                            heappush(heap, (-ready._seq, next(counter), ready))
                            ready = None
                        heappush(heap, (-nxt._seq, next(counter), nxt))
            node = ready
            outs = g = None  # the buffers hold the gradients now (the leaf ownership test counts their holders)
    finally:
        set_grad_mode(prev)
    if accumulate and inputs is not None:
        # backward(inputs=...) fills .grad of non-leaf inputs too (leaves were done by AccumulateGrad)
        for t, g in zip(inputs, captured):
            if g is not None and t.grad_fn is not None and not t._retains_grad:  # retain_grad already stored it
                _accumulate_into_leaf(t, g, create_graph, run_hooks=False)
    return captured


def _pruned(deps: dict, capture: dict) -> tuple[set, dict]:
    """For ``autograd.grad`` / ``backward(inputs=...)``: the nodes among those met (``deps``'s keys) that lead to
    a captured edge, and the dependency counts among them alone."""
    target_nodes = {key[0] for key in capture}
    needed: set = set()
    for node in _topo_sorted(list(deps)):  # leaves first: a node is needed if it feeds a needed node
        if id(node) in target_nodes or any(n in needed for n, _ in node.next_functions if n is not None):
            needed.add(node)
    pruned: dict = {}
    for node in deps:
        if node in needed:
            for nxt, _ in node.next_functions:
                if nxt is not None and nxt in needed:
                    pruned[nxt] = pruned.get(nxt, 0) + 1
    return needed, pruned


def _capture(node: Node, grads: list, capture: dict, captured: list) -> None:
    """Keep the gradients that reach a captured edge of ``node`` (a leaf's after its tensor hooks)."""
    for nr, g in enumerate(grads):
        k = capture.get((id(node), nr))
        if k is not None and g is not None:
            if node.__class__ is AccumulateGrad and node.variable._hooks:
                g = _run_tensor_hooks(node.variable._hooks, g)
            captured[k] = g


def _apply(node: Node, grads: list) -> tuple:
    """``node.apply`` for its gradients ``grads`` (some may be None; all None: no gradient reached it, and
    none leaves), under anomaly mode's checks when on."""
    for g in grads:  # (not grads.count(None): that compares with ==, a tensor op)
        if g is not None:
            break
    else:
        return (None,) * len(node.next_functions)
    if anomaly["enabled"]:
        return _apply_node_under_anomaly(node, tuple(grads))
    return node.apply(tuple(grads))


def _apply_with_hooks(node: Node, grads: list, hooks) -> tuple:
    """:func:`_apply` between the node's pre-hooks (which may replace its gradients) and its post-hooks (which
    may replace its results)."""
    for h in hooks.pre:
        r = h(tuple(grads))
        if r is not None:
            grads = list(r)
    outs = _apply(node, grads)
    for h in hooks.post:
        r = h(outs, tuple(grads))
        if r is not None:
            outs = tuple(r)
    return outs


def _apply_node_under_anomaly(node: Node, grads: tuple) -> tuple:
    """``node.apply(grads)`` with anomaly mode's forward traceback on error and its check for nan."""
    try:
        outs = node.apply(grads)
    except Exception:
        tb = node.metadata.get("traceback_")
        if tb:
            warnings.warn(
                f"Error detected in {node.name()}. Traceback of forward call that caused the error:\n{''.join(tb)}",
                stacklevel=2,
            )
        raise
    if anomaly["check_nan"]:
        for i, g in enumerate(outs):
            if g is not None and g._dtype.is_floating_point:
                from kiln._ops.elementwise import isnan

                if isnan(g.detach()).any().item():
                    raise RuntimeError(f"Function '{node.name()}' returned nan values in its {i}th output.")
    return outs


def _topo_sorted(nodes: list[Node]) -> list[Node]:
    """Nodes ordered so that every node comes after everything it feeds into (leaves first)."""
    node_set = set(nodes)
    out: list[Node] = []
    state_: dict[Node, int] = {}
    for root in nodes:
        if root in state_:
            continue
        stack = [(root, iter(root.next_functions))]
        state_[root] = 1
        while stack:
            node, it = stack[-1]
            advanced = False
            for nxt, _ in it:
                if nxt is not None and nxt in node_set and nxt not in state_:
                    state_[nxt] = 1
                    stack.append((nxt, iter(nxt.next_functions)))
                    advanced = True
                    break
            if not advanced:
                stack.pop()
                out.append(node)
    return out
