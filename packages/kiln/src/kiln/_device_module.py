"""``kiln.cuda``, ``kiln.cpu`` and ``kiln.<plugin device>``: per-device-type modules.

Each is a real module object (``import kiln.cuda``, ``from kiln.cuda import is_available``) that
answers from the device plugin's contract, so a third-party device gets the same
``is_available()``/``device_count()``/``synchronize()``/memory/seeding API as ``cuda`` without any code
of its own in kiln. ``kiln.cuda`` always exists: without kiln-cuda it reports no device, and seeding it
is a no-op that takes effect once the device appears, as PyTorch's lazy CUDA seeding is.

:class:`_Finder` (on ``sys.meta_path``, after the path finders) is what makes ``import kiln.<type>`` and
``import kiln.<type>.amp`` work for device types, and ``import kiln.distributed`` / ``kiln.onnx`` import
a placeholder that names the package to install (in the ``AttributeError`` of any name used) until that
package provides the real module.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types

_ALWAYS = ("cpu", "cuda")
_CACHE: dict[str, DeviceModule] = {}


class DeviceModule(types.ModuleType):
    """Helpers for one device type: availability, count, synchronisation, memory statistics, seeding."""

    def __init__(self, name: str):
        super().__init__(
            f"kiln.{name}",
            f"``kiln.{name}``: availability, synchronisation, memory statistics and seeding of device type "
            f"{name!r}, answered by its plugin's contract (``torch.{name}``'s names).",
        )
        self.__path__: list[str] = []  # a package: kiln.<type>.amp is its submodule
        # a spec as if imported, so importlib.util.find_spec("kiln.<type>") works however it was created
        self.__spec__ = importlib.machinery.ModuleSpec(self.__name__, _FINDER, is_package=True)
        self.__loader__ = _FINDER
        self.__all__ = sorted(n for n in _PUBLIC if n != "amp")
        self._type = name

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(_PUBLIC) | set(self._extension_names()))

    def __getattr__(self, attr: str):
        if attr == "amp":  # kiln-amp's kiln.<type>.amp, imported on first use
            import importlib

            return importlib.import_module(f"{self.__name__}.amp")
        if not attr.startswith("_"):  # the plugin's own names (its contract's ``module``)
            extension = self._extension()
            if extension is not None and attr in self._extension_names():
                return getattr(extension, attr)
        raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r}")

    def _extension(self):
        c = self._contract()
        return None if c is None else c.module

    def _extension_names(self) -> list[str]:
        extension = self._extension()
        if extension is None:
            return []
        names = getattr(extension, "__all__", None)
        return list(names) if names is not None else [n for n in vars(extension) if not n.startswith("_")]

    def _contract(self):
        from kiln import _plugins

        _plugins.load()
        return _plugins._devices.get(self._type)

    def is_available(self) -> bool:
        """True when a plugin provides this device type and it reports itself usable."""
        c = self._contract()
        return bool(c is not None and c.is_available())

    def is_initialized(self) -> bool:
        """Whether the device type is set up; kiln initialises a device on first use, so this is
        :meth:`is_available`."""
        return self.is_available()

    def init(self) -> None:
        """Initialise the device type: raises the not-installed error when no plugin provides it."""
        from kiln._plugins import device_type

        device_type(self._type)

    def device_count(self) -> int:
        """How many devices of this type are usable (0 when none)."""
        c = self._contract()
        return int(c.device_count()) if c is not None and c.is_available() else 0

    def synchronize(self, device=None) -> None:
        """Wait for all queued work on the device to finish."""
        from kiln._plugins import device_type

        device_type(self._type).synchronize(_index(device))

    def memory_stats(self, device=None) -> dict:
        """The device's memory statistics (keys as the plugin reports them); empty when no device of this
        type is available, as PyTorch's are before CUDA starts."""
        c = self._contract()
        if c is None or not c.is_available():
            return {}
        return dict(c.memory_stats(_index(device)))

    def memory_allocated(self, device=None) -> int:
        """Bytes currently held by tensors on the device (0 when the plugin does not track it)."""
        return int(self.memory_stats(device).get("allocated_bytes.all.current", 0))

    def max_memory_allocated(self, device=None) -> int:
        """Peak bytes held by tensors on the device (0 when the plugin does not track it)."""
        return int(self.memory_stats(device).get("allocated_bytes.all.peak", 0))

    def memory_reserved(self, device=None) -> int:
        """Bytes the device's allocator holds, in use or cached (0 when the plugin does not track it)."""
        return int(self.memory_stats(device).get("reserved_bytes.all.current", 0))

    def max_memory_reserved(self, device=None) -> int:
        """Peak bytes the device's allocator held (0 when the plugin does not track it)."""
        return int(self.memory_stats(device).get("reserved_bytes.all.peak", 0))

    def empty_cache(self) -> None:
        """Release the allocator's unused cached memory; nothing to do when the device type is absent
        or its plugin keeps no cache (as ``torch.cuda.empty_cache`` before CUDA is initialised)."""
        c = self._contract()
        release = getattr(c, "empty_cache", None) if c is not None and c.is_available() else None
        if release is not None:
            release()

    def _generators(self, device=None) -> list:
        from kiln._device import device as Device
        from kiln.random import default_generator

        if self._type == "cpu":
            return [default_generator("cpu")]
        if device is not None:
            return [default_generator(Device(self._type, _index(device) or 0))]
        return [default_generator(Device(self._type, i)) for i in range(max(1, self.device_count()))]

    def manual_seed(self, seed: int) -> None:
        """Seed the current device's default generator (allowed, and kept, while no device exists)."""
        self._generators(0)[0].manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        """Seed the default generator of every device of this type."""
        for g in self._generators():
            g.manual_seed(seed)

    def seed(self) -> None:
        """Seed the current device's default generator from OS entropy."""
        self._generators(0)[0].seed()

    def seed_all(self) -> None:
        """Seed every device's default generator from one draw of OS entropy."""
        gens = self._generators()
        s = gens[0].seed()
        for g in gens[1:]:
            g.manual_seed(s)

    def initial_seed(self) -> int:
        """The seed the current device's default generator was last reset from."""
        return self._generators(0)[0].initial_seed()

    def get_rng_state(self, device=None):
        """The default generator's state of one device (index, name or device; the current one when
        None), a uint8 tensor."""
        return self._generators(0 if device is None else device)[0].get_state()

    def set_rng_state(self, new_state, device=None) -> None:
        """Restore the default generator's state of one device (the current one when None)."""
        self._generators(0 if device is None else device)[0].set_state(new_state)

    def get_rng_state_all(self) -> list:
        """The default generators' states of every device of this type."""
        return [g.get_state() for g in self._generators()]

    def set_rng_state_all(self, new_states) -> None:
        """Restore every device's default generator from :meth:`get_rng_state_all`'s list."""
        gens, states = self._generators(), list(new_states)
        if len(states) != len(gens):
            raise ValueError(f"set_rng_state_all: expected {len(gens)} states (one per device), got {len(states)}")
        for g, s in zip(gens, states, strict=True):
            g.set_state(s)

    def __repr__(self) -> str:
        return f"<module 'kiln.{self._type}' (kiln device type {self._type!r})>"


