"""Which dims of a trace's values follow a dim marked dynamic, and where the traced code fixes one.

kiln guards shapes exactly and reads sizes as Python ints, so it cannot follow a size through Python code
the way PyTorch's symbolic shapes do. What it can follow is the graph: each dim of each value gets a
*token*, :data:`STATIC` (a size fixed for every call the trace serves: a parameter's, an unmarked input
dim's), ``None`` (not known: a size an op took from Python, ``view``'s, ``expand``'s, a new tensor's) or a
*symbol* (an int: a dim marked dynamic, or one kiln treats as dynamic). Ops whose output dims are their
inputs' by rule pass the tokens on: pointwise ops with broadcasting, reductions, the views that move dims
(``t``, ``transpose``, ``permute``, ``unsqueeze``, ``squeeze``, ``expand``, a ``view`` keeping a dim),
``matmul``, ``bmm``, ``addmm``, ``baddbmm``, a copy into a buffer, and the ops that keep their input's shape
(``clone``, ``cumsum``, ``_softmax``...). Any other op's outputs are not known.

Where a rule makes two dims equal, their symbols become one; where it makes a symbol's dim equal to a
:data:`STATIC` one of the same size (``x + w`` with ``w`` a parameter, ``x @ W`` over a marked dim), the
code has *specialized* that symbol to the size (PyTorch's ``ConstraintViolationError`` for a dim marked with
``mark_dynamic``). A size read into Python and used there (``x.view(8, -1)``, ``if x.shape[0] == 8``) is
not seen: such a trace is simply exact for its size, as every kiln trace is.
"""

from __future__ import annotations

from kiln.compile._graph import Graph, Node, Value

__all__ = ["STATIC", "Symbols", "follow"]

STATIC = "static"
"""The token of a dim whose size is the same on every call the trace serves."""


class Symbols:
    """The symbols of one trace: which are one (union-find), and the size and op that fixed each, if any."""

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.fixed: dict[int, tuple[int, Node]] = {}  # root -> (size, the op that fixed it)

    def new(self) -> int:
        """A fresh symbol."""
        self.parent.append(len(self.parent))
        return len(self.parent) - 1

    def find(self, s: int) -> int:
        """The symbol ``s`` is one with (its root)."""
        while self.parent[s] != s:
            self.parent[s] = self.parent[self.parent[s]]
            s = self.parent[s]
        return s

    def union(self, a: int, b: int) -> int:
        """Make ``a`` and ``b`` one symbol; its root."""
        a, b = self.find(a), self.find(b)
        if a != b:
            self.parent[b] = a
            if b in self.fixed:
                self.fixed.setdefault(a, self.fixed.pop(b))
        return a

    def fix(self, s: int, size: int, node: Node) -> None:
        """``s`` meets a fixed dim of ``size`` at ``node``."""
        self.fixed.setdefault(self.find(s), (size, node))

    def fixed_at(self, s: int) -> tuple[int, Node] | None:
        """``(size, node)`` if the code fixed ``s``'s size, else None."""
        return self.fixed.get(self.find(s))


class _Unreadable(Exception):
    """A node whose shapes the rule does not explain: its outputs are not known."""


def follow(graph: Graph, tokens: dict[int, list], symbols: Symbols) -> dict[int, list]:
    """The tokens of every value of ``graph`` that the rules reach, from ``tokens`` (its inputs'), by value
    index; a value left out is not known. ``symbols`` learns which symbols are one and which are fixed."""
    tokens = dict(tokens)
    for node in graph.nodes:
        if node.kind != "op":
            for v in node.outputs:  # (a draw: a tensor made from Python's sizes)
                tokens.pop(v.index, None)
            continue
        try:
            outs = _rule(node, tokens, symbols)
        except Exception:  # noqa: BLE001 - shapes a rule does not explain (_Unreadable, or odd arguments): not known
            outs = None
        for k, v in enumerate(node.outputs):
            out = outs[k] if outs is not None and k < len(outs) else None
            if out is not None and len(out) == len(v.shape):
                tokens[v.index] = out
            else:  # (an in-place op's written value keeps its index: not known either, from here on)
                tokens.pop(v.index, None)
    return tokens


