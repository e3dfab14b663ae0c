"""Elementwise ops: arithmetic with broadcasting, unary math, ``where`` (the comparisons are in :mod:`.comparison`).

Families share one meta and one reference builder each, so a new op is one ``op(...)`` definition.
Half-precision inputs (float16, bfloat16) are computed in float32 and rounded once, as PyTorch's CPU
kernels do.
"""

from __future__ import annotations

import math

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._lazy import first_call
from kiln._ops._meta import astype, broadcast_pair, common_device, is_scalar, result_type, scalar_type_name
from kiln._spec import ComputeSpec, Spec
from kiln._tensor import Tensor

reciprocal = first_call(globals(), "kiln._ops.unary_math", "reciprocal")  # unary_math imports this module

TOP_LEVEL = (
    "abs",
    "absolute",
    "add",
    "bitwise_and",
    "bitwise_not",
    "bitwise_or",
    "bitwise_xor",
    "cos",
    "div",
    "divide",
    "exp",
    "isnan",
    "log",
    "logical_not",
    "mul",
    "multiply",
    "neg",
    "negative",
    "pow",
    "sigmoid",
    "sign",
    "sin",
    "sqrt",
    "sub",
    "subtract",
    "tanh",
    "true_divide",
    "where",
)
"""The names ``kiln`` exports at its top level (as ``torch`` does)."""

Number = "int | float | bool"
_HALF = (dt.float16, dt.bfloat16)


_compute_np = dt.compute_numpy  # (imported from here by the other op modules)


def _arg(x, np_dtype, result: dt.dtype | None = None):
    """An operand in the compute dtype. Python integers wrap into integer compute dtypes as in
    PyTorch (``uint8_tensor + -3`` adds 253); a Python float meeting a half-precision ``result`` is
    rounded to that precision first, as PyTorch converts scalars to the common dtype (except in mul
    and div, whose references leave ``result`` out: PyTorch keeps the scalar in float32 there); other
    Python scalars stay weak."""
    if isinstance(x, np.ndarray):
        return x if (x.dtype is np_dtype or x.dtype == np_dtype) else astype(x, np_dtype)
    if np_dtype.kind in "iub" and isinstance(x, int):
        return np.array(x).astype(np_dtype)[()]
    if result in _HALF and isinstance(x, float):
        return np.float32(np.array(x, dtype=result.numpy))
    return x


def _operands(a, b, np_dtype, result: dt.dtype | None = None) -> tuple:
    """Both operands of a binary reference through :func:`_arg`, in one call: arrays already in the compute
    dtype (the usual case) come back as they are."""
    if a.__class__ is not np.ndarray or a.dtype is not np_dtype:
        a = _arg(a, np_dtype, result)
    if b.__class__ is not np.ndarray or b.dtype is not np_dtype:
        b = _arg(b, np_dtype, result)
    return a, b


def _check_operand(x, name: str, op_name: str) -> None:
    if not isinstance(x, Tensor) and not is_scalar(x):
        raise TypeError(f"{op_name}(): argument '{name}' must be Tensor or Number, not {type(x).__name__}")
    _check_int_range(x)


def _check_int_range(x) -> None:
    """PyTorch's errors for a Python int operand that neither int64 nor uint64 holds (its scalars)."""
    if x.__class__ is int and not -(2**63) <= x < 2**64:
        raise OverflowError("int too big to convert" if x > 0 else "can't convert negative int to unsigned")


# ---------------------------------------------------------------------------------------- binary


_PY_SCALARS = (int, float, bool)
_SCALAR_RESULT: dict[tuple, dt.dtype] = {}


