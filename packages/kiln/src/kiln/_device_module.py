"""``kiln.cuda``, ``kiln.cpu`` and ``kiln.<plugin device>``: per-device-type helper namespaces.

Each answers from the device plugin's contract, so a third-party device gets the same
``is_available()``/``device_count()``/``synchronize()``/memory API as ``cuda`` without any code of
its own in kiln.
"""

from __future__ import annotations

_ALWAYS = ("cpu", "cuda")
_CACHE: dict[str, DeviceModule] = {}


class DeviceModule:
    """Helpers for one device type: availability, count, synchronisation, memory statistics."""

    def __init__(self, name: str):
        self.name = name

    def _contract(self):
        from kiln import _plugins

        _plugins.load()
        return _plugins._devices.get(self.name)

    def is_available(self) -> bool:
        """True when a plugin provides this device type and it reports itself usable."""
        c = self._contract()
        return bool(c is not None and c.is_available())

    def device_count(self) -> int:
        """How many devices of this type are usable (0 when none)."""
        c = self._contract()
        return int(c.device_count()) if c is not None and c.is_available() else 0

    def synchronize(self, device=None) -> None:
        """Wait for all queued work on the device to finish."""
        from kiln._plugins import device_type

        index = None if device is None else (device if isinstance(device, int) else _index(device))
        device_type(self.name).synchronize(index)

    def memory_stats(self, device=None) -> dict:
        """The device's memory statistics (keys as the plugin reports them)."""
        from kiln._plugins import device_type

        index = None if device is None else (device if isinstance(device, int) else _index(device))
        return dict(device_type(self.name).memory_stats(index))

    def memory_allocated(self, device=None) -> int:
        """Bytes currently held by tensors on the device (0 when the plugin does not track it)."""
        return int(self.memory_stats(device).get("allocated_bytes.all.current", 0))

    def max_memory_allocated(self, device=None) -> int:
        """Peak bytes held by tensors on the device (0 when the plugin does not track it)."""
        return int(self.memory_stats(device).get("allocated_bytes.all.peak", 0))

    def manual_seed(self, seed: int) -> None:
        """Seed this device type's default generator."""
        from kiln.random import default_generator

        default_generator(self.name).manual_seed(seed)

    @property
    def amp(self):
        """This device type's mixed-precision names (``kiln.cpu.amp.autocast``, ``kiln.cuda.amp.GradScaler``,
        ``custom_fwd`` / ``custom_bwd``), as PyTorch spells them; they come with kiln-amp."""
        try:
            from kiln.amp import device_amp
        except ModuleNotFoundError as exc:
            if exc.name not in ("kiln.amp", "kiln"):
                raise
            raise ModuleNotFoundError(
                f"kiln.{self.name}.amp needs the kiln-amp package: pip install kiln-amp"
            ) from None
        return device_amp(self.name)

    def __repr__(self) -> str:
        return f"<kiln device module '{self.name}'>"


def _index(device) -> int | None:
    from kiln._device import as_device

    return as_device(device).index


def device_module(name: str) -> DeviceModule | None:
    """The helper namespace for a device type, or None when no such type is known."""
    m = _CACHE.get(name)
    if m is not None:
        return m
    if name.startswith("_"):
        return None
    if name not in _ALWAYS:
        from kiln import _plugins

        if _plugins._lock._is_owned():  # asked while plugins load: not a device (yet)
            return None
        _plugins.load()
        if name not in _plugins._devices:
            return None
    m = _CACHE[name] = DeviceModule(name)
    return m
