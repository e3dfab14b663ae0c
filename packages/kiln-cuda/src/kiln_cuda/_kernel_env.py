"""What generated kernel modules see: scalar math, casts and the jit decorators, bound for the hardware
or for numba's simulator.

Kernel source is one text for both. Its leaf math functions (``exp_``, ``fmod_``...) are libdevice's on a
GPU (``expf`` for float32, ``exp`` for float64) and NumPy's ufuncs under the simulator, where Python's
``math`` raises on overflow, poles and domain errors that CUDA answers with inf or NaN. The bf16 helpers
convert bfloat16 bits to float32 and back (round to nearest even) on integers, so every GPU computes
bfloat16 tensors.
"""

from __future__ import annotations

import math
import re
import threading

import numpy as np

from kiln_cuda import _driver

__all__ = ["bind", "caster", "leaf", "HELPERS"]

# leaf name -> (libdevice float32, libdevice float64, NumPy function for the simulator)
_LEAVES = {
    "exp": ("expf", "exp", np.exp),
    "log": ("logf", "log", np.log),
    "sqrt": ("sqrtf", "sqrt", np.sqrt),
    "sin": ("sinf", "sin", np.sin),
    "cos": ("cosf", "cos", np.cos),
    "tan": ("tanf", "tan", np.tan),
    "tanh": ("tanhf", "tanh", np.tanh),
    "sinh": ("sinhf", "sinh", np.sinh),
    "cosh": ("coshf", "cosh", np.cosh),
    "asin": ("asinf", "asin", np.arcsin),
    "acos": ("acosf", "acos", np.arccos),
    "atan": ("atanf", "atan", np.arctan),
    "asinh": ("asinhf", "asinh", np.arcsinh),
    "acosh": ("acoshf", "acosh", np.arccosh),
    "atanh": ("atanhf", "atanh", np.arctanh),
    "expm1": ("expm1f", "expm1", np.expm1),
    "log1p": ("log1pf", "log1p", np.log1p),
    "floor": ("floorf", "floor", np.floor),
    "ceil": ("ceilf", "ceil", np.ceil),
    "trunc": ("truncf", "trunc", np.trunc),
    "rint": ("rintf", "rint", np.rint),
    "fabs": ("fabsf", "fabs", np.abs),
    "fmod": ("fmodf", "fmod", np.fmod),
    "atan2": ("atan2f", "atan2", np.arctan2),
    "pow": ("powf", "pow", np.power),
    "copysign": ("copysignf", "copysign", np.copysign),
    "hypot": ("hypotf", "hypot", np.hypot),
    "nextafter": ("nextafterf", "nextafter", np.nextafter),
    "erf": ("erff", "erf", None),
    "erfc": ("erfcf", "erfc", None),
    "lgamma": ("lgammaf", "lgamma", None),
}


def _sim_math(fn):
    """A ``math`` function made total as CUDA's is (inf at poles and overflow, NaN off the domain)."""

    def leaf(x):
        try:
            return type(x)(fn(x)) if isinstance(x, np.floating) else fn(x)
        except OverflowError:
            return type(x)(math.inf) if isinstance(x, np.floating) else math.inf
        except ValueError:
            return type(x)(math.inf if fn is math.lgamma else math.nan)

    return leaf


def caster(np_dtype):
    """The cast to a dtype inside a kernel: a numba type on the GPU, a NumPy scalar type in the simulator."""
    np_dtype = np.dtype(np_dtype)
    if np_dtype == np.bool_:
        return bool
    if _driver.SIM:
        return np_dtype.type
    import numba

    return numba.from_dtype(np_dtype)


def _bits_sim():
    def as_float(i):
        return np.uint32(np.int64(i) & 0xFFFFFFFF).view(np.float32)

    def as_int(f):
        return np.int64(np.float32(f).view(np.int32))

    return as_float, as_int


def leaf(name: str, float_dtype: str):
    """The math function ``name`` (a :data:`_LEAVES` key) for ``float_dtype`` ("float32"/"float64"): libdevice's
    on a GPU, a NumPy function that keeps its argument's type under the simulator."""
    lf, ld, npf = _LEAVES[name]
    if _driver.SIM:
        return npf if npf is not None else _sim_math(getattr(math, name))
    from numba.cuda import libdevice

    return getattr(libdevice, lf if float_dtype == "float32" else ld)


def bind(ns: dict, float_dtype: str) -> None:
    """Fill a generated module's globals: leaves for ``float_dtype`` ("float32"/"float64"), casts, jit."""
    for name in _LEAVES:
        ns[name + "_"] = leaf(name, float_dtype)
    if _driver.SIM:
        ns["as_float"], ns["as_int"] = _bits_sim()
        ns["errstate"] = np.errstate
        ns["shared_lock"] = threading.Lock()
        ns["jit"] = _driver.cuda().jit
        ns["device_jit"] = lambda fn: fn
    else:
        from numba.cuda import libdevice

        ns["as_float"] = libdevice.int_as_float
        ns["as_int"] = libdevice.float_as_int
        c = _driver.cuda()
        ns["jit"] = lambda fn: c.jit(fn, cache=True)
        ns["device_jit"] = lambda fn: c.jit(fn, device=True, inline="always", cache=True)
    ns["cuda"] = _driver.cuda()
    ns["F"] = caster(float_dtype)
    ns["F32"] = caster("float32")
    ns["I32"] = caster("int32")
    ns["I64"] = caster("int64")
    ns["U16"] = caster("uint16")
    ns["caster"] = caster
    ns["INF"] = math.inf
    ns["NAN"] = math.nan
    ns["leaf"] = leaf


