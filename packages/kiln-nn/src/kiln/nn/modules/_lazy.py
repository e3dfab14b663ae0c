"""What kiln's lazy layers (``LazyLinear``, ``LazyConv*``, the lazy norms) share beyond :class:`LazyModuleMixin`."""

from __future__ import annotations

from kiln.nn.modules.lazy import LazyModuleMixin

__all__ = ["_LazyModuleMixin"]


class _LazyModuleMixin(LazyModuleMixin):
    """The layer's ``reset_parameters`` waits for the parameters; ``_in_attr`` names the inferred size
    (``in_features``, ``in_channels``, ``num_features``), 0 until then. The layer's ``__init__`` calls
    ``Module.__init__`` itself, then :meth:`_register_lazy_hooks`; it may keep ``self._factory`` (device, dtype)
    for ``initialize_parameters``, dropped once the module is initialised."""

    _in_attr = ""

    def reset_parameters(self) -> None:
        """Initialise like the eager layer once the parameters are materialised (no-op before)."""
        if not self.has_uninitialized_params() and getattr(self, self._in_attr) != 0:
            super().reset_parameters()

    def _infer_parameters(self, module, args, kwargs=None) -> None:
        super()._infer_parameters(module, args, kwargs)
        module.__dict__.pop("_factory", None)
