"""Pruning (``torch.nn.utils.prune``): zero parts of a parameter through a mask.

Pruning ``module.<name>`` moves the parameter to ``<name>_orig``, registers the 0/1 buffer ``<name>_mask``
and a forward pre-hook (the pruning method itself) that sets ``module.<name> = <name>_orig * <name>_mask``
before every call, so the gradient reaches ``<name>_orig`` through the mask. Pruning the same tensor again
combines the methods in a :class:`PruningContainer`, each new one acting on what the earlier ones kept;
:func:`remove` makes the pruning permanent.
"""

from __future__ import annotations

import numbers
from abc import ABC, abstractmethod
from collections.abc import Iterable

import kiln
from kiln import Tensor

__all__ = [
    "BasePruningMethod",
    "PruningContainer",
    "Identity",
    "RandomUnstructured",
    "L1Unstructured",
    "RandomStructured",
    "LnStructured",
    "CustomFromMask",
    "identity",
    "random_unstructured",
    "l1_unstructured",
    "random_structured",
    "ln_structured",
    "global_unstructured",
    "custom_from_mask",
    "remove",
    "is_pruned",
]


class BasePruningMethod(ABC):
    """The base of the pruning methods (``torch.nn.utils.prune.BasePruningMethod``): a subclass defines
    ``PRUNING_TYPE`` (``"unstructured"``, ``"structured"`` with a ``dim``, or ``"global"``) and
    :meth:`compute_mask`; an instance is the forward pre-hook that recomputes the pruned tensor."""

    _tensor_name: str | None = None

    def __call__(self, module, inputs) -> None:
        setattr(module, self._tensor_name, self.apply_mask(module))

    @abstractmethod
    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        """The new mask of ``t``, combining this method's pruning with ``default_mask`` (the mask so far)."""

    def apply_mask(self, module) -> Tensor:
        """``<name>_orig * <name>_mask`` of ``module``."""
        if self._tensor_name is None:
            raise AssertionError(f"Module {module} has to be pruned")
        orig = getattr(module, self._tensor_name + "_orig")
        mask = getattr(module, self._tensor_name + "_mask")
        return mask.to(dtype=orig.dtype) * orig

    @classmethod
    def apply(cls, module, name: str, *args, importance_scores=None, **kwargs):
        """Prune ``module.<name>`` with ``cls(*args, **kwargs)`` (combined with an earlier pruning of it),
        ranking entries by ``importance_scores`` when given (else by the parameter); returns the method."""
        method = _combined(cls, module, name, *args, **kwargs)
        orig = getattr(module, name)
        if importance_scores is not None and tuple(importance_scores.shape) != tuple(orig.shape):
            raise AssertionError(f"importance_scores should have the same shape as parameter {name} of {module}")
        fresh = not isinstance(method, PruningContainer)
        if fresh:
            module.register_parameter(name + "_orig", orig)
            del module._parameters[name]
            default_mask = kiln.ones_like(orig)
        else:
            default_mask = getattr(module, name + "_mask").detach().clone()
        try:
            scores = importance_scores if importance_scores is not None else orig
            mask = method.compute_mask(scores, default_mask=default_mask)
            module.register_buffer(name + "_mask", mask)
            setattr(module, name, method.apply_mask(module))
            module.register_forward_pre_hook(method)
        except Exception:
            if fresh:
                orig = getattr(module, name + "_orig")
                module.register_parameter(name, orig)
                del module._parameters[name + "_orig"]
            raise
        return method

    def prune(self, t: Tensor, default_mask: Tensor | None = None, importance_scores: Tensor | None = None) -> Tensor:
        """``t`` pruned by this method (a new tensor; nothing is registered anywhere)."""
        if importance_scores is not None and tuple(importance_scores.shape) != tuple(t.shape):
            raise AssertionError("importance_scores should have the same shape as tensor t")
        scores = importance_scores if importance_scores is not None else t
        default_mask = default_mask if default_mask is not None else kiln.ones_like(t)
        return t * self.compute_mask(scores, default_mask=default_mask)

    def remove(self, module) -> None:
        """Make the pruning permanent: ``module.<name>`` becomes a plain parameter holding the pruned values."""
        if self._tensor_name is None:
            raise AssertionError(f"Module {module} has to be pruned before pruning can be removed")
        weight = self.apply_mask(module)
        if hasattr(module, self._tensor_name):
            delattr(module, self._tensor_name)
        orig = module._parameters[self._tensor_name + "_orig"]
        orig.data = weight.data
        del module._parameters[self._tensor_name + "_orig"]
        del module._buffers[self._tensor_name + "_mask"]
        setattr(module, self._tensor_name, orig)


