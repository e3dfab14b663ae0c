"""Guards: what must hold for a trace to be reused, checked on every call by one generated function.

A trace depends on more than its tensors' values: on the structure of the arguments and every Python value
among them, each tensor's shape, strides, dtype, device and ``requires_grad``, the grad mode, the default
dtype and autocast, the Python numbers the function reads from its globals and closure, and the state of
the modules and optimizers it can reach (each submodule's ``training`` flag, its plain attributes, the
identity of its parameters and buffers; each optimizer's hyperparameters and state tensors). The guard
function checks all of that and returns the flat list of the graph's input tensors, or ``None`` when
anything differs (the caller then traces again). ``describe()`` lists the guards in words for
``kiln.compile.explain``.
"""

from __future__ import annotations

import array
import collections
import functools
import operator
import os
import random
import sys
import sysconfig
import types
from collections.abc import Callable
from typing import Any

import numpy as np

import kiln

__all__ = ["GuardBuilder", "flatten", "python_state", "user_file"]

_SCALARS = (int, float, bool, str, type(None), complex)


def flatten(obj: Any, out: list) -> None:
    """The leaves of ``obj`` (tuples, lists and dicts followed) appended to ``out``, in order."""
    if type(obj) in (tuple, list):
        for x in obj:
            flatten(x, out)
    elif type(obj) is dict:
        for x in obj.values():
            flatten(x, out)
    else:
        out.append(obj)


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
    function), the identity of its parameters and buffers, and its hooks. Identities are unique only among
    living objects: compare states through :class:`ModuleStateGuard`, which keeps the traced ones alive."""
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
        hooks = tuple(map(tuple, map(d.get, _HOOKS, _NO_HOOKS)))
        out.append((type(sub), sub.training, tuple(attrs), params, buffers, hooks))
    return tuple(out)


_TENSOR = "tensor"  # marks a tensor attribute's identity among the attributes' values
_OBJECT = "object"  # marks another object's identity among them
_ENTRIES = "entries"  # marks a list's or dict's entries, and an entry's identity among them
# lists, tuples, dicts and sets, their subclasses too (an OrderedDict, a namedtuple); a tuple of plain values is
# itself plain
_CONTAINERS = (list, tuple, dict, set, frozenset)
_NO_HOOKS = ((),) * len(_HOOKS)


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

    Each call first compares identities, which holds on every call of a module nobody changed: the same
    submodules, each with the same class, the same attribute names holding the very same objects (the guard
    keeps them alive, so an identity cannot be reused by another object), the same parameters, buffers and
    hooks. Only when that fails is the whole state compared by value (an attribute set again to an equal
    new number passes there). A 3-module MLP's check: about 13 us, against 17 us by value.

    The classes of the submodules, ``kiln.nn.Module`` included, must hold the very same attributes too, on
    every call: a class attribute or method changed after the trace (``Model.scale = 3.0``,
    ``nn.Module.gain = 2.0``) traces again."""

    __slots__ = ("state", "subs", "classes")

    def __init__(self, module) -> None:
        self.state = module_state(module)
        internal = _module_internals()
        self.subs = []
        subs = _submodules(module)
        # (a class's attributes, the objects they held, kept alive)
        self.classes = [(vars(c), tuple(vars(c).values())) for c in _module_classes(subs)]
        for sub in subs:
            d = sub.__dict__
            # the entries of its own lists and dicts, kept alive too: they change in place
            mine = [(k, v) for k, v in d.items() if isinstance(v, _CONTAINERS) and k not in internal]
            held = [(k, _entries(v)) for k, v in mine if len(v) <= _LIMIT]
            # per container, its entries' identities; a larger one's length alone (as module_state has it)
            ids = tuple((k, tuple(map(id, entries))) for k, entries in held)
            ids += tuple((k, len(v)) for k, v in mine if len(v) > _LIMIT)
            # its parameters and buffers too: their identities are compared
            kept = (tuple(d.values()), held, *(tuple(d.get(n, {}).values()) for n in ("_parameters", "_buffers")))
            self.subs.append((sub, type(sub), kept, _identities(sub), ids))

    def __call__(self, module) -> bool:
        for attrs, held in self.classes:  # (an attribute added, removed or set: another count or object)
            if len(attrs) != len(held) or not all(map(operator.is_, attrs.values(), held)):
                return False
        subs = _submodules(module)
        if len(subs) == len(self.subs):
            for sub, (was, cls, _kept, ids, entry_ids) in zip(subs, self.subs):
                if sub is not was or type(sub) is not cls or _identities(sub) != ids:
                    break
                d = sub.__dict__
                if entry_ids and any(_container_ids(d[k], e) != e for k, e in entry_ids):
                    break
            else:
                return True
        return module_state(module) == self.state


