"""nn primitives: embedding lookups (``embedding``, ``embedding_bag``; ``torch.nn.functional`` names).

Fused ops: ``_embedding`` (``EmbeddingBackward0``) and ``_embedding_bag`` (``EmbeddingBagBackward0``),
each with a NumPy reference and a backward formula written in kiln ops.

Sparse gradients do not exist in kiln: ``sparse=True`` is accepted and the gradient is dense.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import scalar_type_name
from kiln._ops.elementwise import _compute_np, where
from kiln._ops.reduction import sum as _sum
from kiln._ops.softmax import _check_tensor, _require_float, _shape_list
from kiln._spec import Spec
from kiln._tensor import Tensor, _numel

__all__ = ["embedding", "embedding_bag"]

TOP_LEVEL = ("_embedding as embedding",)
"""The names ``kiln`` exports at its top level (as ``torch`` does); ``"x as y"`` where the top-level
function differs from the ``kiln.nn.functional`` one of the same name."""


# ---------------------------------------------------------------------------------------- embedding


def _embedding_meta(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    _check_tensor(weight, "embedding", "weight")
    _check_tensor(indices, "embedding", "indices", 2)
    if len(weight._shape) != 2:
        raise RuntimeError("'weight' must be 2-D")
    if indices._dtype not in (dt.int64, dt.int32):
        raise RuntimeError(
            "Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int; "
            f"but got kiln.{scalar_type_name(indices._dtype)}Tensor instead (while checking arguments for embedding)"
        )
    return Spec((indices._shape + (weight._shape[1],), weight._dtype, weight._device))


def _embedding_ref(spec, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    i = indices.astype(np.int64, copy=False)
    if ((i < 0) | (i >= weight.shape[0])).any():
        raise IndexError("index out of range in self")
    return weight[i]


def _embedding_backward(grad, weight_shape, indices, padding_idx, scale_grad_by_freq):
    from kiln._ops.creation import zeros
    from kiln._ops.histogram import bincount
    from kiln._ops.index import index_add, index_select

    n, d = weight_shape
    flat = indices.reshape(-1).to(dt.int64)
    g = grad.reshape(-1, d)
    if padding_idx is not None and padding_idx >= 0:
        g = where((flat != padding_idx).unsqueeze(1), g, 0.0)
    if scale_grad_by_freq and _numel(flat._shape):
        counts = index_select(bincount(flat, None, n), 0, flat)
        g = g / counts.unsqueeze(1).to(g.dtype)
    return index_add(zeros(n, d, dtype=grad.dtype, device=grad.device), 0, flat, g), None


def _embedding_decomposed(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """``_embedding`` in kiln ops: ``index_select`` of the rows (``padding_idx`` and the rest matter only to
    the backward)."""
    from kiln._ops.index import index_select

    shape = _embedding_meta(weight, indices, padding_idx, scale_grad_by_freq, sparse)[0]
    return index_select(weight, 0, indices.reshape(-1)).reshape(shape)


@op(
    tags=("nn",),
    decompose=_embedding_decomposed,
    meta=_embedding_meta,
    reference=_embedding_ref,
    backward=_embedding_backward,
    grad_fn_name="EmbeddingBackward0",
)
def _embedding(
    weight: Tensor, indices: Tensor, padding_idx: int = -1, scale_grad_by_freq: bool = False, sparse: bool = False
) -> Tensor:
    """Rows of ``weight`` at ``indices`` (``torch.embedding``'s argument order); gradients accumulate into
    the rows used, none into ``padding_idx``'s row; ``sparse`` still gives a dense gradient."""


def _embedding_renorm_(weight: Tensor, indices: Tensor, max_norm: float, norm_type: float) -> None:
    """Rescale in place the rows of ``weight`` used by ``indices`` whose ``norm_type``-norm exceeds ``max_norm``."""
    from kiln._ops.index import index_put, index_select
    from kiln._ops.scans import vector_norm
    from kiln._ops.sort import unique
    from kiln.autograd.grad_mode import no_grad

    with no_grad():
        flat = indices.reshape(-1).to(dt.int64)
        if not _numel(flat._shape):
            return
        used = unique(flat)
        if isinstance(used, tuple):
            used = used[0]
        n = weight.shape[0]
        bad = (used < -n) | (used >= n)
        if bool(bad.any()):
            i = int(used[bad.to(dt.uint8).argmax()].item())
            raise IndexError(
                f"select(): index {i} out of range for tensor of size {_shape_list(weight._shape)} at dimension 0"
            )
        used = where(used < 0, used + n, used)
        rows = index_select(weight, 0, used)
        norms = vector_norm(rows, float(norm_type), 1, True)
        scale = where(norms > max_norm, max_norm / (norms + 1e-7), 1.0)
        weight.copy_(index_put(weight, (used,), rows * scale))


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False):
    """Look up rows of the ``(num_embeddings, dim)`` ``weight`` at the integer ``input``. ``padding_idx``'s
    row gets no gradient; ``max_norm`` renormalizes the used rows in place first; ``sparse=True`` is
    accepted but the gradient is dense (kiln has no sparse tensors)."""
    _check_tensor(weight, "embedding", "weight", 2)
    if padding_idx is not None:
        n = weight.shape[0] if weight.dim() else 0
        if padding_idx > 0:
            if padding_idx >= n:
                raise AssertionError("Padding_idx must be within num_embeddings")
        elif padding_idx < 0:
            if padding_idx < -n:
                raise AssertionError("Padding_idx must be within num_embeddings")
            padding_idx = n + padding_idx
    else:
        padding_idx = -1
    if max_norm is not None:
        _embedding_meta(weight, input)  # validate before writing into weight
        _embedding_renorm_(weight, input, max_norm, norm_type)
    return _embedding(weight, input, padding_idx, scale_grad_by_freq, sparse)