_PUBLIC = tuple(n for n in vars(DeviceModule) if not n.startswith("_")) + ("amp",)


def _index(device) -> int | None:
    if device is None or isinstance(device, int):
        return device
    from kiln._device import as_device

    return as_device(device).index


def device_module(name: str) -> DeviceModule | None:
    """The module for a device type, or None when no such type is known."""
    m = _CACHE.get(name)
    if m is not None:
        return m
    if name.startswith("_") or not name.isidentifier():
        return None
    if name not in _ALWAYS:
        from kiln import _plugins

        if _plugins._lock._is_owned():  # asked while plugins load: not a device (yet)
            return None
        _plugins.load()
        if name not in _plugins._devices:
            return None
    m = _CACHE[name] = DeviceModule(name)  # into sys.modules only when imported (_Finder), so a real
    return m  # kiln.<name> package installed later still wins


# ------------------------------------------------------------------------------------- placeholders

# kiln.<name> -> the distribution that provides it, and the answers its placeholder gives without it
_PLACEHOLDERS: dict[str, tuple[str, dict[str, object]]] = {
    "distributed": ("kiln-distributed", {"is_available": lambda: False, "is_initialized": lambda: False}),
    "onnx": ("kiln-compile", {"is_in_onnx_export": lambda: False}),
    "compile": ("kiln-compile", {"is_compiling": lambda: False}),  # also called: kiln.compile(model) names it
    "compiler": ("kiln-compile", {"is_compiling": lambda: False, "is_dynamo_compiling": lambda: False}),
    "_dynamo": ("kiln-compile", {"is_compiling": lambda: False}),
}

