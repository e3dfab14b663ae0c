"""What the lazy layers (``LazyLinear``, ``LazyConv*``) share: parameters materialised by the first call."""

from __future__ import annotations

from kiln.nn.parameter import UninitializedParameter

__all__ = ["_LazyModuleMixin"]


class _LazyModuleMixin:
    """Parameters stay :class:`~kiln.nn.UninitializedParameter` until the first call (or a ``load_state_dict``);
    that call runs ``initialize_parameters(input)``, then the module becomes ``cls_to_become``.

    ``_in_attr`` names the inferred size (``in_features``, ``in_channels``), 0 until then. The subclass
    registers ``_infer_parameters`` as ``self._lazy_hook`` and keeps ``self._factory`` (device, dtype).
    """

    cls_to_become = None
    _in_attr = ""

    def reset_parameters(self) -> None:
        """Initialise like the eager layer once the parameters are materialised (no-op before)."""
        if not self.has_uninitialized_params() and getattr(self, self._in_attr) != 0:
            super().reset_parameters()

    def has_uninitialized_params(self) -> bool:
        """True until the parameters are materialised."""
        return any(isinstance(p, UninitializedParameter) for p in self._parameters.values())

    @staticmethod
    def _infer_parameters(module, args: tuple) -> None:
        module.initialize_parameters(*args)
        if module.has_uninitialized_params():
            raise RuntimeError(f"module {module._get_name()} has not been fully initialized")
        module._lazy_hook.remove()
        del module._lazy_hook
        del module._factory
        module.__class__ = module.cls_to_become
