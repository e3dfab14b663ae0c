"""``kiln.nn.utils``: gradient clipping, parameter/vector conversion, ``rnn`` sequence helpers,
``parametrize``/``parametrizations``, ``stateless.functional_call``, the hook-based ``weight_norm``/``spectral_norm``,
batch-norm ``fusion``, ``skip_init``, the conv weights' ``memory_format`` and ``prune``."""

from kiln.nn.utils import fusion, init, memory_format, parametrizations, parametrize, prune, rnn, stateless
from kiln.nn.utils.clip_grad import (
    clip_grad_norm,
    clip_grad_norm_,
    clip_grad_value_,
    clip_grads_with_norm_,
    get_total_norm,
)
from kiln.nn.utils.convert_parameters import parameters_to_vector, vector_to_parameters
from kiln.nn.utils.fusion import fuse_conv_bn_eval, fuse_conv_bn_weights, fuse_linear_bn_eval, fuse_linear_bn_weights
from kiln.nn.utils.init import skip_init
from kiln.nn.utils.memory_format import convert_conv2d_weight_memory_format, convert_conv3d_weight_memory_format
from kiln.nn.utils.spectral_norm import remove_spectral_norm, spectral_norm
from kiln.nn.utils.weight_norm import remove_weight_norm, weight_norm

__all__ = [
    "clip_grad_norm_",
    "clip_grad_norm",
    "clip_grad_value_",
    "clip_grads_with_norm_",
    "get_total_norm",
    "parameters_to_vector",
    "vector_to_parameters",
    "rnn",
    "stateless",
    "parametrize",
    "parametrizations",
    "weight_norm",
    "remove_weight_norm",
    "spectral_norm",
    "remove_spectral_norm",
    "fuse_conv_bn_eval",
    "fuse_conv_bn_weights",
    "fuse_linear_bn_eval",
    "fuse_linear_bn_weights",
    "skip_init",
    "convert_conv2d_weight_memory_format",
    "convert_conv3d_weight_memory_format",
    "fusion",
    "init",
    "memory_format",
    "prune",
]