_CHECK_I = (
    "Expected i < index_size to be true, but got false.  (Could this error message be improved?  If so, please "
    "report an enhancement request to PyTorch.)"
)


def _bag_layout(offs, length: int, include_last_offset: bool) -> tuple[np.ndarray, int, int]:
    """(bag of every entry, number of bags, end of the last bag) from the offsets' values."""
    offs = np.asarray(offs, np.int64).reshape(-1)
    n_bags = max(offs.size - 1 if include_last_offset else offs.size, 0)
    # PyTorch's kernels disagree about entries past the last offset with include_last_offset (sum keeps
    # them, mean divides by them without adding them); kiln follows the documentation and drops them
    end = int(offs[-1]) if include_last_offset and offs.size else length
    if not n_bags:
        return np.zeros(length, np.int64), 0, end
    ids = np.searchsorted(offs[:n_bags], np.arange(length), side="right") - 1
    return np.maximum(ids, 0).astype(np.int64), n_bags, end


def _bag_ids(input, offsets, include_last_offset) -> tuple[np.ndarray, int, int]:
    """:func:`_bag_layout` of the host copy of ``offsets``, after PyTorch's checks of their values."""
    length = _numel(input._shape)
    offs = [int(v) for v in offsets.tolist()]
    if offs and offs[0] != 0:
        raise RuntimeError(
            "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from position 0. "
            f"However, got {offs[0]}\n[ kiln.{scalar_type_name(offsets._dtype)}Tensor{{}} ]"
        )
    if offs and offs[-1] > length:
        raise RuntimeError(
            f"offsets[-1] can not be greater than input's length {length} but got offsets[-1] of {offs[-1]}"
        )
    if any(b < a for a, b in itertools.pairwise(offs)):
        raise RuntimeError(_CHECK_I)
    return _bag_layout(offs, length, include_last_offset)


