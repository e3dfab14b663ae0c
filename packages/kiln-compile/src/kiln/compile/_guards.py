"""Guards: what must hold for a trace to be reused, checked on every call by one generated function.

A trace depends on more than its tensors' values: on the structure of the arguments and every Python value
among them, each tensor's shape, strides, dtype, device and ``requires_grad``, the grad mode, the default
dtype and autocast, what the function's code reads (its globals, closure, defaults and the objects it
names: :mod:`kiln.compile._reads`), and the state of
the modules and optimizers it can reach (each submodule's ``training`` flag, its plain attributes, the
identity of its parameters and buffers; each optimizer's hyperparameters and state tensors). The guard
function checks all of that and returns the flat list of the graph's input tensors, or ``None`` when
anything differs (the caller then traces again). ``describe()`` lists the guards in words for
``kiln.compile.explain``.
"""

from __future__ import annotations

import collections
import functools
import itertools
import operator
import re
import sys
import types
from collections.abc import Callable
from typing import Any

import numpy as np

import kiln

__all__ = ["GuardBuilder", "first_failure", "flatten", "holds_relaxed", "mismatch", "reduced"]

_SCALARS = (int, float, bool, str, type(None), complex)


def flatten(obj: Any, out: list, paths: list | None = None, path: str = "") -> None:
    """The leaves of ``obj`` (tuples, lists and dicts followed) appended to ``out``, in order; with ``paths``,
    each leaf's path from ``path`` (``L['x'][0]['image']``) appended to it in step."""
    if type(obj) in (tuple, list):
        for i, x in enumerate(obj):
            flatten(x, out, paths, f"{path}[{i}]" if paths is not None else path)
    elif type(obj) is dict:
        for k, x in obj.items():
            flatten(x, out, paths, f"{path}[{k!r}]" if paths is not None else path)
    else:
        out.append(obj)
        if paths is not None:
            paths.append(path)


_PLAIN_TYPES = (*_SCALARS, kiln.dtype, kiln.device)
# the exact types by id (a class need not be hashable: a metaclass may define __eq__ alone); these classes
# live as long as the process, so their ids stay theirs
_PLAIN_IDS = frozenset(map(id, _PLAIN_TYPES))
_NOT_PLAIN_IDS = frozenset(map(id, (dict, collections.OrderedDict, list, set, kiln.Tensor)))  # a module's own


def _plain(v: Any) -> bool:
    """A value a guard compares by value: a Python scalar, a dtype, a device, or a tuple (a ``kiln.Size``)
    of them."""
    t = id(type(v))
    if t in _PLAIN_IDS:  # the exact types first: every guarded call tests each attribute of each module
        return True
    if type(v) is tuple or type(v) is kiln.Size:  # (self.in_shape = x.shape: equal sizes, new objects)
        return all(_plain(x) for x in v)
    return t not in _NOT_PLAIN_IDS and isinstance(v, _PLAIN_TYPES)


def module_class():
    nn = sys.modules.get("kiln.nn")
    return getattr(nn, "Module", None)


def _optimizer_class():
    optim = sys.modules.get("kiln.optim")
    return getattr(optim, "Optimizer", None)


