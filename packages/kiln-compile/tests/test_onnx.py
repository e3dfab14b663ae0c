"""kiln.onnx.export: onnx.checker passes and onnxruntime computes what kiln does — MLP, digits-style CNN, LSTM,
Transformer encoder — with names, dynamic batch, opsets and the errors PyTorch users expect."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path

import numpy as np
import pytest

import kiln
import kiln.nn as nn

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
import kiln.onnx  # noqa: E402 - needs the onnx package

_spec = importlib.util.spec_from_file_location("_export_models", Path(__file__).with_name("test_export.py"))
_models_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_models_module)


def _flat(x) -> list:
    if isinstance(x, kiln.Tensor):
        return [x]
    return [t for item in x for t in _flat(item)]


def _run(model_bytes: bytes, arrays: list[np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: a for i, a in zip(sess.get_inputs(), arrays)})


@pytest.mark.parametrize("name", ["mlp", "cnn", "lstm", "transformer"])
def test_onnxruntime_matches_kiln(name):
    model, args = _models_module._models()[name]
    model.eval()
    buf = io.BytesIO()
    proto = kiln.onnx.export(model, args, buf)
    onnx.checker.check_model(proto)
    with kiln.no_grad():
        want = _flat(model(*args))
    got = _run(buf.getvalue(), [a.numpy() for a in args])
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_dynamic_batch(name, tmp_path):
    model, (x,) = _models_module._models()[name]
    model.eval()
    path = tmp_path / f"{name}.onnx"
    kiln.onnx.export(
        model, (x,), path, input_names=["x"], output_names=["logits"], dynamic_axes={"x": {0: "batch"}, "logits": [0]}
    )
    loaded = onnx.load(path)
    assert [i.name for i in loaded.graph.input] == ["x"] and [o.name for o in loaded.graph.output] == ["logits"]
    assert loaded.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    other = kiln.randn(5, *x.shape[1:])
    with kiln.no_grad():
        want = model(other).numpy()
    (got,) = _run(path.read_bytes(), [other.numpy()])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_opsets_and_gelu():
    model = nn.Sequential(nn.Linear(4, 4), nn.GELU(approximate="tanh"))
    x = kiln.randn(2, 4)
    with kiln.no_grad():
        want = model(x).numpy()
    for opset, has_gelu in ((17, False), (20, True)):
        proto = kiln.onnx.export(model, x, opset_version=opset)
        assert proto.opset_import[0].version == opset
        assert ("Gelu" in {n.op_type for n in proto.graph.node}) is has_gelu
        (got,) = _run(proto.SerializeToString(), [x.numpy()])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="opset_version must be between 17 and 21"):
        kiln.onnx.export(model, x, opset_version=9)


def test_unsupported_op_names_it():
    with pytest.raises(kiln.onnx.UnsupportedOperatorError, match="'kiln::cumsum' to ONNX opset version 18"):
        kiln.onnx.export(lambda x: x.cumsum(0), (kiln.ones(3),))


def test_export_params_false_makes_weights_inputs():
    model = nn.Linear(3, 2)
    proto = kiln.onnx.export(model, (kiln.ones(1, 3),), export_params=False)
    assert not proto.graph.initializer
    assert {i.name for i in proto.graph.input} == {"input0", "weight", "bias"}

    class Shifted(nn.Module):  # a constant the forward makes stays in the file (found by review)
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 2)

        def forward(self, x):
            return self.lin(x) + kiln.tensor([1.0, -1.0])

    model, x = Shifted(), kiln.randn(1, 3)
    proto = kiln.onnx.export(model, (x,), export_params=False)
    assert {i.name for i in proto.graph.input} == {"input0", "lin.weight", "lin.bias"}
    assert len(proto.graph.initializer) == 1
    with kiln.no_grad():
        want = model(x).numpy()
    (got,) = _run(
        proto.SerializeToString(), [x.numpy(), model.lin.weight.detach().numpy(), model.lin.bias.detach().numpy()]
    )
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_bad_arguments():
    model, x = nn.Linear(3, 2), kiln.ones(1, 3)
    with pytest.raises(ValueError, match="2 input_names for 1 tensor inputs"):
        kiln.onnx.export(model, (x,), input_names=["a", "b"])
    with pytest.raises(ValueError, match="dynamic_axes names no input or output"):
        kiln.onnx.export(model, (x,), dynamic_axes={"nope": [0]})
    with pytest.raises(TypeError, match="unexpected keyword argument 'training_mode'"):
        kiln.onnx.export(model, (x,), training_mode=None)
    with pytest.raises(TypeError, match="args must be a tensor or a tuple"):
        kiln.onnx.export(model, [x])


def test_is_in_onnx_export_and_no_half_written_file(tmp_path):
    seen = []

    class Probe(nn.Module):
        def forward(self, x):
            seen.append(kiln.onnx.is_in_onnx_export())
            return x.cumsum(0)  # no ONNX form: the export fails after tracing

    target = tmp_path / "m.onnx"
    target.write_bytes(b"old")
    with pytest.raises(kiln.onnx.UnsupportedOperatorError):
        kiln.onnx.export(Probe(), (kiln.ones(2),), target)
    assert seen == [True] and not kiln.onnx.is_in_onnx_export()
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
    with pytest.raises(FileNotFoundError):
        kiln.onnx.export(nn.Linear(2, 2), (kiln.ones(1, 2),), tmp_path / "missing" / "m.onnx")


def test_ops_without_a_handler_export_through_their_decomposition():
    model = nn.Sequential(nn.Linear(4, 6), nn.Softplus(), nn.Hardswish(), nn.Mish(), nn.LogSigmoid())
    x = kiln.randn(3, 4) * 3
    proto = kiln.onnx.export(model, (x,))
    assert {"Softplus", "HardSwish", "Mish"}.isdisjoint(n.op_type for n in proto.graph.node)
    with kiln.no_grad():
        want = model(x).numpy()
    (got,) = _run(proto.SerializeToString(), [x.numpy()])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_mixed_dtypes_are_cast_as_eager_promotes_them():
    """Found by review: a float times an int64 tensor exported a Mul of two types, which onnxruntime
    refused to load. Operands are cast to the op's result (or comparison) dtype first."""

    class Mixed(nn.Module):
        def forward(self, x, n):
            return x * n + (n > 1) + (x < n) * 2.0 + x.sum() / 3

    x, n = kiln.randn(2, 3), kiln.tensor([[1, 2, 3], [4, 5, 6]])
    proto = kiln.onnx.export(Mixed(), (x, n))
    onnx.checker.check_model(proto, full_check=True)
    (got,) = _run(proto.SerializeToString(), [x.numpy(), n.numpy()])
    np.testing.assert_allclose(got, Mixed()(x, n).numpy(), rtol=1e-6, atol=1e-6)
