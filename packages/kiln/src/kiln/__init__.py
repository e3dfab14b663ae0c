"""kiln: a PyTorch-style deep learning framework.

``import kiln`` loads the core (Tensor, ops, autograd) and nothing else: plugins (backends, feature
packages) are discovered through the ``kiln`` entry-point group the first time they are needed.
"""

import pkgutil as _pkgutil

# Feature distributions (kiln-nn, kiln-data, ...) contribute kiln/<feature>/ directories.
__path__ = _pkgutil.extend_path(__path__, __name__)

__version__ = "0.1.0"

from kiln import _ops as _ops
from kiln import autograd, linalg, random
from kiln._device import device
from kiln._dtype import (
    bfloat16,
    bool,
    dtype,
    float16,
    float32,
    float64,
    get_default_dtype,
    int8,
    int16,
    int32,
    int64,
    promote_types,
    set_default_dtype,
    uint8,
)
from kiln._ops._meta import broadcast_shapes, can_cast
from kiln._ops.activation import celu, celu_, hardshrink, prelu, rrelu, rrelu_, selu, selu_, threshold, threshold_
from kiln._ops.binary_math import (
    arctan2,
    atan2,
    bitwise_left_shift,
    bitwise_right_shift,
    copysign,
    floor_divide,
    fmod,
    hypot,
    logical_and,
    logical_or,
    logical_xor,
    remainder,
)
from kiln._ops.clamp import clamp, clamp_max, clamp_min, clip
from kiln._ops.copy import copy_
from kiln._ops.creation import (
    arange,
    as_tensor,
    asarray,
    empty,
    empty_like,
    eye,
    from_numpy,
    full,
    full_like,
    linspace,
    meshgrid,
    ones,
    ones_like,
    rand,
    rand_like,
    randint,
    randint_like,
    randn,
    randn_like,
    randperm,
    tensor,
    zeros,
    zeros_like,
)
from kiln._ops.decompositions import det, inverse, slogdet
from kiln._ops.distance import cosine_similarity, pairwise_distance, pdist
from kiln._ops.dropout import alpha_dropout, dropout, feature_alpha_dropout
from kiln._ops.einsum import einsum
from kiln._ops.elementwise import (
    abs,
    absolute,
    add,
    bitwise_and,
    bitwise_not,
    bitwise_or,
    bitwise_xor,
    cos,
    div,
    divide,
    eq,
    exp,
    ge,
    greater,
    greater_equal,
    gt,
    isnan,
    le,
    less,
    less_equal,
    log,
    logical_not,
    lt,
    mul,
    multiply,
    ne,
    neg,
    negative,
    not_equal,
    pow,
    relu,
    sigmoid,
    sign,
    sin,
    sqrt,
    sub,
    subtract,
    tanh,
    true_divide,
    where,
)
from kiln._ops.embedding import _embedding as embedding
from kiln._ops.gather_scatter import gather, scatter, scatter_add, scatter_reduce, take_along_dim
from kiln._ops.histogram import bincount, histc
from kiln._ops.index import (
    index_add,
    index_copy,
    index_fill,
    index_put,
    index_select,
    masked_fill,
    masked_scatter,
    masked_select,
    nonzero,
    repeat_interleave,
    take,
)
from kiln._ops.linalg import matmul, mm
from kiln._ops.nn_conv import (
    conv1d,
    conv2d,
    conv3d,
    conv_transpose1d,
    conv_transpose2d,
    conv_transpose3d,
    convolution,
)
from kiln._ops.normalization import group_norm, layer_norm, rms_norm
from kiln._ops.pad import constant_pad_nd
from kiln._ops.pool import adaptive_avg_pool1d, avg_pool1d, max_pool1d, max_pool1d_with_indices, max_pool2d, max_pool3d
from kiln._ops.pool import adaptive_max_pool1d_with_indices as adaptive_max_pool1d
from kiln._ops.products import addbmm, addmm, addmv, baddbmm, bmm, dot, ger, mv, outer, tensordot, trace
from kiln._ops.reduction import (
    all,
    amax,
    amin,
    any,
    argmax,
    argmin,
    max,
    maximum,
    mean,
    min,
    minimum,
    return_types,
    sum,
    sum_to_size,
)
from kiln._ops.resample import pixel_shuffle, pixel_unshuffle
from kiln._ops.scans import (
    count_nonzero,
    cumprod,
    cumsum,
    logsumexp,
    median,
    nanmean,
    nansum,
    norm,
    prod,
    std,
    std_mean,
    var,
    var_mean,
)
from kiln._ops.shape import (
    cat,
    chunk,
    concat,
    concatenate,
    diag,
    diagonal,
    flip,
    fliplr,
    flipud,
    moveaxis,
    movedim,
    narrow_copy,
    roll,
    split,
    stack,
    tile,
    tril,
    triu,
    unbind,
    unflatten,
)
from kiln._ops.softmax import _tensor_log_softmax as log_softmax
from kiln._ops.softmax import _tensor_softmax as softmax
from kiln._ops.sort import argsort, bucketize, kthvalue, msort, searchsorted, sort, topk, unique, unique_consecutive
from kiln._ops.special import erf, erfc, erfinv
from kiln._ops.strided import as_strided
from kiln._ops.ternary_math import addcdiv, addcmul, lerp
from kiln._ops.unary_math import (
    acos,
    acosh,
    arccos,
    arccosh,
    arcsin,
    arcsinh,
    arctan,
    arctanh,
    asin,
    asinh,
    atan,
    atanh,
    ceil,
    cosh,
    exp2,
    expm1,
    fix,
    floor,
    frac,
    isfinite,
    isinf,
    isneginf,
    isposinf,
    log1p,
    log2,
    log10,
    logit,
    nan_to_num,
    positive,
    reciprocal,
    round,
    rsqrt,
    sgn,
    sinh,
    square,
    tan,
    trunc,
)
from kiln._ops.views import (
    broadcast_to,
    clone,
    contiguous,
    contiguous_format,
    expand,
    flatten,
    memory_format,
    narrow,
    permute,
    preserve_format,
    ravel,
    reshape,
    select,
    squeeze,
    swapaxes,
    swapdims,
    t,
    transpose,
    unsqueeze,
    view,
)
from kiln._tensor import Size, Tensor
from kiln._threads import get_num_threads, set_num_threads
from kiln.autograd import enable_grad, inference_mode, no_grad, set_grad_enabled
from kiln.autograd.grad_mode import is_grad_enabled, is_inference_mode_enabled
from kiln.random import Generator, get_rng_state, initial_seed, manual_seed, seed, set_rng_state
from kiln.serialization import load, save