_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def module_state(module) -> tuple:
    """What a trace of ``module`` depends on besides its tensors' values: per submodule, its class, training
    flag, plain attributes (by value), tensor attributes that are neither parameters nor buffers (by
    identity: a trace reads such a tensor by reference, so another one put there must re-trace), the
    entries of its own lists and dicts (plain ones by value, others by identity: ``self.masks[0]``; one of
    more than ``_LIMIT`` entries by its identity and length only), any other attribute by identity (a
    function), the identity of its parameters and buffers, and its hooks (their keys and identities).
    Identities are unique only among living objects: compare states through :class:`ModuleStateGuard`,
    which keeps the traced ones alive."""
    out = []
    internal = _module_internals()
    for sub in _submodules(module):
        d = sub.__dict__
        attrs = []
        for k, v in d.items():  # private ones too (self._scale)
            if _plain(v):
                attrs.append((k, v))
            elif isinstance(v, kiln.Tensor):
                attrs.append((k, _TENSOR, id(v)))
            elif k in internal:
                continue
            elif isinstance(v, _CONTAINERS) and len(v) > _LIMIT:  # (a vocabulary: its object and length)
                attrs.append((k, _OBJECT, id(v), len(v)))
            elif isinstance(v, (set, frozenset)):  # (in any order)
                attrs.append((k, _ENTRIES, _set_state(v)))
            elif isinstance(v, _CONTAINERS):
                attrs.append((k, _ENTRIES, tuple(x if _plain(x) else (_ENTRIES, id(x)) for x in _entries(v))))
            else:  # a function (self.act = torch.relu; a replaced forward), a submodule's config object
                attrs.append((k, _OBJECT, id(v)))
        params = tuple(id(p) for p in d.get("_parameters", {}).values())
        buffers = tuple(id(b) for b in d.get("_buffers", {}).values())
        # its hooks: their keys and the functions themselves (one replaced under its key is another)
        hooks = tuple((tuple(h), tuple(map(id, h.values()))) for h in map(d.get, _HOOKS, _NO_HOOKS))
        out.append((type(sub), sub.training, tuple(attrs), params, buffers, hooks))
    return tuple(out)


_TENSOR = "tensor"  # marks a tensor attribute's identity among the attributes' values
_OBJECT = "object"  # marks another object's identity among them
_ENTRIES = "entries"  # marks a list's or dict's entries, and an entry's identity among them
# lists, tuples, dicts and sets, their subclasses too (an OrderedDict, a namedtuple); a tuple of plain values is
# itself plain
_CONTAINERS = (list, tuple, dict, set, frozenset)
_NO_HOOKS = ({},) * len(_HOOKS)


def _entries(v, depth: int = 0) -> list:
    """A list's, tuple's or set's entries, or a dict's keys and values in order, each nested container
    followed by its own entries (four levels: ``self.masks["a"][0]``)."""
    items = [x for item in v.items() for x in item] if isinstance(v, dict) else list(v)
    if depth >= 4 or not any(isinstance(x, _CONTAINERS) for x in items):
        return items
    out = []
    for x in items:
        out.append(x)
        if isinstance(x, _CONTAINERS):
            out += _entries(x, depth + 1)
    return out


@functools.cache
def _module_internals() -> frozenset:
    """The attributes every module has (its parameters, buffers, submodules and hooks: guarded apart)."""
    cls = module_class()
    return frozenset() if cls is None else frozenset(cls().__dict__)


class ModuleStateGuard:
    """``guard(module)``: whether :func:`module_state` of ``module`` is what it was when the guard was made.

    Each call first compares identities, which holds on every call of a module nobody changed: each submodule
    with the same class, its attribute names holding the very same objects (the guard keeps them alive, so an
    identity cannot be reused by another object), and the dicts it keeps its submodules, parameters, buffers
    and hooks in holding the same keys and the very same objects. Those dicts hold the whole tree, so the
    submodules are not walked again, and every dict of every submodule is compared in one pass of each kind
    (sizes, objects, keys). Only when that fails is the whole state compared by value (an attribute set again
    to an equal new number passes there, and its identities are recorded again). A 3-module MLP's check:
    about 10 us (12.6 us when each submodule was checked apart), against 17 us by value.

    The classes of the submodules, ``kiln.nn.Module`` included, must hold the very same attributes too, on
    every call: a class attribute or method changed after the trace (``Model.scale = 3.0``,
    ``nn.Module.gain = 2.0``) traces again."""

    __slots__ = (
        "state",
        "root",
        "subs",
        "types",
        "maps",
        "map_sizes",
        "map_values",
        "dicts",
        "tree",
        "entries",
        "held",
    )

    def __init__(self, module) -> None:
        self.state = module_state(module)
        subs = _submodules(module)
        # (a class's attributes, the objects they held, kept alive)
        self.maps = tuple(vars(c) for c in _module_classes(subs))
        self.map_sizes = tuple(map(len, self.maps))
        self.map_values = tuple(v for mp in self.maps for v in mp.values())
        self._identify(module, subs)

    def _identify(self, module, subs: list) -> None:
        """Record the identities the cheap check compares (again after a call that passed by value: an equal
        new number, say, passes by identity from then on)."""
        internal = _module_internals()
        self.root, self.subs, self.types = module, tuple(subs), tuple(map(type, subs))
        self.dicts = tuple(sub.__dict__ for sub in subs)
        inner = [v for d in self.dicts for k, v in d.items() if k in _INNER and isinstance(v, dict)]
        self.tree = _Held([*self.dicts, *inner])
        self.entries, self.held = [], []
        for d in self.dicts:
            # the entries of its own lists and dicts, kept alive too: they change in place
            mine = [(k, v) for k, v in d.items() if isinstance(v, _CONTAINERS) and k not in internal]
            held = [(k, _entries(v)) for k, v in mine if len(v) <= _LIMIT]
            self.held.append(held)
            # per container, its entries' identities; a larger one's length alone (as module_state has it)
            self.entries += [(d, k, tuple(map(id, entries))) for k, entries in held]
            self.entries += [(d, k, len(v)) for k, v in mine if len(v) > _LIMIT]

    def __call__(self, module) -> bool:
        # (a class attribute added, removed or set: another count or object)
        if tuple(map(len, self.maps)) != self.map_sizes or not all(
            map(operator.is_, _chain(map(_MAPPING.values, self.maps)), self.map_values)
        ):
            return False
        if (
            module is self.root
            and tuple(map(type, self.subs)) == self.types
            and all(map(operator.is_, map(_DICT, self.subs), self.dicts))  # (a __dict__ replaced whole)
            and self.tree.same()
            and not any(_container_ids(d[k], e) != e for d, k, e in self.entries)
        ):
            return True
        if module_state(module) != self.state:
            return False
        self._identify(module, _submodules(module))
        return True


