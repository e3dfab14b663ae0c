"""The exceptions of ``kiln.distributed``, as ``torch.distributed``'s (all are ``RuntimeError``\\ s)."""

from __future__ import annotations

__all__ = ["DistBackendError", "DistError", "DistNetworkError", "DistStoreError"]


class DistError(RuntimeError):
    """Base of the errors a process group raises (``torch.distributed.DistError``)."""


class DistBackendError(DistError):
    """A collective engine failed: a peer died, a timeout passed, or ranks disagreed on a call."""


class DistStoreError(DistError):
    """A store operation failed or timed out."""


class DistNetworkError(DistError):
    """A network operation failed: a store or peer could not be reached."""