def _embedding_bag_meta(
    weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx, scale_grad_by_freq
):
    _check_tensor(weight, "embedding_bag", "weight")
    _check_tensor(indices, "embedding_bag", "indices", 2)
    _check_tensor(offsets, "embedding_bag", "offsets", 3)
    if len(weight._shape) != 2:
        raise ValueError(f"weight has to be a 2D Tensor, but got Tensor of dimension {len(weight._shape)}")
    if len(indices._shape) != 1 or len(offsets._shape) != 1:
        raise ValueError("input and offsets have to be 1D Tensors")
    for name, t in (("indices", indices), ("offsets", offsets)):
        if t._dtype not in (dt.int64, dt.int32):
            raise RuntimeError(
                f"Expected tensor for argument #1 '{name}' to have one of the following scalar types: Long, Int; "
                f"but got kiln.{scalar_type_name(t._dtype)}Tensor instead (while checking arguments for "
                "embedding_bag)"
            )
    if mode not in ("sum", "mean", "max"):
        raise ValueError("mode has to be one of sum, mean or max")
    if per_sample_weights is not None:
        if per_sample_weights._shape != indices._shape:
            raise ValueError(
                f"embedding_bag: If per_sample_weights ({per_sample_weights.shape}) is not None, then it must have "
                f"the same shape as the input ({indices.shape})"
            )
        if mode != "sum":
            raise NotImplementedError(
                "embedding_bag: per_sample_weights was not None. per_sample_weights is only supported for "
                f"mode='sum' (got mode='{mode}'). Please open a feature request on GitHub."
            )
    _require_float(weight, "embedding_bag")
    n_bags = max(offsets._shape[0] - (1 if include_last_offset else 0), 0)
    shape = (n_bags, weight._shape[1])
    return (Spec((shape, weight._dtype, weight._device)), Spec((shape, dt.int64, weight._device)))


def _embedding_bag_ref(
    spec, weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx, scale_grad_by_freq
):
    compute = _compute_np(spec[0].dtype)
    n, d = weight.shape
    idx = indices.astype(np.int64, copy=False)
    if ((idx < 0) | (idx >= n)).any():
        raise RuntimeError(_CHECK_I)
    ids, n_bags, end = _bag_layout(offsets, idx.size, include_last_offset)
    keep = (np.arange(idx.size) < end) & (idx != padding_idx)
    ids, idx = ids[keep], idx[keep]
    rows = weight.astype(compute, copy=False)[idx]
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.astype(compute, copy=False)[keep][:, None]
    count = np.bincount(ids, minlength=n_bags)[:, None]
    arg = np.zeros((n_bags, d), np.int64)
    if mode == "max":
        out = np.full((n_bags, d), -np.inf, compute)
        np.maximum.at(out, ids, rows)
        # the (first) row holding each maximum, for the backward
        hit = rows == out[ids]
        first = np.full((n_bags, d), idx.size, np.int64)
        np.minimum.at(first, ids, np.where(hit, np.arange(idx.size)[:, None], idx.size))
        arg = np.where(count > 0, idx[np.minimum(first, max(idx.size - 1, 0))] if idx.size else 0, 0)
        out = np.where(count > 0, out, 0)
    else:
        out = np.zeros((n_bags, d), compute)
        np.add.at(out, ids, rows)
        if mode == "mean":
            out = out / np.maximum(count, 1)
    return out, arg