_DICT = operator.attrgetter("__dict__")
_MAPPING = types.MappingProxyType


class _Held:
    """The identities of some dicts and lists: their sizes, their keys and the objects they hold, each
    compared in one pass over all of them (``same()``); the objects are kept alive, so that no other object
    can take an identity."""

    __slots__ = ("dicts", "lists", "sizes", "keys", "values")

    def __init__(self, dicts, lists=()) -> None:
        self.dicts, self.lists = tuple(dicts), tuple(lists)
        self.sizes = tuple(map(len, (*self.dicts, *self.lists)))
        self.keys = tuple(_chain(self.dicts))
        self.values = tuple(_chain((*map(dict.values, self.dicts), *self.lists)))

    def same(self) -> bool:
        """Whether every dict and list still holds the very same keys and objects, in the same order."""
        return (
            tuple(map(len, (*self.dicts, *self.lists))) == self.sizes
            and all(map(operator.is_, _chain(self.dicts), self.keys))
            and all(map(operator.is_, _chain((*map(dict.values, self.dicts), *self.lists)), self.values))
        )


_INNER = frozenset({"_modules", "_parameters", "_buffers", *_HOOKS})  # the dicts a module keeps its tree in
_chain = itertools.chain.from_iterable


def _container_ids(v, was):
    """What :class:`ModuleStateGuard` compares of a module's own container: its entries' identities, or, for
    one of more than ``_LIMIT`` entries (``was`` an int), its length."""
    return len(v) if type(was) is int else tuple(map(id, _entries(v)))


def _submodules(module) -> list:
    """``module.modules()``: the module and every submodule once, depth first in registration order, read
    from the ``_modules`` dicts directly (a guard reads them on every call; ``named_modules`` builds a
    dotted name per module)."""
    out, seen, todo = [], set(), [module]
    while todo:
        m = todo.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        out.append(m)
        children = m.__dict__.get("_modules")
        if children:
            todo += [c for c in reversed(children.values()) if c is not None]
    return out


def optimizer_state(opt) -> tuple:
    """An optimizer's hyperparameters (every plain value of every group, and its tensor ones by identity),
    the identity of each group's parameters and of its state. Compare states through
    :class:`OptimizerStateGuard`, which keeps the objects whose identities it holds alive."""
    groups = tuple((tuple(map(id, g["params"])), tuple(_hyperparameters(g))) for g in opt.param_groups)
    state = tuple((id(p), tuple((k, id(v)) for k, v in s.items())) for p, s in opt.state.items())
    return (groups, state)


