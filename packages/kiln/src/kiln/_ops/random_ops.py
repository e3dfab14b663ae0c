"""Random tensors: ``rand``/``randn``/``randint``/``randperm`` (+ ``_like``); the samplers ``normal``,
``bernoulli``, ``poisson`` and ``binomial``; and ``Tensor``'s in-place samplers ``uniform_``, ``normal_``,
``bernoulli_``, ``random_``, ``exponential_``, ``geometric_``, ``cauchy_`` and ``log_normal_``.

Every draw is made on the host from a :class:`kiln.Generator` (``generator=``, else the default generator
of the result's device) and copied to the device, so a seed gives the same values on every backend. The
streams are kiln's own (NumPy's PCG64), not PyTorch's: a seeded program is reproducible within kiln, and
tests compare distributions with PyTorch's, not values.

The samplers that take tensors of parameters (``normal``, ``bernoulli``, ``poisson``, ``binomial``) are ops
with device-generic kernels; as in PyTorch, their gradient with respect to the parameters is zero (a
sample is not reparameterised), and ``binomial`` has none. The in-place samplers write through
``copy_``'s path, so autograd sees them as PyTorch does: an error on a leaf that requires grad, a zero
gradient for the overwritten history otherwise.
"""

from __future__ import annotations

import numbers
import warnings

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import check_out_args, op, write_out
from kiln._memory_format import preserve_format, strided
from kiln._ops._meta import broadcast_pair, is_scalar, scalar_type_name
from kiln._ops.copy import _check_inplace_allowed, _check_no_overlap, _write, from_host, host_array
from kiln._ops.creation import (
    _allocating,
    _creation_args,
    _finish,
    _like,
    _scalar_value,
    _size_keyword,
    _takes_out,
    _unsupported,
    zeros_like,
)
from kiln._spec import Spec
from kiln._state import post_modes
from kiln._tensor import Tensor

__all__ = [
    "rand",
    "randn",
    "randint",
    "randperm",
    "rand_like",
    "randn_like",
    "randint_like",
    "normal",
    "bernoulli",
    "poisson",
    "binomial",
]

TOP_LEVEL = tuple(sorted(__all__))
"""The names ``kiln`` exports at its top level (as ``torch`` does): every public name here."""


# ---------------------------------------------------------------------------------------- creation


def _generator(generator, dev):
    from kiln.random import default_generator

    return generator if generator is not None else default_generator(dev)


def _float_draw(name, kernel, method, sizes, size, generator, dtype, device, requires_grad) -> Tensor:
    """``rand``/``randn``: floats of ``size`` from the generator's NumPy ``method`` (``random``,
    ``standard_normal``); integer dtypes refused with PyTorch's ``kernel`` message."""
    shape, d, dev = _creation_args(_size_keyword(name, sizes, size), dtype, device)
    if not d.is_floating_point:
        raise NotImplementedError(f"\"{kernel}\" not implemented for '{scalar_type_name(d)}'")
    gen = _generator(generator, dev)  # its stream is read at each draw: manual_seed replaces it
    np_dtype = np.float64 if d is dt.float64 else np.float32

    def draw() -> Tensor:
        return from_host(getattr(gen._rng, method)(shape, dtype=np_dtype), d, dev)

    return _finish(_drawn(draw), requires_grad)


def _drawn(draw) -> Tensor:
    """``draw()``, the random tensor; a tracer (a post-autograd dispatch mode) is told how to draw another
    like it, since no op of the dispatcher made it (``DispatchMode.made_outside``)."""
    t = draw()
    modes = post_modes()
    if modes:
        draw.random = True  # a tracer draws anew on every run; a program cannot hold it as a constant
        for mode in modes:
            mode.made_outside(t, draw)
    return t


@_takes_out
@_allocating
def rand(
    *sizes,
    size=None,
    generator=None,
    dtype=None,
    device=None,
    requires_grad=False,
    out=None,
    layout=strided,
    pin_memory=False,
) -> Tensor:
    """Uniform random values in ``[0, 1)`` of shape ``size``."""
    _unsupported(layout=layout, pin_memory=pin_memory)
    return _float_draw("rand", "check_uniform_bounds", "random", sizes, size, generator, dtype, device, requires_grad)


