"""The op surface of the core, as the op-surface issue lists it: every name is public and callable,
and ``kiln plugins --json`` lists every registered op with a reference kernel for ``cpu``.

Behaviour is tested per op elsewhere (test_math_ops.py, test_nn_conv.py, ...); this file guards the
inventory, so that a renamed or dropped function fails here by name."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys

import pytest

import kiln
import kiln._ops
import kiln.backend as kb
from kiln._dispatch import OPS

ELEMENTWISE = """add sub mul div true_divide floor_divide remainder fmod pow eq ne lt le gt ge logical_and
logical_or logical_xor logical_not abs neg sign exp exp2 expm1 log log2 log10 log1p sqrt rsqrt reciprocal
sin cos tan asin acos atan sinh cosh tanh asinh acosh atanh atan2 erf erfinv sigmoid logit floor ceil
round trunc frac clamp clip minimum maximum where lerp addcmul addcdiv isnan isinf isfinite nan_to_num
bitwise_and bitwise_or bitwise_xor bitwise_not"""
REDUCTIONS = """sum mean prod max min amax amin argmax argmin var std logsumexp norm all any cumsum cumprod
count_nonzero median unique"""
LINALG = "matmul mm bmm mv dot outer addmm baddbmm einsum tensordot"
LINALG_MODULE = "vector_norm matrix_norm inv det solve cholesky qr svd eigh"
SHAPE = """cat stack split chunk unbind flatten unflatten squeeze unsqueeze repeat_interleave tile
flip roll narrow select diagonal diag tril triu movedim gather scatter scatter_add scatter_reduce
index_select index_add index_copy index_put masked_fill masked_select masked_scatter nonzero take sort
argsort topk kthvalue searchsorted bincount histc meshgrid broadcast_to"""
TENSOR_METHODS = "expand expand_as repeat __getitem__ __setitem__ __matmul__"
NN = """conv1d conv2d conv3d conv_transpose1d conv_transpose2d max_pool1d max_pool2d avg_pool1d avg_pool2d
adaptive_avg_pool2d adaptive_max_pool2d softmax log_softmax batch_norm layer_norm group_norm embedding
dropout interpolate pad cross_entropy nll_loss binary_cross_entropy binary_cross_entropy_with_logits
scaled_dot_product_attention relu gelu silu elu leaky_relu softplus hardtanh mish unfold fold"""
# the core's op modules (kiln._ops.*), found on disk rather than listed: kiln.nn.functional re-exports their names
OP_MODULES = tuple(importlib.import_module(f"kiln._ops.{m.name}") for m in pkgutil.iter_modules(kiln._ops.__path__))


def _nn_function(name: str):
    """Where ``kiln.nn.functional`` gets it: the core's op modules, or ``kiln`` itself (relu)."""
    for module in OP_MODULES:
        if name in getattr(module, "__all__", ()):
            return getattr(module, name)
    return getattr(kiln, name)


CASES = (
    [(n, lambda n=n: getattr(kiln, n)) for n in " ".join((ELEMENTWISE, REDUCTIONS, LINALG, SHAPE)).split()]
    + [(f"linalg.{n}", lambda n=n: getattr(kiln.linalg, n)) for n in LINALG_MODULE.split()]
    + [(f"Tensor.{n}", lambda n=n: getattr(kiln.Tensor, n)) for n in TENSOR_METHODS.split()]
    + [(f"nn.functional.{n}", lambda n=n: _nn_function(n)) for n in NN.split()]
)


@pytest.mark.parametrize("name, get", CASES, ids=[c[0] for c in CASES])
def test_issue_name_is_public_and_documented(name, get):
    fn = get()
    assert callable(fn), name
    assert (fn.__doc__ or "").strip(), f"{name} has no docstring"


@pytest.mark.parametrize("op_name", sorted(kb.ops()))
def test_op_record_is_public_and_documented(op_name):
    """Every op, from its record: its function is documented and its Tensor methods exist."""
    opdef = kb.op(op_name)
    assert callable(opdef.public) and (opdef.public.__doc__ or "").strip(), f"{op_name} has no docstring"
    missing = [m for m in opdef.methods if not callable(getattr(kiln.Tensor, m, None))]
    assert not missing, f"{op_name}: Tensor has no method {missing}"


@pytest.fixture(scope="module")
def plugins_json():
    out = subprocess.run(
        [sys.executable, "-m", "kiln", "plugins", "--json"], capture_output=True, text=True, check=True, timeout=120
    )
    return json.loads(out.stdout)


def _core_ops() -> dict:
    """The core's ops (other tests register ops of their own in this process)."""
    return {name: opdef for name, opdef in OPS.items() if opdef.public.__module__.startswith("kiln._ops.")}


def test_plugins_json_lists_every_registered_op(plugins_json):
    assert set(plugins_json["ops"]) == set(_core_ops())


def test_reference_backend_serves_every_op_with_a_reference_kernel(plugins_json):
    (reference,) = [p for p in plugins_json["plugins"] if p["module"] == "kiln._reference"]
    served = set(reference["kernels"]["cpu"])
    expected = {name for name, opdef in _core_ops().items() if opdef.reference is not None}
    assert expected - served == set()
    # the nn primitives are there by their op names
    for op_name in ("convolution", "_softmax", "_log_softmax", "_native_batch_norm", "_max_pool", "_nll_loss", "gelu"):
        assert op_name in served