# Scalar helpers shared by the generated kernels (device functions on the GPU), written once for both.
# ``F`` is the float type of the kernel's float math; the integer helpers keep their operands' type.
HELPERS = """
def bf16_load(u):
    return as_float(I32(u) << 16)


def bf16_store(f):
    if f != f:
        return U16(0x7FC0)
    b = I64(as_int(F32(f)))
    b = b + 0x7FFF + ((b >> 16) & 1)
    return U16((b >> 16) & 0xFFFF)


def max_nan(a, b):
    if a != a:
        return a
    if b != b:
        return b
    return a if a > b else b


def min_nan(a, b):
    if a != a:
        return a
    if b != b:
        return b
    return a if a < b else b


def sign_f(x):
    return F(x > 0) - F(x < 0)


def rem_f(a, b):
    m = fmod_(a, b)
    if m != 0 and ((b < 0) != (m < 0)):
        m = m + b
    return m


def floordiv_f(a, b):
    if b == 0:
        return a / b
    m = fmod_(a, b)
    d = (a - m) / b
    if m != 0 and ((b < 0) != (m < 0)):
        d = d - F(1)
    if d != 0:
        q = floor_(d)
        if d - q > F(0.5):
            q = q + F(1)
        return q
    return copysign_(F(0), a / b)


def truncdiv_i(a, b):
    q = a // b
    if q * b != a and ((a < 0) != (b < 0)):
        q = q + 1
    return q


def fmod_i(a, b):
    return a - b * truncdiv_i(a, b)


def pow_i(a, b):
    if b < 0:
        if a == 1:
            return a
        if a == -1:
            return a if b % 2 != 0 else -a
        return a * 0
    r = a * 0 + 1
    while b > 0:
        if b % 2 == 1:
            r = r * a
        a = a * a
        b = b // 2
    return r


def logaddexp_f(x, y):
    if x != x or y != y:
        return x + y
    lo = x if x < y else y
    hi = x if x > y else y
    if lo != hi or lo - lo == 0:
        return log1p_(exp_(lo - hi)) + hi
    return x


def digamma_f(x):
    if x == 0:
        return copysign_(F(INF), -x)
    result = F(0)
    if x < 0:
        if x == floor_(x):
            return F(INF) - F(INF)
        # reflection: psi(1 - x) - pi / tan(pi x)
        result = -F(3.141592653589793) / tan_(F(3.141592653589793) * x)
        x = F(1) - x
    while x < F(10):
        result = result - F(1) / x
        x = x + F(1)
    if x != x or x == F(INF):
        return x + result
    z = F(1) / (x * x)
    tail = z * (F(1) / F(12) - z * (F(1) / F(120) - z * (F(1) / F(252) - z * (F(1) / F(240) - z * F(1) / F(132)))))
    return result + log_(x) - F(0.5) / x - tail


def erfinv_f(y):
    if y != y or y < -1 or y > 1:
        return F(INF) - F(INF)
    if y == 1 or y == -1:
        return copysign_(F(INF), y)
    # Giles' single-precision approximation, then two Newton steps on erf (double precision)
    w = -log_((F(1) - y) * (F(1) + y))
    if w < F(5):
        w = w - F(2.5)
        p = F(2.81022636e-08)
        p = F(3.43273939e-07) + p * w
        p = F(-3.5233877e-06) + p * w
        p = F(-4.39150654e-06) + p * w
        p = F(0.00021858087) + p * w
        p = F(-0.00125372503) + p * w
        p = F(-0.00417768164) + p * w
        p = F(0.246640727) + p * w
        p = F(1.50140941) + p * w
    else:
        w = sqrt_(w) - F(3)
        p = F(-0.000200214257)
        p = F(0.000100950558) + p * w
        p = F(0.00134934322) + p * w
        p = F(-0.00367342844) + p * w
        p = F(0.00573950773) + p * w
        p = F(-0.0076224613) + p * w
        p = F(0.00943887047) + p * w
        p = F(1.00167406) + p * w
        p = F(2.83297682) + p * w
    x = p * y
    for _ in range(2):
        x = x - (erf_(x) - y) / (F(1.1283791670955126) * exp_(-x * x))
    return x


def round_f(x, scale, neg):
    if scale == 1:
        return rint_(x)
    if neg:
        return rint_(x / scale) * scale
    return rint_(x * scale) / scale
"""

# every helper above, jitted as a device function in each generated module
HELPER_NAMES = tuple(re.findall(r"^def (\w+)\(", HELPERS, flags=re.MULTILINE))
