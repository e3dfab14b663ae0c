"""``kiln.compile(dynamic=...)``: a call at a new shape traces again (every trace is guarded on its exact
shapes); with ``dynamic=None`` (default) or ``True`` another shape of a kept trace's program does not count
towards ``config.cache_size_limit``, and its fused kernels take their sizes at run time, so later shapes
compile no kernel. Results always match eager ones, forward and backward."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import kiln
import kiln.compile
import kiln.plugins
from kiln._generated import _modules

HAS_CODEGEN = any(getattr(c, "device_type", None) == "cpu" for c in kiln.plugins.compilers().values())


def _chain(x, w, b):
    """A fused chain with a partial sum after it, and a size the code reads into Python (a view)."""
    y = (x * w + b).relu()
    return y.sum(1), y.view(x.shape[0], 4, 2).mean(2)


def _close(got, want) -> None:
    for g, e in zip(got, want):
        assert g.shape == e.shape
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-5, atol=1e-6)


def test_other_sizes_trace_again_without_counting_and_reuse_the_kernels(monkeypatch):
    monkeypatch.setattr(kiln.compile.config, "cache_size_limit", 2)
    f = kiln.compile(_chain)
    w, b = kiln.randn(8), kiln.randn(8)
    sizes = [4, 4, 7, 3, 9, 11, 0, 12, 13, 14, 1, 15, 16, 4, 7]  # more sizes than the limit; 0 and 1 among them
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no cache_size_limit warning
        for i, n in enumerate(sizes):
            x = kiln.randn(n, 8)
            before = len(_modules)
            _close(f(x, w, b), _chain(x, w, b))
            if HAS_CODEGEN and i > sizes.index(3) and n not in (0, 1):  # (0 and 1: other loop patterns)
                assert len(_modules) == before, n  # the first other size (3) made the kernels this one runs
    assert f.trace_count == len(set(sizes)) and f._limited == 1
    entries = f._entries
    assert sum(not e.graphs[0].dynamic for e in entries) == 1  # the first trace: kernels made for its shapes
    x = kiln.randn(7, 8)
    _close(f(x, w, b), _chain(x, w, b))
    assert f.trace_count == len(set(sizes))  # a size seen before runs its trace again


def test_a_changed_program_still_counts(monkeypatch):
    """Only sizes, strides and int arguments may differ: a float constant, a rank, a dtype or a
    ``requires_grad`` is another program, and counts towards the limit."""
    monkeypatch.setattr(kiln.compile.config, "cache_size_limit", 2)
    scale = kiln.compile(lambda x, s: x * s)
    scale(kiln.ones(2), 0.5)
    scale(kiln.ones(2), 0.25)
    with pytest.warns(UserWarning, match="cache_size_limit"):
        assert scale(kiln.ones(2), 4.0).tolist() == [4.0, 4.0]
    rank = kiln.compile(lambda x: x.exp() + 1)
    rank(kiln.ones(2))
    rank(kiln.ones(2, 2))
    with pytest.warns(UserWarning, match="cache_size_limit"):
        rank(kiln.ones(2, 2, 2))
    kinds = kiln.compile(lambda x: x.exp() + 1)
    kinds(kiln.ones(2))
    kinds(kiln.ones(3, dtype=kiln.float64))
    with pytest.warns(UserWarning, match="cache_size_limit"):
        kinds(kiln.ones(4, requires_grad=True))


@pytest.mark.parametrize("setting", ["dynamic=False", "automatic_dynamic_shapes=False"])
def test_static_counts_every_shape(monkeypatch, setting):
    monkeypatch.setattr(kiln.compile.config, "cache_size_limit", 3)
    if setting == "dynamic=False":
        f = kiln.compile(_chain, dynamic=False)
    else:
        monkeypatch.setattr(kiln.compile.config, "automatic_dynamic_shapes", False)
        f = kiln.compile(_chain)
    w, b = kiln.randn(8), kiln.randn(8)
    for n in (2, 3, 4):
        f(kiln.randn(n, 8), w, b)
    assert not any(e.graphs[0].dynamic for e in f._entries)
    x = kiln.randn(5, 8)
    with pytest.warns(UserWarning, match="traced 3 times"):
        _close(f(x, w, b), _chain(x, w, b))  # eager from here on
    assert f.trace_count == 3


def test_dynamic_true_from_the_first_trace():
    f = kiln.compile(_chain, dynamic=True)
    w, b = kiln.randn(8), kiln.randn(8)
    for n in (5, 6):
        x = kiln.randn(n, 8)
        _close(f(x, w, b), _chain(x, w, b))
    assert [e.graphs[0].dynamic for e in f._entries] == [True, True]


def test_accumulated_cache_size_limit(monkeypatch):
    monkeypatch.setattr(kiln.compile.config, "accumulated_cache_size_limit", 3)
    f = kiln.compile(lambda x: x.exp() * 2)
    for n in (1, 2, 3):
        f(kiln.ones(n))
    with pytest.warns(UserWarning, match="accumulated_cache_size_limit"):
        assert f(kiln.ones(4)).shape == (4,)
    assert f.trace_count == 3


def test_training_steps_at_other_batch_sizes_match_eager():
    """A whole compiled step (forward, loss, backward, SGD with momentum) at batch sizes that change, the
    last batch of an epoch among them: the parameters follow an eager twin's."""
    kiln.manual_seed(0)
    models = [kiln.nn.Sequential(kiln.nn.Linear(6, 16), kiln.nn.Tanh(), kiln.nn.Linear(16, 3)) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [kiln.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in models]

    def step(model, opt, x, y):
        opt.zero_grad()
        loss = kiln.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    compiled = kiln.compile(lambda x, y: step(models[0], opts[0], x, y))
    for n in (8, 8, 8, 5, 8, 3, 5, 8, 2):
        x, y = kiln.randn(n, 6), kiln.randint(0, 3, (n,))
        got = compiled(x, y)
        want = step(models[1], opts[1], x, y)
        assert abs(got.item() - want.item()) < 1e-5
    for p, q in zip(models[0].parameters(), models[1].parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert compiled._limited <= 3  # the first steps (optimizer state made, .grad None, then not): the rest are sizes


@pytest.mark.skipif(not HAS_CODEGEN, reason="needs a code generator for cpu (kiln-cpu)")
def test_only_sizes_that_changed_are_read(monkeypatch):
    """In a trace of the same program at other shapes, a fused group over values whose shapes all traces
    share (a parameter's update) keeps kernels made for its shapes; one over the batch reads the batch's size
    at run time, and keeps the other sizes written in."""
    seen = []
    real = kiln.plugins.compilers

    class Recorder:
        device_type = "cpu"
        partial_reductions = True

        def __init__(self, codegen):
            self.codegen = codegen

        def __call__(self, group):
            seen.append(group)
            return self.codegen(group)

    def compilers():
        return {name: Recorder(c) if getattr(c, "device_type", None) == "cpu" else c for name, c in real().items()}

    monkeypatch.setattr(kiln.plugins, "compilers", compilers)
    f = kiln.compile(lambda x, w: ((x * 2 + 1).relu().sum(1), (w * 3 + 1).exp()))
    w = kiln.randn(8)
    f(kiln.randn(4, 8), w)
    assert sorted((g.shape, g.dynamic) for g in seen) == [((4, 8), False), ((8,), False)]  # the first trace
    seen.clear()
    x = kiln.randn(5, 8)
    _close(f(x, w), ((x * 2 + 1).relu().sum(1), (w * 3 + 1).exp()))
    assert sorted((g.shape, g.dynamic, g.dynamic_dims) for g in seen) == [((5, 8), True, (0,)), ((8,), False, ())]


@pytest.mark.parametrize(
    "layer", [lambda: kiln.nn.LayerNorm(6), lambda: kiln.nn.BatchNorm1d(6), lambda: kiln.nn.GroupNorm(2, 6)]
)
def test_normalization_steps_count_once(monkeypatch, layer):
    """A normalization's backward takes a layout (a named tuple) holding its statistics' shape: its sizes
    are sizes too, so a training step at other batch sizes is one program."""
    monkeypatch.setattr(kiln.compile.config, "cache_size_limit", 3)
    kiln.manual_seed(0)
    model = kiln.nn.Sequential(kiln.nn.Linear(4, 6), layer(), kiln.nn.ReLU(), kiln.nn.Linear(6, 2))
    _one_program_at_every_batch_size(model, lambda h: h.square().mean())


def _one_program_at_every_batch_size(model, loss_of) -> None:
    """A compiled SGD step of ``model`` with the loss ``loss_of(output)``, at 9 batch sizes: no warning, and
    at most two traces counted (the first, and the one after ``.grad`` exists) under a limit of 3."""
    opt = kiln.optim.SGD(model.parameters(), lr=0.1)

    def step(x):
        opt.zero_grad()
        loss = loss_of(model(x))
        loss.backward()
        opt.step()
        return loss

    compiled = kiln.compile(step)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in (8, 8, 7, 6, 5, 9, 10, 11, 12):
            compiled(kiln.randn(n, 4))
    assert compiled._limited <= 2


def test_slices_and_nan_constants_are_the_same_program(monkeypatch):
    monkeypatch.setattr(kiln.compile.config, "cache_size_limit", 1)

    def glu(x):
        half = x[:, : x.shape[1] // 2]
        a, b = x.chunk(2, -1)
        return half * kiln.sigmoid(b) + a

    def masked(x):
        return x.masked_fill(x > 0, float("nan")) * 2  # a new NaN object on every call

    for fn in (glu, masked):
        f = kiln.compile(fn)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for n in (2, 4, 6, 8):
                x = kiln.randn(3, n)
                got, want = f(x), fn(x)
                assert kiln.allclose(got, want, equal_nan=True)
        assert f._limited == 1


def test_the_warning_counts_what_its_limit_counts(monkeypatch):
    monkeypatch.setattr(kiln.compile.config, "cache_size_limit", 2)
    f = kiln.compile(lambda x, s: x * s)
    for n in (2, 3, 4, 5):  # other shapes: not counted
        f(kiln.ones(n), 0.5)
    f(kiln.ones(2), 0.25)
    with pytest.warns(UserWarning, match=r"traced 2 times \(kiln.compile.config.cache_size_limit\)"):
        f(kiln.ones(2), 4.0)


def test_module_compile_and_settings_pass_dynamic_through(monkeypatch):
    net = kiln.nn.Linear(3, 2)
    static = kiln.compile(net, dynamic=False)
    assert static._compiled._dynamic is False
    monkeypatch.setattr(kiln.compile.config, "automatic_dynamic_shapes", False)
    f = kiln.compile(lambda x: (x * 2).exp(), dynamic=True)  # an explicit True wins over the setting
    for n in (2, 3):
        f(kiln.ones(n))
    assert [e.graphs[0].dynamic for e in f._entries] == [True, True] and f._limited == 1


def test_past_the_limit_other_shapes_are_still_traced(monkeypatch):
    """The limit reached by other programs (other float constants), a call at a new shape of a kept trace's
    program is still traced and compiled; one of yet another program is traced once and kept to run eagerly
    (with the warning), and after cache_size_limit such programs no call is traced."""
    monkeypatch.setattr(kiln.compile.config, "cache_size_limit", 2)
    f = kiln.compile(lambda x, s: x * s + 1)
    f(kiln.ones(3), 0.5)
    f(kiln.ones(3), 0.25)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert f(kiln.ones(5), 0.5).tolist() == [1.5] * 5
    assert len(f._entries) == 3 and f.trace_count == 3
    with pytest.warns(UserWarning, match="traced 2 times"):
        assert f(kiln.ones(3), 4.0).tolist() == [5.0] * 3
    assert f(kiln.ones(3), 4.0).tolist() == [5.0] * 3 and f.trace_count == 4  # its entry runs it eagerly
    assert f(kiln.ones(6), 0.5).tolist() == [1.5] * 6 and f.trace_count == 5  # another shape: compiled
    assert [e.forward is None for e in f._entries].count(True) == 1
    for s in (5.0, 6.0, 7.0):
        assert f(kiln.ones(3), s).tolist() == [s + 1] * 3
    assert f.trace_count == 6  # a second other program, then none traced
    assert f(kiln.ones(7), 0.25).tolist() == [1.25] * 7 and f.trace_count == 6


def test_other_state_at_the_same_shapes_counts(monkeypatch):
    """Guards that failed on state, not on shapes: a module attribute changed by each call, a global tensor
    rebound (whose memory a kept trace would hold) count towards the limit."""
    monkeypatch.setattr(kiln.compile.config, "cache_size_limit", 3)

    class Counting(kiln.nn.Linear):
        calls = 0

        def forward(self, x):
            self.calls += 1
            return super().forward(x)

    net = kiln.compile(Counting(4, 2))
    with pytest.warns(UserWarning, match="cache_size_limit"):
        for _ in range(10):
            net(kiln.ones(2, 4))
    # three traces count; past the limit, three more are kept to run eagerly (other programs), then none
    assert net._compiled._limited == 3 and net._compiled.trace_count == 6 and len(net._compiled._entries) == 6
    global _BATCH
    f = kiln.compile(lambda w: (_BATCH * w).sum())
    with pytest.warns(UserWarning, match="cache_size_limit"):
        for _ in range(10):
            _BATCH = kiln.randn(16)
            assert abs(f(kiln.ones(16)).item() - _BATCH.sum().item()) < 1e-4
    assert f._limited == 3 and len(f._entries) == 6


_BATCH = None


@pytest.mark.skipif(not HAS_CODEGEN, reason="needs a code generator for cpu (kiln-cpu)")
def test_changed_dims_accumulate():
    """The batch changes, then the sequence length, then both: once each dim has changed, the kernels read
    both sizes, and every later shape reuses them."""
    f = kiln.compile(lambda x, w: (x * w + 1).relu().sum(-1))
    w = kiln.randn(16)
    made = []
    for shape in ((4, 3), (5, 3), (5, 8), (6, 9), (7, 2), (3, 11), (8, 5)):
        x = kiln.randn(*shape, 16)
        before = len(_modules)
        for _ in range(2):
            _close([f(x, w)], [(x * w + 1).relu().sum(-1)])
        made.append(len(_modules) - before)
    assert made[4:] == [0, 0, 0], made


def test_a_standardization_step_counts_once(monkeypatch):
    """``(h - h.mean(0)) / h.std(0)`` in a training step: std's backward scales by 2/(n - 1), computed as a
    division by the int n - 1, so each batch size is the same program (a float computed from the size
    would make each another)."""
    monkeypatch.setattr(kiln.compile.config, "cache_size_limit", 3)
    kiln.manual_seed(0)
    _one_program_at_every_batch_size(
        kiln.nn.Linear(4, 3), lambda h: ((h - h.mean(0)) / (h.std(0) + 1e-5)).square().mean() + h.var(0).sum()
    )
