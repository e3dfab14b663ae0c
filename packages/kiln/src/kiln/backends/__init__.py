"""``kiln.backends``: PyTorch's backend switches (``torch.backends``), so programs that set them run.

Submodules: :mod:`~kiln.backends.cpu`, :mod:`~kiln.backends.cuda`, :mod:`~kiln.backends.cudnn`,
:mod:`~kiln.backends.mps`, :mod:`~kiln.backends.mkldnn`, :mod:`~kiln.backends.mkl`,
:mod:`~kiln.backends.openmp` and :mod:`~kiln.backends.opt_einsum`. Each says what it does in kiln: most
flags name libraries kiln does not use (cuDNN, MKL, oneDNN) and are kept so that setting them works.
"""

from kiln.backends import cpu, cuda, cudnn, mkl, mkldnn, mps, openmp, opt_einsum

__all__ = ["cpu", "cuda", "cudnn", "mkl", "mkldnn", "mps", "openmp", "opt_einsum"]