def binary_meta(op_name: str, *, float_result: bool = False, bool_result: bool = False, alpha: bool = False):
    """Meta for ``f(input, other)``: broadcast shape, promoted dtype, common device; with ``alpha``, the
    checks of add's and sub's third argument."""

    def meta(input, other, *extra):
        if isinstance(input, Tensor) and isinstance(other, Tensor):
            shape = input._shape
            if shape != other._shape:
                shape = broadcast_pair(shape, other._shape)
            a, b = input._dtype, other._dtype
            dtype = a if (a is b) else result_type(input, other)
            dev = input._device if input._device is other._device else common_device(op_name, input, other)
        elif isinstance(input, Tensor) and other.__class__ in _PY_SCALARS:  # tensor op Python number: memoised
            shape, dev = input._shape, input._device
            _check_int_range(other)
            key = (input._dtype, bool(shape), other.__class__, dt._default_dtype)
            dtype = _SCALAR_RESULT.get(key)
            if dtype is None:
                dtype = _SCALAR_RESULT[key] = result_type(input, other)
        else:
            _check_operand(input, "input", op_name)
            _check_operand(other, "other", op_name)
            tensor_operand = input if isinstance(input, Tensor) else other
            shape = tensor_operand._shape if isinstance(tensor_operand, Tensor) else ()
            dtype = result_type(input, other)
            dev = common_device(op_name, input, other)
        if float_result and not dtype.is_floating_point:
            dtype = dt.get_default_dtype()
        if alpha and extra and extra[0] != 1:
            _alpha_check(dtype, extra[0], op_name)
        if bool_result:
            return ComputeSpec((shape, dt.bool, dev, dtype))  # extra field: the compute dtype
        return Spec((shape, dtype, dev))

    return meta


def binary_reference(np_fn):
    """Reference kernel ``np_fn(a, b)`` computed in the result dtype (float32 for half types)."""

    def ref(spec, a, b, *extra):
        d = spec.compute_dtype if len(spec) > 3 else spec.dtype
        compute = _compute_np(d)
        a, b = _operands(a, b, compute, d)
        return np_fn(a, b, *extra)

    return ref


def _alpha_check(dtype: dt.dtype, alpha, op_name: str) -> None:
    if not is_scalar(alpha) and not (isinstance(alpha, Tensor) and not alpha._shape):  # a 0-d tensor is a number
        raise TypeError(f"{op_name}(): argument 'alpha' must be Number, not {type(alpha).__name__}")
    if isinstance(alpha, bool) and dtype is not dt.bool:
        raise RuntimeError("Boolean alpha only supported for Boolean results.")
    if not dtype.is_floating_point and isinstance(alpha, float):
        raise RuntimeError("For integral input tensors, argument alpha must not be a floating point number.")


_add_meta = binary_meta("add", alpha=True)


def _sub_meta(input, other, alpha=1):
    spec = _SUB_BASE(input, other)
    a_bool, b_bool = _is_bool(input), _is_bool(other)
    if a_bool and b_bool:
        raise RuntimeError(
            "Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or `logical_xor()` "
            "operator instead."
        )
    if a_bool or b_bool:
        raise RuntimeError(
            "Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to invert "
            "a mask, use the `~` or `logical_not()` operator instead."
        )
    if alpha != 1:
        _alpha_check(spec.dtype, alpha, "sub")
    return spec


def _is_bool(x) -> bool:
    return x._dtype is dt.bool if isinstance(x, Tensor) else isinstance(x, bool)


_SUB_BASE = binary_meta("sub")


def _alpha_ref(np_fn):
    """The reference of ``add``/``sub``: ``np_fn(a, alpha * b)`` in the compute dtype, the product rounded
    first; a bool ``add`` is ``a or (b and alpha)`` (the meta refuses bool ``sub``)."""

    def ref(spec, a, b, alpha=1, out=None):
        d = spec.dtype
        compute = _compute_np(d)
        a, b = _operands(a, b, compute, d)
        if d is dt.bool:
            return np.logical_or(a, np.logical_and(b, bool(alpha)), out=out)
        if alpha != 1:
            b = np.multiply(b, _arg(alpha, compute), dtype=compute)
        return np_fn(a, b, dtype=compute, out=out)

    def into(spec, out, b, alpha=1):
        """The write into ``out`` (``input``'s values): NumPy's ufunc buffers an operand that overlaps it."""
        ref(spec, out, b, alpha, out=out)

    ref.same_dtype_ufunc = (np_fn, (1,))
    ref.write_into = into  # the reference in-place kernel writes into self's own array (kiln._reference)
    return ref