def _container_ids(v, was):
    """What :class:`ModuleStateGuard` compares of a module's own container: its entries' identities, or, for
    one of more than ``_LIMIT`` entries (``was`` an int), its length."""
    return len(v) if type(was) is int else tuple(map(id, _entries(v)))


def _identities(sub) -> tuple:
    """The identities a submodule's state is made of: its attribute names, the objects they hold, and its
    parameters', buffers' and hooks' (containers the module keeps in its attributes and changes in place)."""
    d = sub.__dict__
    return (
        tuple(d),
        tuple(map(id, d.values())),
        tuple(map(id, d.get("_parameters", {}).values())),
        tuple(map(id, d.get("_buffers", {}).values())),
        tuple(map(tuple, map(d.get, _HOOKS, _NO_HOOKS))),  # (map: no Python frame per hook dict)
    )


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
    parameter appended to a group, a hyperparameter or a state tensor changed traces again)."""

    __slots__ = ("state", "held")

    def __init__(self, opt) -> None:
        self.state = optimizer_state(opt)
        self.held = ([dict(g) for g in opt.param_groups], [(p, dict(s)) for p, s in opt.state.items()])

    def __call__(self, opt) -> bool:
        return optimizer_state(opt) == self.state


_LIMIT = 4096
"""The most entries of a container (or elements of a NumPy array) a guard compares; a function that reads
a larger one cannot be guarded and runs eagerly (``kiln.compile.explain`` says why)."""

_MISSING = object()


class Unguardable(Exception):
    """What a function reads cannot be guarded (too large to compare on every call)."""


def _functions(fn: Callable, module_cls) -> tuple[Any, list]:
    """(the ``self`` of a bound method, the Python functions whose code a call of ``fn`` runs and kiln can
    see: the function, a module's ``forward``)."""
    func = getattr(fn, "__func__", fn)
    owner = getattr(fn, "__self__", None)
    if owner is None and not isinstance(func, (types.FunctionType, type)):
        call = _class_attribute(type(fn), "__call__")
        if isinstance(call, types.FunctionType):  # a callable object: its __call__'s code, with it as self
            owner, func = fn, call
    funcs = [func]
    if module_cls is not None and isinstance(owner, module_cls):  # a module's call: its forward's code too
        funcs.append(getattr(type(owner).forward, "__func__", type(owner).forward))
    return owner, [f for f in funcs if getattr(f, "__code__", None) is not None]


def _helpers(funcs: list) -> list:
    """``funcs`` and the user functions their code reaches by name, transitively: those found in globals and
    closures (of the same module, defined inside another function, or imported from another user module)
    and those of a user module the code names (``helpers.apply(x)``)."""
    seen = {id(f): f for f in funcs}
    todo = list(funcs)
    while todo:
        f = todo.pop()
        g = f.__globals__
        names = _names(f.__code__)
        found = [g.get(n) for n in names]
        for cell in f.__closure__ or ():
            try:
                found.append(cell.cell_contents)
            except ValueError:  # an empty cell
                continue
        for m in [v for v in found if type(v) is types.ModuleType and user_file(getattr(v, "__file__", None))]:
            found += [m.__dict__.get(n) for n in names]
        for v in found:
            v = getattr(v, "__func__", v)
            user = isinstance(v, types.FunctionType) and (
                v.__globals__ is g or "<locals>" in v.__qualname__ or _user_code(v)
            )
            if user and id(v) not in seen and len(seen) < 64:
                seen[id(v)] = v
                todo.append(v)
    return list(seen.values())


def reachable_objects(fn: Callable, leaves: list, gb: GuardBuilder) -> list:
    """Guard what ``fn`` reads besides its arguments, and return the modules and optimizers it can reach
    (arguments, its ``self``, its defaults, a partial's bound arguments, the globals and closures it
    reads), whose state the caller guards. The attributes the code names of the object a method is bound
    to (not a module or optimizer) are guarded as an argument's are.

    Read from the code of ``fn`` and of the user functions it calls by name (:func:`_helpers`): each global
    and closure value those functions name is guarded by what it is: a Python value by value, a tensor, a
    function, a module or any other object by identity; lists, tuples and dicts by their entries, NumPy
    arrays by their contents, and the attributes those functions name of plain objects (the arguments'
    too) and of Python modules. The values are the ones the trace starts from: a container the function appends to fails
    its guard on the next call and traces again (Python runs only while tracing), until the cache limit.
    Raises :class:`Unguardable` for a container too large to compare."""
    module_cls, opt_cls = module_class(), _optimizer_class()
    kinds = tuple(c for c in (module_cls, opt_cls) if c is not None)
    objects = [x for x in leaves if kinds and isinstance(x, kinds)]
    walker = _Walker(gb, kinds, objects)
    while isinstance(fn, functools.partial):  # a partial's bound arguments are read as arguments are
        objects += [x for x in (*fn.args, *fn.keywords.values()) if kinds and isinstance(x, kinds)]
        walker.later.append((fn, gb.const(fn), "the partial compiled", False))
        fn = fn.func
    owner, funcs = _functions(fn, module_cls)
    if owner is not None and kinds and isinstance(owner, kinds):
        objects.append(owner)
    funcs = _helpers(funcs)
    for f in funcs:
        walker.add_names(_names(f.__code__))
    for f in funcs:
        walker.code(f)
    # The module trees reached, until no new one is found (a module kept in a plain list, an argument's,
    # a default's): the methods of the user's module classes (a submodule's forward, a helper method, a
    # property) and the functions they hold, read as the function's own code; then what they hold beyond
    # their own state: a config object's attributes the code names (self.cfg.scale), a NumPy array's
    # values, a module kept in a plain list (not a submodule: its own state); the object itself is guarded
    # by identity (ModuleStateGuard), as are a container's entries.
    internal = _module_internals()
    done: set[int] = set()
    pending = [(obj, path, path, True) for obj, path in gb.argument_objects]  # an argument's (opts.scale)
    if owner is not None and not (kinds and isinstance(owner, kinds)):  # a method's object: self.scale
        pending.append((owner, gb.const(owner), f"the {type(owner).__name__} the method is bound to", True))
    later = 0  # the defaults and partials' arguments walker.later lists, from here on: not read yet
    held_done: set[tuple[int, str]] = set()  # (submodule, attribute) whose objects are read
    while True:
        # (a default in a dict may be replaced: by value; in a tuple whose identity is guarded: its insides)
        pending += [(v, p, w, not changes) for v, p, w, changes in walker.later[later:] if changes or not _plain(v)]
        later = len(walker.later)
        trees = [
            o for o in walker.objects if module_cls is not None and isinstance(o, module_cls) and id(o) not in done
        ]
        done.update(map(id, trees))
        more = _helpers(_module_methods(trees, module_cls))
        for f in more:
            walker.add_names(_names(f.__code__))
        for f in more:
            walker.code(f)
        # the objects a module holds under a name the code reads (self.cfg, self.layers[0]; a metric object
        # the training loop calls outside the compiled call is not read)
        held = [
            (sub, k, v)
            for obj in walker.objects
            if module_cls is not None and isinstance(obj, module_cls)
            for sub in _submodules(obj)
            for k, v in sub.__dict__.items()
            if k in walker.names and k not in internal and (id(sub), k) not in held_done
        ]
        if not trees and not pending and not held:
            break
        for sub, k, v in held:
            held_done.add((id(sub), k))
            entries = _entries(v) if isinstance(v, _CONTAINERS) and len(v) <= _LIMIT else [v]
            for x in entries:
                if _held_object(x):
                    walker.members(x, gb.const(x), f"{type(sub).__name__}.{k}", 1)
        # defaults, a partial's bound arguments, the arguments' objects, the object a method is bound to
        for value, path, words, inside in pending:
            if inside:
                walker.members(value, path, words, 0)
            else:
                walker.value(value, path, words, 0)
        pending = []
    unique = {id(o): o for o in objects}
    return list(unique.values())


def _held_object(v: Any) -> bool:
    """Whether a module attribute's value (or an entry of its container) is an object whose insides a trace
    may read and a guard checks (:meth:`_Walker.members`, under a name the code reads): a NumPy array, a
    module (one kept in a plain list: not a submodule) or an optimizer, or a plain object with attributes
    (not a tensor, a container, a function or a class)."""
    if type(v) is np.ndarray:
        return True
    module_cls, opt_cls = module_class(), _optimizer_class()
    if any(c is not None and isinstance(v, c) for c in (module_cls, opt_cls)):
        return True
    if _plain(v) or isinstance(v, (kiln.Tensor, *_CONTAINERS, *_CODE, types.ModuleType)):
        return False
    return _instance_dict(v) is not None or bool(_slots(type(v)))


def _module_classes(modules: list) -> list[type]:
    """The distinct classes of ``modules`` and their bases up to ``nn.Module`` (``object`` left out), told
    apart by identity (a class need not be hashable)."""
    found: dict[int, type] = {}
    for m in modules:
        for c in type(m).__mro__:
            if c is not object:
                found.setdefault(id(c), c)
    return list(found.values())


# a module's methods a call does not run (construction, printing, pickling): what they name is not read
_NOT_CALLED = frozenset({"__init__", "__repr__", "__str__", "extra_repr", "__getstate__", "__setstate__"})


def _module_methods(objects: list, module_cls) -> list:
    """The functions of the modules in the trees of ``objects``: those of their classes up to ``nn.Module``
    that the user defined (methods, properties' getters, not those a call does not run: ``__init__``,
    ``extra_repr``...; kiln's own classes are left out), and the user functions the modules hold (``self.act = my_activation``, in a list too; not ``F.relu``)."""
    if module_cls is None:
        return []
    trees = [sub for obj in objects if isinstance(obj, module_cls) for sub in _submodules(obj)]
    out = []
    for c in _module_classes(trees):
        if _kiln_code(c):
            continue
        for k, v in vars(c).items():
            if k in _NOT_CALLED:
                continue
            v = v.fget if isinstance(v, property) else getattr(v, "__func__", v)
            if isinstance(v, types.FunctionType):
                out.append(v)
    internal = _module_internals()
    for sub in trees:
        d = sub.__dict__
        hooks = [h for name in _HOOKS for h in (d.get(name) or {}).values()]  # (user hooks run in the call)
        for k, v in [*d.items(), *(("hook", h) for h in hooks)]:
            if k not in internal:
                held = _entries(v) if isinstance(v, _CONTAINERS) and len(v) <= _LIMIT else [v]
                funcs = (getattr(x, "__func__", x) for x in held)
                out += [f for f in funcs if isinstance(f, types.FunctionType) and _user_code(f)]
    return out


def _kiln_code(obj) -> bool:
    """Whether a class or function is kiln's own (its code's reads are not the user's: not walked)."""
    return (getattr(obj, "__module__", None) or "").startswith("kiln")


@functools.cache
def _library_dirs() -> tuple[str, ...]:
    """The directories of the standard library and of installed packages."""
    paths = sysconfig.get_paths()
    found = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k)}
    return tuple(os.path.join(os.path.normcase(os.path.realpath(d)), "") for d in found)


