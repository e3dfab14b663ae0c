"""``kiln.backends.cuda``: CUDA switches. ``matmul.allow_tf32`` is a view of
:func:`kiln.get_float32_matmul_precision` (True unless it is ``"highest"``), as in PyTorch; the
scaled-dot-product-attention switches record which kernels a device may use (all enabled by default, as
in PyTorch); kiln's own attention is one math kernel, used whatever they say, since no kiln device has
another yet."""

from __future__ import annotations

import contextlib

__all__ = [
    "enable_flash_sdp",
    "enable_math_sdp",
    "enable_mem_efficient_sdp",
    "enable_cudnn_sdp",
    "flash_sdp_enabled",
    "is_built",
    "math_sdp_enabled",
    "matmul",
    "mem_efficient_sdp_enabled",
    "cudnn_sdp_enabled",
    "preferred_linalg_library",
    "sdp_kernel",
]


def is_built() -> bool:
    """Whether the kiln-cuda backend is installed (a GPU need not be present)."""
    import importlib.util

    return importlib.util.find_spec("kiln_cuda") is not None


class _Matmul:
    """``kiln.backends.cuda.matmul``: ``allow_tf32``, ``allow_fp16_reduced_precision_reduction``,
    ``allow_bf16_reduced_precision_reduction``; any other attribute is an error, as in PyTorch."""

    _REDUCTIONS = ("allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction")

    def __init__(self):
        object.__setattr__(self, "_flags", dict.fromkeys(self._REDUCTIONS, True))

    def __getattr__(self, name: str):
        from kiln._flags import get_float32_matmul_precision

        if name == "allow_tf32":
            return get_float32_matmul_precision() != "highest"
        if name in self._REDUCTIONS:
            return self._flags[name]
        raise AttributeError("Unknown attribute " + name)

    def __setattr__(self, name: str, value) -> None:
        from kiln._flags import set_float32_matmul_precision

        if name == "allow_tf32":
            set_float32_matmul_precision("high" if value else "highest")
        elif name in self._REDUCTIONS:
            self._flags[name] = bool(value)
        else:
            raise AttributeError("Unknown attribute " + name)


matmul = _Matmul()

_SDP = {"flash": True, "mem_efficient": True, "cudnn": True, "math": True}


def _setter(kind: str):
    def enable(enabled: bool) -> None:
        _SDP[kind] = bool(enabled)

    enable.__name__ = enable.__qualname__ = f"enable_{kind}_sdp"
    enable.__doc__ = f"Allow or forbid the {kind} attention kernel (recorded; no kiln device has one yet)."

    def enabled() -> bool:
        return _SDP[kind]

    enabled.__name__ = enabled.__qualname__ = f"{kind}_sdp_enabled"
    enabled.__doc__ = f"Whether the {kind} attention kernel may be used (True unless disabled)."
    return enable, enabled


enable_flash_sdp, flash_sdp_enabled = _setter("flash")
enable_mem_efficient_sdp, mem_efficient_sdp_enabled = _setter("mem_efficient")
enable_cudnn_sdp, cudnn_sdp_enabled = _setter("cudnn")


enable_math_sdp, math_sdp_enabled = _setter("math")


@contextlib.contextmanager
def sdp_kernel(enable_flash=True, enable_math=True, enable_mem_efficient=True, enable_cudnn=True):
    """Choose the attention kernels for the block (PyTorch's deprecated form of ``sdpa_kernel``)."""
    saved = dict(_SDP)
    _SDP.update(
        flash=bool(enable_flash),
        mem_efficient=bool(enable_mem_efficient),
        cudnn=bool(enable_cudnn),
        math=bool(enable_math),
    )
    try:
        yield
    finally:
        _SDP.update(saved)


def preferred_linalg_library(backend=None) -> str:
    """The linear-algebra library for CUDA tensors: kiln-cuda uses its own kernels, so a preference
    (``"cusolver"``, ``"magma"``, ``"default"``) is accepted and ``"default"`` is what runs."""
    if backend not in (None, "default", "cusolver", "magma"):
        raise RuntimeError(f"Unknown input value {backend!r}: expected 'default', 'cusolver' or 'magma'")
    return "default"