def _combined(cls, module, name: str, *args, **kwargs) -> BasePruningMethod:
    """A new ``cls`` method for ``module.<name>``, in a container with the method that already prunes it."""
    old, keys = None, []
    for key, hook in module._forward_pre_hooks.items():
        if isinstance(hook, BasePruningMethod) and hook._tensor_name == name:
            old = hook
            keys.append(key)
    if len(keys) > 1:
        raise AssertionError(
            f"Avoid adding multiple pruning hooks to the same tensor {name} of module {module}. Use a PruningContainer."
        )
    for key in keys:
        del module._forward_pre_hooks[key]
    method = cls(*args, **kwargs)
    method._tensor_name = name
    if old is None:
        return method
    if isinstance(old, PruningContainer):
        old.add_pruning_method(method)
        return old
    container = PruningContainer(old)
    container.add_pruning_method(method)
    return container


class PruningContainer(BasePruningMethod):
    """Pruning methods applied one after the other to one tensor (``torch.nn.utils.prune.PruningContainer``):
    each later method prunes what the earlier ones kept (the entries, or for a structured method the
    channels, its mask still has)."""

    def __init__(self, *args) -> None:
        self._pruning_methods: tuple = ()
        if not isinstance(args, Iterable):  # pragma: no cover - *args is always a tuple
            args = (args,)
        if len(args) == 1 and not isinstance(args[0], Iterable):
            self._tensor_name = args[0]._tensor_name
            self.add_pruning_method(args[0])
        elif len(args) == 1 and isinstance(args[0], Iterable):
            for method in args[0]:
                self.add_pruning_method(method)
        else:
            for method in args:
                self.add_pruning_method(method)

    def add_pruning_method(self, method) -> None:
        """Append ``method`` (it must act on the same tensor)."""
        if not isinstance(method, BasePruningMethod) and method is not None:
            raise TypeError(f"{type(method)} is not a BasePruningMethod subclass")
        if method is not None and self._tensor_name != method._tensor_name:
            raise ValueError(
                "Can only add pruning methods acting on the parameter named "
                f"'{self._tensor_name}' to PruningContainer {self}. Found '{method._tensor_name}'"
            )
        self._pruning_methods += (method,)

    def __len__(self) -> int:
        return len(self._pruning_methods)

    def __iter__(self):
        return iter(self._pruning_methods)

    def __getitem__(self, idx):
        return self._pruning_methods[idx]

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        """The last method's mask, computed on the part of ``t`` that ``default_mask`` keeps."""
        method = self._pruning_methods[-1]
        new_mask = default_mask.to(dtype=t.dtype)
        kind = method.PRUNING_TYPE
        if kind == "unstructured":
            keep = default_mask == 1
            new_mask[keep] = method.compute_mask(t[keep], default_mask=default_mask[keep]).to(dtype=new_mask.dtype)
            return new_mask
        if kind == "structured":
            if not hasattr(method, "dim"):
                raise AttributeError(
                    'Pruning methods of PRUNING_TYPE "structured" need to have the attribute `dim` defined.'
                )
            dims = t.dim()
            dim = method.dim + dims if method.dim < 0 else method.dim
            if dim < 0:
                raise IndexError(f"Index is out of bounds for tensor with dimensions {dims}")
            kept = default_mask.sum(dim=[d for d in range(dims) if d != dim]) != 0
            index = kept.nonzero().reshape(-1)
            partial = method.compute_mask(
                t.index_select(dim, index), default_mask=default_mask.index_select(dim, index)
            )
            return new_mask.index_copy(dim, index, partial.to(dtype=new_mask.dtype))
        if kind == "global":
            return method.compute_mask(t, default_mask=default_mask).to(dtype=new_mask.dtype)
        raise ValueError(f"Unrecognized PRUNING_TYPE {kind}")


class Identity(BasePruningMethod):
    """Prunes nothing: the mask stays all ones (``torch.nn.utils.prune.Identity``)."""

    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        """``default_mask``."""
        return default_mask

    @classmethod
    def apply(cls, module, name):
        """Register an identity pruning of ``module.<name>``."""
        return super().apply(module, name)


def _check_amount(amount) -> None:
    if not isinstance(amount, numbers.Real):
        raise TypeError(f"Invalid type for amount: {amount}. Must be int or float.")
    if (isinstance(amount, numbers.Integral) and amount < 0) or (
        not isinstance(amount, numbers.Integral) and (float(amount) > 1.0 or float(amount) < 0.0)
    ):
        raise ValueError(f"amount={amount} should either be a float in the range [0, 1] or a non-negative integer")


def _count(amount, size: int) -> int:
    """How many of ``size`` to prune: ``amount`` itself (an int, at most ``size``) or a rounded fraction."""
    if isinstance(amount, numbers.Integral):
        if amount > size:
            raise ValueError(f"amount={amount} should be smaller than the number of parameters to prune={size}")
        return int(amount)
    return round(amount * size)


