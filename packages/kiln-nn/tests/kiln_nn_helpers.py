"""Shared test helpers (imported by name; conftest puts this folder on sys.path): moving values between kiln and the PyTorch oracle, and building twin models."""

from __future__ import annotations

import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")


def to_np(t) -> np.ndarray:
    """A NumPy copy of a kiln or torch tensor."""
    if isinstance(t, kiln.Tensor):
        return np.array(t.detach().numpy())
    return t.detach().numpy().copy()


def k2t(t, requires_grad: bool = False):
    """The torch twin of a kiln tensor."""
    out = torch.from_numpy(to_np(t))
    return out.requires_grad_(requires_grad)


def t2k(t, requires_grad: bool = False):
    """The kiln twin of a torch tensor."""
    return kiln.tensor(to_np(t), requires_grad=requires_grad)


def copy_weights(kmodel, tmodel) -> None:
    """Load the kiln model's parameters and buffers into the torch model (same names)."""
    sd = {k: k2t(v) for k, v in kmodel.state_dict().items()}
    tmodel.load_state_dict(sd)


def assert_close(a, b, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Compare a kiln and a torch tensor (either order) elementwise."""
    np.testing.assert_allclose(to_np(a), to_np(b), rtol=rtol, atol=atol)


def kiln_to_torch_name(text: str) -> str:
    """Printed text with kiln's names swapped for torch's (``kiln.float32`` -> ``torch.float32``)."""
    return text.replace("kiln.", "torch.")
