"""kiln-cpu's fused optimizer updates against kiln.optim's own loop: bit-identical parameters and state
for SGD and Adam/AdamW over a sweep of hyper-parameters, float32 and float64, 0-d and empty parameters
and special values; close to torch.optim; the calls handed back to the loop; the plugin hook."""

from __future__ import annotations

import numpy as np
import pytest
from kiln_cpu_helpers import assert_same, make

import kiln
from kiln import _plugins
from kiln_cpu import _jit_optim, config
from kiln_cpu import optim as fused

optim = pytest.importorskip("kiln.optim")  # kiln-nn: a test-time extra of kiln-cpu
_functional = pytest.importorskip("kiln.optim._functional")

FLOAT = {"float32": kiln.float32, "float64": kiln.float64}
SHAPES = [(6, 5), (17,), (), (0, 3)]  # the 0-d and the empty parameter too
STEPS = 3


@pytest.fixture(autouse=True)
def loop_on_reference(numba_for_every_size, monkeypatch):
    """The loop's ops run on the NumPy reference kernels (nothing else compiles here; kiln-cpu's own
    kernels are bit-identical to them), and explicit registrations start empty."""
    monkeypatch.setattr(config, "min_numel", 1 << 30)
    monkeypatch.setattr(_functional, "_FUSED", {})


@pytest.fixture
def optim_spy(monkeypatch):
    """A list that receives ``(algorithm, numpy dtype)`` for every call of a fused Numba loop."""
    calls: list[tuple] = []
    for name in ("sgd", "sgd_momentum", "adam", "adam_amsgrad"):
        real, algorithm = getattr(_jit_optim, name), name.split("_")[0]
        monkeypatch.setattr(
            _jit_optim, name, lambda *a, _real=real, _alg=algorithm: calls.append((_alg, a[0].dtype)) or _real(*a)
        )
    return calls


def _params(dtype, seed=0, shapes=SHAPES):
    """Parameters (leaves that require grad) with special values mixed into the larger ones."""
    params = [make(s, dtype, seed + k) if 0 not in s else kiln.zeros(s, dtype=dtype) for k, s in enumerate(shapes)]
    return [p.requires_grad_() for p in params]


def _grads(params, step):
    """Gradients for ``step``: normals with NaN, inf, -0.0... in the first parameter's only."""
    out = []
    for k, p in enumerate(params):
        if k == 0:
            out.append(make(tuple(p.shape), p.dtype, 100 + step))
        else:
            rng = np.random.default_rng(1000 * step + k)
            out.append(kiln.from_numpy(np.array(rng.standard_normal(tuple(p.shape)), dtype=p.dtype.numpy)))
    return out


def _train(cls, kwargs, dtype, use_fused, steps=STEPS, **data):
    """``steps`` steps of ``cls(**kwargs)``: the parameters and the optimizer's state afterwards."""
    algorithm = "sgd" if cls is optim.SGD else "adam"
    _functional._FUSED.clear()
    if not use_fused:
        _functional.register_fused_update(algorithm, "cpu", None)
    params = _params(dtype, **data)
    opt = cls(params, **kwargs)
    for step in range(steps):
        for p, g in zip(params, _grads(params, step)):
            p.grad = g
        opt.step()
    _functional._FUSED.clear()
    return params, [opt.state[p] for p in params]


def _assert_identical(a, b):
    """The same parameters and the same state, bit for bit (NaN where NaN)."""
    (pa, sa), (pb, sb) = a, b
    for x, y in zip(pa, pb):
        assert_same(x.detach(), y.detach())
    for x, y in zip(sa, sb):
        assert sorted(x) == sorted(y)
        for key in x:
            if isinstance(x[key], kiln.Tensor):
                assert_same(x[key], y[key])
            else:
                assert x[key] == y[key]


