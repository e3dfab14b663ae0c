"""SummaryWriter.add_graph: the ops a model calls, recorded at kiln's dispatcher, as a TensorBoard graph.

PyTorch traces with torch.jit; kiln records the same forward call at its dispatcher. The oracle is the
structure of PyTorch's graph for the same model: the same module scopes (``Net/Sequential[seq]/
Linear[0]``), and for models made of ops both name alike, the same ops in the same scopes.
"""

from __future__ import annotations

import warnings

import kiln_testutil as U
import numpy as np
import pytest
import torch

pytest.importorskip("tensorboard", reason="kiln.utils.tensorboard needs tensorboard (the core's 'tensorboard' extra)")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter as TorchWriter

import kiln
from kiln.utils.tensorboard import SummaryWriter


def _graph(logdir, model, inputs, writer=SummaryWriter, **kwargs):
    """The GraphDef TensorBoard reads back after ``add_graph``, as {name: node}, and the accumulator."""
    with writer(str(logdir)) as w:
        w.add_graph(model, inputs, **kwargs)
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {n.name: n for n in acc.Graph().node}, acc


def _shapes(node) -> list[list[int]]:
    return [[d.size for d in s.dim] for s in node.attr["_output_shapes"].list.shape]


def _ops(nodes, prefix: str) -> list[tuple[str, str]]:
    """(scope, op name) of every op node whose op starts with ``prefix`` (``kiln::``, ``aten::``)."""
    return sorted(
        (name.rsplit("/", 1)[0], node.op.split("::", 1)[1])
        for name, node in nodes.items()
        if node.op.startswith(prefix)
    )


def test_graph_of_a_function(tmp_path):
    def f(x, w):
        h = kiln.mv(x, w).unsqueeze(1).expand(5, 3).relu()  # mv: a composite, one node
        values, indices = h.max(dim=1)
        return values + indices, h.sum()

    x, w = kiln.randn(5, 4), kiln.randn(4)
    nodes, acc = _graph(tmp_path, f, (x, w))
    assert nodes["input/x"].op == nodes["input/w"].op == "IO Node"
    assert _shapes(nodes["input/x"]) == [[5, 4]]
    assert list(nodes["mv"].input) == ["input/x", "input/w"]
    assert nodes["mv"].op == "kiln::mv" and _shapes(nodes["mv"]) == [[5]]
    assert [n.op for n in nodes.values()].count("kiln::matmul") == 0  # mv's own ops are not recorded
    assert list(nodes["relu"].input) == ["expand"] and _shapes(nodes["relu"]) == [[5, 3]]
    (max_node,) = [n for n in nodes.values() if n.op.startswith("kiln::") and "max" in n.op]
    assert _shapes(max_node) == [[5], [5]]  # values and indices
    assert b"dim: 1" in max_node.attr["attr"].s
    assert list(nodes["add"].input) == [max_node.name, max_node.name + ":1"]  # the second output
    assert list(nodes["output/output.1"].input) == ["add"]
    assert list(nodes["output/output.2"].input) == ["sum"] and _shapes(nodes["output/output.2"]) == [[]]
    assert "step1" in acc.Tags()["run_metadata"]
    assert acc.RunMetadata("step1").step_stats.dev_stats[0].device == "/device:CPU:0"


def test_graph_inputs_outputs_and_constants(tmp_path):
    table = kiln.arange(4.0)

    def f(x):
        return x, x * table

    nodes, _ = _graph(tmp_path, f, kiln.ones(4))
    assert list(nodes["output/output.1"].input) == ["input/x"]  # returned unchanged
    (constant,) = [n for n in nodes.values() if n.op == "Constant"]
    assert _shapes(constant) == [[4]]
    assert sorted(nodes["mul"].input) == sorted(["input/x", constant.name])


def test_detach_and_data_are_edges(tmp_path):
    nodes, _ = _graph(tmp_path, lambda x: x.detach() * x.data.t(), kiln.ones(2, 2))
    detaches = [n for n in nodes.values() if n.op == "kiln::detach"]
    assert len(detaches) == 2 and all(list(n.input) == ["input/x"] for n in detaches)
    assert not [n for n in nodes.values() if n.op == "Constant"]


def test_graph_of_no_input_and_of_non_tensor_arguments(tmp_path):
    nodes, _ = _graph(tmp_path / "a", lambda: kiln.ones(2).exp() * 3, None)
    assert list(nodes["mul"].input) == ["exp"] and list(nodes["output/output.1"].input) == ["mul"]
    assert not [n for n in nodes if n.startswith("input/")]
    nodes, _ = _graph(tmp_path / "b", lambda x, k: x.sum(dim=k), (kiln.ones(2, 3), 1))
    assert "input/k" not in nodes and b"dim: 1" in nodes["sum"].attr["attr"].s


def test_list_outputs_warn_under_strict_trace(tmp_path):
    f = lambda x: [x * 2, {"y": x + 1}]
    with pytest.warns(UserWarning, match="use_strict_trace=False"):
        nodes, _ = _graph(tmp_path / "strict", f, kiln.ones(2))
    assert len([n for n in nodes if n.startswith("output/")]) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _graph(tmp_path / "lenient", f, kiln.ones(2), use_strict_trace=False)