@op(
    tags=("pointwise",),
    inplace=True,
    meta=_add_meta,
    reference=_alpha_ref(np.add),
    backward=lambda grad, alpha: (grad, grad if alpha == 1 else grad * alpha),
    methods=("add", "__add__", "__radd__"),
)
def add(input: Tensor, other: Tensor | Number, *, alpha: Number = 1) -> Tensor:
    """``input + alpha * other``, broadcasting ``input`` and ``other`` (``torch.add``)."""


def _sub_decomposed(input, other, *, alpha=1):
    """``sub`` in kiln ops: ``add`` with ``-alpha`` (``a + (-alpha) * b`` rounds as ``a - alpha * b``)."""
    return add(input, other, alpha=-alpha)


@op(
    decompose=_sub_decomposed,
    tags=("pointwise",),
    inplace=True,
    meta=_sub_meta,
    reference=_alpha_ref(np.subtract),
    backward=lambda grad, alpha: (grad, -grad if alpha == 1 else grad * -alpha),
    methods=("sub", "__sub__", "subtract"),
    grad_fn_name=lambda args: "SubBackward0" if isinstance(args[0], Tensor) else "RsubBackward1",
)
def sub(input: Tensor, other: Tensor | Number, *, alpha: Number = 1) -> Tensor:
    """``input - alpha * other``, broadcasting (``torch.sub``)."""


subtract = sub


def _rsub(self, other):
    return sub(other, self)


Tensor.__rsub__ = _rsub


def _mul_ref(spec, a, b, out=None):
    if spec.dtype is dt.bool:
        return np.logical_and(a, b, out=out)
    compute = _compute_np(spec.dtype)
    # no half-precision rounding of a Python scalar here: PyTorch multiplies (and divides) by it in float32
    a, b = _operands(a, b, compute)
    return np.multiply(a, b, dtype=compute, out=out)


_mul_ref.same_dtype_ufunc = (np.multiply, ())
_mul_ref.write_into = lambda spec, out, b: _mul_ref(spec, out, b, out=out)  # into self's array (kiln._reference)


def _mul_backward(grad, input, other, needs_input_grad):
    return (
        grad * other if needs_input_grad[0] else None,
        grad * input if needs_input_grad[1] else None,
    )


@op(
    tags=("pointwise",),
    inplace=True,
    meta=binary_meta("mul"),
    reference=_mul_ref,
    backward=_mul_backward,
    methods=("mul", "__mul__", "__rmul__", "multiply"),
)
def mul(input: Tensor, other: Tensor | Number) -> Tensor:
    """``input * other``, broadcasting (``torch.mul``)."""


multiply = mul


def _div_meta(input, other, rounding_mode=None):
    if rounding_mode not in (None, "trunc", "floor"):
        raise RuntimeError(
            f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '{rounding_mode}'"
        )
    spec = _DIV_TRUE(input, other) if rounding_mode is None else _DIV_ROUND(input, other)
    if rounding_mode is not None and spec.dtype is dt.bool:
        raise NotImplementedError(f"\"div_{rounding_mode}_cpu\" not implemented for 'Bool'")
    return spec


_DIV_TRUE = binary_meta("div", float_result=True)
_DIV_ROUND = binary_meta("div")


def _div_ref(spec, a, b, rounding_mode=None):
    out = spec.dtype
    compute = _compute_np(out)
    a, b = _arg(a, compute), _arg(b, compute)  # a Python scalar stays float32, as for mul
    if rounding_mode is None:
        return np.true_divide(a, b, dtype=compute)
    if out.is_floating_point:
        if rounding_mode == "floor":  # Python's floor division (divmod-based), as PyTorch
            return np.floor_divide(a, b, dtype=compute)
        return np.trunc(np.true_divide(a, b, dtype=compute))
    if 0 not in spec.shape and np.any(np.asarray(b) == 0):
        raise RuntimeError("ZeroDivisionError")
    q = np.floor_divide(a, b, dtype=compute)
    if rounding_mode == "floor":
        return q
    fix = (np.remainder(a, b, dtype=compute) != 0) & ((np.asarray(a) < 0) != (np.asarray(b) < 0))
    return q + fix