SGD_CASES = {
    "plain": {"lr": 0.1},
    "momentum": {"lr": 0.05, "momentum": 0.9},
    "dampening": {"lr": 0.05, "momentum": 0.8, "dampening": 0.3},
    "nesterov-decay": {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
    "maximize-decay": {"lr": 0.1, "momentum": 0.5, "weight_decay": 0.2, "maximize": True},
    "decay-only": {"lr": 0.3, "weight_decay": 0.07},
    "int-hyper": {"lr": 1, "momentum": 1, "dampening": 1},
}

ADAM_CASES = {
    "adam": (optim.Adam, {"lr": 1e-3}),
    "adam-amsgrad": (optim.Adam, {"lr": 0.1, "amsgrad": True}),
    "adam-l2": (optim.Adam, {"lr": 0.01, "weight_decay": 0.1}),
    "adam-maximize-amsgrad-l2": (optim.Adam, {"lr": 0.02, "amsgrad": True, "weight_decay": 0.05, "maximize": True}),
    "adam-small-beta1": (optim.Adam, {"lr": 0.1, "betas": (0.3, 0.5), "eps": 1e-3}),  # lerp from the gradient
    "adam-zero-betas": (optim.Adam, {"lr": 0.1, "betas": (0.0, 0.0), "eps": 0}),
    "adamw": (optim.AdamW, {"lr": 1e-2}),
    "adamw-amsgrad-maximize": (optim.AdamW, {"lr": 0.05, "amsgrad": True, "maximize": True, "weight_decay": 0.3}),
    "adam-decoupled-flag": (optim.Adam, {"lr": 0.05, "weight_decay": 0.2, "decoupled_weight_decay": True}),
}


@pytest.mark.parametrize("dtype", FLOAT)
@pytest.mark.parametrize("case", SGD_CASES)
def test_sgd_is_bit_identical_to_the_loop(case, dtype, optim_spy):
    kwargs = SGD_CASES[case]
    got = _train(optim.SGD, kwargs, FLOAT[dtype], True)
    assert optim_spy == [("sgd", np.dtype(dtype))] * (STEPS * 3)  # every non-empty parameter, every step
    _assert_identical(got, _train(optim.SGD, kwargs, FLOAT[dtype], False))
    assert len(optim_spy) == STEPS * 3  # the loop run called no Numba loop


@pytest.mark.parametrize("dtype", FLOAT)
@pytest.mark.parametrize("case", ADAM_CASES)
def test_adam_is_bit_identical_to_the_loop(case, dtype, optim_spy):
    cls, kwargs = ADAM_CASES[case]
    got = _train(cls, kwargs, FLOAT[dtype], True)
    assert optim_spy == [("adam", np.dtype(dtype))] * (STEPS * 3)
    _assert_identical(got, _train(cls, kwargs, FLOAT[dtype], False))
    assert got[1][0]["step"].item() == STEPS and got[1][0]["step"].ndim == 0
    assert len(optim_spy) == STEPS * 3


def test_large_tensors_split_over_threads_give_the_same_bits(monkeypatch, optim_spy):
    ranges = []
    real = fused._threads.parallel
    monkeypatch.setattr(
        fused._threads, "parallel", lambda fn, args, n, grain: ranges.append(n) or real(fn, args, n, grain)
    )
    monkeypatch.setattr(fused, "_GRAIN", 64)
    shapes = [(40, 25), (3,)]
    kwargs = {"lr": 0.1, "amsgrad": True, "weight_decay": 0.1}
    expected = _train(optim.AdamW, kwargs, kiln.float32, False, shapes=shapes)
    monkeypatch.setattr(config, "min_numel", 0)
    before = kiln.get_num_threads()
    kiln.set_num_threads(2)
    try:
        got = _train(optim.AdamW, kwargs, kiln.float32, True, shapes=shapes)
    finally:
        kiln.set_num_threads(before)
    _assert_identical(got, expected)
    assert ranges == [1000, 3] * STEPS and len(optim_spy) > 2 * STEPS  # the big one ran in several ranges


@pytest.mark.parametrize(
    "make_opt",
    {
        "sgd-nesterov": lambda ps, m: m.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
        "adam-amsgrad": lambda ps, m: m.Adam(ps, lr=0.01, amsgrad=True, weight_decay=0.1),
        "adamw-maximize": lambda ps, m: m.AdamW(ps, lr=0.01, maximize=True),
    }.values(),
    ids=["sgd-nesterov", "adam-amsgrad", "adamw-maximize"],
)
def test_close_to_torch(make_opt, optim_spy):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    init = [rng.standard_normal(s).astype(np.float32) for s in [(5, 4), (4,), ()]]
    grads = [[rng.standard_normal(a.shape).astype(np.float32) for a in init] for _ in range(4)]
    kp = [kiln.from_numpy(a.copy()).requires_grad_() for a in init]
    tp = [torch.tensor(a.copy(), requires_grad=True) for a in init]
    kopt, topt = make_opt(kp, optim), make_opt(tp, torch.optim)
    for gs in grads:
        for k, t, g in zip(kp, tp, gs):
            k.grad, t.grad = kiln.from_numpy(g.copy()), torch.tensor(g.copy())
        kopt.step()
        topt.step()
    for k, t in zip(kp, tp):
        np.testing.assert_allclose(k.detach().numpy(), t.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert len(optim_spy) == 4 * 3


def test_a_momentum_buffer_is_a_new_tensor(optim_spy):
    (p,) = _params(kiln.float32, shapes=[(4, 3)])
    p.grad = make((4, 3), kiln.float32, 9)
    opt = optim.SGD([p], lr=0.1, momentum=0.9)
    version = p._version
    opt.step()
    buf = opt.state[p]["momentum_buffer"]
    assert isinstance(buf, kiln.Tensor) and buf.is_contiguous() and not buf.requires_grad
    assert not np.shares_memory(buf.numpy(), p.grad.numpy())
    assert_same(buf, p.grad)
    assert p._version > version and optim_spy


# ------------------------------------------------------------------------------------------- hand-back


def _sgd_hyper(**over):
    """SGD's keyword arguments to ``update``, with ``over`` changed."""
    hyper = {"weight_decay": 0.1, "momentum": 0.9, "lr": 0.1, "dampening": 0, "nesterov": False}
    return {**hyper, "maximize": False, **over}


def _adam_hyper(**over):
    """Adam's keyword arguments to ``update``, with ``over`` changed."""
    hyper = {"amsgrad": False, "beta1": 0.9, "beta2": 0.999, "lr": 0.01, "weight_decay": 0.0, "eps": 1e-8}
    return {**hyper, "maximize": False, "decoupled_weight_decay": False, **over}


def _adam_lists(params, grads):
    """The state lists of a first Adam step (no AMSGrad buffers)."""
    return [grads, [kiln.zeros_like(p) for p in params], [kiln.zeros_like(p) for p in params], [None] * len(params),
            [kiln.tensor(0.0) for _ in params]]  # fmt: skip


def _transposed(shape, dtype, seed):
    """A non-contiguous tensor of ``shape``."""
    return make(shape[::-1], dtype, seed).t()


def _outcome(fn):
    """What ``fn()`` returned, or the type and message of what it raised."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - compared, not swallowed
        return (type(exc), str(exc))


def _update_without_grad(name, params, lists, hyper):
    """``update(name, params, *lists, **hyper)`` as an optimizer's step runs it; the new parameters."""
    with kiln.no_grad():
        _functional.update(name, params, *lists, **hyper)
    return [p.detach().numpy().copy() for p in params]


def _both_ways(build, name, hyper):
    """``update(name, *build())`` with the fused path and with the loop: each run's parameters (or error)."""
    results = []
    for use_fused in (True, False):
        _functional._FUSED.clear()
        if not use_fused:
            _functional.register_fused_update(name, "cpu", None)
        results.append(_outcome(lambda: _update_without_grad(name, *build(), hyper)))
    _functional._FUSED.clear()
    return results


HANDED_BACK = {
    "noncontiguous-param": lambda: ([_transposed((4, 3), kiln.float32, 0)], [[make((4, 3), kiln.float32, 1)], [None]]),
    "noncontiguous-grad": lambda: ([make((4, 3), kiln.float32, 0)], [[_transposed((4, 3), kiln.float32, 1)], [None]]),
    "noncontiguous-buffer": lambda: (
        [make((4, 3), kiln.float32, 0)],
        [[make((4, 3), kiln.float32, 1)], [_transposed((4, 3), kiln.float32, 2)]],
    ),
    "float16": lambda: ([make((5,), kiln.float16, 0)], [[make((5,), kiln.float16, 1)], [None]]),
    "one-float16-among-float32": lambda: (
        [make((5,), kiln.float32, 0), make((5,), kiln.float16, 1)],
        [[make((5,), kiln.float32, 2), make((5,), kiln.float16, 3)], [None, None]],
    ),
    "mixed-dtypes": lambda: ([make((5,), kiln.float32, 0)], [[make((5,), kiln.float64, 1)], [None]]),
    "float64-buffer": lambda: (
        [make((5,), kiln.float32, 0)],
        [[make((5,), kiln.float32, 1)], [make((5,), kiln.float64, 2)]],
    ),
    "broadcast-grad": lambda: ([make((4, 3), kiln.float32, 0)], [[make((3,), kiln.float32, 1)], [None]]),
    "missing-grad": lambda: ([make((4,), kiln.float32, 0)], [[None], [None]]),
    "grad-is-param": lambda: (lambda p: ([p], [[p], [None]]))(make((4,), kiln.float32, 0)),
}


@pytest.mark.parametrize("case", HANDED_BACK)
def test_sgd_hands_back_what_it_does_not_take(case, optim_spy):
    fused_run, loop_run = _both_ways(HANDED_BACK[case], "sgd", _sgd_hyper())
    assert optim_spy == []
    if isinstance(loop_run, tuple):
        assert fused_run == loop_run
    else:
        for a, b in zip(fused_run, loop_run):
            np.testing.assert_array_equal(a, b)


def _adam_case(param=None, grad=None, exp_avg=None):
    """A builder of one Adam call: contiguous float32 tensors unless given."""

    def build():
        p = param() if param else make((4, 3), kiln.float32, 0)
        lists = _adam_lists([p], [grad() if grad else make(tuple(p.shape), p.dtype, 1)])
        if exp_avg:
            lists[1] = [exp_avg()]
        return [p], lists

    return build


ADAM_HANDED_BACK = {
    "noncontiguous-param": (_adam_case(param=lambda: _transposed((4, 3), kiln.float32, 0)), {}),
    "noncontiguous-grad": (_adam_case(grad=lambda: _transposed((4, 3), kiln.float32, 1)), {}),
    "noncontiguous-state": (_adam_case(exp_avg=lambda: _transposed((4, 3), kiln.float32, 2)), {}),
    "float16": (_adam_case(param=lambda: make((5,), kiln.float16, 0)), {}),
    "float64-state": (_adam_case(exp_avg=lambda: make((4, 3), kiln.float64, 2)), {}),
    "missing-max-state": (_adam_case(), {"amsgrad": True}),  # max_exp_avg_sq is None: the loop raises
    "numpy-scalar-beta": (_adam_case(), {"beta1": np.float32(0.9)}),
    "beta-out-of-range": (_adam_case(), {"beta1": 1.5}),
    "lr-beyond-float32": (_adam_case(), {"lr": 1e39}),
    "eps-beyond-float32": (_adam_case(), {"eps": 1e39}),
}


@pytest.mark.parametrize("case", ADAM_HANDED_BACK)
def test_adam_hands_back_what_it_does_not_take(case, optim_spy):
    build, over = ADAM_HANDED_BACK[case]
    fused_run, loop_run = _both_ways(build, "adam", _adam_hyper(**over))
    assert optim_spy == []
    if isinstance(loop_run, tuple):
        assert fused_run == loop_run
    else:
        for a, b in zip(fused_run, loop_run):
            np.testing.assert_array_equal(a, b)


def test_a_differentiable_update_records_through_the_loop(optim_spy):
    w = kiln.ones(4, requires_grad=True)
    p = w * 2  # a parameter computed from another: the update is part of the graph
    g = make((4,), kiln.float32, 1)
    _functional.update("sgd", [p], [g], [None], **_sgd_hyper(momentum=0))
    assert optim_spy == [] and p.grad_fn is not None
    p.sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), np.full(4, 2 * (1 - 0.1 * 0.1), np.float32))