@_takes_out
@_allocating
def randn(
    *sizes,
    size=None,
    generator=None,
    dtype=None,
    device=None,
    requires_grad=False,
    out=None,
    layout=strided,
    pin_memory=False,
) -> Tensor:
    """Standard normal random values of shape ``size``."""
    _unsupported(layout=layout, pin_memory=pin_memory)
    return _float_draw(
        "randn", "normal_kernel_cpu", "standard_normal", sizes, size, generator, dtype, device, requires_grad
    )


@_takes_out
@_allocating
def randint(
    *args,
    low=None,
    high=None,
    size=None,
    generator=None,
    dtype=None,
    device=None,
    requires_grad=False,
    out=None,
    layout=strided,
    pin_memory=False,
) -> Tensor:
    """Random integers in ``[low, high)``: ``randint(high, size)`` or ``randint(low, high, size)``."""
    _unsupported(layout=layout, pin_memory=pin_memory)
    args = list(args)
    if size is None:
        if not args:
            raise TypeError("randint() missing required argument 'size'")
        size = args.pop()
    if low is not None or high is not None:  # randint(low=0, high=5, size=...), randint(high=5, size=...)
        if high is None:
            raise TypeError("randint() missing required argument 'high'")
        if (low is not None and args) or len(args) > 1:
            raise TypeError("randint() got multiple values for argument 'low'")
        args = [low if low is not None else (args[0] if args else 0), high]
    if len(args) == 1:
        low, high = 0, args[0]
    elif len(args) == 2:
        low, high = args
    else:
        raise TypeError("randint() expects (high, size) or (low, high, size)")
    low, high = int(_scalar_value(low)), int(_scalar_value(high))
    if low >= high:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}")
    shape, d, dev = _creation_args((size,), dtype, device, dt.int64)
    gen = _generator(generator, dev)  # its stream is read at each draw: manual_seed replaces it
    return _finish(
        _drawn(lambda: from_host(gen._rng.integers(low, high, size=shape, dtype=np.int64), d, dev)), requires_grad
    )


@_takes_out
@_allocating
def randperm(
    n: int,
    *,
    generator=None,
    dtype=dt.int64,
    device=None,
    requires_grad=False,
    out=None,
    layout=strided,
    pin_memory=False,
) -> Tensor:
    """A random permutation of the integers from 0 to ``n - 1`` (int64 unless ``dtype`` says otherwise),
    drawn from ``generator`` (the device's default generator when None)."""
    _unsupported(layout=layout, pin_memory=pin_memory)
    n = int(_scalar_value(n))
    if n < 0:
        raise RuntimeError(f"Trying to create tensor with negative dimension {n}: [{n}]")
    _, d, dev = _creation_args(((n,),), dtype, device, dt.int64)
    if d is dt.bool:
        raise NotImplementedError("\"randperm\" not implemented for 'Bool'")
    if not d.is_floating_point and n > 0 and n - 1 > np.iinfo(d.numpy).max:
        raise RuntimeError(f"value cannot be converted to type {np.dtype(d.numpy).name}_t without overflow")
    gen = _generator(generator, dev)  # its stream is read at each draw: manual_seed replaces it
    return _finish(_drawn(lambda: from_host(gen._rng.permutation(n).astype(d.numpy), d, dev)), requires_grad)


def rand_like(
    input: Tensor,
    *,
    generator=None,
    dtype=None,
    layout=None,
    device=None,
    requires_grad=False,
    memory_format=preserve_format,
) -> Tensor:
    """Uniform random values with ``input``'s shape, dtype and device (drawn from ``generator``)."""
    _unsupported(layout=layout, memory_format=memory_format)
    shape, d, dev = _like(input, dtype, device)
    return rand(shape, generator=generator, dtype=d, device=dev, requires_grad=requires_grad)


def randn_like(
    input: Tensor,
    *,
    generator=None,
    dtype=None,
    layout=None,
    device=None,
    requires_grad=False,
    memory_format=preserve_format,
) -> Tensor:
    """Standard normal values with ``input``'s shape, dtype and device (drawn from ``generator``)."""
    _unsupported(layout=layout, memory_format=memory_format)
    shape, d, dev = _like(input, dtype, device)
    return randn(shape, generator=generator, dtype=d, device=dev, requires_grad=requires_grad)


