"""``kiln.backends.cuda``: CUDA switches. ``matmul.allow_tf32`` is a view of
:func:`kiln.get_float32_matmul_precision` (True unless it is ``"highest"``), as in PyTorch; the
scaled-dot-product-attention switches choose among kernels kiln-cuda may provide (kiln's own
attention is one math kernel, so only ``math_sdp`` has an effect: it cannot be disabled)."""

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

_SDP = {"flash": False, "mem_efficient": False, "cudnn": False}


def _setter(kind: str):
    def enable(enabled: bool) -> None:
        _SDP[kind] = bool(enabled)

    enable.__name__ = enable.__qualname__ = f"enable_{kind}_sdp"
    enable.__doc__ = f"Allow the {kind} attention kernel where a device provides one (kiln's devices do not yet)."

    def enabled() -> bool:
        return _SDP[kind]

    enabled.__name__ = enabled.__qualname__ = f"{kind}_sdp_enabled"
    enabled.__doc__ = f"Whether the {kind} attention kernel may be used (False: no kiln device has one yet)."
    return enable, enabled


enable_flash_sdp, flash_sdp_enabled = _setter("flash")
enable_mem_efficient_sdp, mem_efficient_sdp_enabled = _setter("mem_efficient")
enable_cudnn_sdp, cudnn_sdp_enabled = _setter("cudnn")


def enable_math_sdp(enabled: bool) -> None:
    """The math attention kernel is the one kiln has: it stays enabled (``False`` raises)."""
    if not enabled:
        raise RuntimeError("kiln has only the math kernel of scaled_dot_product_attention; it cannot be disabled")


def math_sdp_enabled() -> bool:
    """True: the math kernel of ``scaled_dot_product_attention`` is always available."""
    return True


@contextlib.contextmanager
def sdp_kernel(enable_flash=True, enable_math=True, enable_mem_efficient=True, enable_cudnn=True):
    """Choose the attention kernels for the block (PyTorch's deprecated form of ``sdpa_kernel``)."""
    saved = dict(_SDP)
    enable_math_sdp(enable_math)
    _SDP.update(flash=bool(enable_flash), mem_efficient=bool(enable_mem_efficient), cudnn=bool(enable_cudnn))
    try:
        yield
    finally:
        _SDP.update(saved)


def preferred_linalg_library(backend=None) -> str:
    """The linear-algebra library for CUDA tensors: kiln-cuda uses its own kernels (``"default"``)."""
    if backend not in (None, "default"):
        raise RuntimeError(f"kiln has one CUDA linear-algebra backend ('default'); got {backend!r}")
    return "default"
