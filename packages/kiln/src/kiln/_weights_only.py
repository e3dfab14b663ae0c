"""The restricted unpickler behind ``kiln.load(weights_only=True)`` (PyTorch's weights-only model).

An opcode interpreter of its own, not ``pickle.Unpickler``: Python's unpickler lets ``BUILD`` set
attributes on any object on its stack (a function, a class), which a hostile file could use to change
kiln itself. Here the risky opcodes act only on what the allow-list names:

- ``GLOBAL``/``STACK_GLOBAL`` resolve only allowed names (the table :mod:`kiln._pickle_load` gives,
  plus what :func:`kiln.serialization.add_safe_globals` added); the modules ``sys``, ``os``, ``posix``
  and ``nt`` are blocked even when allowed;
- ``REDUCE`` calls only an allowed callable, ``NEWOBJ`` instantiates only an allowed class (or a
  parameter), ``BUILD`` sets state only on tensors, parameters, ``OrderedDict`` and instances of
  allowed classes;
- persistent ids load only storages; ``INST``/``OBJ``/``EXT*`` and out-of-band buffers are refused.

Refusals raise ``pickle.UnpicklingError`` with PyTorch's explanation of how to allow a global, in
kiln's names. A stream that is not a well-formed pickle raises :class:`Malformed`, which is both an
``UnpicklingError`` and a ``ValueError`` (kiln's type for every malformed file). Every length read
from the stream is checked against the bytes that are left before anything is allocated.
"""

from __future__ import annotations

import _compat_pickle
import codecs
import io
import pickle
import struct
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any

from kiln._tensor import Tensor
from kiln.serialization import _read_exact, _short

BLOCKED_MODULES = ("sys", "os", "posix", "nt")

UNSAFE_MESSAGE = (
    "Re-running `kiln.load` with `weights_only` set to `False` will likely succeed, but it can result in "
    "arbitrary code execution. Do it only if you got the file from a trusted source."
)
DOCS_MESSAGE = (
    "\n\nCheck the documentation of kiln.load (kiln.serialization) to learn more about types accepted by "
    "default with weights_only."
)


class Malformed(pickle.UnpicklingError, ValueError):
    """A file whose pickle, archive or tensor records are broken (not a refusal of what it contains)."""

    def __init__(self, msg: str) -> None:
        super().__init__(f"kiln.load: invalid PyTorch file: {msg}")


class Unsupported(Malformed):
    """A well-formed file holding something kiln has no counterpart for."""

    def __init__(self, msg: str) -> None:
        pickle.UnpicklingError.__init__(self, f"kiln.load: {msg}")


