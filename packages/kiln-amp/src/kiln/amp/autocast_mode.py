"""Autocast: the dispatch mode that ``kiln.autocast`` regions push, and the ``custom_fwd`` / ``custom_bwd``
decorators for custom autograd functions.

The mode holds no list of ops. Each op's policy comes from its record (``kiln.backend.op(name).autocast``;
the policies and their meanings are ``kiln.backend.AUTOCAST_POLICIES``), and functions written in ops
that PyTorch treats as one op (``mse_loss``, ``linear`` ...) carry theirs as composites
(``kiln.backend.composites()``). So every device, a third party's included, gets the same policy. What
is cast follows PyTorch: floating tensors other than float64, on a device type whose autocast is on in
this thread; in-place ops are not cast; an explicit ``dtype=`` argument wins over the policy. Casts of
weights (leaf tensors that require grad) to the lower dtype are kept until the outermost region exits.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import kiln
from kiln.backend import DispatchMode

__all__ = ["AutocastMode", "autocast", "custom_bwd", "custom_fwd", "is_autocast_available"]

autocast = kiln.autocast
is_autocast_available = kiln.is_autocast_available

_CASTABLE = (kiln.float16, kiln.bfloat16, kiln.float32)

# Ops whose policy is "banned_float16": what to use instead (PyTorch's message for binary_cross_entropy).
_BANNED = {
    "_binary_cross_entropy": (
        "kiln.nn.functional.binary_cross_entropy and kiln.nn.BCELoss are unsafe to autocast.\n"
        "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
        "In this case, combine the two layers using kiln.nn.functional.binary_cross_entropy_with_logits\n"
        "or kiln.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
        "safe to autocast."
    ),
}


class AutocastMode(DispatchMode):
    """The pre-autograd dispatch mode behind :class:`kiln.autocast` (one per thread, on the dispatch stack
    while a region is open). Casts are ordinary ops, recorded by autograd, so gradients flow back to the
    original dtype."""

    level = "pre_autograd"

    def __init__(self) -> None:
        # (id of the weight, target dtype, grad mode) -> (weight, its version, its cast)
        self._cache: dict[tuple, tuple] = {}

    def clear_cache(self) -> None:
        """Forget the kept weight casts (the outermost region exited)."""
        self._cache.clear()

    def dispatch(self, op, args: tuple, redispatch: Callable):
        """Cast ``args`` as ``op``'s policy says, then run the op."""
        policy = op.autocast
        if policy is None:
            return redispatch(op, args)
        if policy != "lower" and "dtype" in op.param_names:
            i = op.param_names.index("dtype")
            if i < len(args) and args[i] is not None:
                return redispatch(op, args)  # an explicit dtype= wins
        positions = op.tensor_params
        cast = self._caster(policy, op.name, [args[i] for i in positions if i < len(args)])
        if cast is None:
            return redispatch(op, args)
        args = list(args)
        for i in positions:
            if i < len(args):
                args[i] = cast(args[i])
        return redispatch(op, tuple(args))

    def dispatch_composite(self, composite, args: tuple, kwargs: dict, redispatch: Callable):
        """Cast a composite's tensor arguments (positional or keyword) as its policy says; its own ops then
        run without autocast, as PyTorch runs a composite op below its autocast key."""
        cast = self._caster(composite.autocast, composite.name, [*args, *kwargs.values()])
        if cast is not None:
            args = tuple(cast(a) for a in args)
            kwargs = {k: cast(v) for k, v in kwargs.items()}
        return redispatch(composite, args, kwargs)

    # ------------------------------------------------------------------------------------------ casting

    def _caster(self, policy: str, name: str, values: list) -> Callable[[Any], Any] | None:
        """A function casting one argument (a tensor, or a list or tuple of them) as ``policy`` says, or
        None when nothing in ``values`` is to be cast."""
        eligible = [t for t in _tensors(values) if t.dtype in _CASTABLE and kiln.is_autocast_enabled(t.device.type)]
        if not eligible:
            return None
        if policy == "promote":
            kinds = {t.dtype for t in eligible}
            widest = next(iter(kinds)) if len(kinds) == 1 else kiln.float32
            return self._make_caster(lambda _: widest, cache=False)
        if policy == "lower":
            return self._make_caster(lambda t: kiln.get_autocast_dtype(t.device.type), cache=True)
        if policy == "fp32":
            return self._make_caster(lambda _: kiln.float32, cache=False)
        half = [t for t in eligible if kiln.get_autocast_dtype(t.device.type) is kiln.float16]
        if policy == "fp32_float16":
            if not half:
                return None
            return self._make_caster(
                lambda t: kiln.float32 if kiln.get_autocast_dtype(t.device.type) is kiln.float16 else None,
                cache=False,
            )
        if policy == "banned_float16":
            if half:
                raise RuntimeError(_BANNED.get(name, f"{name} is unsafe to autocast to float16."))
            return self._make_caster(lambda _: kiln.float32, cache=False)
        raise RuntimeError(f"autocast: op {name} has an unknown policy {policy!r}")

    def _make_caster(self, target_of: Callable, cache: bool) -> Callable[[Any], Any]:
        def cast_one(t):
            if not isinstance(t, kiln.Tensor) or t.dtype not in _CASTABLE:
                return t
            if not kiln.is_autocast_enabled(t.device.type):
                return t
            target = target_of(t)
            if target is None or t.dtype is target:
                return t
            if cache and t.is_leaf and t.requires_grad and kiln.is_autocast_cache_enabled():
                return self._cached(t, target)
            return t.to(target)

        def cast(value):
            if isinstance(value, (list, tuple)) and any(isinstance(v, kiln.Tensor) for v in value):
                return type(value)(cast_one(v) for v in value)
            return cast_one(value)

        return cast

    def _cached(self, t, target):
        key = (id(t), target, kiln.is_grad_enabled())
        hit = self._cache.get(key)
        if hit is not None and hit[0] is t and hit[1] == t._version:
            return hit[2]
        out = t.to(target)
        self._cache[key] = (t, t._version, out)  # keeps t alive, so its id cannot be reused meanwhile
        return out