def _user_code(obj) -> bool:
    """Whether a function or class is the user's: neither kiln's nor the standard library's nor an installed
    package's (a logger's methods are not walked: they reach every logger of the process)."""
    if _kiln_code(obj):
        return False
    code = getattr(obj, "__code__", None)
    if code is not None:
        return user_file(code.co_filename)
    return user_file(getattr(sys.modules.get(getattr(obj, "__module__", None) or ""), "__file__", None))


def user_file(file: str | None) -> bool:
    """Whether the source file ``file`` is the user's: not in the standard library's or installed packages'
    directories (no file, or one made by ``exec``: the user's)."""
    if not file or file.startswith("<"):
        return True
    return not os.path.normcase(os.path.realpath(file)).startswith(_library_dirs())


_CODE = (
    types.FunctionType,
    types.MethodType,
    types.BuiltinFunctionType,
    types.BuiltinMethodType,
    type,
    functools.partial,
)  # what a guard compares by identity alone (a partial's bound arguments: only when it is the compiled one)


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


class _Walker:
    """Adds the guards of the values functions read (see :func:`reachable_objects`)."""

    def __init__(self, gb: GuardBuilder, kinds: tuple, objects: list) -> None:
        self.gb, self.kinds, self.objects = gb, kinds, objects
        self.names: set[str] = set()  # every name the code read so far names (see add_names)
        self.seen: set[int] = set()  # the objects whose insides are guarded
        self.walked: set[int] = set()  # the functions whose reads are guarded
        # (object, path, words, depth) of the objects whose attributes the code names are guarded: a name
        # found later (in a method's code read later) is looked up on each of them too
        self.named: list[tuple[Any, str, str, int]] = []
        # (value, path, words, replaceable) read as arguments are, once every function's names are known: the
        # functions' defaults, a partial's bound arguments
        self.later: list[tuple[Any, str, str, bool]] = []

    def function_reads(self, f, who: str) -> None:
        g = f.__globals__
        gname = self.gb.const(g)
        for name in sorted(_names(f.__code__)):
            if name in g:
                self.value(g[name], f"{gname}.get({name!r}, _MISSING)", f"global {name}", 0)
        for i, cell in enumerate(f.__closure__ or ()):
            try:
                v = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            self.value(v, f"{self.gb.const(cell)}.cell_contents", f"closure value {i} of {who}", 0)
        fname = self.gb.const(f) if f.__defaults__ or f.__kwdefaults__ else ""
        if f.__defaults__:  # a tuple: the same one holds the same values (an object's insides guarded later)
            self.gb.check(f"{fname}.__defaults__ is {self.gb.const(f.__defaults__)}", f"the defaults of {who}")
            for i, x in enumerate(f.__defaults__):
                self.later.append((x, f"{fname}.__defaults__[{i}]", f"default {i} of {who}", False))
        for k, x in (f.__kwdefaults__ or {}).items():  # a dict: changes in place
            self.later.append((x, f"_default({fname}, {k!r})", f"default {k} of {who}", True))
        defaults = (*(f.__defaults__ or ()), *(f.__kwdefaults__ or {}).values())
        self.objects += [x for x in defaults if self.kinds and isinstance(x, self.kinds)]

    def value(self, v: Any, path: str, words: str, depth: int) -> None:
        gb = self.gb
        t = type(v)
        if _plain(v):
            gb.check(gb.equals(path, v), f"{words} == {v!r}")
            return
        gb.check(f"{path} is {gb.const(v)}", f"{words} is the same {t.__name__}")
        self.members(v, path, words, depth)

    def members(self, v: Any, path: str, words: str, depth: int) -> None:
        """The guards on what ``v`` (at ``path``, already guarded by identity) holds."""
        gb = self.gb
        t = type(v)
        if isinstance(v, kiln.Tensor) or id(v) in self.seen or depth > 4:
            return
        self.seen.add(id(v))
        if self.kinds and isinstance(v, self.kinds):
            self.objects.append(v)
        elif isinstance(v, _CONTAINERS):  # (a subclass too: an OrderedDict, a namedtuple)
            if len(v) > _LIMIT:
                raise Unguardable(f"{words} is a {t.__name__} of {len(v)} entries (more than {_LIMIT})")
            if isinstance(v, (set, frozenset)):  # by value, each entry that is no Python value by identity
                gb.check(f"_set_state({path}) == {gb.const(_set_state(v))}", f"{words} holds the same entries")
                return
            if isinstance(v, dict):
                gb.check(f"tuple({path}) == {gb.const(tuple(v))}", f"{words} has keys {tuple(v)}")
                items = [(f"{path}[{gb.const(k)}]", f"{words}[{k!r}]", x) for k, x in v.items()]
            else:
                gb.check(f"len({path}) == {len(v)}", f"{words} has {len(v)} entries")
                items = [(f"{path}[{i}]", f"{words}[{i}]", x) for i, x in enumerate(v)]
            for p, w, x in items:
                self.value(x, p, w, depth + 1)
        elif t is np.ndarray:
            if v.size > _LIMIT:
                raise Unguardable(f"{words} is a NumPy array of {v.size} elements (more than {_LIMIT})")
            gb.check(f"_same_array({path}, {gb.const(v.copy())})", f"{words} holds the same values")
        elif isinstance(v, functools.partial):  # its bound arguments (a tuple; keywords: a dict), its code
            gb.check(f"tuple({path}.keywords) == {gb.const(tuple(v.keywords))}", f"{words} binds the same keywords")
            for i, x in enumerate(v.args):
                self.members(x, f"{path}.args[{i}]", f"{words}, argument {i}", depth + 1)
            for k, x in v.keywords.items():
                self.value(x, f"{path}.keywords.get({k!r}, _MISSING)", f"{words}, argument {k}", depth + 1)
            func = getattr(v.func, "__func__", v.func)
            if isinstance(func, types.FunctionType) and _user_code(func):
                self.code(func)
        elif t is types.ModuleType or (isinstance(v, type) and _user_code(v)):
            self.named.append((v, path, words, depth))
            self.attributes(v, path, words, depth, self.names)
        elif not isinstance(v, _CODE) and (_instance_dict(v) is not None or _slots(t)):
            call = _class_attribute(t, "__call__")  # a callable object: its __call__ counts as named
            if isinstance(call, types.FunctionType) and _user_code(call):
                self.code(call)
            self.named.append((v, path, words, depth))
            self.attributes(v, path, words, depth, self.names)

    def attributes(self, v: Any, path: str, words: str, depth: int, names: set[str]) -> None:
        """Guards on the attributes among ``names`` of ``v``, a Python module, a user class or a plain object.

        A Python module's plain values and tensors by value (``config.scale``). A plain object's attributes
        as Python looks them up: its own and its slots' by value (as arguments); if its class is the user's
        (:func:`_user_code`), its class's plain values by value and its class's methods and properties by
        identity, their code read in turn (what they read is guarded as the function's own reads). A user
        class's the same way, along its MRO. Other descriptors (those of C types) are not guarded."""
        gb = self.gb
        user = isinstance(v, type) or _user_code(type(v))
        for name in sorted(names):
            lookup = f"getattr({path}, {name!r}, _MISSING)"
            if type(v) is types.ModuleType:
                x = v.__dict__.get(name, _MISSING)
                if _plain(x) or isinstance(x, kiln.Tensor):
                    self.value(x, lookup, f"{words}.{name}", depth + 1)
                continue
            if not user:  # a library's object: its own attributes the code names, as before classes were read
                d = _instance_dict(v)
                if d is not None and name in d:
                    self.value(d[name], lookup, f"{words}.{name}", depth + 1)
                continue
            if isinstance(v, type):
                found, where = _class_attribute(v, name), f"_class_attribute({path}, {name!r})"
                own = False
            else:
                found, where = _static_attribute(v, name), f"_static_attribute({path}, {name!r})"
                own = name in (_instance_dict(v) or {}) or (
                    name in _slots(type(v)) and type(found).__name__ == "member_descriptor"
                )
            if found is _MISSING:
                continue
            if own or _plain(found) or isinstance(found, kiln.Tensor):  # (a class's number: by value too)
                try:
                    x = getattr(v, name)
                except AttributeError:  # an empty slot
                    x = _MISSING
                self.value(x, lookup, f"{words}.{name}", depth + 1)
            elif isinstance(found, (types.FunctionType, property, staticmethod, classmethod)):
                gb.check(f"{where} is {gb.const(found)}", f"{words}.{name} is the same {type(found).__name__}")
                fn = found.fget if isinstance(found, property) else getattr(found, "__func__", found)
                if isinstance(fn, types.FunctionType) and _user_code(fn):
                    self.code(fn)
            elif not hasattr(type(found), "__get__"):  # a nested object, an enum member
                self.value(found, where, f"{words}.{name}", depth + 1)

    def add_names(self, names: set[str]) -> None:
        """Count ``names`` as read by the code: each is looked up on the objects met so far too."""
        new = names - self.names
        if not new:
            return
        self.names |= new
        for v, path, words, depth in list(self.named):
            self.attributes(v, path, words, depth, new)

    def code(self, fn: types.FunctionType) -> None:
        """Guard what ``fn`` reads from its globals and closure, as the compiled function's own reads; the
        names it reads are looked up on the objects met (:meth:`add_names`)."""
        if id(fn) in self.walked:
            return
        self.walked.add(id(fn))
        self.add_names(_names(fn.__code__))
        self.function_reads(fn, getattr(fn, "__qualname__", "function"))


