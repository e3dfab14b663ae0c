"""kiln.export: programs that reproduce the model, save as safetensors + JSON, load with the core alone, and refuse
what they cannot hold; malformed files are rejected with ValueError before anything runs."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap

import pytest

import kiln
import kiln.export
import kiln.nn as nn


def _models():
    kiln.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 3))
    cnn = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Dropout(0.3), nn.Linear(4 * 4 * 4, 10),
    )  # fmt: skip
    lstm = nn.LSTM(5, 7, num_layers=2, batch_first=True)
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, batch_first=True), 2)
    return {
        "mlp": (mlp, (kiln.randn(4, 8),)),
        "cnn": (cnn, (kiln.randn(2, 1, 8, 8),)),
        "lstm": (lstm, (kiln.randn(3, 6, 5),)),
        "transformer": (encoder, (kiln.randn(2, 5, 8),)),
    }


def _close(a, b):
    if isinstance(a, kiln.Tensor):
        return kiln.allclose(a, b, atol=1e-5)
    return type(a) is type(b) and len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("name", ["mlp", "cnn", "lstm", "transformer"])
def test_export_save_load_reproduces_the_model(name, tmp_path):
    model, args = _models()[name]
    model.eval()
    ep = kiln.export.export(model, args)
    with kiln.no_grad():
        want = model(*args)
    assert _close(ep(*args), want)
    path = tmp_path / f"{name}.safetensors"
    kiln.export.save(ep, path)
    loaded = kiln.jit.load(path)
    assert _close(loaded(*args), want)
    fresh = tuple(kiln.randn(*a.shape) for a in args)  # new values, same shapes: the program is not a replay
    with kiln.no_grad():
        assert _close(loaded(*fresh), model(*fresh))
    params = dict(model.named_parameters())
    assert set(params) <= set(loaded.state_dict)


def test_program_loads_and_runs_with_the_core_alone(tmp_path):
    model, args = _models()["cnn"]
    model.eval()
    path = tmp_path / "cnn.safetensors"
    kiln.jit.save(kiln.jit.trace(model, args), path)
    kiln.save(args[0], tmp_path / "x.safetensors")
    with kiln.no_grad():
        kiln.save(model(*args), tmp_path / "y.safetensors")
    script = textwrap.dedent(
        f"""
        import sys
        for name in ("kiln.nn", "kiln.compile", "kiln.export", "kiln_compile", "numba"):
            sys.modules[name] = None  # not importable: the program needs none of them
        import kiln
        program = kiln.jit.load({str(path)!r})
        x = kiln.load({str(tmp_path / "x.safetensors")!r})
        y = kiln.load({str(tmp_path / "y.safetensors")!r})
        assert kiln.allclose(program(x), y, atol=1e-5)
        print("ok")
        """
    )
    env = {"KILN_DISABLE_PLUGINS": "cpu,cuda,compile"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert proc.stdout.strip() == "ok", proc.stderr


def test_what_cannot_be_exported_is_refused_with_the_reason():
    model, args = _models()["cnn"]
    model.train()
    with pytest.raises(RuntimeError, match="random draw"):
        kiln.export.export(model, args)

    def branchy(x):
        return x * 2 if x.sum() > 0 else x

    with pytest.raises(kiln.compile.GraphBreakError, match=r"test_export\.py"):
        kiln.export.export(branchy, (kiln.ones(2),))
    with pytest.raises(RuntimeError, match=r"returns a Python value \(str\)"):
        kiln.export.export(lambda x: "no", (kiln.ones(2),))
    with pytest.raises(TypeError, match="Expecting `args` to be a tuple"):
        kiln.export.export(lambda x: x, [kiln.ones(2)])
    with pytest.raises(NotImplementedError, match="dynamic_shapes"):
        kiln.export.export(lambda x: x, (kiln.ones(2),), dynamic_shapes={"x": {0: "batch"}})
    with pytest.raises(NotImplementedError, match="no TorchScript"):
        kiln.jit.script(model)


def test_wrong_inputs_are_refused_at_the_call():
    ep = kiln.export.export(lambda x, y: x @ y, (kiln.ones(2, 3), kiln.ones(3, 4)))
    with pytest.raises(TypeError, match="takes 2 tensors, got 1"):
        ep(kiln.ones(2, 3))
    with pytest.raises(RuntimeError, match=r"input 1: expected kiln.float32 of shape \[3, 4\], got kiln.float64"):
        ep(kiln.ones(2, 3), kiln.ones(3, 4, dtype=kiln.float64))
    with pytest.raises(RuntimeError, match=r"shape \[2, 3\], got kiln.float32 of shape \[5, 3\]"):
        ep(kiln.ones(5, 3), kiln.ones(3, 4))


def test_output_structure_and_constants():
    k = kiln.tensor([1.0, 2.0])

    def f(x):
        return {"sum": (x + k).sum(), "pair": [x * 2, None]}

    ep = kiln.export.export(f, (kiln.ones(2),))
    out = ep(kiln.ones(2))
    assert set(out) == {"sum", "pair"} and out["pair"][1] is None
    assert out["sum"].item() == 5.0 and out["pair"][0].tolist() == [2.0, 2.0]
    assert any(name.startswith("_constant") for name in ep.state_dict)


# ------------------------------------------------------------------------------------- malformed files


def _saved(graph: dict, weights: dict) -> io.BytesIO:
    buf = io.BytesIO()
    kiln.save({"program": json.dumps(graph), "weights": weights}, buf, format="safetensors")
    buf.seek(0)
    return buf


def _good():
    ep = kiln.export.export(nn.Linear(3, 2), (kiln.ones(1, 3),))
    return json.loads(json.dumps(ep.graph)), dict(ep.state_dict)


def _nested(depth: int) -> list:
    out: list = [1]
    for _ in range(depth):
        out = [out]
    return out


def _mutations():
    def set_(path, value):
        def apply(g, w):
            target = g
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value

        return apply

    return {
        "format": set_(["format"], "something"),
        "version": set_(["version"], 99),
        "unknown op": set_(["nodes", 0, "op"], "os.system"),
        "value before made": set_(["nodes", 0, "args", 0], {"v": 999}),
        "negative index": set_(["nodes", 0, "outputs"], [-1]),
        "bad dtype": set_(["inputs", 0, "dtype"], "float128"),
        "bad shape": set_(["inputs", 0, "shape"], [-3]),
        "unknown tag": set_(["nodes", 0, "args", 0], {"eval": "1+1"}),
        "bad float": set_(["nodes", 0, "args", 0], {"float": "1e400"}),
        "bad slice": set_(["nodes", 0, "args", 0], {"slice": ["__import__", 1, 2]}),
        "bad device": set_(["nodes", 0, "args", 0], {"device": "nowhere:x"}),
        "bad memory format": set_(["nodes", 0, "args", 0], {"memory_format": "__class__"}),
        "missing weight": lambda g, w: w.clear(),
        "output never made": set_(["outputs"], [12345]),
        "out_spec out of range": set_(["out_spec"], 7),
        "out_spec form": set_(["out_spec"], ["set", []]),
        "out_spec items": set_(["out_spec"], ["tuple", 5]),
        "wrong output count": set_(["nodes", 0, "outputs"], [50, 51]),
        "nodes not a list": set_(["nodes"], {"a": 1}),
        "deep nesting": set_(["nodes", 0, "args", 0], _nested(25)),
    }


@pytest.mark.parametrize("what", sorted(_mutations()))
def test_malformed_program_is_refused(what):
    graph, weights = _good()
    _mutations()[what](graph, weights)
    with pytest.raises(ValueError, match="invalid exported program"):
        kiln.jit.load(_saved(graph, weights))


def test_files_that_are_not_programs_are_refused(tmp_path):
    path = tmp_path / "weights.safetensors"
    kiln.save({"w": kiln.ones(2)}, path)
    with pytest.raises(ValueError, match="not a kiln exported program"):
        kiln.jit.load(path)
    buf = io.BytesIO()
    kiln.save({"program": "{not json", "weights": {}}, buf)
    buf.seek(0)
    with pytest.raises(ValueError, match="not valid JSON"):
        kiln.jit.load(buf)
    good = io.BytesIO()
    kiln.export.save(kiln.export.export(nn.Linear(3, 2), (kiln.ones(1, 3),)), good)
    (tmp_path / "cut.safetensors").write_bytes(good.getvalue()[:-7])  # truncated
    with pytest.raises(ValueError):
        kiln.jit.load(tmp_path / "cut.safetensors")


def test_the_module_is_callable():
    model = nn.Linear(3, 2)
    program = kiln.export(model, (kiln.ones(1, 3),))
    assert isinstance(program, kiln.export.ExportedProgram)
    assert kiln.allclose(program(kiln.ones(1, 3)), model(kiln.ones(1, 3)).detach())


def test_strided_and_offset_inputs_give_the_eager_result():
    ep = kiln.export(lambda x: x.detach() * 2, (kiln.ones(3, 4),))
    y = kiln.randn(4, 3)
    big = kiln.randn(13)
    assert kiln.allclose(ep(y.t()), y.t() * 2)
    assert kiln.allclose(ep(big[1:].reshape(3, 4)), big[1:].reshape(3, 4) * 2)
    ep2 = kiln.export(lambda x: x.detach() + 1, (kiln.randn(4, 3).t(),))  # traced on a strided example
    assert kiln.allclose(ep2(y.t()), y.t() + 1)