def _tensors(values) -> list:
    out = []
    for v in values:
        if isinstance(v, kiln.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(x for x in v if isinstance(x, kiln.Tensor))
    return out


# ---------------------------------------------------------------------------------------- custom functions


def _cast_inputs(value, device_type: str, dtype):
    if isinstance(value, kiln.Tensor):
        if value.is_floating_point() and value.dtype is not kiln.float64 and value.device.type == device_type:
            return value.to(dtype)
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(_cast_inputs(v, device_type, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _cast_inputs(v, device_type, dtype) for k, v in value.items()}
    return value


def custom_fwd(fwd: Callable | None = None, *, device_type: str, cast_inputs=None) -> Callable:
    """Decorate a custom ``autograd.Function``'s ``forward``: it remembers whether autocast was on (so
    :func:`custom_bwd` can run ``backward`` the same way); with ``cast_inputs=dtype`` its floating inputs
    on ``device_type`` are cast to ``dtype`` and it runs with autocast off, inside an autocast region."""
    if not isinstance(device_type, str):
        raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
    if fwd is None:
        return functools.partial(custom_fwd, device_type=device_type, cast_inputs=cast_inputs)

    @functools.wraps(fwd)
    def decorate_fwd(*args, **kwargs):
        ctx = args[0]
        ctx._dtype = kiln.get_autocast_dtype(device_type)
        if cast_inputs is None:
            ctx._fwd_used_autocast = kiln.is_autocast_enabled(device_type)
            return fwd(*args, **kwargs)
        on = kiln.is_autocast_enabled(device_type)
        ctx._fwd_used_autocast = False
        if not on:
            return fwd(*args, **kwargs)
        with kiln.autocast(device_type=device_type, enabled=False):
            return fwd(*_cast_inputs(args, device_type, cast_inputs), **_cast_inputs(kwargs, device_type, cast_inputs))

    return decorate_fwd


def custom_bwd(bwd: Callable | None = None, *, device_type: str) -> Callable:
    """Decorate a custom ``autograd.Function``'s ``backward``: it runs with the autocast state its
    :func:`custom_fwd`-decorated ``forward`` ran with."""
    if not isinstance(device_type, str):
        raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
    if bwd is None:
        return functools.partial(custom_bwd, device_type=device_type)

    @functools.wraps(bwd)
    def decorate_bwd(*args, **kwargs):
        ctx = args[0]
        with kiln.autocast(device_type=device_type, enabled=ctx._fwd_used_autocast, dtype=ctx._dtype):
            return bwd(*args, **kwargs)

    return decorate_bwd