def _div_backward(grad, input, other, rounding_mode, needs_input_grad):
    if rounding_mode is not None:
        z = _zeros_like(grad)  # zeros, as PyTorch: not grad * 0, which is NaN for an infinite or NaN grad
        return (z if needs_input_grad[0] else None, z if needs_input_grad[1] else None)
    return (
        grad / other if needs_input_grad[0] else None,
        -grad * input / (other * other) if needs_input_grad[1] else None,
    )


@op(
    tags=("pointwise",),
    inplace=True,
    meta=_div_meta,
    reference=_div_ref,
    backward=_div_backward,
    methods=("div", "__truediv__", "divide", "true_divide"),
)
def div(input: Tensor, other: Tensor | Number, *, rounding_mode: str | None = None) -> Tensor:
    """``input / other`` (true division; ``rounding_mode`` ``'trunc'`` or ``'floor'`` rounds), broadcasting."""


divide = true_divide = div


def _rdiv(self, other):
    """``other / self``: PyTorch computes it as ``self.reciprocal() * other`` (two roundings), and so does kiln."""
    if isinstance(other, Tensor):
        return div(other, self)
    return mul(reciprocal(self), other)


Tensor.__rtruediv__ = _rdiv


def _pow_meta(input, exponent):
    spec = _POW_BASE(input, exponent)
    # Only a negative *scalar* exponent is refused; a tensor of exponents computes 1/x truncated (PyTorch)
    if not spec.dtype.is_floating_point and is_scalar(exponent) and exponent < 0:
        raise RuntimeError("Integers to negative integer powers are not allowed.")
    if spec.dtype is dt.bool and not isinstance(input, Tensor):
        raise NotImplementedError("\"pow\" not implemented for 'Bool'")
    return spec


_POW_BASE = binary_meta("pow")


def _pow_node_name(args) -> str:
    if not isinstance(args[0], Tensor):
        return "PowBackward2"
    return "PowBackward1" if isinstance(args[1], Tensor) else "PowBackward0"


# A float32 or float64 tensor to one of these Python-number powers is computed as PyTorch computes it:
# with multiplications, a division or a square root, not the general pow, which is tens of times slower
# (and differs at infinities and -0.0: pow(-inf, 0.5) is inf, sqrt(-inf) NaN). For float16 and bfloat16
# kiln keeps the general pow. kiln-cpu's loops compute these expressions in this order.
_POW_SPECIAL: dict[float, object] = {
    2: np.square,
    3: lambda x: x * x * x,
    0.5: np.sqrt,
    -0.5: lambda x: np.divide(1, np.sqrt(x)),  # divide, not reciprocal: the same IEEE quotient, SIMD loops
    -1: lambda x: np.divide(1, x),
    -2: lambda x: np.divide(1, x * x),
}


def _pow_ref(spec, a, b):
    if spec.dtype is dt.bool:  # NumPy has no boolean power: x ** y is x or not y
        return np.logical_or(_arg(a, np.dtype(bool)), np.logical_not(_arg(b, np.dtype(bool))))
    compute = _compute_np(spec.dtype)
    special = _POW_SPECIAL.get(b) if b.__class__ in (int, float) and spec.dtype in (dt.float32, dt.float64) else None
    if special is not None:
        return special(_arg(a, compute))
    a, b = _arg(a, compute, spec.dtype), _arg(b, compute, spec.dtype)
    if compute.kind in "iu":
        neg = np.asarray(b) < 0
        if neg.any():  # NumPy refuses; PyTorch gives the truncated 1 / a ** -b
            pos = np.power(a, np.where(neg, 0, b).astype(compute))
            odd = np.asarray(b) % 2 != 0
            special = np.where(a == 1, 1, np.where(a == -1, np.where(odd, -1, 1), 0)).astype(compute)
            return np.where(neg, special, pos)
    return np.power(a, b, dtype=compute)