# kiln.<name> -> (core module, names): what its placeholder serves as the core has it, the real functions
# (torch._dynamo's marks: a script marks its tensors whether or not it compiles)
_SERVED: dict[str, tuple[str, tuple[str, ...]]] = {
    "_dynamo": ("kiln._marks", ("mark_dynamic", "mark_static", "maybe_mark_dynamic")),
}


class _Placeholder(types.ModuleType):
    """A module a not-installed kiln package provides: it imports, so a script may import it at the top
    and never use it; any other name raises ``AttributeError`` naming the package to install."""

    def __init__(self, name: str, dist: str, answers: dict[str, object]):
        super().__init__(
            f"kiln.{name}", f"Placeholder for ``kiln.{name}``, which the {dist} package provides: pip install {dist}"
        )
        self._dist = dist
        for k, fn in answers.items():
            fn.__name__ = fn.__qualname__ = k
            fn.__doc__ = f"False: {dist} is not installed."
            setattr(self, k, fn)
        served = _SERVED.get(name)
        if served is not None:
            core = importlib.import_module(served[0])
            for k in served[1]:
                setattr(self, k, getattr(core, k))

    def __call__(self, *args, **kwargs):
        raise ModuleNotFoundError(
            f"{self.__name__}() needs the {self._dist} package, which is not installed: pip install {self._dist}",
            name=self.__name__,
        )

    def __getattr__(self, attr: str):
        # AttributeError (PEP 562), so hasattr() and getattr(..., default) probe it as any module
        if attr.startswith("__"):
            raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r}")
        raise AttributeError(
            f"{self.__name__}.{attr} needs the {self._dist} package, which is not installed: pip install {self._dist}"
        )


class _Finder:  # a meta-path finder and loader by protocol (importlib.abc costs import time)
    """Imports ``kiln.<device type>``, ``kiln.<device type>.amp`` and the placeholders (last on
    ``sys.meta_path``: a real module of that name, installed by a package, always wins)."""

    def find_spec(self, fullname: str, path=None, target=None):
        parts = fullname.split(".")
        if parts[0] != "kiln" or len(parts) not in (2, 3):
            return None
        if len(parts) == 2 and parts[1] in _PLACEHOLDERS:
            return importlib.machinery.ModuleSpec(fullname, self)
        if device_module(parts[1]) is None or (len(parts) == 3 and parts[2] != "amp"):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=len(parts) == 2)

    def create_module(self, spec):
        parts = spec.name.split(".")
        if len(parts) == 2 and parts[1] in _PLACEHOLDERS:
            return _Placeholder(parts[1], *_PLACEHOLDERS[parts[1]])
        if len(parts) == 2:
            return device_module(parts[1])
        try:
            from kiln.amp import device_amp
        except ModuleNotFoundError as exc:
            if exc.name not in ("kiln.amp", "kiln"):
                raise
            raise ModuleNotFoundError(
                f"{spec.name} needs the kiln-amp package: pip install kiln-amp", name=spec.name
            ) from None
        mod = types.ModuleType(spec.name, f"``{spec.name}``: PyTorch's older spellings of kiln.amp's names.")
        mod.__dict__.update((k, v) for k, v in vars(device_amp(parts[1])).items() if k != "__name__")
        return mod

    def exec_module(self, module) -> None:
        return None


_FINDER = _Finder()


def install_finder() -> None:
    """Put :class:`_Finder` on ``sys.meta_path`` once (``import kiln`` does)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)
