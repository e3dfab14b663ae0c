"""``LinearCrossEntropyOptions`` (``torch.nn.LinearCrossEntropyOptions``): how the chunked
``linear_cross_entropy`` splits its batch."""

from __future__ import annotations

import dataclasses
from typing import Literal

import kiln

__all__ = ["LinearCrossEntropyOptions"]

# ("auto" acc_policy, "auto" chunking_method) per (device type, input dtype), as PyTorch picks them
_AUTO_DEFAULTS = {
    ("cuda", "bfloat16"): ("compact", "aspect_ratio:2"),
    ("cuda", "float16"): ("compact", "aspect_ratio:2"),
    ("cpu", "bfloat16"): ("accurate", "aspect_ratio"),
    ("cpu", "float16"): ("accurate", "aspect_ratio"),
}
_AUTO_FALLBACK = ("compact", "aspect_ratio:2")
_ACC_DTYPES = ("float16", "bfloat16", "float32", "float64")


@dataclasses.dataclass(slots=True, frozen=True)
class LinearCrossEntropyOptions:
    """Options of the chunked :func:`kiln.nn.functional.linear_cross_entropy`: the batch is processed
    ``batch_chunk_size`` rows at a time and each chunk's logits are recomputed for the backward pass
    instead of kept, so the full ``(N, num_classes)`` logits never exist at once.

    * ``batch_chunk_size``: rows per chunk (``None``: from ``chunking_method``, or one chunk);
    * ``chunking_method``: ``"aspect_ratio[:k]"`` sizes a chunk's logits like the input
      (``next_pow2(ceil(N / ceil(C / in_features))) // k`` rows), ``"auto"`` picks per device and dtype,
      ``None`` uses ``batch_chunk_size``; giving both with different results raises ``ValueError``;
    * ``acc_dtype``: the dtype the chunks compute in (``None``: float32 for float16/bfloat16 input under
      ``acc_policy="auto"``, else the input's);
    * ``acc_policy`` (``"accurate"``, ``"balanced"``, ``"compact"``, ``"auto"``) and ``allow_retain_graph``
      are accepted and validated as in PyTorch; kiln computes every chunk in ``acc_dtype`` whatever the
      policy (PyTorch's policies trade precision for memory in its fused kernel), and its recomputing
      backward allows ``retain_graph=True`` whatever ``allow_retain_graph`` says.
    """

    allow_retain_graph: bool = False
    batch_chunk_size: int | None = None
    chunking_method: str | None = "auto"
    acc_policy: Literal["accurate", "balanced", "compact", "auto"] = "auto"
    acc_dtype: kiln.dtype | None = None

    def __post_init__(self) -> None:
        if self.acc_policy not in {"auto", "accurate", "balanced", "compact"}:
            raise ValueError(f"invalid acc_policy: {self.acc_policy!r}")
        if self.chunking_method is not None and self.chunking_method != "auto":
            name, sep, factor = self.chunking_method.partition(":")
            factor = factor if sep else "1"
            if not (name == "aspect_ratio" and factor.isdigit() and int(factor) > 0):
                raise ValueError(f"invalid chunking_method: {self.chunking_method!r}")
        if not (
            self.batch_chunk_size is None or (isinstance(self.batch_chunk_size, int) and self.batch_chunk_size > 0)
        ):
            raise ValueError(f"batch_chunk_size must be positive int or None, got {self.batch_chunk_size!r}")
        if self.acc_dtype is not None and getattr(self.acc_dtype, "name", None) not in _ACC_DTYPES:
            raise ValueError(
                "acc_dtype must be one of {None, kiln.float16, kiln.bfloat16, kiln.float32, kiln.float64}, got "
                f"{self.acc_dtype!r}. Pass acc_dtype=None to let the op pick automatically."
            )

    @staticmethod
    def _chunk_size(method: str, num_batches: int, in_features: int, num_classes: int) -> int:
        factor = int(method.split(":", 1)[1]) if ":" in method else 1
        ratio = -(-num_classes // in_features)
        target = -(-num_batches // ratio)
        return min((1 << max(target - 1, 0).bit_length()) // factor, num_batches)

    def _adjust(self, num_batches: int, in_features: int, num_classes: int, dtype, device=None):
        """These options with every ``"auto"`` and ``None`` resolved for one call."""
        policy, method = self.acc_policy, self.chunking_method
        if method == "auto" and self.batch_chunk_size is not None:
            method = None
        if policy == "auto" or method == "auto":
            key = (device.type, dtype.name) if device is not None else None
            auto_policy, auto_method = _AUTO_DEFAULTS.get(key, _AUTO_FALLBACK)
            policy = auto_policy if policy == "auto" else policy
            method = auto_method if method == "auto" else method
        size = num_batches if self.batch_chunk_size is None else min(self.batch_chunk_size, num_batches)
        if method is not None:
            size = self._chunk_size(method, num_batches, in_features, num_classes)
            if self.batch_chunk_size is not None and self.batch_chunk_size != size:
                raise ValueError(
                    f"batch_chunk_size (={self.batch_chunk_size}) and chunking_method ('{method}') give different "
                    f"chunk sizes ({self.batch_chunk_size} vs {size}); pass only one."
                )
        acc = self.acc_dtype
        if acc is None:
            low = dtype in (kiln.float16, kiln.bfloat16)
            acc = kiln.float32 if self.acc_policy == "auto" and low else dtype
        return dataclasses.replace(
            self, acc_policy=policy, chunking_method=method, batch_chunk_size=max(1, size), acc_dtype=acc
        )