def _embedding_bag_backward(
    grads,
    weight,
    indices,
    offsets,
    mode,
    per_sample_weights,
    include_last_offset,
    padding_idx,
    scale_grad_by_freq,
    result,
    needs_input_grad,
):
    from kiln._ops.creation import tensor, zeros
    from kiln._ops.gather_scatter import scatter_add
    from kiln._ops.histogram import bincount
    from kiln._ops.index import index_add, index_select

    grad = grads[0]
    n, d = weight._shape
    dev = weight.device
    idx = indices.to(dt.int64)
    ids_np, n_bags, end = _bag_layout(offsets.tolist(), _numel(idx._shape), include_last_offset)
    keep_np = (np.arange(ids_np.size) < end) & (np.asarray(idx.tolist(), np.int64).reshape(-1) != padding_idx)
    gw = gp = None
    if mode == "max":
        if needs_input_grad[0]:
            filled = np.bincount(ids_np[keep_np], minlength=n_bags) > 0  # an empty bag's zeros come from no row
            g = where(tensor(filled, device=dev).unsqueeze(1), grad, 0.0)
            gw = scatter_add(zeros(n, d, dtype=grad.dtype, device=dev), 0, result[1], g)
        return gw, None, None, None
    ids = tensor(ids_np, device=dev)
    keep = tensor(keep_np, device=dev).unsqueeze(1)
    g = index_select(grad, 0, ids) if ids_np.size else zeros(0, d, dtype=grad.dtype, device=dev)
    if mode == "mean":
        count = np.maximum(np.bincount(ids_np[keep_np], minlength=n_bags), 1)
        g = g / tensor(count[ids_np].astype(np.float64), device=dev).to(g.dtype).unsqueeze(1)
    g = where(keep, g, 0.0)
    if per_sample_weights is not None and needs_input_grad[3]:
        gp = _sum(g * index_select(weight, 0, idx), 1)
    if needs_input_grad[0]:
        gwe = g if per_sample_weights is None else g * per_sample_weights.unsqueeze(1)
        if scale_grad_by_freq and ids_np.size:
            gwe = gwe / index_select(bincount(idx, None, n), 0, idx).unsqueeze(1).to(gwe.dtype)
        gw = index_add(zeros(n, d, dtype=grad.dtype, device=dev), 0, idx, gwe)
    return gw, None, None, gp


@op(
    tags=("nn",),
    meta=_embedding_bag_meta,
    reference=_embedding_bag_ref,
    backward=_embedding_bag_backward,
    num_outputs=2,
    differentiable_outputs=(0,),
    grad_fn_name="EmbeddingBagBackward0",
)
def _embedding_bag(
    weight: Tensor,
    indices: Tensor,
    offsets: Tensor,
    mode: str,
    per_sample_weights: Tensor | None,
    include_last_offset: bool,
    padding_idx: int,
    scale_grad_by_freq: bool,
) -> tuple[Tensor, Tensor]:
    """Sum, mean or max of the rows of ``weight`` at the 1-D ``indices``, one bag per offset, and the row
    each maximum came from (mode ``'max'``; zeros otherwise). ``padding_idx`` entries (``-1``: none) are
    left out of their bag."""


def _check_bag_indices(idx: Tensor, n: int, mode: str, ids: np.ndarray) -> None:
    """Indices in ``[0, n)``, with the message of the PyTorch kernel that would meet the bad one (observed:
    max mode checks each index; sum and mean name its position in its bag, or fail an internal check for a
    bag of one)."""
    if not _numel(idx._shape):
        return
    bad = (idx < 0) | (idx >= n)
    if not bool(bad.any()):
        return
    pos = int(bad.reshape(-1).to(dt.uint8).argmax().item())
    value = int(idx.reshape(-1)[pos].item())
    if mode == "max":
        raise RuntimeError(f"embedding_bag: Expected idx >= 0 && idx < num_embeddings but found idx to be {value}")
    same_bag = np.flatnonzero(ids == ids[pos])
    if same_bag.size == 1:
        raise RuntimeError(_CHECK_I)
    raise RuntimeError(
        f"Index {pos - int(same_bag[0])} of input takes value {value} which is not in the valid range [0, {n})"
    )


def _type_text(x) -> str:
    return "<class 'kiln.Tensor'>" if isinstance(x, Tensor) else str(type(x))


