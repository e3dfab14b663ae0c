"""Autocast regions and their per-thread state (``kiln.autocast``, ``kiln.is_autocast_enabled`` ...).

The core keeps what a region is: per thread, per device type, whether autocast is on and in which
dtype, how deeply regions nest and whether the weight-cast cache is on, with PyTorch's functions to
read and set them. What autocast *does* (read each op's policy from the op record, cast the arguments,
cache the weights' casts) is the dispatch mode kiln-amp registers under the name ``"autocast"``
(``kiln_register_modes``). Entering a region pushes that mode, once per thread, in front of autograd;
without kiln-amp, entering one raises an error that names the package to install.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable
from typing import Any

from kiln import _dtype as dt

__all__ = [
    "autocast",
    "autocast_decrement_nesting",
    "autocast_increment_nesting",
    "clear_autocast_cache",
    "get_autocast_dtype",
    "is_autocast_available",
    "is_autocast_cache_enabled",
    "is_autocast_enabled",
    "set_autocast_cache_enabled",
    "set_autocast_dtype",
    "set_autocast_enabled",
]

_INSTALL = "autocast needs the kiln-amp package: pip install kiln-amp"


class _State(threading.local):
    def __init__(self) -> None:
        self.enabled: dict[str, bool] = {}
        self.dtype: dict[str, dt.dtype] = {}
        self.nesting = 0
        self.cache_enabled = True
        self.mode = None  # this thread's autocast mode (kiln-amp's), made on first use
        self.pushed = False  # whether it is on the dispatch stack


_state = _State()


def _default_dtype(device_type: str) -> dt.dtype:
    """bfloat16 on cpu; elsewhere the device type's ``autocast_dtype`` (its plugin's choice), else float16."""
    if device_type == "cpu":
        return dt.bfloat16
    from kiln import _plugins

    _plugins.load()
    contract = _plugins._devices.get(device_type)
    chosen = getattr(contract, "autocast_dtype", None)
    return chosen if chosen is not None else dt.float16


def _mode_class():
    from kiln import _plugins

    cls = _plugins.modes().get("autocast")
    if cls is None:
        raise ModuleNotFoundError(f"kiln.{_INSTALL}")
    return cls


def _sync_mode() -> None:
    """Keep this thread's autocast mode on the dispatch stack exactly while autocast is on for some device
    type. The mode (and its weight-cast cache) lives as long as the thread: an ``enabled=False`` region
    inside an enabled one takes the mode off the stack without losing the cache."""
    wanted = any(_state.enabled.values())
    if wanted and not _state.pushed:
        if _state.mode is None:
            _state.mode = _mode_class()()
        _state.mode.__enter__()
        _state.pushed = True
    elif not wanted and _state.pushed:
        _state.pushed = False
        _state.mode.__exit__(None, None, None)


def is_autocast_available(device_type: str) -> bool:
    """Whether autocast can run for ``device_type`` (``"cpu"``, ``"cuda"`` or a plugin's device type)."""
    if device_type in ("cpu", "cuda"):
        return True
    from kiln._device_module import device_module

    return device_module(device_type) is not None


def is_autocast_enabled(device_type: str = "cuda") -> bool:
    """Whether autocast is on for ``device_type`` in this thread (PyTorch's default device type: cuda)."""
    return _state.enabled.get(device_type, False)


def set_autocast_enabled(device_type, enabled: bool | None = None) -> None:
    """Switch autocast on or off for ``device_type`` in this thread (``set_autocast_enabled(True)``: cuda).

    Prefer :class:`autocast` regions, which restore the previous state on exit."""
    if enabled is None:  # the older one-argument form, for cuda
        device_type, enabled = "cuda", device_type
    if enabled:
        _mode_class()  # the error naming kiln-amp, before any state changes
    _state.enabled[device_type] = bool(enabled)
    _sync_mode()


def get_autocast_dtype(device_type: str) -> dt.dtype:
    """The dtype autocast casts to on ``device_type`` in this thread: the one set with
    :func:`set_autocast_dtype`, else the device type's default (bfloat16 on cpu, float16 on cuda, a plugin
    device's ``autocast_dtype``, else float16)."""
    d = _state.dtype.get(device_type)
    return d if d is not None else _default_dtype(device_type)


def set_autocast_dtype(device_type: str, dtype: dt.dtype) -> None:
    """Set the dtype autocast casts to on ``device_type`` in this thread."""
    if not isinstance(dtype, dt.dtype):
        raise TypeError(f"set_autocast_dtype(): argument 'dtype' must be kiln.dtype, not {type(dtype).__name__}")
    _state.dtype[device_type] = dtype


def _older_names(prefix: str, device_type: str) -> dict:
    """PyTorch's per-device spellings (``is_autocast_cpu_enabled``, ``set_autocast_gpu_dtype``, ...): the
    device-type functions with ``device_type`` filled in."""

    def is_enabled() -> bool:
        return is_autocast_enabled(device_type)

    def set_enabled(enabled: bool) -> None:
        set_autocast_enabled(device_type, enabled)

    def get_dtype() -> dt.dtype:
        return get_autocast_dtype(device_type)

    def set_dtype(dtype: dt.dtype) -> None:
        set_autocast_dtype(device_type, dtype)

    names = {}
    for fn, name, target in (
        (is_enabled, f"is_autocast_{prefix}_enabled", "is_autocast_enabled"),
        (set_enabled, f"set_autocast_{prefix}_enabled", "set_autocast_enabled"),
        (get_dtype, f"get_autocast_{prefix}_dtype", "get_autocast_dtype"),
        (set_dtype, f"set_autocast_{prefix}_dtype", "set_autocast_dtype"),
    ):
        fn.__name__ = fn.__qualname__ = name
        fn.__doc__ = f"``{target}({device_type!r}, ...)`` under PyTorch's older name."
        names[name] = fn
    return names


for _prefix, _device_type in (("cpu", "cpu"), ("gpu", "cuda"), ("ipu", "ipu"), ("xla", "xla")):
    _names = _older_names(_prefix, _device_type)
    globals().update(_names)
    __all__ += sorted(_names)


def is_autocast_cache_enabled() -> bool:
    """Whether autocast keeps the casts of weights (leaf tensors that require grad) until the outermost
    region exits."""
    return _state.cache_enabled


def set_autocast_cache_enabled(enabled: bool) -> None:
    """Switch the weight-cast cache on or off in this thread."""
    _state.cache_enabled = bool(enabled)


def clear_autocast_cache() -> None:
    """Forget the weight casts kept so far in this thread (done when the outermost region exits)."""
    if _state.mode is not None:
        _state.mode.clear_cache()


def autocast_increment_nesting() -> int:
    """Count one more open autocast region in this thread; returns the new depth."""
    _state.nesting += 1
    return _state.nesting


def autocast_decrement_nesting() -> int:
    """Count one region fewer in this thread; returns the new depth."""
    _state.nesting = max(0, _state.nesting - 1)
    return _state.nesting


class autocast:
    """A region (``with``) or a decorator in which ops on ``device_type`` run in mixed precision.

    Each op runs as its autocast policy on the op record says (``kiln.backend.AUTOCAST_POLICIES``): matrix
    products and convolutions in ``dtype`` (default: bfloat16 on cpu, float16 elsewhere), losses and
    range-sensitive ops in float32, the rest as given. Only out-of-place ops on floating tensors of
    ``device_type`` are cast, never float64 ones; regions nest (``enabled=False`` inside switches it off);
    the casts of weights are kept until the outermost region exits (``cache_enabled``); the state is per
    thread. Needs the kiln-amp package (the error says so when it is missing).
    """

    def __init__(
        self,
        device_type: str,
        dtype: dt.dtype | None = None,
        enabled: bool = True,
        cache_enabled: bool | None = None,
    ):
        if not isinstance(device_type, str):
            raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
        if dtype is not None and not isinstance(dtype, dt.dtype):
            raise TypeError(f"autocast(): argument 'dtype' must be kiln.dtype, not {type(dtype).__name__}")
        if not is_autocast_available(device_type):
            raise RuntimeError(f"User specified an unsupported autocast device_type '{device_type}'")
        self.device = device_type
        self.fast_dtype = get_autocast_dtype(device_type) if dtype is None else dtype
        self._cache_enabled = is_autocast_cache_enabled() if cache_enabled is None else bool(cache_enabled)
        enabled = bool(enabled)
        if enabled:
            _mode_class()  # the error naming kiln-amp, at construction as for every other bad argument
            from kiln._device_module import device_module

            name = device_type.upper() if device_type in ("cpu", "cuda") else device_type
            if device_type != "cpu" and not device_module(device_type).is_available():
                warnings.warn(f"{name} is not available. Disabling autocast.", stacklevel=2)
                enabled = False
            elif self.fast_dtype not in (dt.bfloat16, dt.float16):
                warnings.warn(
                    f"In {name} autocast, but the target dtype is not supported. Disabling autocast.\n"
                    f"{name} Autocast only supports dtypes of kiln.bfloat16, kiln.float16 currently.",
                    stacklevel=2,
                )
                enabled = False
        self._enabled = enabled
        self._prev: list[tuple] = []  # a stack: one instance may be entered again (a recursive decorated call)

    def __enter__(self) -> autocast:
        self._prev.append((is_autocast_enabled(self.device), _state.dtype.get(self.device), _state.cache_enabled))
        _state.enabled[self.device] = self._enabled
        _state.dtype[self.device] = self.fast_dtype
        _state.cache_enabled = self._cache_enabled
        autocast_increment_nesting()
        try:
            _sync_mode()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: Any) -> bool:
        enabled, dtype, cache = self._prev.pop()
        if autocast_decrement_nesting() == 0:
            clear_autocast_cache()
        _state.enabled[self.device] = enabled
        if dtype is None:
            _state.dtype.pop(self.device, None)
        else:
            _state.dtype[self.device] = dtype
        _state.cache_enabled = cache
        _sync_mode()
        return False

    def __call__(self, func: Callable) -> Callable:
        """Use the region as a decorator: ``func`` runs inside it on every call."""
        if not callable(func):
            raise TypeError(
                f"autocast()(func) requires a callable, but got {type(func).__name__}. "
                "Did you mean to use autocast as a context manager? For example:\n"
                "    with kiln.autocast(device_type=...):\n"
                "        output = model(input)"
            )

        @functools.wraps(func)
        def run(*args, **kwargs):
            with self:
                return func(*args, **kwargs)

        return run

    def __repr__(self) -> str:
        return f"autocast(device_type={self.device!r}, dtype={self.fast_dtype}, enabled={self._enabled})"