def _hyperparameters(group: dict):
    """A parameter group's plain values by value, its tensor ones (``lr=kiln.tensor(0.1)``) by identity."""
    for k, v in group.items():
        if k != "params" and _plain(v):
            yield (k, v)
        elif isinstance(v, kiln.Tensor):
            yield (k, _TENSOR, id(v))


class OptimizerStateGuard:
    """``guard(opt)``: whether :func:`optimizer_state` of ``opt`` is what it was when the guard was made (a
    parameter appended to a group, a hyperparameter or a state tensor changed traces again).

    As :class:`ModuleStateGuard`, each call first compares identities: the same group list and state dict,
    each group, its parameter list and each parameter's state holding the very same keys and objects. Only
    when that fails is the state compared by value (a learning rate set again to an equal new number)."""

    __slots__ = ("state", "root", "groups", "opt_state", "contents")

    def __init__(self, opt) -> None:
        self.state = optimizer_state(opt)
        self._identify(opt)

    def _identify(self, opt) -> None:
        """Record the identities the cheap check compares (its record keeps every object alive that the state
        holds by identity); again after a call that passed by value."""
        self.root, self.groups, self.opt_state = opt, opt.param_groups, opt.state
        lists = [self.groups] + [g["params"] for g in self.groups if isinstance(g.get("params"), list)]
        dicts = [*self.groups, self.opt_state, *(s for s in self.opt_state.values() if isinstance(s, dict))]
        self.contents = _Held([d for d in dicts if isinstance(d, dict)], lists)

    def __call__(self, opt) -> bool:
        if (
            opt is self.root
            and opt.param_groups is self.groups
            and opt.state is self.opt_state
            and self.contents.same()
        ):
            return True
        if optimizer_state(opt) != self.state:
            return False
        self._identify(opt)
        return True


_LIMIT = 4096
"""The most entries of a container (or elements of a NumPy array) a guard compares; a function that reads
a larger one cannot be guarded and runs eagerly (``kiln.compile.explain`` says why)."""

_MISSING = object()


class Unguardable(Exception):
    """What a function reads cannot be guarded (too large to compare on every call)."""


def _module_classes(modules: list) -> list[type]:
    """The distinct classes of ``modules`` and their bases up to ``nn.Module`` (``object`` left out), told
    apart by identity (a class need not be hashable)."""
    found: dict[int, type] = {}
    for m in modules:
        for c in type(m).__mro__:
            if c is not object:
                found.setdefault(id(c), c)
    return list(found.values())


def _slots(cls: type) -> list[str]:
    """The ``__slots__`` names of ``cls`` and its bases."""
    out = []
    for c in cls.__mro__:
        names = c.__dict__.get("__slots__", ())
        out += [names] if isinstance(names, str) else list(names)
    return out


def _class_attribute(cls: type, name: str) -> Any:
    """``name`` as found in the dicts along ``cls``'s MRO, descriptors unresolved (``_MISSING`` if absent)."""
    for c in cls.__mro__:
        if name in c.__dict__:
            return c.__dict__[name]
    return _MISSING


def _static_attribute(obj: Any, name: str) -> Any:
    """What ``obj.name`` is looked up as, without running it: the instance's own value, else the class's
    (a function, a property, a class attribute), else ``_MISSING``. A guard compares its identity: another
    method, property or instance attribute put there traces again."""
    d = _instance_dict(obj)
    if d is not None and name in d:
        return d[name]
    return _class_attribute(type(obj), name)


def _instance_dict(obj: Any) -> dict | None:
    """``obj``'s own ``__dict__``, read past any ``__getattr__`` (one that raises ``KeyError`` too), or
    None when it has none."""
    try:
        d = object.__getattribute__(obj, "__dict__")
    except Exception:  # noqa: BLE001 - no instance dict (slots), or a descriptor that raises
        return None
    return d if isinstance(d, dict) else None


def _default(f: types.FunctionType, key: int | str) -> Any:
    """Default ``key`` of ``f`` (an index into its positional defaults, or a keyword-only name), or
    ``_MISSING`` once they changed shape."""
    try:
        return f.__defaults__[key] if type(key) is int else f.__kwdefaults__[key]
    except (IndexError, KeyError, TypeError):
        return _MISSING