def randint_like(
    input: Tensor,
    low: int = 0,
    high: int | None = None,
    *,
    generator=None,
    dtype=None,
    layout=None,
    device=None,
    requires_grad=False,
    memory_format=preserve_format,
) -> Tensor:
    """Random integers in ``[low, high)`` with ``input``'s shape, dtype and device (``randint_like(input,
    high)`` draws from ``[0, high)``, as PyTorch's two-argument overload)."""
    _unsupported(layout=layout, memory_format=memory_format)
    if high is None:
        low, high = 0, low
    shape, d, dev = _like(input, dtype, device)
    return randint(low, high, shape, generator=generator, dtype=d, device=dev, requires_grad=requires_grad)


def _rng(generator, dev) -> np.random.Generator:
    return _generator(generator, dev)._rng


def _number(x):
    """A Python number from a number or a 0-d tensor (PyTorch accepts both for a float parameter)."""
    return x.item() if isinstance(x, Tensor) else x


def _g(x) -> str:
    """A float as PyTorch's messages print it (C++ stream formatting: ``-1``, ``0.5``, ``nan``)."""
    return f"{x:g}" if isinstance(x, float) else str(x)


def _float_compute(d: dt.dtype):
    """The host dtype draws for ``d`` are computed in: float64 for float64, float32 otherwise."""
    return np.float64 if d is dt.float64 else np.float32


# ---------------------------------------------------------------------------------------- normal


def _normal_meta(mean, std, generator=None):
    mt, st = isinstance(mean, Tensor), isinstance(std, Tensor)
    for name, v, t in (("mean", mean, mt), ("std", std, st)):
        if not t and not is_scalar(v):
            raise TypeError(f"normal(): argument '{name}' must be Tensor or float, not {type(v).__name__}")
    if not (mt or st):
        raise TypeError("normal(): expected a tensor mean or std (or a size with float mean and std)")
    if not st and not std >= 0.0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {_g(float(std))}")
    ref = mean if mt else std
    if mt and st:
        if mean._device != std._device:
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two devices, "
                f"{mean._device} and {std._device}!"
            )
        shape = broadcast_pair(mean._shape, std._shape)
    else:
        shape = ref._shape
    if not ref._dtype.is_floating_point:
        raise NotImplementedError(f"\"normal_kernel_cpu\" not implemented for '{scalar_type_name(ref._dtype)}'")
    return Spec((shape, ref._dtype, ref._device))


def _normal_kernel(spec, mean, std, generator=None):
    compute = _float_compute(spec.dtype)
    m = host_array(mean).astype(compute) if isinstance(mean, Tensor) else compute(mean)
    s = host_array(std).astype(compute) if isinstance(std, Tensor) else compute(std)
    if isinstance(std, Tensor) and np.any(~(s >= 0)):
        raise RuntimeError("normal expects all elements of std >= 0.0")
    z = _rng(generator, spec.device).standard_normal(spec.shape, dtype=compute)
    with np.errstate(invalid="ignore", over="ignore"):
        values = np.where(s == 0, np.broadcast_to(m, spec.shape), m + s * z)  # std 0: the mean, also for inf
    return from_host(values, spec.dtype, spec.device)


def _normal_node_name(args) -> str:
    mean, std = args[0], args[1]
    if isinstance(mean, Tensor) and isinstance(std, Tensor):
        return "NormalBackward3"
    return "NormalBackward1" if isinstance(mean, Tensor) else "NormalBackward2"


@op(
    tags=("random",),
    meta=_normal_meta,
    reference=_normal_kernel,
    device_generic=True,
    backward=lambda grad: (zeros_like(grad), zeros_like(grad)),
    grad_fn_name=_normal_node_name,
)
def _normal(mean: Tensor | float, std: Tensor | float, generator=None) -> Tensor:
    """Normal draws with a tensor ``mean`` and/or ``std`` (broadcast; the result has ``mean``'s dtype when it
    is a tensor, else ``std``'s); the gradient with respect to both is zero, as PyTorch's."""


