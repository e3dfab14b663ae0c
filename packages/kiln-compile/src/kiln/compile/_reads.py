"""What a traced call reads besides its arguments' tensors, found from its code: the walk that adds those
guards (:func:`reachable_objects`), and the snapshot of the Python state a call's arguments hold
(:func:`python_state`), which tells a call that changed them.

The walk reads the code of the compiled function and of the user functions it reaches (helpers by name, in
any user module; the methods of the user's module classes; the functions and hooks the modules hold; the
methods and properties of the user's objects the code names). Each global, closure value, default and
bound argument that code loads is guarded by what it is (:class:`_Walker`), and every attribute the
code names is looked up on every object met. Kiln's own code, the standard library's and installed
packages' are not read (:func:`user_file`).
"""

from __future__ import annotations

import array
import collections
import dis
import functools
import os
import random
import site
import sys
import sysconfig
import types
from collections.abc import Callable
from typing import Any

import numpy as np

import kiln
from kiln.compile._guards import (
    _CONTAINERS,
    _HOOKS,
    _LIMIT,
    _MISSING,
    GuardBuilder,
    Unguardable,
    _class_attribute,
    _entries,
    _instance_dict,
    _module_classes,
    _module_internals,
    _optimizer_class,
    _plain,
    _set_state,
    _slots,
    _static_attribute,
    _submodules,
    module_class,
)

__all__ = ["PythonState", "kiln_module", "python_state", "reachable_objects", "user_file"]


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
    # (kiln's own, Module._call_impl and kiln.nn's forwards: no user reads)
    return owner, [f for f in funcs if getattr(f, "__code__", None) is not None and not _kiln_code(f)]


_MAX_HELPERS = 512
"""The most user functions a walk reads; a call that reaches more cannot be guarded and runs eagerly."""


def _helpers(funcs: list) -> list:
    """``funcs`` and the user functions their code reaches by name, transitively: those found in globals and
    closures (of the same module, defined inside another function, or imported from another user module)
    and those the code reads as an attribute of a user module (``helpers.apply(x)``). In a fixed order;
    raises :class:`Unguardable` past :data:`_MAX_HELPERS`."""
    seen = {id(f): f for f in funcs}
    todo = list(funcs)
    while todo:
        f = todo.pop(0)
        g = f.__globals__
        code = f.__code__
        found = [g.get(n) for n in sorted(_global_names(code))]
        cells = {}
        for name, cell in zip(code.co_freevars, f.__closure__ or ()):
            try:
                cells[name] = cell.cell_contents
            except ValueError:  # an empty cell
                continue
        found += list(cells.values())
        found += _module_functions(code, {**g, **cells})
        for v in found:
            v = getattr(v, "__func__", v)
            user = isinstance(v, types.FunctionType) and (
                v.__globals__ is g or "<locals>" in v.__qualname__ or _user_code(v)
            )
            if user and id(v) not in seen:
                if len(seen) >= _MAX_HELPERS:
                    raise Unguardable(f"it reaches more than {_MAX_HELPERS} functions of its own")
                seen[id(v)] = v
                todo.append(v)
    return list(seen.values())


def _module_functions(code: types.CodeType, g: dict) -> list:
    """What ``code`` reads as an attribute of a user module it names as a global or a closure variable (in
    ``g``: ``helpers.apply``, the attribute read right after the module), its nested functions' included."""
    out = []
    last = None
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and type(last) is types.ModuleType:
            last = last.__dict__.get(ins.argval)  # (a submodule: pkg.utils.scale)
            out.append(last)
        else:
            last = g.get(ins.argval) if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF") else None
        if type(last) is types.ModuleType and not _user_module(last):
            last = None
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out += _module_functions(c, g)
    return out


def _kinds() -> tuple[type, ...]:
    """The classes whose objects' state is guarded apart: ``kiln.nn.Module`` and ``kiln.optim.Optimizer``
    (where imported)."""
    return tuple(c for c in (module_class(), _optimizer_class()) if c is not None)