def _set_state(v) -> frozenset:
    """A set's entries: each Python value by value, anything else by identity."""
    return frozenset(x if _plain(x) else (_OBJECT, id(x)) for x in v)


def _same_array(a, b) -> bool:
    return type(a) is np.ndarray and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)


class GuardBuilder:
    """Collects the guards of one trace and generates their check."""

    def __init__(self) -> None:
        self.lines: list[tuple[bool, str]] = []  # (late, source line)
        self.conditions: list[str] = []
        self.words: list[str] = []
        self.consts: dict[str, Any] = {}
        self.argument_objects: list[tuple[Any, str]] = []  # non-plain argument leaves, by path
        self.input_meta: list[tuple[int, tuple, tuple | None]] = []  # per input tensor: (its metadata guard's
        # index, metadata, marks: :func:`_mark_spec`)
        self.kept: list[int] = []  # the guards skip_guard_eval_unsafe tests too (see :func:`reduced`)

    def const(self, value: Any) -> str:
        """A name the generated code reads ``value`` by."""
        name = f"c{len(self.consts)}"
        self.consts[name] = value
        return name

    def equals(self, path: str, v: Any) -> str:
        """The condition that the Python value at ``path`` is ``v``: of its exact type, and equal (NaN, which
        equals nothing, as NaN)."""
        if v != v:  # (a NumPy float64 or a complex NaN too: told apart by its text)
            return f"type({path}) is {self.const(type(v))} and repr({path}) == {self.const(repr(v))}"
        return f"type({path}) is {self.const(type(v))} and {path} == {self.const(v)}"

    def check(self, condition: str, words: str, *, late: bool = False, kept: bool = False) -> None:
        """Add ``condition`` (a Python expression over ``args`` and ``kwargs``) as a guard, described by ``words``.
        A ``late`` one (costly: a module tree's state) is tested after every other, so that a call another
        entry serves is turned away by the cheap ones first. A ``kept`` one is tested under
        ``set_stance(skip_guard_eval_unsafe=True)`` too (:func:`reduced`)."""
        if kept:
            self.kept.append(len(self.conditions))
        self.lines.append((late, f"    if not ({condition}): return None"))
        self.conditions.append(condition)
        self.words.append(words)

    def structure(self, obj: Any, path: str, tensors: list[str]) -> None:
        """Guards on the arguments at ``path``: containers' types, lengths and keys; every leaf by its kind.
        ``tensors`` collects the expressions of the tensor leaves, in :func:`flatten`'s order."""
        t = type(obj)
        if t in (tuple, list):
            self.check(
                f"type({path}) is {self.const(t)} and len({path}) == {len(obj)}",
                f"{path} is a {t.__name__} of {len(obj)}",
                kept=True,
            )
            for i, x in enumerate(obj):
                self.structure(x, f"{path}[{i}]", tensors)
        elif t is dict:
            keys = tuple(obj)
            self.check(
                f"type({path}) is dict and tuple({path}) == {self.const(keys)}", f"{path} has keys {keys}", kept=True
            )
            for k, x in obj.items():
                self.structure(x, f"{path}[{self.const(k)}]", tensors)
        elif isinstance(obj, kiln.Tensor):
            self.input_meta.append((len(self.conditions), *self.tensor(obj, path, path, kept=True)))
            tensors.append(path)
        elif obj is None:
            self.check(f"{path} is None", f"{path} is None")
        elif _plain(obj):
            self.check(self.equals(path, obj), f"{path} == {obj!r}")
        else:
            # kept (as every identity guard): a trace reads another object's tensors by reference, stale there
            self.check(f"{path} is {self.const(obj)}", f"{path} is the same {t.__name__} object", kept=True)
            self.argument_objects.append((obj, path))

    def tensor(self, t: kiln.Tensor, expr: str, label: str, kept: bool = False) -> tuple:
        """Guards on one tensor's class, dtype, device, shape, strides, offset, ``requires_grad`` and the marks
        of ``kiln._dynamo.mark_dynamic`` and its kin on it (:func:`_meta`; ``kept``: see :meth:`check`);
        returns that metadata and the marks (:func:`_mark_spec`)."""
        marks = _mark_spec(t)
        if marks is None:  # (the usual case: one call, and a new mark on the tensor fails it)
            meta = _meta(t)
            test = f"_meta({expr}) == {self.const(meta)}"
        else:
            meta = _meta_marked(t, marks)
            test = f"_meta_marked({expr}, {self.const(marks)}) == {self.const(meta)}"
        self.check(test, f"{label}: {_describe_meta(meta)}", kept=kept)
        return meta, marks

    def grad_hooks(self, t: kiln.Tensor, expr: str, label: str) -> None:
        """For a leaf that requires grad, a guard on its gradient hooks (:func:`_grad_hooks`): for a trace that
        ran backward inside it (outside, the engine runs the hooks a leaf has at the time)."""
        if t.requires_grad and t.grad_fn is None:
            hooks = _grad_hooks(t)
            self.check(
                f"_grad_hooks({expr}) == {self.const(hooks)}", f"{label}: its {len(hooks[0]) + len(hooks[1])} hooks"
            )

    def object_state(self, obj: Any) -> None:
        """Guards on a module's or an optimizer's state (see :func:`module_state`)."""
        module_cls = module_class()
        if module_cls is not None and isinstance(obj, module_cls):
            what = f"the state of module {type(obj).__name__} (training flags, attributes, parameters)"
            self.check(f"{self.const(ModuleStateGuard(obj))}({self.const(obj)})", what, late=True)
        else:
            what = f"the parameters, hyperparameters and state of optimizer {type(obj).__name__}"
            self.check(f"{self.const(OptimizerStateGuard(obj))}({self.const(obj)})", what, late=True)

    def build(self, tensors: list[str]) -> Callable:
        """The guard function ``(args, kwargs) -> list of input tensors | None``."""
        body = "\n".join(line for _late, line in sorted(self.lines, key=lambda x: x[0])) or "    pass"
        src = f"def guard(args, kwargs):\n{body}\n    return [{', '.join(tensors)}]\n"
        ns = dict(self.consts)
        ns.update(
            _meta=_meta,
            _meta_marked=_meta_marked,
            _grad_hooks=_grad_hooks,
            _MISSING=_MISSING,
            _same_array=_same_array,
            _default=_default,
            _set_state=_set_state,
            _static_attribute=_static_attribute,
            _class_attribute=_class_attribute,
        )
        exec(compile(src, "<kiln.compile guards>", "exec"), ns)  # noqa: S102 - our own generated source
        fn = ns["guard"]
        fn.source = src
        checks = [eval(f"lambda args, kwargs: {c}", ns) for c in self.conditions]
        fn.failures = lambda args, kwargs: [w for w, c in zip(self.words, checks) if not _holds(c, args, kwargs)]
        # for the stances (kiln.compiler.set_stance): each guard alone, in the order the function tests them
        fn.checks, fn.words, fn.input_meta = checks, list(self.words), list(self.input_meta)
        fn.order = [i for i, _ in sorted(enumerate(self.lines), key=lambda x: x[1][0])]
        fn.keys = [_CONST_NAME.sub("c", c) for c in self.conditions]  # the same guard in another trace: same key
        fn.tensor_at = [eval(f"lambda args, kwargs: {e}", ns) for e in tensors]
        fn.kept, fn.conditions, fn.namespace, fn.tensors = frozenset(self.kept), list(self.conditions), ns, tensors
        fn.reduced = {}  # keys -> function: see reduced()
        return fn