def normal(
    mean,
    std=1.0,
    size=None,
    *,
    generator=None,
    out=None,
    dtype=None,
    layout=strided,
    device=None,
    pin_memory=False,
    requires_grad=False,
) -> Tensor:
    """Draws from normal distributions with the given means and standard deviations (``torch.normal``'s four
    forms): ``normal(mean_tensor, std_tensor)`` (broadcast), ``normal(mean_tensor, std=1.0)``,
    ``normal(mean, std_tensor)``, and ``normal(mean, std, size)`` with float ``mean`` and ``std`` (then
    ``dtype``, ``device`` and ``requires_grad`` apply). ``std`` must be non-negative. ``out=``: the result is
    written there."""
    if out is not None:
        check_out_args("normal", (mean, std))
        if isinstance(out, Tensor) and not out._dtype.is_floating_point:  # the draws are made in out's dtype
            raise NotImplementedError(f"\"normal_kernel_cpu\" not implemented for '{scalar_type_name(out._dtype)}'")
    if size is not None:
        _unsupported(layout=layout, pin_memory=pin_memory)
        mean, std = _number(mean), _number(std)
        if not (is_scalar(mean) and is_scalar(std)):
            raise TypeError(
                f"normal(): with a size, mean and std must be floats, not {type(mean).__name__} and "
                f"{type(std).__name__}"
            )
        if not std >= 0.0:
            raise RuntimeError(f"normal expects std >= 0.0, but found std {_g(float(std))}")
        shape, d, dev = _creation_args((size,), dtype, device, out._dtype if isinstance(out, Tensor) else None)
        if not d.is_floating_point:
            raise NotImplementedError(f"\"normal_kernel_cpu\" not implemented for '{scalar_type_name(d)}'")
        compute, gen = _float_compute(d), _generator(generator, dev)

        def draw() -> Tensor:
            z = gen._rng.standard_normal(shape, dtype=compute)
            with np.errstate(invalid="ignore", over="ignore"):
                return from_host(mean + std * z if std else np.full(shape, mean, compute), d, dev)

        result = _finish(_drawn(draw), requires_grad)
    else:
        if std is None or not (isinstance(std, Tensor) or is_scalar(std)):
            raise TypeError(f"normal(): argument 'std' must be Tensor or float, not {type(std).__name__}")
        if dtype is not None or device is not None or requires_grad:
            raise TypeError("normal(): dtype, device and requires_grad apply only with a size (float mean and std)")
        _unsupported(layout=layout, pin_memory=pin_memory)
        result = _normal(mean, std, generator)
    return result if out is None else write_out("normal", result, out)


# ---------------------------------------------------------------------------------------- bernoulli, poisson, binomial


def _bernoulli_meta(input, p=None, generator=None):
    if not isinstance(input, Tensor):
        raise TypeError(f"bernoulli(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")
    if p is None:
        if not input._dtype.is_floating_point:
            raise NotImplementedError(
                f"\"bernoulli_tensor_cpu_p_\" not implemented for '{scalar_type_name(input._dtype)}'"
            )
    else:
        _check_bernoulli_p(_number(p))
    return Spec((input._shape, input._dtype, input._device))


def _check_bernoulli_p(p) -> None:
    if not is_scalar(p):
        raise TypeError(f"bernoulli(): argument 'p' must be float, not {type(p).__name__}")
    if not 0 <= p <= 1:
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={_g(float(p))}")


_P_RANGE = "Expected p_in >= 0 && p_in <= 1 to be true, but got false."


def _bernoulli_draw(probs: np.ndarray, shape: tuple, rng: np.random.Generator) -> np.ndarray:
    """0/1 draws with the (broadcast) probabilities ``probs``; PyTorch's error for one outside [0, 1]."""
    probs = np.asarray(probs)
    if np.any(~((probs >= 0) & (probs <= 1))):
        raise RuntimeError(_P_RANGE)
    return rng.random(shape) < probs


def _bernoulli_kernel(spec, input, p=None, generator=None):
    probs = host_array(input).astype(np.float64) if p is None else float(_number(p))
    values = _bernoulli_draw(probs, spec.shape, _rng(generator, spec.device))
    return from_host(values, spec.dtype, spec.device)


def _bernoulli_backward(grad, p):
    if p is not None:
        raise RuntimeError("derivative for aten::bernoulli is not implemented")
    return zeros_like(grad)


@op(
    tags=("random",),
    meta=_bernoulli_meta,
    reference=_bernoulli_kernel,
    device_generic=True,
    backward=_bernoulli_backward,
)
def _bernoulli(input: Tensor, p: float | None = None, generator=None) -> Tensor:
    """0/1 draws of ``input``'s shape and dtype: with the probabilities ``input`` (floating), or with the
    one probability ``p``."""