def _check_structured(t: Tensor) -> None:
    if t.dim() <= 1:
        raise ValueError(
            "Structured pruning can only be applied to multidimensional tensors. Found tensor of shape "
            f"{t.shape} with {t.dim()} dims"
        )


def _zero_flat(mask: Tensor, index: Tensor) -> Tensor:
    flat = mask.reshape(-1).clone()
    flat[index] = 0
    return flat.reshape(mask.shape)


class RandomUnstructured(BasePruningMethod):
    """Prune ``amount`` (a count, or a fraction) entries chosen at random (``torch.nn.utils.prune.RandomUnstructured``)."""

    PRUNING_TYPE = "unstructured"

    def __init__(self, amount) -> None:
        _check_amount(amount)
        self.amount = amount

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        """``default_mask`` with ``amount`` random entries zeroed."""
        k = _count(self.amount, t.numel())
        if k == 0:
            return default_mask.clone()
        order = kiln.topk(kiln.rand_like(t).reshape(-1), k).indices
        return _zero_flat(default_mask, order)

    @classmethod
    def apply(cls, module, name, amount):
        """Prune ``module.<name>`` at random."""
        return super().apply(module, name, amount=amount)


class L1Unstructured(BasePruningMethod):
    """Prune the ``amount`` entries of smallest absolute value (``torch.nn.utils.prune.L1Unstructured``)."""

    PRUNING_TYPE = "unstructured"

    def __init__(self, amount) -> None:
        _check_amount(amount)
        self.amount = amount

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        """``default_mask`` with the ``amount`` smallest ``|t|`` entries zeroed."""
        k = _count(self.amount, t.numel())
        if k == 0:
            return default_mask.clone()
        order = kiln.topk(t.abs().reshape(-1), k, largest=False).indices
        return _zero_flat(default_mask, order)

    @classmethod
    def apply(cls, module, name, amount, importance_scores=None):
        """Prune ``module.<name>`` by magnitude (of ``importance_scores`` when given)."""
        return super().apply(module, name, amount=amount, importance_scores=importance_scores)


def _channel_mask(t: Tensor, dim: int, channels: Tensor) -> Tensor:
    """A 0/1 tensor like ``t`` with ones in the ``channels`` (indices along ``dim``)."""
    shape = [1] * t.dim()
    shape[dim] = t.shape[dim]
    keep = kiln.zeros(t.shape[dim], dtype=t.dtype, device=t.device)
    keep[channels] = 1
    return keep.reshape(shape).expand(t.shape).clone()


class RandomStructured(BasePruningMethod):
    """Prune ``amount`` channels along ``dim`` chosen at random (``torch.nn.utils.prune.RandomStructured``)."""

    PRUNING_TYPE = "structured"

    def __init__(self, amount, dim: int = -1) -> None:
        _check_amount(amount)
        self.amount = amount
        self.dim = dim

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        """``default_mask`` times a mask keeping all but ``amount`` random channels."""
        _check_structured(t)
        size = t.shape[self.dim]
        k = _count(self.amount, size)
        if k == 0:
            return default_mask
        draws = kiln.rand(size, device=t.device)
        threshold = kiln.kthvalue(draws, k).values
        channels = (draws > threshold).nonzero().reshape(-1)
        return _channel_mask(t, self.dim % t.dim(), channels) * default_mask.to(dtype=t.dtype)

    @classmethod
    def apply(cls, module, name, amount, dim=-1):
        """Prune channels of ``module.<name>`` at random."""
        return super().apply(module, name, amount=amount, dim=dim)


class LnStructured(BasePruningMethod):
    """Prune the ``amount`` channels along ``dim`` of smallest ``L_n`` norm (``torch.nn.utils.prune.LnStructured``);
    ``n`` is any order :func:`kiln.linalg.vector_norm` takes (``inf``, ``-inf``, ``"fro"``, ``"nuc"`` as
    :func:`kiln.norm`)."""

    PRUNING_TYPE = "structured"

    def __init__(self, amount, n, dim: int = -1) -> None:
        _check_amount(amount)
        self.amount = amount
        self.n = n
        self.dim = dim

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        """``default_mask`` times a mask keeping the channels of largest norm."""
        _check_structured(t)
        size = t.shape[self.dim]
        k = _count(self.amount, size)
        if k == 0:
            return default_mask
        dim = self.dim % t.dim()
        norms = kiln.norm(t, p=self.n, dim=[d for d in range(t.dim()) if d != dim])
        channels = kiln.topk(norms, size - k, largest=True).indices
        return _channel_mask(t, dim, channels) * default_mask.to(dtype=t.dtype)

    @classmethod
    def apply(cls, module, name, amount, n, dim, importance_scores=None):
        """Prune channels of ``module.<name>`` by norm (of ``importance_scores`` when given)."""
        return super().apply(module, name, amount=amount, n=n, dim=dim, importance_scores=importance_scores)


