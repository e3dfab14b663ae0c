"""``kiln.nn.parallel``: single-process data parallelism (``torch.nn.parallel``).

:class:`DataParallel` splits each batch across the accelerator's devices, runs the module on every
device with its parameters copied there (the copies are differentiable, so gradients flow back to the
one set of parameters), and gathers the outputs on ``output_device``. With no accelerator (or one
device) it calls the module directly, as PyTorch does without CUDA.

``DistributedDataParallel`` is kiln-distributed's class (``kiln.distributed.ddp``), imported on first use
of the name; without that package the name still imports, so ``from kiln.nn.parallel import
DistributedDataParallel`` at the top of a script works, and constructing one raises
``ModuleNotFoundError`` naming the package.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import kiln
from kiln.nn.modules.module import Module

__all__ = [
    "DataParallel",
    "DistributedDataParallel",
    "data_parallel",
    "gather",
    "parallel_apply",
    "replicate",
    "scatter",
]


def _devices(device_ids) -> list[kiln.device]:
    if device_ids is None:
        acc = kiln.accelerator.current_accelerator()
        if acc is None:
            return []
        device_ids = list(range(kiln.accelerator.device_count()))
        return [kiln.device(acc.type, i) for i in device_ids]
    acc = kiln.accelerator.current_accelerator()
    out = []
    for d in device_ids:
        if isinstance(d, int):
            if acc is None:
                raise RuntimeError(f"DataParallel: device id {d} given, but no accelerator device is available")
            d = kiln.device(acc.type, d)
        out.append(kiln.device(d))
    return out


def _rebuild(like: tuple | list, items: list) -> tuple | list:
    """``items`` in the container type of ``like`` (a named tuple takes them as fields)."""
    return type(like)(*items) if hasattr(like, "_fields") else type(like)(items)


def scatter(inputs: Any, target_gpus: Sequence, dim: int = 0) -> list:
    """Split every tensor in ``inputs`` (nested tuples/lists/dicts) into one chunk per device along
    ``dim`` and move each chunk to its device; other objects are repeated."""
    devices = _devices(target_gpus)

    def split(obj):
        if isinstance(obj, kiln.Tensor):
            chunks = obj.chunk(len(devices), dim)
            return [c.to(d) for c, d in zip(chunks, devices, strict=False)]
        if isinstance(obj, (tuple, list)) and obj:
            cols = [split(x) for x in obj]
            n = min(len(c) for c in cols)
            return [_rebuild(obj, [c[i] for c in cols]) for i in range(n)]
        if isinstance(obj, dict) and obj:
            cols = {k: split(v) for k, v in obj.items()}
            n = min(len(c) for c in cols.values())
            return [type(obj)((k, c[i]) for k, c in cols.items()) for i in range(n)]
        return [obj for _ in devices]

    return split(inputs)


def replicate(network: Module, devices: Sequence, detach: bool = False) -> list:
    """One callable per device running ``network`` with its parameters and buffers copied there
    (differentiably, unless ``detach``)."""
    from kiln.func import functional_call

    devices = _devices(devices)
    state = dict(network.named_parameters()) | dict(network.named_buffers())

    def on(device):
        moved = {k: (v.detach() if detach else v).to(device) for k, v in state.items()}
        return lambda *args, **kwargs: functional_call(network, moved, args, kwargs)

    return [on(d) for d in devices]


def parallel_apply(modules: Sequence, inputs: Sequence, kwargs_tup: Sequence | None = None, devices=None) -> list:
    """Call ``modules[i](*inputs[i], **kwargs_tup[i])`` for every i; the outputs in order."""
    if len(modules) != len(inputs):
        raise AssertionError(f"The number of modules {len(modules)} is not equal to the number of inputs {len(inputs)}")
    kwargs_tup = kwargs_tup or [{}] * len(modules)
    return [
        m(*(i if isinstance(i, (tuple, list)) else (i,)), **k)
        for m, i, k in zip(modules, inputs, kwargs_tup, strict=True)
    ]


def gather(outputs: Sequence, target_device, dim: int = 0) -> Any:
    """Concatenate the per-device outputs along ``dim`` on ``target_device`` (nested structures
    gathered element by element)."""
    target = kiln.device(target_device) if not isinstance(target_device, int) else _devices([target_device])[0]
    first = outputs[0]
    if isinstance(first, kiln.Tensor):
        if first.dim() == 0:
            import warnings

            warnings.warn(
                "Was asked to gather along dimension 0, but all input tensors were scalars; will instead unsqueeze "
                "and return a vector.",
                UserWarning,
                stacklevel=2,
            )
            return kiln.stack([o.to(target) for o in outputs])
        return kiln.cat([o.to(target) for o in outputs], dim)
    if isinstance(first, (tuple, list)):
        return _rebuild(first, [gather([o[i] for o in outputs], target, dim) for i in range(len(first))])
    if isinstance(first, dict):
        return type(first)((k, gather([o[k] for o in outputs], target, dim)) for k in first)
    return first


class DataParallel(Module):
    """Run ``module`` on every device of ``device_ids`` (default: all of the accelerator's), each on its
    share of the batch along ``dim``, and gather the outputs on ``output_device`` (default:
    ``device_ids[0]``). As in PyTorch: without an accelerator it is the module itself, called directly;
    with one device the module is moved there and the inputs follow; with several, the module must live on
    ``device_ids[0]`` when it is called."""

    def __init__(self, module: Module, device_ids=None, output_device=None, dim: int = 0):
        super().__init__()
        self.module = module
        self.dim = dim
        self.device_ids = _devices(device_ids) if kiln.accelerator.is_available() else []
        self.output_device = None
        if self.device_ids:
            self.output_device = self.device_ids[0] if output_device is None else _devices([output_device])[0]
            if len(self.device_ids) == 1:
                module.to(self.device_ids[0])

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """The module's output on this batch (split, run per device and gathered when there are devices)."""
        if not self.device_ids:
            return self.module(*inputs, **kwargs)
        src = self.device_ids[0]
        for t in list(self.module.parameters()) + list(self.module.buffers()):
            if t.device != src:
                raise RuntimeError(
                    f"module must have its parameters and buffers on device {src} (device_ids[0]) but found one "
                    f"of them on device: {t.device}"
                )
        ins = scatter(inputs, self.device_ids, self.dim) if inputs else [() for _ in self.device_ids]
        kws = scatter(kwargs, self.device_ids, self.dim) if kwargs else [{} for _ in ins]
        if len(self.device_ids) == 1:
            return self.module(*ins[0], **kws[0])
        n = min(len(ins), len(kws))
        replicas = replicate(self.module, self.device_ids[:n])
        return gather(parallel_apply(replicas, ins[:n], kws[:n]), self.output_device, self.dim)


def data_parallel(module: Module, inputs, device_ids=None, output_device=None, dim: int = 0, module_kwargs=None):
    """The functional form of :class:`DataParallel`: one call of ``module`` over ``inputs``."""
    dp = DataParallel(module, device_ids, output_device, dim)
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    return dp(*inputs, **(module_kwargs or {}))


class _DistributedDataParallelMissing(Module):
    """``DistributedDataParallel`` without the kiln-distributed package: importing the name works, so that a
    script's imports do not fail, and constructing it raises ``ModuleNotFoundError`` saying what to install."""

    def __new__(cls, *args: Any, **kwargs: Any):
        raise ModuleNotFoundError(
            "DistributedDataParallel needs the kiln-distributed package, which is not installed: "
            "pip install kiln-distributed",
            name="kiln.distributed",
        )


_DistributedDataParallelMissing.__name__ = _DistributedDataParallelMissing.__qualname__ = "DistributedDataParallel"


def __getattr__(name: str) -> Any:
    # ``DistributedDataParallel`` IS kiln-distributed's class when that package is installed; it is imported
    # on first use, so that ``import kiln.nn`` never imports (nor needs) kiln.distributed.
    if name != "DistributedDataParallel":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from kiln.distributed.ddp import DistributedDataParallel as cls
    except ModuleNotFoundError as e:
        if e.name not in ("kiln.distributed", "kiln.distributed.ddp"):
            raise
        cls = _DistributedDataParallelMissing
    globals()[name] = cls
    return cls