def bernoulli(input: Tensor, p: float | None = None, *, generator=None, out=None) -> Tensor:
    """Draws 0 or 1 for each element: 1 with the probability that element of ``input`` holds (a floating
    tensor of values in ``[0, 1]``), or with the one probability ``p`` when given (then ``input`` gives only
    the shape and dtype). The result has ``input``'s dtype; ``out=``: it is written there."""
    if out is not None:
        check_out_args("bernoulli", (input, p))
        return write_out("bernoulli", _bernoulli(input, p, generator), out)
    return _bernoulli(input, p, generator)


def _tensor_bernoulli(self: Tensor, p: float | None = None, *, generator=None) -> Tensor:
    """0/1 draws with this tensor's probabilities, or with probability ``p`` (:func:`kiln.bernoulli`)."""
    if isinstance(p, Tensor):
        raise TypeError("bernoulli(): argument 'p' must be float, not Tensor (use bernoulli_ for tensor probabilities)")
    return _bernoulli(self, p, generator)


Tensor.bernoulli = _tensor_bernoulli


def _poisson_meta(input, generator=None):
    if not isinstance(input, Tensor):
        raise TypeError(f"poisson(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")
    if not input._dtype.is_floating_point:
        raise NotImplementedError(f"\"poisson_cpu\" not implemented for '{scalar_type_name(input._dtype)}'")
    return Spec((input._shape, input._dtype, input._device))


def _poisson_kernel(spec, input, generator=None):
    rates = host_array(input).astype(np.float64)
    if np.any(~(rates >= 0)):
        raise RuntimeError("invalid Poisson rate, expected rate to be non-negative")
    rng = _rng(generator, spec.device)
    big = rates > 1e15  # beyond what NumPy samples; PyTorch's sampler overflows to int64's minimum there
    values = np.asarray(rng.poisson(np.where(big, 0.0, rates)), dtype=np.float64)
    values[big] = -(2.0**63)
    return from_host(values, spec.dtype, spec.device)


@op(
    tags=("random",),
    meta=_poisson_meta,
    reference=_poisson_kernel,
    device_generic=True,
    backward=lambda grad: zeros_like(grad),
)
def poisson(input: Tensor, generator=None) -> Tensor:
    """Poisson draws with the rates ``input`` (a floating tensor of non-negative values), of its dtype; the
    gradient with respect to the rates is zero, as PyTorch's."""


def _binomial_meta(count, prob, generator=None):
    for name, v, pos in (("count", count, 1), ("prob", prob, 2)):
        if not isinstance(v, Tensor):
            raise TypeError(f"binomial(): argument '{name}' (position {pos}) must be Tensor, not {type(v).__name__}")
        if not v._dtype.is_floating_point:
            raise ValueError(
                f"binomial only supports floating-point dtypes for {name}, got: {scalar_type_name(v._dtype)}"
            )
    if prob._dtype is not count._dtype:
        raise RuntimeError(f"Found dtype {scalar_type_name(prob._dtype)} but expected {scalar_type_name(count._dtype)}")
    if count._dtype.itemsize == 2:
        raise NotImplementedError(f"\"binomial_cpu\" not implemented for '{scalar_type_name(count._dtype)}'")
    return Spec((broadcast_pair(count._shape, prob._shape), count._dtype, count._device))


def _binomial_kernel(spec, count, prob, generator=None):
    n = np.broadcast_to(host_array(count).astype(np.float64), spec.shape)
    p = np.broadcast_to(host_array(prob).astype(np.float64), spec.shape)
    bad = np.isnan(n) | np.isnan(p)
    trials = np.where(bad | ~np.isfinite(n), 0.0, np.clip(np.floor(n), 0.0, 2.0**62)).astype(np.int64)
    values = _rng(generator, spec.device).binomial(trials, np.where(bad, 0.0, np.clip(p, 0.0, 1.0)))
    values = np.where(bad, np.nan, np.asarray(values, dtype=np.float64))
    return from_host(values, spec.dtype, spec.device)


def _binomial_backward(grad):
    raise RuntimeError("derivative for aten::binomial is not implemented")