def is_tensor(obj) -> bool:
    """True if ``obj`` is a kiln Tensor."""
    return isinstance(obj, Tensor)


def is_floating_point(input: Tensor) -> bool:
    """True if ``input`` has a floating point dtype."""
    return input.is_floating_point()


def numel(input: Tensor) -> int:
    """Number of elements of ``input``."""
    return input.numel()


def result_type(tensor1, tensor2) -> dtype:
    """The dtype an arithmetic op on the two operands (tensors or numbers) would produce."""
    from kiln._ops._meta import result_type as _rt

    return _rt(tensor1, tensor2)


def from_dlpack(ext_tensor) -> Tensor:
    """A tensor sharing memory with any object that implements ``__dlpack__`` (NumPy, PyTorch, ...)."""
    from kiln._interop import from_dlpack as _from_dlpack

    return _from_dlpack(ext_tensor)


def __getattr__(name: str):
    # kiln.cuda, kiln.cpu, kiln.<plugin device>: a small module-like object per device type.
    # Submodules (kiln.hookspecs, kiln.nn from kiln-nn, kiln.data, ...) are imported on first use, so
    # `import kiln; kiln.nn.Linear(...)` works as `torch.nn` does, and `import kiln` stays small.
    import importlib
    import importlib.util

    from kiln._device_module import device_module

    if name in ("hookimpl", "hookspec"):  # the pluggy markers, imported only when a plugin asks
        from kiln import hookspecs

        return getattr(hookspecs, name)
    if name.startswith("_"):
        raise AttributeError(f"module 'kiln' has no attribute '{name}'")
    if importlib.util.find_spec(f"kiln.{name}") is not None:
        return importlib.import_module(f"kiln.{name}")
    mod = device_module(name)
    if mod is None:
        raise AttributeError(f"module 'kiln' has no attribute '{name}'")
    return mod


half = float16
float = float32  # noqa: A001
double = float64
long = int64
int = int32  # noqa: A001
short = int16

# ``from kiln import *`` exports the public API (it shadows builtins such as sum/max/abs, as torch's does)
__all__ = sorted(n for n, v in list(globals().items()) if not n.startswith("_") and not isinstance(v, type(_pkgutil)))
__all__ += ["autograd", "random"]