def _names(code: types.CodeType) -> set[str]:
    """The names ``code`` reads (globals, attributes), its nested functions' included, and the strings it
    holds that could name an attribute (``getattr(self, "gain")``)."""
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _names(c)
        elif type(c) is str and c.isidentifier():
            names.add(c)
    return names


class PythonState:
    """What Python state a call's arguments hold (:func:`python_state`), compared by identities; it keeps
    the objects it saw alive, so no identity it holds is another object's later."""

    __slots__ = ("ids", "held", "budget")

    def __init__(self) -> None:
        self.ids: list = []
        self.held: list = []
        self.budget = 1 << 16  # entries recorded at most (a dataset passed as a list is not walked whole)

    def __eq__(self, other) -> bool:
        return isinstance(other, PythonState) and self.ids == other.ids

    __hash__ = None


def python_state(*roots: Any) -> PythonState:
    """What Python state ``roots`` (a call's positional arguments and keywords) hold, for telling whether a
    call changed it: each list's, tuple's, dict's, set's and deque's type and entries' identities, each
    user object's attributes' identities, the bytes of a small NumPy array, ``bytearray`` or ``array``,
    the state of a NumPy or ``random`` generator, nested ones followed (four levels; a container of more
    than ``_LIMIT`` entries by its length). Modules, optimizers, tensors, code, Python modules and other
    libraries' objects (a logger fills a cache on first use) are left out."""
    state = PythonState()
    seen: set[int] = set()
    for root in roots:
        _python_state(root, 0, state, seen)
    return state