def _pow_backward(grad, input, exponent, needs_input_grad):
    g_in = g_exp = None
    if needs_input_grad[0]:
        if is_scalar(exponent):
            g_in = _zeros_like(grad) if exponent == 0 else grad * exponent * pow(input, exponent - 1)
        else:
            g_in = grad * exponent * pow(input, exponent - 1)
            g_in = where(exponent == 0, 0.0, g_in)
    if needs_input_grad[1]:
        # recomputed rather than saved: an in-place pow_ then must not pin its own result
        result = pow(input, exponent)
        if is_scalar(input):  # scalar ** tensor
            if input == 0:
                g_exp = where(exponent >= 0, 0.0, grad * result * -math.inf)
            else:
                g_exp = grad * result * (math.log(input) if input > 0 else math.nan)
        else:
            g_exp = grad * where((input == 0) & (exponent >= 0), 0.0, result * log(input))
    return (g_in, g_exp)


@op(
    tags=("pointwise",),
    inplace=True,
    meta=_pow_meta,
    reference=_pow_ref,
    backward=_pow_backward,
    autocast="fp32_float16",
    methods=("pow", "__pow__"),
    grad_fn_name=_pow_node_name,
)
def pow(input: Tensor | Number, exponent: Tensor | Number) -> Tensor:  # noqa: A001
    """``input ** exponent`` elementwise, broadcasting (``torch.pow``)."""


def _rpow(self, other):
    return pow(other, self)


Tensor.__rpow__ = _rpow


def _bitwise_meta(name):
    base = binary_meta(name)

    def meta(input, other):
        spec = base(input, other)
        if spec.dtype.is_floating_point:
            raise NotImplementedError(f"\"{name}_cpu\" not implemented for '{scalar_type_name(spec.dtype)}'")
        return spec

    return meta


@op(
    tags=("pointwise",),
    inplace=True,
    meta=_bitwise_meta("bitwise_and"),
    reference=binary_reference(np.bitwise_and),
    methods=("bitwise_and", "__and__", "__rand__"),
)
def bitwise_and(input: Tensor, other: Tensor | Number) -> Tensor:
    """Bitwise AND of integer or bool tensors (logical AND for bool)."""


@op(
    tags=("pointwise",),
    inplace=True,
    meta=_bitwise_meta("bitwise_or"),
    reference=binary_reference(np.bitwise_or),
    methods=("bitwise_or", "__or__", "__ror__"),
)
def bitwise_or(input: Tensor, other: Tensor | Number) -> Tensor:
    """Bitwise OR of integer or bool tensors (logical OR for bool)."""


@op(
    tags=("pointwise",),
    inplace=True,
    meta=_bitwise_meta("bitwise_xor"),
    reference=binary_reference(np.bitwise_xor),
    methods=("bitwise_xor", "__xor__", "__rxor__"),
)
def bitwise_xor(input: Tensor, other: Tensor | Number) -> Tensor:
    """Bitwise XOR of integer or bool tensors (logical XOR for bool)."""


# ---------------------------------------------------------------------------------------- unary


_BOOL_ERRORS = {
    "neg": (
        RuntimeError,
        "Negation, the `-` operator, on a bool tensor is not supported. If you are trying to invert a mask, "
        "use the `~` or `logical_not()` operator instead.",
    ),
    "relu": (RuntimeError, "Boolean inputs not supported for relu"),
}


