"""``kiln.backends.mps``: Apple's Metal backend, which kiln does not have (a device plugin could add it)."""

__all__ = ["is_available", "is_built"]


def is_available() -> bool:
    """Whether a kiln device plugin provides ``"mps"`` and it is usable (False without one)."""
    from kiln._device_module import device_module

    return device_module("mps") is not None and device_module("mps").is_available()


def is_built() -> bool:
    """Whether a plugin registers the ``"mps"`` device type."""
    from kiln._device_module import device_module

    return device_module("mps") is not None