_CONST_NAME = re.compile(r"\bc\d+\b")


def first_failure(guard: Callable, args, kwargs, skip: frozenset = frozenset()) -> int | None:
    """The index of the first guard of ``guard`` (a built guard function) that fails on the call, in the order
    the function tests them, leaving out the guards ``skip``; None if all hold (or if ``guard`` is another
    function, which tells nothing)."""
    for i in getattr(guard, "order", ()):
        if i not in skip and not _holds(guard.checks[i], args, kwargs):
            return i
    return None


def reduced(guard: Callable, keys: frozenset) -> Callable:
    """``guard`` testing only its kept guards (the call's structure and its tensors' metadata, the tensors read
    by reference's, grad mode and the like, how the tensors share memory: what the compiled code relies on)
    and those whose key (the condition with its constants' names left out) is in ``keys``: the guard
    ``set_stance(skip_guard_eval_unsafe=True)`` runs. Made once per set of keys."""
    if not hasattr(guard, "order"):  # (another function put there: all of it)
        return guard
    made = guard.reduced.get(keys)
    if made is not None:
        return made
    tested = [i for i in guard.order if i in guard.kept or guard.keys[i] in keys]
    body = "".join(f"    if not ({guard.conditions[i]}): return None\n" for i in tested)
    src = f"def guard(args, kwargs):\n{body}    return [{', '.join(guard.tensors)}]\n"
    ns = dict(guard.namespace)
    exec(compile(src, "<kiln.compile guards>", "exec"), ns)  # noqa: S102 - our own generated source
    if len(guard.reduced) > 3:  # (the keys only grow: the kept guards alone, and the latest keys)
        guard.reduced = {k: f for k, f in guard.reduced.items() if not k}
    guard.reduced[keys] = ns["guard"]
    return ns["guard"]