_BYTES = (bytearray, array.array)


def _python_state(obj: Any, depth: int, state: PythonState, seen: set) -> None:
    if depth > 4 or state.budget <= 0 or _plain(obj) or isinstance(obj, (kiln.Tensor, *_CODE, types.ModuleType)):
        return
    if id(obj) in seen:
        return
    seen.add(id(obj))
    module_cls, opt_cls = module_class(), _optimizer_class()
    if any(c is not None and isinstance(obj, c) for c in (module_cls, opt_cls)):
        return
    state.held.append(obj)
    entries: list = []
    if isinstance(obj, (*_CONTAINERS, collections.deque)) and len(obj) > _LIMIT:
        state.ids.append((id(obj), type(obj), len(obj)))
        return
    if isinstance(obj, (*_CONTAINERS, collections.deque)):
        entries = [x for item in obj.items() for x in item] if isinstance(obj, dict) else list(obj)
        state.ids.append((id(obj), type(obj), tuple(map(id, entries))))
    elif isinstance(obj, (np.ndarray, *_BYTES)):
        size = obj.size if isinstance(obj, np.ndarray) else len(obj)
        state.ids.append(
            (id(obj), bytes(obj.tobytes() if isinstance(obj, np.ndarray) else obj) if size <= _LIMIT else size)
        )
        return
    elif isinstance(obj, np.random.Generator):
        state.ids.append((id(obj), repr(obj.bit_generator.state)))
        return
    elif isinstance(obj, random.Random):
        state.ids.append((id(obj), obj.getstate()))
        return
    elif _user_code(type(obj)):
        try:
            d = _instance_dict(obj) or {}
            entries, names = list(d.values()), tuple(d)
            entries += [getattr(obj, n, _MISSING) for n in _slots(type(obj))]
        except Exception:  # noqa: BLE001 - a __getattr__ that raises: the object is left out
            return
        state.ids.append((id(obj), names, tuple(map(id, entries))))
    state.budget -= len(entries)
    state.held.append(entries)
    for x in entries:
        _python_state(x, depth + 1, state, seen)


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

    def const(self, value: Any) -> str:
        """A name the generated code reads ``value`` by."""
        name = f"c{len(self.consts)}"
        self.consts[name] = value
        return name

    def equals(self, path: str, v: Any) -> str:
        """The condition that the Python value at ``path`` is ``v``: of its exact type, and equal (NaN, which
        equals nothing, as NaN)."""
        if type(v) is float and v != v:
            return f"type({path}) is float and {path} != {path}"
        return f"type({path}) is {self.const(type(v))} and {path} == {self.const(v)}"

    def check(self, condition: str, words: str, *, late: bool = False) -> None:
        """Add ``condition`` (a Python expression over ``args`` and ``kwargs``) as a guard, described by ``words``.
        A ``late`` one (costly: a module tree's state) is tested after every other, so that a call another
        entry serves is turned away by the cheap ones first."""
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
            )
            for i, x in enumerate(obj):
                self.structure(x, f"{path}[{i}]", tensors)
        elif t is dict:
            keys = tuple(obj)
            self.check(f"type({path}) is dict and tuple({path}) == {self.const(keys)}", f"{path} has keys {keys}")
            for k, x in obj.items():
                self.structure(x, f"{path}[{self.const(k)}]", tensors)
        elif isinstance(obj, kiln.Tensor):
            self.tensor(obj, path, path)
            tensors.append(path)
        elif obj is None:
            self.check(f"{path} is None", f"{path} is None")
        elif _plain(obj):
            self.check(self.equals(path, obj), f"{path} == {obj!r}")
        else:
            self.check(f"{path} is {self.const(obj)}", f"{path} is the same {t.__name__} object")
            self.argument_objects.append((obj, path))

    def tensor(self, t: kiln.Tensor, expr: str, label: str) -> None:
        """Guards on one tensor's class, dtype, device, shape, strides, offset and ``requires_grad``."""
        meta = (type(t), t.dtype, t.device, tuple(t.shape), t.stride(), t.storage_offset(), t.requires_grad)
        self.check(f"_meta({expr}) == {self.const(meta)}", f"{label}: {_describe_meta(meta)}")

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
        return fn


