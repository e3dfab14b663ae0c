"""kiln.testing: helpers for testing kiln code and kiln plugins (from the kiln-testing distribution).

* :func:`assert_close` — ``torch.testing.assert_close``'s semantics and messages, for tensors on any device;
* :func:`make_tensor` — ``torch.testing.make_tensor``: random tensors of a dtype on a device, optionally strided;
* :func:`gradcheck`, :func:`gradgradcheck` — finite-difference gradient checks that accept device tensors;
* :mod:`kiln.testing.strategies` — hypothesis strategies for shapes, dtypes and strided tensors.

The conformance suite for device plugins is the pytest plugin of the same distribution:
``pytest --kiln-device=NAME`` (see the "Writing a device plugin" guide).
"""

from __future__ import annotations

from kiln.testing._comparison import assert_close, default_tolerances
from kiln.testing._creation import make_tensor
from kiln.testing._gradcheck import GradcheckError, gradcheck, gradgradcheck


def __getattr__(name: str):
    if name == "strategies":  # hypothesis is imported only by tests that ask for the strategies
        import importlib

        return importlib.import_module("kiln.testing.strategies")
    raise AttributeError(f"module 'kiln.testing' has no attribute '{name}'")


__all__ = [
    "assert_close",
    "default_tolerances",
    "make_tensor",
    "gradcheck",
    "gradgradcheck",
    "GradcheckError",
    "strategies",  # imported lazily by __getattr__
]