@op(
    tags=("random",),
    meta=_binomial_meta,
    reference=_binomial_kernel,
    device_generic=True,
    backward=_binomial_backward,
    grad_fn_name="NotImplemented",
)
def binomial(count: Tensor, prob: Tensor, generator=None) -> Tensor:
    """Binomial draws: the number of successes in ``count`` trials (the integer part of each element; a
    negative count gives 0) with success probability ``prob`` (broadcast with ``count``; both floating, of one
    dtype). Not differentiable."""


# ---------------------------------------------------------------------------------------- in-place samplers

_FLOAT_LIMITS = {dt.float16: 65504.0, dt.bfloat16: 3.3895313892515355e38, dt.float32: 3.4028234663852886e38}
_MANTISSA_DIGITS = {dt.float16: 11, dt.bfloat16: 8, dt.float32: 24, dt.float64: 53}
_TYPE_NAMES = {  # the ScalarType names PyTorch's distribution messages print
    dt.float16: "Half",
    dt.bfloat16: "BFloat16",
    dt.float32: "Float",
    dt.float64: "Double",
}


def _sample_into(self: Tensor, generator, draw, label: str, operands: tuple = ()) -> Tensor:
    """Write ``draw(rng, shape)`` (host values) into ``self`` through ``copy_``'s path; returns ``self``.
    Autograd's node for the old history is named ``label`` (PyTorch's: ``NormalBackward0``...), with an
    edge per tensor parameter of the sampler (``operands``)."""
    gen, shape, d, dev = _generator(generator, self._device), self._shape, self._dtype, self._device
    src = _drawn(lambda: from_host(np.asarray(draw(gen._rng, shape)), d, dev))
    return _write(self, src, label=label, operands=operands)


def _inplace_checks(self: Tensor, name: str) -> None:
    """What PyTorch checks before a sampler's own arguments: a tensor to write, history that allows the write,
    elements that do not share memory."""
    if not isinstance(self, Tensor):
        raise TypeError(f"{name}(): argument 'self' must be Tensor, not {type(self).__name__}")
    _check_inplace_allowed(self)
    _check_no_overlap(self)


def _float_param(value, name: str, method: str) -> float:
    value = _number(value)
    if isinstance(value, bool) or not is_scalar(value):
        raise TypeError(f"{method}(): argument '{name}' must be float, not {type(value).__name__}")
    return float(value)


def _need_float(self: Tensor, kernel: str) -> None:
    if not self._dtype.is_floating_point:
        raise NotImplementedError(f"\"{kernel}\" not implemented for '{scalar_type_name(self._dtype)}'")


def _continuous_only(self: Tensor, what: str, name) -> None:
    if not self._dtype.is_floating_point:
        raise RuntimeError(
            f"{what} distribution is a continuous probability distribution. dtype must be a floating point but "
            f"you specified {name}"
        )


def uniform_(self: Tensor, from_: float = 0.0, to: float = 1.0, *, generator=None, **kwargs) -> Tensor:
    """Fill with draws from the continuous uniform distribution on ``[from, to)`` (PyTorch's parameter is
    named ``from``, which kiln also takes as a keyword: ``t.uniform_(**{"from": -1, "to": 1})``)."""
    from_ = kwargs.pop("from", from_)
    if kwargs:
        raise TypeError(f"uniform_() got an unexpected keyword argument '{next(iter(kwargs))}'")
    _inplace_checks(self, "uniform_")
    lo, hi = _float_param(from_, "from", "uniform_"), _float_param(to, "to", "uniform_")
    _need_float(self, "check_uniform_bounds")
    d = self._dtype
    limit = _FLOAT_LIMITS.get(d, float(np.finfo(np.float64).max))
    for name, v in (("from", lo), ("to", hi)):
        if not -limit <= v <= limit:
            raise RuntimeError(f"{name} is out of bounds for {dt.CPP_TYPE_NAMES[d]}")
    if lo > hi:
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found from={_g(lo)} > to={_g(hi)}")
    if hi - lo > limit:
        raise RuntimeError(
            f"uniform_ expects to-from <= std::numeric_limits<{_TYPE_NAMES[d]}>::max(), but found to={_g(hi)} and "
            f"from={_g(lo)} which result in to-from to exceed the limit"
        )
    compute = _float_compute(d)
    return _sample_into(
        self, generator, lambda rng, shape: lo + (hi - lo) * rng.random(shape, dtype=compute), "UniformBackward0"
    )