class CustomFromMask(BasePruningMethod):
    """Prune with a given 0/1 ``mask`` (``torch.nn.utils.prune.CustomFromMask``)."""

    PRUNING_TYPE = "global"

    def __init__(self, mask: Tensor) -> None:
        self.mask = mask

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        """``default_mask * mask``."""
        if tuple(default_mask.shape) != tuple(self.mask.shape):
            raise AssertionError
        return default_mask * self.mask.to(dtype=default_mask.dtype)

    @classmethod
    def apply(cls, module, name, mask):
        """Prune ``module.<name>`` with ``mask``."""
        return super().apply(module, name, mask=mask)


def identity(module, name: str):
    """Register a pruning of ``module.<name>`` that prunes nothing (``<name>_orig``, an all-ones mask)."""
    Identity.apply(module, name)
    return module


def random_unstructured(module, name: str, amount):
    """Prune ``amount`` random entries of ``module.<name>``; returns ``module``."""
    RandomUnstructured.apply(module, name, amount)
    return module


def l1_unstructured(module, name: str, amount, importance_scores=None):
    """Prune the ``amount`` entries of ``module.<name>`` smallest in absolute value; returns ``module``."""
    L1Unstructured.apply(module, name, amount=amount, importance_scores=importance_scores)
    return module


def random_structured(module, name: str, amount, dim: int):
    """Prune ``amount`` random channels of ``module.<name>`` along ``dim``; returns ``module``."""
    RandomStructured.apply(module, name, amount, dim)
    return module


def ln_structured(module, name: str, amount, n, dim: int, importance_scores=None):
    """Prune the ``amount`` channels of ``module.<name>`` along ``dim`` of smallest ``L_n`` norm; returns
    ``module``."""
    LnStructured.apply(module, name, amount, n, dim, importance_scores=importance_scores)
    return module


def global_unstructured(parameters, pruning_method, importance_scores=None, **kwargs) -> None:
    """Prune the ``(module, name)`` pairs of ``parameters`` together, as one vector, with the unstructured
    ``pruning_method`` class (built with ``kwargs``): e.g. the globally smallest entries."""
    from kiln.nn.utils.convert_parameters import parameters_to_vector

    if not isinstance(parameters, Iterable):
        raise TypeError("global_unstructured(): parameters is not an Iterable")
    parameters = list(parameters)
    importance_scores = importance_scores if importance_scores is not None else {}
    if not isinstance(importance_scores, dict):
        raise TypeError("global_unstructured(): importance_scores must be of type dict")
    scores = parameters_to_vector([importance_scores.get((m, n), getattr(m, n)) for m, n in parameters])
    default_mask = parameters_to_vector([getattr(m, n + "_mask", kiln.ones_like(getattr(m, n))) for m, n in parameters])
    container = PruningContainer()
    container._tensor_name = "temp"
    method = pruning_method(**kwargs)
    method._tensor_name = "temp"
    if method.PRUNING_TYPE != "unstructured":
        raise TypeError(
            'Only "unstructured" PRUNING_TYPE supported for the `pruning_method`. Found method '
            f"{pruning_method} of type {method.PRUNING_TYPE}"
        )
    container.add_pruning_method(method)
    final = container.compute_mask(scores, default_mask)
    offset = 0
    for module, name in parameters:
        param = getattr(module, name)
        count = param.numel()
        custom_from_mask(module, name, mask=final[offset : offset + count].reshape(param.shape))
        offset += count


def custom_from_mask(module, name: str, mask: Tensor):
    """Prune ``module.<name>`` with the 0/1 ``mask``; returns ``module``."""
    CustomFromMask.apply(module, name, mask)
    return module


def remove(module, name: str):
    """Make the pruning of ``module.<name>`` permanent (drops ``<name>_orig``, ``<name>_mask`` and the hook);
    returns ``module``."""
    for key, hook in module._forward_pre_hooks.items():
        if isinstance(hook, BasePruningMethod) and hook._tensor_name == name:
            hook.remove(module)
            del module._forward_pre_hooks[key]
            return module
    raise ValueError(f"Parameter '{name}' of module {module} has to be pruned before pruning can be removed")


def is_pruned(module) -> bool:
    """Whether ``module`` or a submodule carries a pruning hook."""
    for _, submodule in module.named_modules():
        for hook in submodule._forward_pre_hooks.values():
            if isinstance(hook, BasePruningMethod):
                return True
    return False