def _holds(check: Callable, args, kwargs) -> bool:
    try:
        return bool(check(args, kwargs))
    except Exception:  # noqa: BLE001 - an earlier guard (a structure one) fails too, and is the one reported
        return False


def _meta(t: kiln.Tensor) -> tuple:
    return (type(t), t.dtype, t.device, t.shape, t.stride(), t.storage_offset(), t.requires_grad)


def _grad_hooks(t: kiln.Tensor) -> tuple:
    """A leaf's gradient hooks and post-accumulate-grad hooks, the functions themselves: a trace whose
    backward ran inside it ran the hooks the leaf had then, so another set must trace again."""
    ref = t._accumulator
    post = ref.post_hooks if ref is not None else None
    return (tuple(t._hooks) if t._hooks else (), tuple(post) if post else ())


def _describe_meta(meta: tuple) -> str:
    cls, dtype, device, shape, stride, offset, rg = meta
    return f"{cls.__name__} {dtype} on {device}, shape {list(shape)}, strides {stride}, offset {offset}, requires_grad={rg}"


def global_state() -> tuple:
    """The global settings a trace depends on: grad and inference mode, the default dtype, autocast."""
    autocast = tuple((dev, kiln.is_autocast_enabled(dev), kiln.get_autocast_dtype(dev)) for dev in ("cpu", "cuda"))
    return (kiln.is_grad_enabled(), kiln.is_inference_mode_enabled(), kiln.get_default_dtype(), autocast)