def _of(tokens: dict, v: Value) -> list:
    got = tokens.get(v.index)
    return list(got) if got is not None else [None] * len(v.shape)


def _meet(pairs: list[tuple[int, object]], n: int, symbols: Symbols, node: Node):
    """The token of a dim of size ``n`` that the ``(size, token)`` pairs must all equal (size 1 broadcasts)."""
    syms, static = [], False
    for m, tok in pairs:
        if m != n:
            if m == 1:
                continue
            raise _Unreadable
        if tok is STATIC:
            static = True
        elif tok is not None:
            syms.append(tok)
    if syms:
        root = syms[0]
        for s in syms[1:]:
            root = symbols.union(root, s)
        if static and n >= 2:
            symbols.fix(root, n, node)
        return symbols.find(root)
    return STATIC if static else None


def _broadcast(operands: list[tuple[tuple, list]], shape: tuple, symbols: Symbols, node: Node) -> list:
    """The tokens of ``shape``, the broadcast of the ``(shape, tokens)`` operands."""
    nd = len(shape)
    if any(len(s) > nd for s, _ in operands):
        raise _Unreadable
    out = []
    for p, n in enumerate(shape):
        pairs = [(s[k], t[k]) for s, t in operands if (k := p - nd + len(s)) >= 0]
        out.append(_meet(pairs, n, symbols, node))
    return out


def _rule(node: Node, tokens: dict, symbols: Symbols) -> list | None:
    """The tokens of ``node``'s outputs (one list per output), or None where no rule applies."""
    op = node.op
    vals = [a for a in node.args if isinstance(a, Value)]
    shapes = [v.shape for v in node.outputs]
    if "pointwise" in op.tags or op.name == "_copy_from":
        out = _broadcast([(v.shape, _of(tokens, v)) for v in vals], shapes[0], symbols, node)
        return [out if s == shapes[0] else None for s in shapes]
    if not vals:
        return None
    src, first = vals[0], _of(tokens, vals[0])
    if "reduction" in op.tags:
        return _reduction(node, src, first, shapes)
    if op.name in _VIEWS:
        return [_VIEWS[op.name](node, src, first, shapes[0])]
    if op.name in _PRODUCTS:
        return [_PRODUCTS[op.name](node, vals, [_of(tokens, v) for v in vals], shapes[0], symbols)]
    if op.tags & _SAME_SHAPE and all(s == src.shape for s in shapes) and _distinct(src.shape):
        return [first] * len(shapes)  # (clone, _to_copy, cumsum, flip, _softmax: dim k of the output is dim k's)
    return None


_SAME_SHAPE = frozenset({"copy", "scan", "shape", "fused"})


def _distinct(shape: tuple) -> bool:
    """Whether the sizes of 2 or more of ``shape`` differ from each other (so a dim is told by its size)."""
    big = [n for n in shape if n >= 2]
    return len(big) == len(set(big))


def _reduction(node: Node, src: Value, toks: list, shapes: list) -> list | None:
    dims = getattr(node.spec, "dims", None)
    if dims is None or not src.shape:
        return None
    nd = len(src.shape)
    reduced = {d % nd for d in dims}
    if len(shapes[0]) == nd:  # keepdim: size 1 there
        out = [STATIC if d in reduced else t for d, t in enumerate(toks)]
        kept = [1 if d in reduced else n for d, n in enumerate(src.shape)]
    else:
        out = [t for d, t in enumerate(toks) if d not in reduced]
        kept = [n for d, n in enumerate(src.shape) if d not in reduced]
    return [out if tuple(kept) == s else None for s in shapes]


def _t(node, src, toks, shape):
    return toks[::-1] if len(toks) == 2 else toks


def _transpose(node, src, toks, shape):
    nd = len(toks)
    a, b = node.args[1] % nd, node.args[2] % nd
    toks[a], toks[b] = toks[b], toks[a]
    return toks


def _permute(node, src, toks, shape):
    return [toks[d % len(toks)] for d in node.args[1]]


def _unsqueeze(node, src, toks, shape):
    toks.insert(node.args[1] % (len(toks) + 1), STATIC)
    return toks