def normal_(self: Tensor, mean: float = 0.0, std: float = 1.0, *, generator=None) -> Tensor:
    """Fill with draws from the normal distribution ``N(mean, std²)`` (``std >= 0``)."""
    _inplace_checks(self, "normal_")
    mean, std = _float_param(mean, "mean", "normal_"), _float_param(std, "std", "normal_")
    if not std >= 0.0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {_g(std)}")
    _need_float(self, "normal_kernel_cpu")
    compute = _float_compute(self._dtype)

    def draw(rng, shape):
        z = rng.standard_normal(shape, dtype=compute)
        with np.errstate(invalid="ignore", over="ignore"):
            return mean + std * z if std else np.full(shape, mean, compute)

    return _sample_into(self, generator, draw, "NormalBackward0")


def bernoulli_(self: Tensor, p: Tensor | float = 0.5, *, generator=None) -> Tensor:
    """Fill with 0 or 1: 1 with probability ``p``, a float or a floating tensor broadcast to this tensor's
    shape (any dtype is filled, bool and integers included)."""
    _inplace_checks(self, "bernoulli_")
    if isinstance(p, Tensor):
        if not p._dtype.is_floating_point:
            raise NotImplementedError(f"\"bernoulli_tensor_cpu_p_\" not implemented for '{scalar_type_name(p._dtype)}'")
        probs = host_array(p.expand(self._shape).detach()).astype(np.float64)
    else:
        probs = _float_param(p, "p", "bernoulli_")
        _check_bernoulli_p(probs)
    label, operands = ("BernoulliBackward1", (p,)) if isinstance(p, Tensor) else ("BernoulliBackward2", ())
    return _sample_into(self, generator, lambda rng, shape: _bernoulli_draw(probs, shape, rng), label, operands)


def exponential_(self: Tensor, lambd: float = 1.0, *, generator=None) -> Tensor:
    """Fill with draws from the exponential distribution of rate ``lambd`` (``> 0``)."""
    _inplace_checks(self, "exponential_")
    lambd = _float_param(lambd, "lambd", "exponential_")
    if not lambd > 0.0:
        raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={_g(lambd)}")
    _continuous_only(self, "Exponential", scalar_type_name(self._dtype))
    return _sample_into(
        self, generator, lambda rng, shape: rng.standard_exponential(shape) / lambd, "ExponentialBackward0"
    )


def geometric_(self: Tensor, p: float, *, generator=None) -> Tensor:
    """Fill with draws from the geometric distribution: the number of Bernoulli(``p``) trials up to and
    including the first success (``0 < p < 1``; values 1, 2, ...)."""
    _inplace_checks(self, "geometric_")
    p = _float_param(p, "p", "geometric_")
    if not 0.0 < p < 1.0:
        raise RuntimeError(f"geometric_ expects p to be in (0, 1), but got p={_g(p)}")
    if self._dtype is dt.bool:
        raise NotImplementedError("\"geometric_cpu\" not implemented for 'Bool'")
    return _sample_into(self, generator, lambda rng, shape: rng.geometric(p, shape), "GeometricBackward0")


def cauchy_(self: Tensor, median: float = 0.0, sigma: float = 1.0, *, generator=None) -> Tensor:
    """Fill with draws from the Cauchy distribution of location ``median`` and scale ``sigma`` (``> 0``)."""
    _inplace_checks(self, "cauchy_")
    median, sigma = _float_param(median, "median", "cauchy_"), _float_param(sigma, "sigma", "cauchy_")
    if not sigma > 0.0:
        raise RuntimeError(f"cauchy_ expects sigma > 0.0, but found sigma={_g(sigma)}")
    _continuous_only(self, "Cauchy", dt.CPP_TYPE_NAMES[self._dtype])
    return _sample_into(
        self, generator, lambda rng, shape: median + sigma * rng.standard_cauchy(shape), "CauchyBackward0"
    )


def log_normal_(self: Tensor, mean: float = 1.0, std: float = 2.0, *, generator=None) -> Tensor:
    """Fill with draws whose logarithm is normal, ``exp(N(mean, std²))`` (``std > 0``)."""
    _inplace_checks(self, "log_normal_")
    mean, std = _float_param(mean, "mean", "log_normal_"), _float_param(std, "std", "log_normal_")
    if not std > 0.0:
        raise RuntimeError(f"log_normal_ expects std > 0.0, but found std={_g(std)}")
    _need_float(self, "log_normal_cpu")

    def draw(rng, shape):
        with np.errstate(over="ignore"):
            return np.exp(mean + std * rng.standard_normal(shape))

    return _sample_into(self, generator, draw, "LogNormalBackward0")