def reachable_objects(fn: Callable, leaves: list, gb: GuardBuilder) -> list:
    """Guard what ``fn`` reads besides its arguments, and return the modules and optimizers it can reach
    (arguments, its ``self``, its defaults, a partial's bound arguments, the globals and closures it
    reads, what the modules reached hold), whose state the caller guards.

    Read from the code of ``fn`` and of the user functions it reaches (:func:`_helpers`; the methods of the
    user's module classes, the functions and hooks the modules hold): each global and closure value that
    code loads, each default and bound argument, is guarded by what it is (:meth:`_Walker.value`): a
    Python value by value, a tensor, a function, a module or any other object by identity; lists, tuples,
    dicts and sets (subclasses too) by their entries, NumPy arrays by their contents, and the attributes
    the code names of Python modules, user classes and objects (their classes' methods and properties by
    identity, their code read in turn). The values are the ones the trace starts from: a container the
    function appends to fails its guard on the next call and traces again (Python runs only while
    tracing), until the cache limit. Raises :class:`Unguardable` for a container or NumPy array too large
    to compare, or past :data:`_MAX_HELPERS` functions."""
    module_cls, kinds = module_class(), _kinds()
    objects = [x for x in leaves if kinds and isinstance(x, kinds)]
    walker = _Walker(gb, kinds, objects)
    while isinstance(fn, functools.partial):  # a partial's bound arguments are read as arguments are
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
        # hooks that are objects (a callable, a partial): what they hold, as an argument's
        for obj in trees:
            for sub in _submodules(obj):
                pending += [
                    (h, gb.const(h), f"a hook of {type(sub).__name__}", True)
                    for h in _hooks(sub)
                    if not isinstance(h, (types.FunctionType, types.MethodType))
                ]
        if not trees and not pending and not held:
            break
        for sub, k, v in held:
            held_done.add((id(sub), k))
            for x in _held(v):
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


def _hooks(sub) -> list:
    """The hooks registered on the module ``sub`` (forward, forward-pre, backward, backward-pre)."""
    return [h for name in _HOOKS for h in (sub.__dict__.get(name) or {}).values()]


def _held(v: Any) -> list:
    """What a module attribute holds: a container's entries (nested ones too; a container of more than
    ``_LIMIT`` entries is compared by its length alone), or the value itself."""
    return _entries(v) if isinstance(v, _CONTAINERS) and len(v) <= _LIMIT else [v]


def _held_object(v: Any) -> bool:
    """Whether a module attribute's value (or an entry of its container) is an object whose insides a trace
    may read and a guard checks (:meth:`_Walker.members`, under a name the code reads): a NumPy array, a
    module (one kept in a plain list: not a submodule), an optimizer, a partial, or an object with
    attributes (not a tensor, a container, a Python value, a function, a method, a class or a Python
    module, which the module's own state compares by identity)."""
    if type(v) is np.ndarray or isinstance(v, (*_kinds(), functools.partial)):
        return True
    if _plain(v) or isinstance(v, (kiln.Tensor, *_CONTAINERS, *_CODE, types.ModuleType)):
        return False
    return _instance_dict(v) is not None or bool(_slots(type(v)))


# a module's methods a call does not run (construction, printing, pickling): what they name is not read
_NOT_CALLED = frozenset({"__init__", "__repr__", "__str__", "extra_repr", "__getstate__", "__setstate__"})


def _module_methods(objects: list, module_cls) -> list:
    """The functions of the modules in the trees of ``objects``: those of their classes up to ``nn.Module``
    that the user defined (methods, properties' getters, not those a call does not run: ``__init__``,
    ``extra_repr``...; kiln's own classes are left out), and the user functions the modules hold
    (``self.act = my_activation``, in a list too; not ``F.relu``) and their hooks."""
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
        for k, v in [*sub.__dict__.items(), *(("hook", h) for h in _hooks(sub))]:  # (user hooks run in the call)
            if k not in internal:
                funcs = (getattr(x, "__func__", x) for x in _held(v))
                out += [f for f in funcs if isinstance(f, types.FunctionType) and _user_code(f)]
    return out


