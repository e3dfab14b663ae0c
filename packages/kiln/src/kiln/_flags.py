"""Global switches PyTorch programs set at their top: float32 matmul precision, deterministic
algorithms, warn-always. ``kiln.backends.cuda.matmul.allow_tf32`` is a view of the matmul precision,
as in PyTorch.

kiln's own kernels neither use reduced-precision (TF32) matmuls nor pick nondeterministic algorithms
(for a fixed thread count), so on the CPU these switches change no result; they are kept so programs
that set them run unchanged, and a device plugin whose kernels can differ reads them through the
getters here.
"""

from __future__ import annotations

import builtins

__all__ = [
    "are_deterministic_algorithms_enabled",
    "get_deterministic_debug_mode",
    "get_float32_matmul_precision",
    "is_deterministic_algorithms_warn_only_enabled",
    "is_warn_always_enabled",
    "set_deterministic_debug_mode",
    "set_float32_matmul_precision",
    "set_warn_always",
    "use_deterministic_algorithms",
]

_PRECISIONS = ("highest", "high", "medium")
_state = {"matmul_precision": "highest", "deterministic": False, "warn_only": False, "warn_always": False}


def set_float32_matmul_precision(precision: str) -> None:
    """Set the internal precision of float32 matrix multiplications: ``"highest"`` (the default: full
    float32), ``"high"`` or ``"medium"`` (a device may then use TF32 or bfloat16 passes). An unknown value
    warns and changes nothing, as in PyTorch."""
    if precision not in _PRECISIONS:
        import warnings

        warnings.warn(
            f"{precision} is not one of 'highest', 'high', or 'medium'; the current "
            "set_float32_matmul_precision call has no effect.",
            UserWarning,
            stacklevel=2,
        )
        return
    _state["matmul_precision"] = precision


def get_float32_matmul_precision() -> str:
    """The float32 matmul precision: ``"highest"``, ``"high"`` or ``"medium"``."""
    return _state["matmul_precision"]


def use_deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
    """Ask for deterministic algorithms (an op with only a nondeterministic kernel then raises, or warns
    with ``warn_only=True``). kiln's CPU kernels are all deterministic for a fixed thread count."""
    if not isinstance(mode, builtins.bool):
        raise TypeError(
            f"_set_deterministic_algorithms(): argument 'mode' (position 1) must be bool, not {type(mode).__name__}"
        )
    if not isinstance(warn_only, builtins.bool):
        raise TypeError(
            "_set_deterministic_algorithms(): argument 'warn_only' must be bool, not " + type(warn_only).__name__
        )
    _state["deterministic"] = mode
    _state["warn_only"] = warn_only and mode


def are_deterministic_algorithms_enabled() -> bool:
    """Whether :func:`use_deterministic_algorithms` is on."""
    return _state["deterministic"]


def is_deterministic_algorithms_warn_only_enabled() -> bool:
    """Whether deterministic mode only warns (``warn_only=True``)."""
    return _state["warn_only"]


_DEBUG_MODES = ("default", "warn", "error")


def set_deterministic_debug_mode(debug_mode: int | str) -> None:
    """Deterministic mode as a level: ``"default"``/0 (off), ``"warn"``/1, ``"error"``/2."""
    if isinstance(debug_mode, str):
        if debug_mode not in _DEBUG_MODES:
            raise RuntimeError(
                f"invalid value of debug_mode, expected one of `default`, `warn`, `error`, but got {debug_mode}"
            )
        debug_mode = _DEBUG_MODES.index(debug_mode)
    elif not isinstance(debug_mode, builtins.int) or isinstance(debug_mode, builtins.bool):
        raise TypeError(f"debug_mode must be str or int, but got {type(debug_mode).__name__}")
    if debug_mode not in (0, 1, 2):
        raise RuntimeError(f"invalid value of debug_mode, expected 0, 1, or 2, but got {debug_mode}")
    use_deterministic_algorithms(debug_mode > 0, warn_only=debug_mode == 1)


def get_deterministic_debug_mode() -> int:
    """0 (off), 1 (warn) or 2 (error): the level :func:`set_deterministic_debug_mode` set."""
    if not _state["deterministic"]:
        return 0
    return 1 if _state["warn_only"] else 2


def set_warn_always(b: bool, /) -> None:
    """Record PyTorch's warn-always switch (warnings it issues once per process would warn every time);
    kiln's once-only warnings go through Python's ``warnings`` filters, which decide that instead."""
    _state["warn_always"] = builtins.bool(b)


def is_warn_always_enabled() -> bool:
    """Whether :func:`set_warn_always` is on."""
    return _state["warn_always"]