def _random_bounds(d: dt.dtype) -> tuple[int, int]:
    """The integers ``random_`` may produce in ``d`` by default: ``[0, max]`` for integers and bool, ``[0, 2**digits]``
    for floating dtypes (every integer there is exact)."""
    if d is dt.bool:
        return 0, 1
    if d.is_floating_point:
        return 0, 2 ** _MANTISSA_DIGITS[d]
    return 0, int(np.iinfo(d.numpy).max)


def _int_param(value, name: str):
    value = _number(value)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"random_(): argument '{name}' must be int, not {type(value).__name__}")
    value = int(value)
    if not -(2**63) <= value < 2**63:
        raise ValueError("Overflow when unpacking long long")
    return value


def _check_random_range(d: dt.dtype, lo: int, hi_inc: int) -> None:
    """PyTorch's checks of a ``random_`` range ``[lo, hi_inc]`` against the dtype: errors for integers, a
    warning for floating dtypes beyond the exactly representable integers."""
    if d.is_floating_point:
        digits = _MANTISSA_DIGITS[d]
        for name, v in (("from", lo), ("to - 1", hi_inc)):
            if not -(2**digits) <= v <= 2**digits:
                warnings.warn(
                    f"{name} is out of bounds [-(2^{digits}), 2^{digits}]. Due to precision limitations "
                    f"{dt.CPP_TYPE_NAMES[d]} can support discrete uniform distribution only within this range. This "
                    "warning will become an error in version 1.7 release, please fix the code in advance",
                    UserWarning,
                    stacklevel=4,
                )
        return
    info = (0, 1) if d is dt.bool else (int(np.iinfo(d.numpy).min), int(np.iinfo(d.numpy).max))
    for name, v in (("from", lo), ("to - 1", hi_inc)):
        if not info[0] <= v <= info[1]:
            raise RuntimeError(f"{name} is out of bounds for {dt.CPP_TYPE_NAMES[d]}")


def random_(self: Tensor, *args, generator=None, **kwargs) -> Tensor:
    """Fill with integers drawn uniformly: ``random_()`` from ``[0, max]`` (for floating dtypes ``[0, 2**d]``,
    ``d`` the mantissa's digits), ``random_(to)`` from ``[0, to)``, ``random_(from, to)`` from ``[from, to)``
    (``to=None``: up to the dtype's maximum). PyTorch's first parameter is named ``from``; kiln takes it as a
    keyword too (``**{"from": 1}``)."""
    names = ("from", "to")
    if len(args) > 2:
        raise TypeError(f"random_() takes at most 2 positional arguments ({len(args)} given)")
    given = dict(zip(names if len(args) == 2 or "to" in kwargs else ("to",), args))
    for k in list(kwargs):
        if k not in names or k in given:
            raise TypeError(f"random_() got an unexpected keyword argument '{k}'")
        given[k] = kwargs.pop(k)
    _inplace_checks(self, "random_")
    d = self._dtype
    lo, hi_inc = _random_bounds(d)
    if "from" in given or "to" in given:
        lo = _int_param(given.get("from", 0), "from")
        to = _int_param(given.get("to"), "to")
        if to is None:  # [from, the dtype's maximum]
            hi_inc = _random_bounds(d)[1]
            if d.is_floating_point and lo > hi_inc:
                raise RuntimeError(
                    "random_ expects 'from' casted to dtype to be less than or equal to 'to_inc' casted to dtype, "
                    f"but got from={lo} > to_inc={hi_inc}"
                )
        else:
            if lo >= to:
                raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={lo} >= to={to}")
            hi_inc = to - 1
        _check_random_range(d, lo, hi_inc)
    label = "RandomBackward0" if "from" in given else "RandomBackward1" if "to" in given else "RandomBackward2"
    return _sample_into(self, generator, lambda rng, shape: rng.integers(lo, hi_inc, shape, endpoint=True), label)


for _fn in (uniform_, normal_, bernoulli_, exponential_, geometric_, cauchy_, log_normal_, random_):
    setattr(Tensor, _fn.__name__, _fn)
