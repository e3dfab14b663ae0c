"""nn primitives: ``one_hot`` (``torch.nn.functional.one_hot``), an op with a NumPy reference kernel."""

from __future__ import annotations

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops.activation import _need_tensor
from kiln._spec import Spec
from kiln._tensor import Tensor

__all__ = ["one_hot"]


# ---------------------------------------------------------------------------------------- one_hot


def _one_hot_meta(tensor, num_classes=-1):
    _need_tensor(tensor, "one_hot", "tensor", 1)
    if tensor._dtype is not dt.int64:
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    n = tensor.numel()
    if n == 0:
        if num_classes <= 0:
            raise RuntimeError("Can not infer total number of classes from empty tensor.")
        return Spec((tensor._shape + (num_classes,), dt.int64, tensor._device))
    from kiln._ops.sort import _host_np

    values = _host_np(tensor)  # read on the host: no device kernel runs inside a meta function
    lo, hi = int(values.min()), int(values.max())
    if lo < 0:
        raise RuntimeError("Class values must be non-negative.")
    if num_classes == -1:
        num_classes = hi + 1
    elif hi >= num_classes:
        raise RuntimeError("Class values must be smaller than num_classes.")
    return Spec((tensor._shape + (num_classes,), dt.int64, tensor._device))


def _one_hot_ref(spec, a, num_classes=-1):
    c = spec.shape[-1]
    return (np.asarray(a)[..., None] == np.arange(c, dtype=np.int64)).astype(np.int64)


def _one_hot_decomposed(tensor, num_classes=-1):
    """``one_hot`` in kiln ops: ``tensor[..., None] == arange(num_classes)`` as int64 (the meta function
    infers and checks the number of classes)."""
    from kiln._ops.comparison import eq
    from kiln._ops.creation import arange

    classes = _one_hot_meta(tensor, num_classes)[0][-1]
    return eq(tensor.unsqueeze(-1), arange(classes, device=tensor._device)).to(dt.int64)


@op(tags=("index",), decompose=_one_hot_decomposed, meta=_one_hot_meta, reference=_one_hot_ref)
def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
    """An int64 tensor with a trailing dim of size ``num_classes`` (inferred as ``max + 1`` when -1)
    holding 1 at each index of ``tensor`` and 0 elsewhere."""