class Refusal:
    """An allow-listed name that loads as an error: a torch dtype kiln lacks, say."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message

    def error(self) -> Unsupported:
        """The error to raise where the name appears."""
        return Unsupported(self.message)


class _Raw(Exception):  # carries an error from the caller's code out of the loop untouched
    def __init__(self, error: BaseException) -> None:
        self.error = error


def refused(message: str) -> pickle.UnpicklingError:
    """PyTorch's wrapping of a weights-only refusal, with kiln's names."""
    if "was not an allowed global by default" in message:
        return pickle.UnpicklingError(
            "Weights only load failed. This file can still be loaded, to do so you have two options, do those "
            f"steps only if you trust the source of the checkpoint. \n\t(1) {UNSAFE_MESSAGE}\n\t(2) Alternatively, "
            "to load with `weights_only=True` please check the recommended steps in the following error message."
            f"\n\tWeightsUnpickler error: {message}{DOCS_MESSAGE}"
        )
    return pickle.UnpicklingError(f"Weights only load failed. {UNSAFE_MESSAGE}\n\n\n{message}{DOCS_MESSAGE}")


def _unsupported_global(full_path: str) -> pickle.UnpicklingError:
    if full_path.startswith("builtins."):  # as PyTorch: builtins.eval is named eval
        full_path = full_path[len("builtins.") :]
    return refused(
        f"Unsupported global: GLOBAL {full_path} was not an allowed global by default. Please use "
        f"`kiln.serialization.add_safe_globals([{full_path}])` or the "
        f"`kiln.serialization.safe_globals([{full_path}])` context manager to allowlist this global if you "
        "trust this class/function."
    )


def _name(obj: Any) -> str:
    mod, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    return f"{mod}.{qual}" if isinstance(mod, str) and isinstance(qual, str) else _short(obj)


class Unpickler:
    """Loads one pickle from ``file`` (``read``/``readline``; ``size`` bytes from its position, if known).

    ``allowed`` maps ``"module.name"`` to the object that name loads as; ``state_setters`` maps the id of
    a type whose instances ``BUILD`` may update to a function ``(inst, state)``; ``persistent_load``
    turns a storage's persistent id into its tensor; ``parameter`` is kiln's parameter class (or None).
    """

    def __init__(
        self,
        file: Any,
        *,
        allowed: dict[str, Any],
        persistent_load: Callable[[Any], Any],
        build: Callable[[Any, Any], bool],
        parameter: type | None,
        encoding: str = "utf-8",
        size: int | None = None,
    ) -> None:
        self._file = file
        self._allowed = allowed
        self._allowed_ids = {id(v) for v in allowed.values()}
        self._persistent_load = persistent_load
        self._build = build
        self._parameter = parameter
        self._encoding = encoding
        self._end = None if size is None else file.tell() + size
        self.memo: dict[int, Any] = {}
        self.stack: list[Any] = []
        self.metastack: list[list[Any]] = []

    # ------------------------------------------------------------------------------------- reading
    def _read(self, n: int) -> bytes:
        if n < 0:
            raise Malformed("a negative length in the pickle")
        if self._end is not None and n > self._end - self._file.tell():
            raise Malformed(f"the pickle is truncated (an item of {n} bytes runs past the end)")
        return _read_exact(self._file, n, "an item in the pickle", Malformed)

    def _readline(self) -> bytes:
        line = self._file.readline(1 << 20)
        if not line.endswith(b"\n"):
            raise Malformed("the pickle is truncated (a text argument has no end of line)")
        return line[:-1]

    def _u(self, fmt: str, n: int) -> Any:
        return struct.unpack(fmt, self._read(n))[0]

    def _pop_mark(self) -> list[Any]:
        items = self.stack
        if not self.metastack:
            raise Malformed("the pickle pops a MARK that was never pushed")
        self.stack = self.metastack.pop()
        return items

    def _decode_str(self, data: bytes) -> Any:
        if self._encoding == "bytes":
            return data
        return data.decode(self._encoding, "strict")

    # ------------------------------------------------------------------------------------- globals
    def _global(self, module: str, name: str) -> Any:
        if (module, name) in _compat_pickle.NAME_MAPPING:  # Python 2 names, as PyTorch maps them
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        full_path = f"{module}.{name}"
        if module in BLOCKED_MODULES:
            raise refused(f"Trying to load unsupported GLOBAL {full_path} whose module {module} is blocked.")
        if full_path in self._allowed:
            obj = self._allowed[full_path]
            if type(obj) is Refusal:
                raise obj.error()
            return obj
        raise _unsupported_global(full_path)

    def _is_allowed(self, obj: Any) -> bool:
        return id(obj) in self._allowed_ids

    # ------------------------------------------------------------------------------------- the loop
    def load(self) -> Any:
        """Read one pickle, to its STOP opcode, and return the object it describes."""
        dispatch = _DISPATCH
        try:
            while True:
                key = self._file.read(1)
                if not key:
                    raise Malformed("the pickle ends before its STOP opcode")
                op = dispatch.get(key[0])
                if op is None:
                    if key[0] not in _KNOWN_OPCODES:
                        raise Malformed(f"the pickle has an unknown opcode {key[0]}")
                    raise refused(f"Unsupported operand {key[0]}")
                if op is _stop:
                    if len(self.stack) != 1 or self.metastack:
                        raise Malformed("the pickle's STOP leaves a stack that is not one object")
                    return self.stack.pop()
                op(self)
        except (pickle.UnpicklingError, MemoryError, RecursionError):
            raise
        except _Raw as raw:  # from persistent_load: map_location's and the device's own errors
            raise raw.error from None
        except (
            IndexError,
            KeyError,
            TypeError,
            ValueError,
            AttributeError,
            OverflowError,
            struct.error,
            UnicodeError,
        ) as e:
            raise Malformed(f"the pickle is malformed ({type(e).__name__}: {_short(str(e))})") from None


def _stop(u: Unpickler) -> None:  # handled in the loop
    raise AssertionError


def _proto(u: Unpickler) -> None:
    proto = u._read(1)[0]
    if proto > pickle.HIGHEST_PROTOCOL:
        raise Malformed(f"unsupported pickle protocol {proto}")


def _frame(u: Unpickler) -> None:
    u._u("<Q", 8)  # the frame's length: this reader reads opcode by opcode anyway


def _push(value: Any) -> Callable[[Unpickler], None]:
    def op(u: Unpickler) -> None:
        u.stack.append(value)

    return op


def _push_new(factory: Callable[[], Any]) -> Callable[[Unpickler], None]:
    def op(u: Unpickler) -> None:
        u.stack.append(factory())

    return op


def _read_int(fmt: str, n: int) -> Callable[[Unpickler], None]:
    def op(u: Unpickler) -> None:
        u.stack.append(u._u(fmt, n))

    return op


def _int_text(u: Unpickler) -> None:
    line = u._readline()  # protocol 0 wrote True and False as I01 and I00
    u.stack.append(False if line == b"00" else True if line == b"01" else int(line))


def _long_text(u: Unpickler) -> None:
    u.stack.append(int(u._readline().rstrip(b"L")))


def _long_n(width: str, n: int) -> Callable[[Unpickler], None]:
    def op(u: Unpickler) -> None:
        size = u._u(width, n)
        u.stack.append(pickle.decode_long(u._read(size)))

    return op


def _float_text(u: Unpickler) -> None:
    u.stack.append(float(u._readline()))


def _binfloat(u: Unpickler) -> None:
    u.stack.append(u._u(">d", 8))


def _string_text(u: Unpickler) -> None:  # protocol 0 str of Python 2: a quoted repr
    data = u._readline()
    if len(data) < 2 or data[0] != data[-1] or data[:1] not in (b'"', b"'"):
        raise Malformed("the pickle's STRING opcode argument must be quoted")
    u.stack.append(u._decode_str(codecs.escape_decode(data[1:-1])[0]))


def _binstring(width: str, n: int) -> Callable[[Unpickler], None]:
    def op(u: Unpickler) -> None:
        size = u._u(width, n)
        u.stack.append(u._decode_str(u._read(size)))

    return op


def _unicode_text(u: Unpickler) -> None:
    u.stack.append(str(u._readline(), "raw-unicode-escape"))


def _binunicode(width: str, n: int) -> Callable[[Unpickler], None]:
    def op(u: Unpickler) -> None:
        size = u._u(width, n)
        u.stack.append(str(u._read(size), "utf-8", "surrogatepass"))

    return op


def _binbytes(width: str, n: int, kind: type = bytes) -> Callable[[Unpickler], None]:
    def op(u: Unpickler) -> None:
        size = u._u(width, n)
        u.stack.append(kind(u._read(size)))

    return op


def _mark(u: Unpickler) -> None:
    u.metastack.append(u.stack)
    u.stack = []


def _pop(u: Unpickler) -> None:
    if u.stack:
        u.stack.pop()
    else:
        u._pop_mark()


def _pop_mark(u: Unpickler) -> None:
    u._pop_mark()


def _dup(u: Unpickler) -> None:
    u.stack.append(u.stack[-1])


def _tuple(u: Unpickler) -> None:
    items = u._pop_mark()  # first: it replaces u.stack
    u.stack.append(tuple(items))


def _tuple_n(n: int) -> Callable[[Unpickler], None]:
    def op(u: Unpickler) -> None:
        if len(u.stack) < n:
            raise Malformed(f"the pickle builds a {n}-tuple from a stack of {len(u.stack)}")
        items = tuple(u.stack[len(u.stack) - n :])
        del u.stack[len(u.stack) - n :]
        u.stack.append(items)

    return op


def _list(u: Unpickler) -> None:
    items = u._pop_mark()
    u.stack.append(items)


def _dict(u: Unpickler) -> None:
    items = u._pop_mark()
    if len(items) % 2:
        raise Malformed("the pickle's DICT has a key without a value")
    u.stack.append({items[i]: items[i + 1] for i in range(0, len(items), 2)})


def _list_target(u: Unpickler, op: str) -> list:
    target = u.stack[-1]
    if type(target) is not list:
        raise refused(f"Can only {op} to lists, but got {type(target)}")
    return target


def _append(u: Unpickler) -> None:
    item = u.stack.pop()
    _list_target(u, "append").append(item)


def _appends(u: Unpickler) -> None:
    items = u._pop_mark()
    _list_target(u, "extend").extend(items)


def _dict_target(u: Unpickler, op: str) -> dict:
    target = u.stack[-1]
    if type(target) not in (dict, OrderedDict, Counter):
        raise refused(f"Can only {op} for dict, collections.OrderedDict, collections.Counter, but got {type(target)}")
    return target


def _setitem(u: Unpickler) -> None:
    value, key = u.stack.pop(), u.stack.pop()
    _dict_target(u, "SETITEM")[key] = value


def _setitems(u: Unpickler) -> None:
    items = u._pop_mark()
    if len(items) % 2:
        raise Malformed("the pickle's SETITEMS has a key without a value")
    target = _dict_target(u, "SETITEMS")
    for i in range(0, len(items), 2):
        target[items[i]] = items[i + 1]


def _additems(u: Unpickler) -> None:
    items = u._pop_mark()
    target = u.stack[-1]
    if type(target) is not set:
        raise refused(f"Can only add items to sets, but got {type(target)}")
    target.update(items)


def _global(u: Unpickler) -> None:
    module = u._readline().decode("utf-8")
    name = u._readline().decode("utf-8")
    u.stack.append(u._global(module, name))


def _stack_global(u: Unpickler) -> None:
    name, module = u.stack.pop(), u.stack.pop()
    if type(module) is not str or type(name) is not str:
        raise Malformed("the pickle's STACK_GLOBAL takes two strings")
    u.stack.append(u._global(module, name))


def _reduce(u: Unpickler) -> None:
    args = u.stack.pop()
    func = u.stack[-1]
    if not u._is_allowed(func):
        msg = f"Trying to call reduce for unrecognized function {_short(func)}"
        if hasattr(func, "__self__"):
            msg += f" which belongs to {_short(func.__self__)}"
        raise refused(msg)
    if not callable(func):
        raise Malformed(f"REDUCE calls {_short(func)}, which is not callable")
    if type(args) is not tuple:
        raise Malformed(f"REDUCE arguments of {_name(func)} must be a tuple, got {type(args).__name__}")
    _no_tensor_arguments(u, func, args, None)
    u.stack[-1] = _call(func, args, {})


def _no_tensor_arguments(u: Unpickler, cls: Any, args: tuple, kwargs: dict | None) -> None:
    """``kiln.Tensor(10**12)`` would allocate what the file asks for: tensors load from storages only."""
    if isinstance(cls, type) and issubclass(cls, Tensor) and cls is not u._parameter and (args or kwargs):
        raise Malformed(f"the pickle calls {_name(cls)} with arguments; tensors are rebuilt from their storages")


def _call(func: Callable, args: tuple, kwargs: dict) -> Any:
    try:
        return func(*args, **kwargs)
    except (pickle.UnpicklingError, MemoryError, RecursionError):
        raise
    except Exception as e:  # noqa: BLE001 - an allowed callable refusing the file's arguments
        raise Malformed(
            f"{_name(func)} failed on the file's arguments ({type(e).__name__}: {_short(str(e))})"
        ) from None


def _newobj(u: Unpickler, kwargs: dict | None = None) -> None:
    args = u.stack.pop()
    cls = u.stack.pop()
    if type(args) is not tuple or (kwargs is not None and type(kwargs) is not dict):
        raise Malformed("NEWOBJ arguments must be a tuple (and a dict)")
    if cls is not None and cls is u._parameter:
        u.stack.append(_call(cls, args, kwargs or {}))
    elif isinstance(cls, type) and u._is_allowed(cls):
        _no_tensor_arguments(u, cls, args, kwargs)
        u.stack.append(_call(cls.__new__, (cls, *args), kwargs or {}))
    else:
        raise refused(
            f"Can only create new object for nn.Parameter or classes allowlisted via `add_safe_globals` but got {_short(cls)}"
        )


def _newobj_ex(u: Unpickler) -> None:
    kwargs = u.stack.pop()
    _newobj(u, kwargs)


def _build(u: Unpickler) -> None:
    state = u.stack.pop()
    inst = u.stack[-1]
    if not u._build(inst, state) and not (u._is_allowed(type(inst)) and _build_allowed(inst, state)):
        raise refused(
            "Can only build Tensor, Parameter, OrderedDict or types allowlisted via `add_safe_globals`, "
            f"but got {type(inst)}"
        )


def _build_allowed(inst: Any, state: Any) -> bool:
    """``BUILD`` on an instance of an allowed class, as pickle does it."""
    setstate = getattr(inst, "__setstate__", None)
    if setstate is not None:
        _call(setstate, (state,), {})
        return True
    slots = None
    if isinstance(state, tuple) and len(state) == 2:
        state, slots = state
    if state:
        if not isinstance(state, dict) or not all(type(k) is str for k in state):
            raise Malformed(f"BUILD state of a {type(inst).__name__} must be a dict with str keys")
        _call(inst.__dict__.update, (state,), {})
    if slots:
        if not isinstance(slots, dict):
            raise Malformed(f"BUILD slot state of a {type(inst).__name__} must be a dict")
        for k, v in slots.items():
            _call(setattr, (inst, k, v), {})
    return True


def _persid_text(u: Unpickler) -> None:
    pid = u._readline().decode("ascii")
    u.stack.append(_persistent(u, pid))


def _binpersid(u: Unpickler) -> None:
    u.stack.append(_persistent(u, u.stack.pop()))


def _persistent(u: Unpickler, pid: Any) -> Any:
    if type(pid) is not tuple and type(pid) is not int:
        raise refused(f"persistent_load id must be tuple or int, but got {type(pid)}")
    if type(pid) is tuple and pid and (pid[0].decode("ascii") if isinstance(pid[0], bytes) else pid[0]) != "storage":
        raise refused(f"Only persistent_load of storage is allowed, but got {_short(pid[0])}")
    try:
        return u._persistent_load(pid)
    except pickle.UnpicklingError:
        raise
    except Exception as e:  # noqa: BLE001
        raise _Raw(e) from None


def _get(u: Unpickler, idx: int) -> None:
    if idx not in u.memo:
        raise Malformed(f"the pickle reads memo entry {idx}, which was never stored")
    u.stack.append(u.memo[idx])


def _get_text(u: Unpickler) -> None:
    _get(u, int(u._readline()))


def _get_n(fmt: str, n: int) -> Callable[[Unpickler], None]:
    def op(u: Unpickler) -> None:
        _get(u, u._u(fmt, n))

    return op


def _put_text(u: Unpickler) -> None:
    idx = int(u._readline())
    if idx < 0:
        raise Malformed("negative memo index")
    u.memo[idx] = u.stack[-1]


def _put_n(fmt: str, n: int) -> Callable[[Unpickler], None]:
    def op(u: Unpickler) -> None:
        u.memo[u._u(fmt, n)] = u.stack[-1]

    return op


def _memoize(u: Unpickler) -> None:
    u.memo[len(u.memo)] = u.stack[-1]


_DISPATCH: dict[int, Callable[[Unpickler], None]] = {
    op[0]: fn
    for op, fn in {
        pickle.PROTO: _proto,
        pickle.FRAME: _frame,
        pickle.STOP: _stop,
        pickle.NONE: _push(None),
        pickle.NEWTRUE: _push(True),
        pickle.NEWFALSE: _push(False),
        pickle.INT: _int_text,
        pickle.BININT: _read_int("<i", 4),
        pickle.BININT1: _read_int("<B", 1),
        pickle.BININT2: _read_int("<H", 2),
        pickle.LONG: _long_text,
        pickle.LONG1: _long_n("<B", 1),
        pickle.LONG4: _long_n("<i", 4),
        pickle.FLOAT: _float_text,
        pickle.BINFLOAT: _binfloat,
        pickle.STRING: _string_text,
        pickle.BINSTRING: _binstring("<i", 4),
        pickle.SHORT_BINSTRING: _binstring("<B", 1),
        pickle.UNICODE: _unicode_text,
        pickle.BINUNICODE: _binunicode("<I", 4),
        pickle.SHORT_BINUNICODE: _binunicode("<B", 1),
        pickle.BINUNICODE8: _binunicode("<Q", 8),
        pickle.BINBYTES: _binbytes("<I", 4),
        pickle.SHORT_BINBYTES: _binbytes("<B", 1),
        pickle.BINBYTES8: _binbytes("<Q", 8),
        pickle.BYTEARRAY8: _binbytes("<Q", 8, bytearray),
        pickle.MARK: _mark,
        pickle.POP: _pop,
        pickle.POP_MARK: _pop_mark,
        pickle.DUP: _dup,
        pickle.EMPTY_TUPLE: _push_new(tuple),
        pickle.TUPLE: _tuple,
        pickle.TUPLE1: _tuple_n(1),
        pickle.TUPLE2: _tuple_n(2),
        pickle.TUPLE3: _tuple_n(3),
        pickle.EMPTY_LIST: _push_new(list),
        pickle.LIST: _list,
        pickle.APPEND: _append,
        pickle.APPENDS: _appends,
        pickle.EMPTY_DICT: _push_new(dict),
        pickle.DICT: _dict,
        pickle.SETITEM: _setitem,
        pickle.SETITEMS: _setitems,
        pickle.EMPTY_SET: _push_new(set),
        pickle.ADDITEMS: _additems,
        pickle.GLOBAL: _global,
        pickle.STACK_GLOBAL: _stack_global,
        pickle.REDUCE: _reduce,
        pickle.NEWOBJ: _newobj,
        pickle.NEWOBJ_EX: _newobj_ex,
        pickle.BUILD: _build,
        pickle.PERSID: _persid_text,
        pickle.BINPERSID: _binpersid,
        pickle.GET: _get_text,
        pickle.BINGET: _get_n("<B", 1),
        pickle.LONG_BINGET: _get_n("<I", 4),
        pickle.PUT: _put_text,
        pickle.BINPUT: _put_n("<B", 1),
        pickle.LONG_BINPUT: _put_n("<I", 4),
        pickle.MEMOIZE: _memoize,
    }.items()
}


_KNOWN_OPCODES = {op[0] for name in pickle.__all__ if isinstance(op := getattr(pickle, name), bytes) and len(op) == 1}


def load(data: bytes | io.BufferedIOBase, **kwargs: Any) -> Any:
    """Unpickle one object from ``data`` (bytes, or a file at the pickle's start) with :class:`Unpickler`."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = io.BytesIO(data)
        kwargs.setdefault("size", len(data.getbuffer()))
    return Unpickler(data, **kwargs).load()