def unary_meta(op_name: str, *, int_to_float: bool = True, allow_bool: bool = True, bool_result: bool = False):
    """Meta for ``f(input)``: same shape; integer inputs give the default float dtype if ``int_to_float``."""

    def meta(input, *extra):
        if not isinstance(input, Tensor):
            raise TypeError(f"{op_name}(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")
        d = input._dtype
        if not allow_bool and d is dt.bool:
            cls, msg = _BOOL_ERRORS.get(op_name, (NotImplementedError, f"\"{op_name}_cpu\" not implemented for 'Bool'"))
            raise cls(msg)
        if bool_result:
            return Spec((input._shape, dt.bool, input._device))
        if int_to_float and not d.is_floating_point:
            d = dt.get_default_dtype()
        return Spec((input._shape, d, input._device))

    return meta


def unary_reference(np_fn):
    """Reference kernel ``np_fn(a)`` computed in the result dtype (float32 for half types)."""

    def ref(spec, a):
        compute = _compute_np(spec.dtype)
        return np_fn(_arg(a, compute))

    if isinstance(np_fn, np.ufunc):  # an array in the compute dtype: np_fn(a), called by the kernel (kiln._reference)
        ref.same_dtype_ufunc = (np_fn, ())
    return ref


def _unary(
    name, np_fn, backward, doc, *, autocast=None, int_to_float=True, allow_bool=True, methods=None, decompose=None
):
    """A unary pointwise op: ``np_fn(a)`` (a NumPy ufunc or function of the array), or a reference function of
    ``(spec, a)`` itself when ``np_fn`` has the attribute ``reference`` set true."""

    @op(
        tags=("pointwise",),
        inplace=True,
        meta=unary_meta(name, int_to_float=int_to_float, allow_bool=allow_bool),
        reference=np_fn if getattr(np_fn, "reference", False) else unary_reference(np_fn),
        backward=backward,
        autocast=autocast,
        name=name,
        doc=doc,
        methods=methods if methods is not None else (name,),
        decompose=decompose,
    )
    def unary(input: Tensor) -> Tensor:
        pass

    return unary


neg = _unary(
    "neg",
    np.negative,
    lambda grad: -grad,
    "``-input`` elementwise (``torch.neg``).",
    int_to_float=False,
    allow_bool=False,
    methods=("neg", "__neg__", "negative"),
)
negative = neg
abs = _unary(  # noqa: A001
    "abs",
    np.abs,
    lambda grad, input: grad * sign(input),
    "Absolute value elementwise.",
    int_to_float=False,
    allow_bool=False,
    methods=("abs", "__abs__", "absolute"),
)
absolute = abs


def _sign_np(a):
    if a.dtype == bool:
        return a.copy()
    s = np.sign(a)
    return np.where(np.isnan(a), 0, s) if a.dtype.kind == "f" else s


sign = _unary(
    "sign", _sign_np, lambda grad: _zeros_like(grad), "The sign (-1, 0, 1) of each element.", int_to_float=False
)
exp = _unary("exp", np.exp, lambda grad, result: grad * result, "``e ** input`` elementwise.", autocast="fp32_float16")
log = _unary("log", np.log, lambda grad, input: grad / input, "Natural logarithm elementwise.", autocast="fp32_float16")
sqrt = _unary("sqrt", np.sqrt, lambda grad, result: grad / (result * 2), "Square root elementwise.")
sin = _unary("sin", np.sin, lambda grad, input: grad * cos(input), "Sine elementwise.")
cos = _unary("cos", np.cos, lambda grad, input: -grad * sin(input), "Cosine elementwise.")
tanh = _unary("tanh", np.tanh, lambda grad, result: grad * (1 - result * result), "Hyperbolic tangent elementwise.")


def _sigmoid_np(a):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-a))


def _in_float(input: Tensor) -> tuple[Tensor, dt.dtype]:
    """``input`` in the dtype a float-valued unary op computes in (the default float dtype for integers,
    float32 for half precision), and the op's result dtype."""
    d = input._dtype if input._dtype.is_floating_point else dt.get_default_dtype()
    compute = dt.float32 if d in _HALF else d
    return (input if input._dtype is compute else input.to(compute)), d


def _sigmoid_decomposed(input):
    """``sigmoid`` in kiln ops: ``1 / (1 + exp(-x))``."""
    x, d = _in_float(input)
    return reciprocal(exp(-x) + 1.0).to(d)