def test_grad_mode_on_a_leaf_raises_as_the_loop_does(optim_spy):
    p, g = make((4,), kiln.float32, 0).requires_grad_(), make((4,), kiln.float32, 1)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        _functional.update("sgd", [p], [g], [None], **_sgd_hyper())
    assert optim_spy == []


@pytest.mark.parametrize("algorithm", [optim.SGD, optim.Adam])
def test_the_optimizer_with_differentiable_true_runs_the_recorded_loop(algorithm, optim_spy):
    w = make((5,), kiln.float32, 0).requires_grad_() * 1.0  # a non-leaf parameter: its update is recorded
    w.grad = make((5,), kiln.float32, 1)
    algorithm([w], lr=0.01, differentiable=True).step()
    assert w.grad_fn is not None and optim_spy == []


# ------------------------------------------------------------------------------------------------ hook


def test_kiln_cpu_registers_through_the_hook():
    assert _plugins.fused_update("sgd", "cpu") is fused.sgd
    assert _plugins.fused_update("adam", "cpu") is fused.adam
    info = next(i for i in _plugins.plugins() if i.name == "cpu")
    assert "kiln_register_fused_updates" in info.hooks
    assert sorted(info.fused_updates) == ["adam@cpu", "sgd@cpu"]


def test_an_explicit_registration_wins(optim_spy):
    seen = []
    _functional.register_fused_update("sgd", "cpu", lambda params, *lists, **hyper: seen.append(len(params)))
    p = make((3,), kiln.float32, 0).requires_grad_()
    p.grad = make((3,), kiln.float32, 1)
    optim.SGD([p], lr=0.1).step()
    assert seen == [1] and optim_spy == []


@pytest.mark.parametrize("step_dtype", [kiln.float32, kiln.float64, kiln.int64])
def test_the_step_counter_counts_as_in_the_loop(step_dtype, optim_spy):
    def build():
        params = [make((4, 3), kiln.float32, 0), make((), kiln.float32, 1)]
        lists = _adam_lists(params, [make(tuple(p.shape), kiln.float32, 2 + k) for k, p in enumerate(params)])
        lists[4] = [kiln.tensor(7, dtype=step_dtype) for _ in params]
        return params, lists

    results = []
    for use_fused in (True, False):
        _functional._FUSED.clear()
        if not use_fused:
            _functional.register_fused_update("adam", "cpu", None)
        params, lists = build()
        versions = [t._version for t in lists[4]]
        got = _update_without_grad("adam", params, lists, _adam_hyper(weight_decay=0.1))
        assert [t._version for t in lists[4]] == [v + 1 for v in versions]
        results.append((got, [t.item() for t in lists[4]], [t.dtype for t in lists[4]]))
    assert results[0][1:] == results[1][1:] == ([8, 8], [step_dtype] * 2)
    for a, b in zip(results[0][0], results[1][0]):
        assert a.tobytes() == b.tobytes()
    assert len(optim_spy) == 2