def holds_relaxed(guard: Callable, args, kwargs, ok: Callable[[int, int, int], bool]) -> bool:
    """Whether ``guard`` holds on the call but for sizes of its input tensors that ``ok(position, dim, size)``
    allows (their strides may differ then, a contiguous tensor's being contiguous)."""
    if not hasattr(guard, "order"):  # (another function put there: it tells nothing)
        return False
    metas = {ci: (pos, meta, marks) for pos, (ci, meta, marks) in enumerate(guard.input_meta)}
    for i in guard.order:
        if i not in metas:
            if not _holds(guard.checks[i], args, kwargs):
                return False
            continue
        pos, old, marks = metas[i]
        try:
            new = _meta_of(guard.tensor_at[pos](args, kwargs), marks)
        except Exception:  # noqa: BLE001 - another structure of arguments
            return False
        if new[:3] != old[:3] or new[5:] != old[5:] or len(new[3]) != len(old[3]):
            return False
        if any(a != b and not ok(pos, d, a) for d, (a, b) in enumerate(zip(new[3], old[3]))):
            return False
        if new[4] != old[4] and (new[4] != _contiguous(new[3]) or old[4] != _contiguous(old[3])):
            return False
    return True


def _contiguous(shape: tuple) -> tuple:
    from kiln.compile._graph import contiguous_strides

    return contiguous_strides(tuple(shape))


def mismatch(guard: Callable, args, kwargs, names: list[str]) -> str | None:
    """Why ``guard`` fails on the call, in PyTorch's words for an input tensor (``tensor 'x' size mismatch at
    index 0. expected 4, actual 5``; ``names``: the input tensors' names), else the guard's; None if it holds."""
    i = first_failure(guard, args, kwargs)
    if i is None:
        return None
    for pos, (ci, old, marks) in enumerate(guard.input_meta):
        if ci == i:
            try:
                t = guard.tensor_at[pos](args, kwargs)
                new = _meta_of(t, marks)
            except Exception:  # noqa: BLE001 - another structure of arguments
                break
            if new[:7] == old[:7]:  # (the marks differ)
                return _marks_changed(t, marks)
            return f"tensor '{names[pos]}' {_changed(new, old)}"
    return f"{guard.words[i]}: no longer holds"


def _marks_changed(t: kiln.Tensor, marks: tuple | None) -> str:
    """How the marks on ``t`` differ from the traced ones (``marks``: :func:`_mark_spec`), in PyTorch's words."""
    if marks is None:
        return "_has_dynamo_dim_marking is present on runtime tensor but was absent at compile time"
    for name, traced in marks:
        found = getattr(t, name, None)
        if traced is None and hasattr(t, name):
            return f"{name} is present on runtime tensor but was absent at compile time"
        if traced is not None and found is not None and not set(found) <= traced:
            return f"{name} not a subset: runtime {set(found)} is not a subset of compiled {set(traced)}"
    return "the dimension marks differ"


