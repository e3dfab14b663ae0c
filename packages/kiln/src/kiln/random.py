"""Random number generation: ``kiln.Generator``, ``manual_seed`` and per-device default generators.

Every generator draws from NumPy's PCG64 on the host; random tensors for other devices are drawn on
the host and copied, so a seed gives the same numbers on every device. Streams are reproducible
within kiln; they are not PyTorch's Mersenne Twister streams.
"""

from __future__ import annotations

import json
import os

import numpy as np

from kiln._device import CPU, as_device
from kiln._device import device as Device

__all__ = ["Generator", "manual_seed", "seed", "initial_seed", "get_rng_state", "set_rng_state", "default_generator"]

_DEFAULT_SEED = 67280421310721  # PyTorch's default CPU seed, so initial_seed() reads the same


class Generator:
    """A pseudo-random number generator for one device (``torch.Generator``)."""

    def __init__(self, device: str | Device = "cpu"):
        self._start(device, _DEFAULT_SEED)
        _tell_modes(self)  # a stream started while a mode records: a replay would draw on from this one

    def _start(self, device: str | Device, seed: int) -> None:
        self.device = as_device(device)
        self._seed = seed
        self._rng = np.random.Generator(np.random.PCG64(seed))

    def manual_seed(self, seed: int) -> Generator:
        """Reset the stream from ``seed``; returns ``self``."""
        seed = int(seed)
        if seed < -(2**63) or seed >= 2**64:
            raise RuntimeError(f"Overflow when unpacking long long ({seed})")
        self._start(self.device, seed % 2**64)
        _tell_modes(self)
        return self

    def seed(self) -> int:
        """Seed from OS entropy and return the seed used."""
        s = int.from_bytes(os.urandom(8), "little")
        self.manual_seed(s)
        return s

    def initial_seed(self) -> int:
        """The seed the stream was last reset from."""
        return self._seed

    def get_state(self):
        """The generator state as a uint8 tensor (restore it with :meth:`set_state`)."""
        from kiln._ops.creation import tensor

        payload = json.dumps({"seed": self._seed, "state": self._rng.bit_generator.state}).encode()
        return tensor(list(payload), dtype=_uint8())

    def set_state(self, new_state) -> Generator:
        """Restore a state from :meth:`get_state`; returns ``self``."""
        from kiln._tensor import Tensor

        if not isinstance(new_state, Tensor) or new_state.dtype is not _uint8():
            raise TypeError("set_state expects a kiln.uint8 tensor from get_state()")
        payload = json.loads(bytes(new_state.tolist()).decode())
        self._seed = payload["seed"]
        self._rng = np.random.Generator(np.random.PCG64())
        self._rng.bit_generator.state = payload["state"]
        _tell_modes(self)
        return self

    def __repr__(self) -> str:
        return f"<kiln.Generator object on {self.device}>"


def _tell_modes(generator: Generator) -> None:
    """A generator's stream was started or reset: the active post-autograd modes are told
    (``DispatchMode.generator_reset``)."""
    from kiln._state import post_modes

    for mode in post_modes():
        mode.generator_reset(generator)


def _uint8():
    from kiln._dtype import uint8

    return uint8


_DEFAULTS: dict[Device, Generator] = {}


def default_generator(device: str | Device = CPU) -> Generator:
    """The default generator of a device (created on first use)."""
    d = as_device(device)
    if d.type != "cpu" and d.index is None:
        d = Device(d.type, 0)  # tensors live on "cuda:0", not "cuda": one generator for both spellings
    g = _DEFAULTS.get(d)
    if g is None:  # (made on first use, maybe inside a traced call: the modes are not told, nothing was reset)
        cpu = _DEFAULTS.get(CPU) or _DEFAULTS.setdefault(CPU, _new_default(CPU, _DEFAULT_SEED))
        g = _DEFAULTS[d] = cpu if d is CPU else _new_default(d, cpu.initial_seed())
    return g


def _new_default(device: Device, seed: int) -> Generator:
    g = Generator.__new__(Generator)
    g._start(device, seed)
    return g


def manual_seed(seed: int) -> Generator:
    """Seed the default generator of every device; returns the CPU default generator."""
    cpu = default_generator(CPU)
    cpu.manual_seed(seed)
    for d, g in _DEFAULTS.items():
        if d is not CPU:
            g.manual_seed(seed)
    return cpu


def seed() -> int:
    """Seed every default generator from OS entropy; returns the seed."""
    s = default_generator(CPU).seed()
    manual_seed(s)
    return s


def initial_seed() -> int:
    """The initial seed of the default CPU generator."""
    return default_generator(CPU).initial_seed()


def get_rng_state():
    """The default CPU generator's state as a uint8 tensor."""
    return default_generator(CPU).get_state()


def set_rng_state(new_state) -> None:
    """Restore the default CPU generator's state."""
    default_generator(CPU).set_state(new_state)
