"""Converting convolution weights to a memory format (``torch.nn.utils.memory_format``).

kiln's memory formats are ``kiln.contiguous_format`` and ``kiln.preserve_format`` (strided tensors
without a channels-last layout), so the conversion re-lays the weights out in those."""

from __future__ import annotations

from kiln.autograd.grad_mode import no_grad

__all__ = ["convert_conv2d_weight_memory_format", "convert_conv3d_weight_memory_format"]


def _convert(module, memory_format, classes):
    if isinstance(module, classes):
        with no_grad():
            module.weight.data = module.weight.detach().clone(memory_format=memory_format)
    for child in module.children():
        _convert(child, memory_format, classes)
    return module


def convert_conv2d_weight_memory_format(module, memory_format):
    """Lay out the weight of every ``Conv2d``/``ConvTranspose2d`` in ``module`` (recursively) in
    ``memory_format``, in place; returns ``module``."""
    from kiln.nn.modules.conv import Conv2d, ConvTranspose2d

    return _convert(module, memory_format, (Conv2d, ConvTranspose2d))


def convert_conv3d_weight_memory_format(module, memory_format):
    """Lay out the weight of every ``Conv3d``/``ConvTranspose3d`` in ``module`` (recursively) in
    ``memory_format``, in place; returns ``module``."""
    from kiln.nn.modules.conv import Conv3d, ConvTranspose3d

    return _convert(module, memory_format, (Conv3d, ConvTranspose3d))