def _squeeze(node, src, toks, shape):
    nd, dim = len(toks), node.args[1] if len(node.args) > 1 else None
    dims = range(nd) if dim is None else [d % nd for d in (dim if isinstance(dim, (list, tuple)) else (dim,))]
    drop = {d for d in dims if src.shape[d] == 1}
    return [t for d, t in enumerate(toks) if d not in drop]


def _expand(node, src, toks, shape):
    lead = len(shape) - len(toks)  # new leading dims and dims grown from 1 take sizes from Python: not known
    return [None] * lead + [t if n == shape[lead + k] else None for k, (t, n) in enumerate(zip(toks, src.shape))]


def _kept(src, toks, shape):
    """A reshape's dims that keep an input dim: the leading and trailing dims whose size is the input's and
    occurs once in both shapes; the others take sizes from Python: not known."""
    out: list = [None] * len(shape)
    once = {n for n in shape if n >= 2 and shape.count(n) == 1 and src.shape.count(n) == 1}
    for k in range(min(len(shape), len(src.shape))):
        if shape[k] != src.shape[k]:
            break
        out[k] = toks[k] if shape[k] in once else None
    for k in range(1, min(len(shape), len(src.shape)) + 1):
        if shape[-k] != src.shape[-k]:
            break
        out[-k] = toks[-k] if shape[-k] in once else out[-k]
    return out


def _view(node, src, toks, shape):
    return _kept(src, toks, tuple(shape))


_VIEWS = {
    "t": _t,
    "transpose": _transpose,
    "permute": _permute,
    "unsqueeze": _unsqueeze,
    "squeeze": _squeeze,
    "expand": _expand,
    "view": _view,
}


def _matmul(node, vals, toks, shape, symbols):
    (a, b), (ta, tb) = vals[:2], toks[:2]
    sa, sb = a.shape, b.shape
    if len(sa) == 1 and len(sb) == 1:
        _contract(sa[0], ta[0], sb[0], tb[0], symbols, node)
        return []
    if len(sa) == 1:
        _contract(sa[0], ta[0], sb[-2], tb[-2], symbols, node)
        return _batch(sb[:-2], tb[:-2], (), [], shape[:-1], symbols, node) + [tb[-1]]
    if len(sb) == 1:
        _contract(sa[-1], ta[-1], sb[0], tb[0], symbols, node)
        return ta[:-1]
    _contract(sa[-1], ta[-1], sb[-2], tb[-2], symbols, node)
    return _batch(sa[:-2], ta[:-2], sb[:-2], tb[:-2], shape[:-2], symbols, node) + [ta[-2], tb[-1]]


def _contract(n: int, t, m: int, u, symbols: Symbols, node: Node) -> None:
    """The contracted dims of a product: equal sizes, so one token."""
    if n != m:
        raise _Unreadable
    _meet([(n, t), (m, u)], n, symbols, node)


def _batch(sa, ta, sb, tb, shape, symbols, node) -> list:
    return _broadcast([(tuple(sa), list(ta)), (tuple(sb), list(tb))], tuple(shape), symbols, node)


def _bmm(node, vals, toks, shape, symbols):
    (a, b), (ta, tb) = vals[:2], toks[:2]
    _contract(a.shape[2], ta[2], b.shape[1], tb[1], symbols, node)
    return [_meet([(a.shape[0], ta[0]), (b.shape[0], tb[0])], shape[0], symbols, node), ta[1], tb[2]]


def _addmm(node, vals, toks, shape, symbols):
    """``addmm(input, a, b)`` / ``baddbmm``: the product, then ``input`` broadcast against it."""
    product = (_bmm if node.op.name == "baddbmm" else _mm)(node, vals[1:], toks[1:], shape, symbols)
    return _broadcast([(tuple(shape), product), (vals[0].shape, toks[0])], tuple(shape), symbols, node)


def _mm(node, vals, toks, shape, symbols):
    (a, b), (ta, tb) = vals[:2], toks[:2]
    _contract(a.shape[1], ta[1], b.shape[0], tb[0], symbols, node)
    return [ta[0], tb[1]]


_PRODUCTS = {"matmul": _matmul, "bmm": _bmm, "addmm": _addmm, "baddbmm": _addmm}
