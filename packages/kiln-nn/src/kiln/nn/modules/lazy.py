"""``LazyModuleMixin`` (``torch.nn.modules.lazy``): modules whose parameters get their shapes from the first
input."""

from __future__ import annotations

import itertools

from kiln.nn.parameter import is_lazy

__all__ = ["LazyModuleMixin"]


class LazyModuleMixin:
    """A mixin for modules whose parameters and buffers are :class:`~kiln.nn.UninitializedParameter` /
    :class:`~kiln.nn.UninitializedBuffer` until the first call (``torch.nn.modules.lazy.LazyModuleMixin``).

    Put it first among the bases and implement ``initialize_parameters(*args, **kwargs)``, which
    materialises them from the first call's arguments; the call then runs, and the module becomes
    ``cls_to_become`` when that is set. ``load_state_dict`` materialises them from the checkpoint instead.
    """

    cls_to_become = None

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._register_lazy_hooks()

    def _register_lazy_hooks(self) -> None:
        self._initialize_hook = self.register_forward_pre_hook(self._infer_parameters, with_kwargs=True)

    def has_uninitialized_params(self) -> bool:
        """True while a parameter or buffer of this module is still uninitialised."""
        return any(is_lazy(t) for t in itertools.chain(self._parameters.values(), self._buffers.values()))

    def initialize_parameters(self, *args, **kwargs) -> None:
        """Materialise the uninitialised parameters and buffers from the first call's arguments."""
        raise NotImplementedError(f"initialize_parameters is not implemented for {self.__class__.__name__}")

    def _infer_parameters(self, module, args, kwargs=None) -> None:
        module.initialize_parameters(*args, **(kwargs or {}))
        if module.has_uninitialized_params():
            raise RuntimeError(f"module {self._get_name()} has not been fully initialized")
        module._initialize_hook.remove()
        del module._initialize_hook
        if module.cls_to_become is not None:
            module.__class__ = module.cls_to_become

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        # uninitialised tensors go into the state dict as they are (a detached copy would lose their kind)
        for name, t in itertools.chain(self._parameters.items(), self._buffers.items()):
            if t is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = t if keep_vars or is_lazy(t) else t.detach()

    def _replicate_for_data_parallel(self):
        raise RuntimeError(
            "Modules with uninitialized parameters can't be used with `DataParallel`. Run a dummy forward pass to "
            "correctly initialize the modules"
        )