def _changed(new: tuple, old: tuple) -> str:
    """What differs between two tensors' metadata (:func:`_meta`), as PyTorch words a tensor guard's failure."""
    labels = ("type", "dtype", "device")
    for k, label in enumerate(labels):
        if new[k] != old[k]:
            show = (lambda c: c.__name__) if k == 0 else str
            return f"{label} mismatch. expected {show(old[k])}, actual {show(new[k])}"
    if new[6] != old[6]:
        return f"requires_grad mismatch. expected requires_grad={int(old[6])}"
    if len(new[3]) != len(old[3]):
        return f"rank mismatch. expected {len(old[3])}, actual {len(new[3])}"
    for label, a, b in (("size", new[3], old[3]), ("stride", new[4], old[4])):
        for d, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return f"{label} mismatch at index {d}. expected {y}, actual {x}"
    return f"storage offset mismatch. expected {old[5]}, actual {new[5]}"


def _holds(check: Callable, args, kwargs) -> bool:
    try:
        return bool(check(args, kwargs))
    except Exception:  # noqa: BLE001 - an earlier guard (a structure one) fails too, and is the one reported
        return False


_MARKS = ("_dynamo_dynamic_indices", "_dynamo_weak_dynamic_indices", "_dynamo_static_indices")
"""The attributes ``kiln._dynamo.mark_dynamic``, ``maybe_mark_dynamic`` and ``mark_static`` set (PyTorch's)."""
_MARKED = frozenset((*_MARKS, "_has_dynamo_dim_marking"))


def _meta(t: kiln.Tensor) -> tuple:
    """What a trace's guard tests of a tensor: its class, dtype, device, shape, strides, offset,
    ``requires_grad``, whether it is an inference tensor (a program writing into one outside inference mode
    would write before the write's error) and, last, whether it has no mark (a trace of an unmarked tensor does
    not serve a marked one, as in PyTorch). Read from the tensor's fields: the guard of every call reads it."""
    d = t.__dict__
    return (
        type(t),
        t._dtype,
        t._device,
        t._shape,
        t._stride,
        t._offset,
        t.requires_grad,
        t._inference,
        not d or _MARKED.isdisjoint(d),
    )


def _meta_marked(t: kiln.Tensor, marks: tuple) -> tuple:
    """:func:`_meta` for a trace of a marked tensor: last, whether ``t``'s marks are ones the trace allows
    (``marks``: :func:`_mark_spec`). As in PyTorch, each mark attribute the traced tensor had may be missing or
    hold a subset of its indices, and one it had not must be missing."""
    ok = True
    for name, traced in marks:
        found = getattr(t, name, None)
        if traced is None:
            ok = ok and not hasattr(t, name)
        elif found is not None:
            ok = ok and set(found) <= traced
    return (*_meta(t)[:-1], ok)


def _mark_spec(t: kiln.Tensor) -> tuple | None:
    """None for a tensor without marks; else, per mark attribute (:data:`_MARKS`), the indices it holds, or
    None where the tensor lacks it."""
    d = t.__dict__
    if not d or _MARKED.isdisjoint(d):
        return None
    return tuple((name, frozenset(d[name]) if name in d else None) for name in _MARKS)


def _meta_of(t: kiln.Tensor, marks: tuple | None) -> tuple:
    return _meta(t) if marks is None else _meta_marked(t, marks)


def _grad_hooks(t: kiln.Tensor) -> tuple:
    """A leaf's gradient hooks and post-accumulate-grad hooks, the functions themselves: a trace whose
    backward ran inside it ran the hooks the leaf had then, so another set must trace again."""
    ref = t._accumulator
    post = ref.post_hooks if ref is not None else None
    return (tuple(t._hooks) if t._hooks else (), tuple(post) if post else ())


def _describe_meta(meta: tuple) -> str:
    cls, dtype, device, shape, stride, offset, rg, inference, _unmarked = meta
    return (
        f"{cls.__name__} {dtype} on {device}, shape {list(shape)}, strides {stride}, offset {offset}, requires_grad={rg}"
        + (", an inference tensor" if inference else "")
    )


def global_state() -> tuple:
    """The global settings a trace depends on: grad and inference mode, the default dtype, autocast."""
    autocast = tuple((dev, kiln.is_autocast_enabled(dev), kiln.get_autocast_dtype(dev)) for dev in ("cpu", "cuda"))
    return (kiln.is_grad_enabled(), kiln.is_inference_mode_enabled(), kiln.get_default_dtype(), autocast)
