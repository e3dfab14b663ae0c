"""``kiln.nn.utils``: gradient clipping, parameter/vector conversion, ``rnn`` sequence helpers,
``parametrize``/``parametrizations`` and the hook-based ``weight_norm``/``spectral_norm``."""

from kiln.nn.utils import parametrizations, parametrize, rnn
from kiln.nn.utils.clip_grad import clip_grad_norm, clip_grad_norm_, clip_grad_value_, get_total_norm
from kiln.nn.utils.convert_parameters import parameters_to_vector, vector_to_parameters
from kiln.nn.utils.spectral_norm import remove_spectral_norm, spectral_norm
from kiln.nn.utils.weight_norm import remove_weight_norm, weight_norm

__all__ = [
    "clip_grad_norm_",
    "clip_grad_norm",
    "clip_grad_value_",
    "get_total_norm",
    "parameters_to_vector",
    "vector_to_parameters",
    "rnn",
    "parametrize",
    "parametrizations",
    "weight_norm",
    "remove_weight_norm",
    "spectral_norm",
    "remove_spectral_norm",
]