sigmoid = _unary(
    "sigmoid",
    _sigmoid_np,
    lambda grad, result: grad * result * (1 - result),
    "Logistic sigmoid ``1 / (1 + exp(-input))``.",
    decompose=_sigmoid_decomposed,
)


def _zeros_like(t: Tensor) -> Tensor:
    from kiln._ops.creation import zeros_like

    return zeros_like(t)


@op(
    tags=("pointwise",),
    meta=unary_meta("isnan", bool_result=True),
    reference=lambda spec, a: np.isnan(a) if a.dtype.kind in "fV" else np.zeros(a.shape, bool),
    methods=("isnan",),
)
def isnan(input: Tensor) -> Tensor:
    """True where ``input`` is NaN."""


@op(
    tags=("pointwise",),
    inplace=True,
    meta=unary_meta("logical_not", bool_result=True),
    reference=lambda spec, a: np.logical_not(a),
    methods=("logical_not",),
)
def logical_not(input: Tensor) -> Tensor:
    """Elementwise logical NOT (nonzero is True) as a bool tensor."""


def _invert_meta(input):
    if input._dtype.is_floating_point:
        raise NotImplementedError(f"\"bitwise_not_cpu\" not implemented for '{scalar_type_name(input._dtype)}'")
    return Spec((input._shape, input._dtype, input._device))


def _bitwise_not_decomposed(input):
    """``bitwise_not`` in kiln ops: ``logical_not`` for bool, else ``-x - 1`` (two's complement; unsigned
    integers wrap to ``max - x``)."""
    if input._dtype is dt.bool:
        return logical_not(input)
    return sub(neg(input), 1)


@op(
    decompose=_bitwise_not_decomposed,
    tags=("pointwise",),
    inplace=True,
    meta=_invert_meta,
    reference=lambda spec, a: np.invert(a),
    methods=("bitwise_not",),
)
def bitwise_not(input: Tensor) -> Tensor:
    """Bitwise NOT of an integer tensor (logical NOT for bool)."""


# ---------------------------------------------------------------------------------------- where


def _where_meta(condition, input, other):
    if not isinstance(condition, Tensor):
        raise TypeError(f"where(): argument 'condition' (position 1) must be Tensor, not {type(condition).__name__}")
    if condition._dtype is not dt.bool and condition._dtype is not dt.uint8:
        raise RuntimeError(
            f"where expected condition to be a boolean tensor, but got a tensor with dtype {scalar_type_name(condition._dtype)}"
        )
    _check_operand(input, "input", "where")
    _check_operand(other, "other", "where")
    shape = broadcast_pair(condition._shape, broadcast_pair(getattr(input, "_shape", ()), getattr(other, "_shape", ())))
    return Spec((shape, result_type(input, other), common_device("where", condition, input, other)))


def _where_ref(spec, cond, a, b):
    compute = _compute_np(spec.dtype)
    return np.where(cond, _arg(a, compute, spec.dtype), _arg(b, compute, spec.dtype))


def _where_backward(grad, condition, needs_input_grad):
    return (
        None,
        where(condition, grad, 0.0) if needs_input_grad[1] else None,
        where(condition, 0.0, grad) if needs_input_grad[2] else None,
    )


@op(tags=("pointwise",), meta=_where_meta, reference=_where_ref, backward=_where_backward, autocast="promote")
def where(condition: Tensor, input: Tensor | Number, other: Tensor | Number) -> Tensor:
    """Elements of ``input`` where ``condition`` is True, else of ``other``, broadcasting all three."""


def _tensor_where(self, condition, y):
    """``t.where(condition, y)``: elements of ``t`` where ``condition`` holds, else of ``y``."""
    return where(condition, self, y)


Tensor.where = _tensor_where


def _invert(self):
    if self._dtype.is_floating_point:
        raise TypeError("~ (operator.invert) is only implemented on integer and Boolean-type tensors")
    return bitwise_not(self)


Tensor.__invert__ = _invert