def embedding_bag(
    input,
    weight,
    offsets=None,
    max_norm=None,
    norm_type=2,
    scale_grad_by_freq=False,
    mode="mean",
    sparse=False,
    per_sample_weights=None,
    include_last_offset=False,
    padding_idx=None,
):
    """Sums, means or maxima of bags of embedding rows: 2-D ``input`` is one bag per row; 1-D ``input`` is
    split into bags at ``offsets``. ``per_sample_weights`` scale the rows (mode ``'sum'``); ``padding_idx``
    entries are left out of their bag; empty bags give zeros. Gradients are dense."""
    from kiln._ops.creation import tensor

    idx = input
    _check_tensor(idx, "embedding_bag")
    _check_tensor(weight, "embedding_bag", "weight", 2)
    if weight._dtype is dt.int64 and idx._dtype.is_floating_point:
        warnings.warn(
            "Argument order of nn.functional.embedding_bag was changed. Usage `embedding_bag(weight, input, ...)` "
            "is deprecated, and should now be `embedding_bag(input, weight, ...)`.",
            UserWarning,
            stacklevel=2,
        )
        weight, idx = idx, weight
    if per_sample_weights is not None and idx.shape != per_sample_weights.shape:
        raise ValueError(
            f"embedding_bag: If per_sample_weights ({per_sample_weights.shape}) is not None, then it must have the "
            f"same shape as the input ({idx.shape})"
        )
    if weight.dim() != 2:
        raise ValueError(f"weight has to be a 2D Tensor, but got Tensor of dimension {weight.dim()}")
    if idx.dim() == 2:
        if offsets is not None:
            raise ValueError(
                "if input is 2D, then offsets has to be None, as input is treated is a mini-batch of fixed length "
                f"sequences. However, found offsets of type {_type_text(offsets)}"
            )
        rows_per_bag = idx._shape[1]
        starts = list(range(0, _numel(idx._shape), rows_per_bag)) if rows_per_bag else [0] * idx._shape[0]
        offsets = tensor(starts, dtype=dt.int64, device=idx.device)
        include_last_offset = False
        idx = idx.reshape(-1)
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.reshape(-1)
    elif idx.dim() == 1:
        if offsets is None:
            raise ValueError("offsets has to be a 1D Tensor but got None")
        if offsets.dim() != 1:
            raise ValueError("offsets has to be a 1D Tensor")
    else:
        raise ValueError(f"input has to be 1D or 2D Tensor, but got Tensor of dimension {idx.dim()}")
    if mode == "max":
        if scale_grad_by_freq:
            raise ValueError("max mode does not support scaling the gradient by the frequency")
        if sparse:
            raise ValueError("max mode does not support sparse weights")
    elif mode not in ("sum", "mean"):
        raise ValueError("mode has to be one of sum, mean or max")
    if max_norm is not None:
        _embedding_renorm_(weight, idx, max_norm, norm_type)
    if per_sample_weights is not None and mode != "sum":
        raise NotImplementedError(
            "embedding_bag: per_sample_weights was not None. per_sample_weights is only supported for mode='sum' "
            f"(got mode='{mode}'). Please open a feature request on GitHub."
        )
    if idx._dtype not in (dt.int64, dt.int32):
        raise RuntimeError(
            "Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int; "
            f"but got kiln.{scalar_type_name(idx._dtype)}Tensor instead (while checking arguments for embedding_bag)"
        )
    if per_sample_weights is not None and per_sample_weights._dtype is not weight._dtype:
        raise RuntimeError(
            "Expected tensor for argument #1 'weight' to have the same type as tensor for argument #1 "
            f"'per_sample_weights'; but type kiln.{scalar_type_name(weight._dtype)}Tensor does not equal "
            f"kiln.{scalar_type_name(per_sample_weights._dtype)}Tensor (while checking arguments for embedding_bag)"
        )
    n = weight._shape[0]
    if padding_idx is not None:
        if not -n <= padding_idx < n:
            raise RuntimeError(
                f"padding_idx must be within the number of embeddings, {-n} through {n - 1}, but got {padding_idx}"
            )
        padding_idx = padding_idx + n if padding_idx < 0 else padding_idx
    ids_np, _, _ = _bag_ids(idx, offsets, include_last_offset)
    _check_bag_indices(idx, n, mode, ids_np)
    pad = -1 if padding_idx is None else padding_idx
    out, _ = _embedding_bag(
        weight, idx, offsets, mode, per_sample_weights, include_last_offset, pad, scale_grad_by_freq
    )
    return out