def kiln_module(name: str) -> bool:
    """Whether the Python module named ``name`` is kiln's: ``kiln`` and its submodules, and the packages of
    kiln's distributions and plugins (``kiln_cpu``, ``kiln_*``)."""
    return name == "kiln" or name.startswith(("kiln.", "kiln_"))


def _kiln_code(obj) -> bool:
    """Whether a class or function is kiln's own (its code's reads are not the user's: not walked)."""
    return kiln_module(getattr(obj, "__module__", None) or "")


@functools.cache
def _library_dirs() -> tuple[str, ...]:
    """The directories of the standard library and of installed packages."""
    paths = sysconfig.get_paths()
    found = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k)}
    found.update(site.getsitepackages() if hasattr(site, "getsitepackages") else ())  # (dist-packages too)
    user = site.getusersitepackages() if hasattr(site, "getusersitepackages") else None
    if isinstance(user, str):
        found.add(user)
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


def _user_module(m: types.ModuleType) -> bool:
    """Whether a Python module is the user's: not kiln's (an editable install of kiln lives outside the
    installed packages' directories too), and not the standard library's or an installed package's."""
    return not kiln_module(m.__name__) and user_file(getattr(m, "__file__", None))


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
)  # code: a guard compares it by identity alone (a partial's bound arguments and function are read apart)


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
        for name in sorted(_global_names(f.__code__)):
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

    def value(self, v: Any, path: str, words: str, depth: int) -> None:
        gb = self.gb
        t = type(v)
        if _plain(v):
            gb.check(gb.equals(path, v), f"{words} == {v!r}")
            return
        # kept under skip_guard_eval_unsafe: another object bound there (a global tensor rebound) is not the one the
        # trace reads by reference
        gb.check(f"{path} is {gb.const(v)}", f"{words} is the same {t.__name__}", kept=True)
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
            if type(v) is types.ModuleType:  # (a user module's functions and submodules too: pkg.utils.scale)
                x = v.__dict__.get(name, _MISSING)
                user = isinstance(x, types.FunctionType) and _user_code(x)
                user = user or (type(x) is types.ModuleType and _user_module(x))
                if _plain(x) or isinstance(x, kiln.Tensor) or user:
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


def _global_names(code: types.CodeType) -> set[str]:
    """The globals ``code`` loads (its nested functions' included): not its attribute names nor its strings
    (a dict key ``"loss"`` is no read of a global ``loss``)."""
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _global_names(c)
    return names


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
    object's attributes' identities, the bytes of a small NumPy array, ``bytearray`` or ``array``, the
    state of a NumPy or ``random`` generator, nested ones followed (four levels; a container of more than
    ``_LIMIT`` entries by its length; another library's object one level: a logger fills a cache on first
    use). Modules, optimizers, tensors, code and Python modules are left out."""
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
    if isinstance(obj, _kinds()):
        return
    state.held.append(obj)
    entries: list = []
    if isinstance(obj, (*_CONTAINERS, collections.deque)):
        if len(obj) > _LIMIT:
            state.ids.append((id(obj), type(obj), len(obj)))
            return
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
    else:
        try:
            d = _instance_dict(obj) or {}
            entries, names = list(d.values()), tuple(d)
            entries += [getattr(obj, n, _MISSING) for n in _slots(type(obj))]
        except Exception:  # noqa: BLE001 - a __getattr__ that raises: the object is left out
            return
        state.ids.append((id(obj), names, tuple(map(id, entries))))
        if not _user_code(type(obj)):  # a library's object: its own attributes only (a logger's cache fills)
            state.held.append(entries)
            return
    state.budget -= len(entries)
    state.held.append(entries)
    for x in entries:
        _python_state(x, depth + 1, state, seen)