def test_verbose_prints_the_nodes(tmp_path, capsys):
    _graph(tmp_path, lambda x: x.exp(), kiln.ones(2), verbose=True)
    out = capsys.readouterr().out
    assert "exp = kiln::exp(input/x)" in out and "output/output.1 = IO Node(exp)" in out


def test_graph_of_something_not_callable(tmp_path):
    with SummaryWriter(str(tmp_path)) as w, pytest.raises(TypeError, match="callable"):
        w.add_graph(42, kiln.ones(2))


try:
    import kiln.nn as nn
except ImportError:  # kiln-nn is not installed: the module graphs below are skipped
    nn = None
needs_nn = pytest.mark.skipif(nn is None, reason="the module graphs need kiln-nn")


def _net(lib):
    """The same network in kiln or in torch."""

    class Net(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = lib.nn.Linear(4, 3)
            self.act = lib.nn.ReLU()
            self.seq = lib.nn.Sequential(lib.nn.Linear(3, 2), lib.nn.Tanh())

        def forward(self, x):
            return self.seq(self.act(self.fc1(x))) * 2

    return Net()


def _nets():
    return _net(kiln), _net(torch)


@needs_nn
def test_module_graph_has_torchs_scopes_and_ops(tmp_path):
    knet, tnet = _nets()
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    knodes, _ = _graph(tmp_path / "k", knet, kiln.from_numpy(x))
    tnodes, _ = _graph(tmp_path / "t", tnet, torch.from_numpy(x), writer=TorchWriter)
    assert _ops(knodes, "kiln::") == _ops(tnodes, "aten::")
    assert _ops(knodes, "kiln::") == [
        ("Net", "mul"),
        ("Net/Linear[fc1]", "linear"),
        ("Net/ReLU[act]", "relu"),
        ("Net/Sequential[seq]/Linear[0]", "linear"),
        ("Net/Sequential[seq]/Tanh[1]", "tanh"),
    ]
    fc1 = knodes["Net/Linear[fc1]/linear"]
    assert list(fc1.input) == ["input/x", "Net/Linear[fc1]/weight", "Net/Linear[fc1]/bias"]
    assert knodes["Net/Linear[fc1]/weight"].op == "Parameter" and _shapes(knodes["Net/Linear[fc1]/weight"]) == [[3, 4]]
    assert list(knodes["output/output.1"].input) == ["Net/mul"]


@needs_nn
def test_conv_net_scopes_match_torch(tmp_path):
    nets = []
    for lib in (kiln, torch):
        n = lib.nn
        nets.append(
            n.Sequential(
                n.Conv2d(1, 4, 3, padding=1),
                n.BatchNorm2d(4),
                n.ReLU(),
                n.MaxPool2d(2),
                n.Flatten(),
                n.Dropout(0.5),
                n.Linear(4 * 4 * 4, 10),
            )
        )
    x = np.random.default_rng(1).standard_normal((2, 1, 8, 8)).astype(np.float32)
    knodes, _ = _graph(tmp_path / "k", nets[0], kiln.from_numpy(x))
    tnodes, _ = _graph(tmp_path / "t", nets[1], torch.from_numpy(x), writer=TorchWriter)
    kscopes = {scope for scope, _ in _ops(knodes, "kiln::")}
    tscopes = {scope for scope, _ in _ops(tnodes, "aten::")}
    assert kscopes == tscopes - {"Sequential/Dropout[5]"}  # eval mode: torch records a no-op dropout
    buffers = {name for name, node in knodes.items() if node.op == "Buffer"}
    assert buffers == {"Sequential/BatchNorm2d[1]/running_mean", "Sequential/BatchNorm2d[1]/running_var"}


@needs_nn
def test_graph_restores_the_model(tmp_path):
    knet, _ = _nets()
    assert knet.training
    _graph(tmp_path, knet, kiln.ones(1, 4))
    assert knet.training
    for m in knet.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks
    knet.eval()
    _graph(tmp_path / "again", knet, kiln.ones(1, 4))
    assert not knet.training


@needs_nn
def test_graph_error_in_forward_is_torchs_and_leaves_the_model_as_it_was(tmp_path):
    knet, tnet = _nets()
    with SummaryWriter(str(tmp_path / "k")) as kw, TorchWriter(str(tmp_path / "t")) as tw, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        U.assert_same_error(lambda: kw.add_graph(knet, kiln.ones(1, 3)), lambda: tw.add_graph(tnet, torch.ones(1, 3)))
    assert knet.training
    for m in knet.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks


@needs_nn
def test_shared_module_ops_get_unique_names(tmp_path):
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x):
            return self.fc(self.fc(x))

    nodes, _ = _graph(tmp_path, Twice(), kiln.ones(2, 3))
    assert nodes["Twice/Linear[fc]/linear_1"].input[0] == "Twice/Linear[fc]/linear"
    assert sum(n.op == "Parameter" for n in nodes.values()) == 2  # weight and bias, once each
