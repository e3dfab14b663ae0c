"""The samplers of ``kiln._ops.random_ops`` against PyTorch: ``kiln.normal`` (four forms), ``bernoulli``,
``poisson``, ``binomial`` and the in-place ``Tensor.uniform_``, ``normal_``, ``bernoulli_``, ``random_``,
``exponential_``, ``geometric_``, ``cauchy_``, ``log_normal_``.

kiln's streams are not PyTorch's, so values are never compared: each distribution is checked
statistically on a seeded draw (mean and variance, or quantiles, within six standard errors of the
distribution's own), and PyTorch's draws are checked against the same expectation, so that both
libraries are known to mean the same parameters. Shapes, dtypes, supports, layouts (writes through
views), autograd behaviour, reproducibility, signatures and errors are compared with PyTorch directly.
"""

# ruff: noqa: B023 - lambdas made inside loops are called within the same iteration

from __future__ import annotations

import inspect
import math
import warnings

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln

N = 200_000  # draws per statistical check: six standard errors of a unit-variance mean are 0.013


def _gens(seed: int = 0):
    return kiln.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)


def _np(t) -> np.ndarray:
    return U.kiln_to_np(t).astype(np.float64) if isinstance(t, kiln.Tensor) else U.torch_to_np(t).astype(np.float64)


def _check_moments(a: np.ndarray, mean: float, var: float, what: str) -> None:
    """The sample mean and variance of ``a`` within six standard errors of ``mean`` and ``var`` (the variance's
    standard error from the fourth moment estimated on the sample)."""
    n = a.size
    m = a.mean()
    assert abs(m - mean) <= 6 * math.sqrt(var / n) + 1e-12, f"{what}: mean {m} vs {mean}"
    m4 = ((a - m) ** 4).mean()
    v = a.var()
    assert abs(v - var) <= 6 * math.sqrt(max(m4 - v * v, 1e-30) / n) + 1e-12, f"{what}: variance {v} vs {var}"


# sampler name -> (call on an empty tensor of the library, with a generator; mean, variance; dtypes)
IN_PLACE = {
    "uniform_": (lambda t, g: t.uniform_(-2.0, 3.0, generator=g), 0.5, 25 / 12, "float"),
    "normal_": (lambda t, g: t.normal_(1.5, 2.0, generator=g), 1.5, 4.0, "float"),
    "bernoulli_ p": (lambda t, g: t.bernoulli_(0.3, generator=g), 0.3, 0.21, "all"),
    "exponential_": (lambda t, g: t.exponential_(2.5, generator=g), 0.4, 0.16, "float"),
    "geometric_": (lambda t, g: t.geometric_(0.25, generator=g), 4.0, 12.0, "int"),
    "random_ to": (lambda t, g: t.random_(10, generator=g), 4.5, 99 / 12, "int"),
    "random_ from to": (lambda t, g: t.random_(-3, 5, generator=g), 0.5, 63 / 12, "int"),
}


@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64], ids=U.dtype_id)
@pytest.mark.parametrize("name", list(IN_PLACE))
def test_in_place_sampler_moments(name, dtype):
    fn, mean, var, _ = IN_PLACE[name]
    kg, tg = _gens(1)
    k = fn(kiln.empty(N, dtype=dtype), kg)
    t = fn(torch.empty(N, dtype=U.K2T[dtype]), tg)
    assert k.dtype is dtype and tuple(k.shape) == (N,)
    _check_moments(_np(t), mean, var, f"torch {name}")  # the premise: the parameters mean the same
    _check_moments(_np(k), mean, var, f"kiln {name}")


def test_samplers_supports():
    kg, _ = _gens(2)
    u = kiln.empty(N).uniform_(-2.0, 3.0, generator=kg).numpy()
    assert u.min() >= -2.0 and u.max() < 3.0
    e = kiln.empty(N, dtype=kiln.float64).exponential_(generator=kg).numpy()
    assert e.min() >= 0.0
    g = kiln.empty(N, dtype=kiln.int64).geometric_(0.5, generator=kg).numpy()
    assert g.min() >= 1
    b = kiln.empty(N, dtype=kiln.bool).bernoulli_(0.5, generator=kg).numpy()
    assert set(np.unique(b)) == {False, True}
    r = kiln.empty(N, dtype=kiln.int64).random_(-3, 5, generator=kg).numpy()
    assert set(np.unique(r)) == set(range(-3, 5))
    r = kiln.empty(N, dtype=kiln.uint8).random_(generator=kg).numpy()
    assert r.min() == 0 and r.max() == 255
    r = kiln.empty(N, dtype=kiln.bool).random_(generator=kg).numpy()
    assert set(np.unique(r)) == {False, True}
    r = kiln.empty(N, dtype=kiln.float32).random_(generator=kg).numpy()
    assert r.min() >= 0 and r.max() <= 2**24 and np.all(r == np.round(r))
    r = kiln.empty(1000, dtype=kiln.int8).random_(120, None, generator=kg).numpy()
    assert set(np.unique(r)) == set(range(120, 128))


def test_random_from_keyword_and_full_int64_range():
    kg, _ = _gens(3)
    r = kiln.empty(N, dtype=kiln.int64).random_(**{"from": 5, "to": 8}, generator=kg).numpy()
    assert set(np.unique(r)) == {5, 6, 7}
    r = kiln.empty(N, dtype=kiln.int64).random_(-(2**63), None, generator=kg).numpy()
    assert r.min() < -(2**61) and r.max() > 2**61  # spans int64 (both signs, far out)
    r = kiln.empty(N, dtype=kiln.float64).random_(to=4, generator=kg).numpy()
    assert set(np.unique(r)) == {0.0, 1.0, 2.0, 3.0}


def test_cauchy_and_log_normal_quantiles():
    kg, tg = _gens(4)
    for lib, g in ((kiln, kg), (torch, tg)):
        c = _np(lib.empty(N, dtype=lib.float64).cauchy_(1.0, 2.0, generator=g))
        q1, q2, q3 = np.quantile(c, [0.25, 0.5, 0.75])  # Cauchy(m, s): quartiles m - s, m, m + s
        assert abs(q2 - 1.0) < 0.05 and abs(q1 + 1.0) < 0.07 and abs(q3 - 3.0) < 0.07, (lib.__name__, q1, q2, q3)
        ln = _np(lib.empty(N, dtype=lib.float64).log_normal_(0.5, 0.75, generator=g))
        assert ln.min() > 0
        _check_moments(np.log(ln), 0.5, 0.75**2, f"{lib.__name__} log_normal_")


def test_bernoulli_with_tensor_probabilities_broadcast():
    kg, tg = _gens(5)
    for lib, g in ((kiln, kg), (torch, tg)):
        p = lib.tensor([0.1, 0.5, 0.9], dtype=lib.float64)
        draws = _np(lib.empty(N, 3).bernoulli_(p, generator=g))
        for j, pj in enumerate((0.1, 0.5, 0.9)):
            _check_moments(draws[:, j], pj, pj * (1 - pj), f"{lib.__name__} bernoulli_ column {j}")
        draws = _np(lib.bernoulli(p.expand(N, 3), generator=g))
        for j, pj in enumerate((0.1, 0.5, 0.9)):
            _check_moments(draws[:, j], pj, pj * (1 - pj), f"{lib.__name__} bernoulli column {j}")
        draws = _np(p.expand(N, 3).bernoulli(0.25, generator=g))
        _check_moments(draws.ravel(), 0.25, 0.1875, f"{lib.__name__} Tensor.bernoulli(p)")


def test_normal_four_forms_moments():
    kg, tg = _gens(6)
    for lib, g in ((kiln, kg), (torch, tg)):
        mean = lib.tensor([[-1.0], [3.0]], dtype=lib.float64)
        std = lib.full((1, N // 2), 2.0, dtype=lib.float64)
        both = _np(lib.normal(mean, std, generator=g))  # broadcast to (2, N / 2)
        _check_moments(both[0], -1.0, 4.0, f"{lib.__name__} normal(T, T) row 0")
        _check_moments(both[1], 3.0, 4.0, f"{lib.__name__} normal(T, T) row 1")
        _check_moments(_np(lib.normal(lib.full((N,), 2.0), 0.5, generator=g)), 2.0, 0.25, "normal(T, f)")
        _check_moments(_np(lib.normal(-2.0, lib.full((N,), 3.0), generator=g)), -2.0, 9.0, "normal(f, T)")
        _check_moments(_np(lib.normal(0.5, 1.5, (N,), generator=g)), 0.5, 2.25, "normal(f, f, size)")
        _check_moments(_np(lib.normal(lib.zeros(N))), 0.0, 1.0, "normal(T) (std 1)")


def test_poisson_and_binomial_moments():
    kg, tg = _gens(7)
    for lib, g in ((kiln, kg), (torch, tg)):
        lam = lib.tensor([0.5, 4.0, 40.0], dtype=lib.float64).expand(N, 3)
        draws = _np(lib.poisson(lam, generator=g))
        assert np.all(draws == np.round(draws)) and draws.min() >= 0
        for j, lj in enumerate((0.5, 4.0, 40.0)):
            _check_moments(draws[:, j], lj, lj, f"{lib.__name__} poisson column {j}")
        n = lib.tensor([1.0, 10.0, 100.0], dtype=lib.float64).expand(N, 3)
        p = lib.tensor([0.3, 0.5, 0.05], dtype=lib.float64).expand(N, 3)
        draws = _np(lib.binomial(n, p, generator=g))
        for j, (nj, pj) in enumerate(((1, 0.3), (10, 0.5), (100, 0.05))):
            _check_moments(draws[:, j], nj * pj, nj * pj * (1 - pj), f"{lib.__name__} binomial column {j}")


def test_binomial_edges_as_torch():
    # counts are floored, a negative count draws nothing, probabilities 0 and 1 are certain
    k = kiln.binomial(kiln.tensor([10.9, -5.0, 7.0, 7.0]), kiln.tensor([0.5, 0.5, 0.0, 1.0]))
    t = torch.binomial(torch.tensor([10.9, -5.0, 7.0, 7.0]), torch.tensor([0.5, 0.5, 0.0, 1.0]))
    assert k[1].item() == t[1].item() == 0.0
    assert k[2].item() == t[2].item() == 0.0 and k[3].item() == t[3].item() == 7.0
    assert 0 <= k[0].item() <= 10


# ---------------------------------------------------------------------------------------- dtypes, shapes, layouts

FLOATS = (kiln.float16, kiln.bfloat16, kiln.float32, kiln.float64)
SAMPLERS = {
    "uniform_": lambda t: t.uniform_(),
    "normal_": lambda t: t.normal_(),
    "bernoulli_": lambda t: t.bernoulli_(),
    "bernoulli_ tensor": lambda t: t.bernoulli_(t.new_full((), 0.5, dtype=_float_like(t))),
    "random_": lambda t: t.random_(),
    "random_ to": lambda t: t.random_(2),
    "exponential_": lambda t: t.exponential_(),
    "geometric_": lambda t: t.geometric_(0.5),
    "cauchy_": lambda t: t.cauchy_(),
    "log_normal_": lambda t: t.log_normal_(),
}


def _float_like(t):
    return kiln.float32 if isinstance(t, kiln.Tensor) else torch.float32


@pytest.mark.parametrize("dtype", U.ALL_DTYPES, ids=U.dtype_id)
@pytest.mark.parametrize("name", list(SAMPLERS))
def test_in_place_sampler_dtypes_and_refusals_match_torch(name, dtype):
    """Each sampler on each dtype: torch's refusal (type and message) or a result of that dtype and shape."""
    fn = SAMPLERS[name]
    make = {kiln: lambda: kiln.zeros(3, 4, dtype=dtype), torch: lambda: torch.zeros(3, 4, dtype=U.K2T[dtype])}
    try:
        t_out = fn(make[torch]())
    except Exception:  # noqa: BLE001 - torch refuses this dtype: kiln must, with its message
        U.assert_same_error(lambda: fn(make[kiln]()), lambda: fn(make[torch]()))
        return
    x = make[kiln]()
    k_out = fn(x)
    assert k_out is x and k_out.dtype is dtype and tuple(k_out.shape) == tuple(t_out.shape)


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_samplers_write_through_views_only_where_viewed(name):
    fn = SAMPLERS[name]
    base = kiln.zeros(4, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = fn(base.t()[::2])  # a strided, transposed view
    assert tuple(out.shape) == (3, 4) and out._base is base
    a = base.numpy()
    assert np.all(a[:, 1::2] == 0), "elements outside the view were written"
    v = base.t()[::2].numpy()
    if name not in ("bernoulli_", "bernoulli_ tensor", "random_ to"):  # these may draw zeros everywhere
        assert np.any(v != 0)
    assert base._version == 1  # one write, counted on the shared version counter


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_samplers_on_empty_and_0d_tensors(name):
    fn = SAMPLERS[name]
    assert fn(kiln.empty(0, 3)).shape == (0, 3)
    s = fn(kiln.zeros(()))
    assert s.shape == () and s.dtype is kiln.float32


def test_expanded_self_refused_as_torch():
    for fn in SAMPLERS.values():
        U.assert_same_error(lambda: fn(kiln.zeros(1).expand(3)), lambda: fn(torch.zeros(1).expand(3)))


def test_bernoulli_probability_tensor_broadcast_and_errors():
    kiln.empty(2, 3).bernoulli_(kiln.tensor([0.0, 1.0, 1.0]))  # (3,) broadcast over rows
    out = kiln.empty(2, 3).bernoulli_(kiln.tensor([0.0, 1.0, 1.0]))
    assert out.tolist() == [[0.0, 1.0, 1.0]] * 2
    assert kiln.empty(3, dtype=kiln.int64).bernoulli_(kiln.tensor([0.0, 1.0, 0.0])).tolist() == [0, 1, 0]
    assert kiln.empty(3).bernoulli_(kiln.tensor(1.0)).tolist() == [1.0, 1.0, 1.0]
    U.assert_same_error(
        lambda: kiln.empty(3).bernoulli_(kiln.tensor([0.0, 1.0])),
        lambda: torch.empty(3).bernoulli_(torch.tensor([0.0, 1.0])),
    )
    U.assert_same_error(
        lambda: kiln.empty(3).bernoulli_(kiln.ones(2, 3)), lambda: torch.empty(3).bernoulli_(torch.ones(2, 3))
    )
    U.assert_same_error(
        lambda: kiln.empty(3).bernoulli_(kiln.tensor([0, 1, 1])),
        lambda: torch.empty(3).bernoulli_(torch.tensor([0, 1, 1])),
    )
    p_range = "Expected p_in >= 0 && p_in <= 1 to be true, but got false."  # torch's adds a note to report it
    for bad in ([0.0, 1.0, 2.0], [0.0, float("nan"), 0.5], [-0.1, 0.5, 0.5]):
        U.assert_same_error(
            lambda: kiln.empty(3).bernoulli_(kiln.tensor(bad)),
            lambda: torch.empty(3).bernoulli_(torch.tensor(bad)),
            message=p_range,
        )
        U.assert_same_error(
            lambda: kiln.bernoulli(kiln.tensor(bad)), lambda: torch.bernoulli(torch.tensor(bad)), message=p_range
        )


# ---------------------------------------------------------------------------------------- functional forms: dtypes, shapes


NORMAL_CASES = {
    "T T": lambda L: L.normal(L.zeros(2, 3), L.ones(3)),
    "T T transposed": lambda L: L.normal(L.zeros(2, 3).t(), L.ones(3, 1)),
    "T T empty": lambda L: L.normal(L.zeros(0, 3), L.ones(3)),
    "T T 0-d": lambda L: L.normal(L.zeros(()), L.ones(())),
    "T T float64 mean": lambda L: L.normal(L.zeros(2, dtype=L.float64), L.ones(2)),
    "T T float32 mean float64 std": lambda L: L.normal(L.zeros(2), L.ones(2, dtype=L.float64)),
    "T T int std": lambda L: L.normal(L.zeros(2), L.ones(2, dtype=L.int64)),
    "T T half bfloat16": lambda L: L.normal(L.zeros(2, dtype=L.float16), L.ones(2, dtype=L.bfloat16)),
    "T f": lambda L: L.normal(L.zeros(2, 3), 2.0),
    "T default std": lambda L: L.normal(L.zeros(4)),
    "T f keywords": lambda L: L.normal(mean=L.zeros(2), std=1.0),
    "f T": lambda L: L.normal(1.0, L.ones(2, 3, dtype=L.float64)),
    "int T": lambda L: L.normal(1, L.ones(2)),
    "bool T": lambda L: L.normal(True, L.ones(2)),
    "f f size": lambda L: L.normal(0.0, 1.0, (2, 3)),
    "f f size keyword": lambda L: L.normal(0.0, 1.0, size=(4,)),
    "f f empty size": lambda L: L.normal(0.0, 1.0, []),
    "f f size dtype": lambda L: L.normal(0.5, 1.0, (2,), dtype=L.float16),
    "f f size requires_grad": lambda L: L.normal(0.5, 1.0, (2,), requires_grad=True),
    "0-d tensor mean with size": lambda L: L.normal(L.tensor(0.0), 1.0, (2,)),
    "bernoulli": lambda L: L.bernoulli(L.full((2, 3), 0.5)),
    "bernoulli p": lambda L: L.bernoulli(L.zeros(2, 3), 0.3),
    "bernoulli p keyword": lambda L: L.bernoulli(L.zeros(3), p=0.3),
    "bernoulli int input p": lambda L: L.bernoulli(L.zeros(3, dtype=L.int64), 0.5),
    "bernoulli bool input p": lambda L: L.bernoulli(L.zeros(3, dtype=L.bool), 0.5),
    "bernoulli half": lambda L: L.bernoulli(L.full((3,), 0.5, dtype=L.float16)),
    "bernoulli empty": lambda L: L.bernoulli(L.zeros(0, 2)),
    "bernoulli 0-d": lambda L: L.bernoulli(L.tensor(1.0)),
    "Tensor.bernoulli": lambda L: L.full((2, 2), 0.5, dtype=L.float64).bernoulli(),
    "Tensor.bernoulli p": lambda L: L.ones(2, 2, dtype=L.bool).bernoulli(0.5),
    "poisson": lambda L: L.poisson(L.full((2, 3), 2.0)),
    "poisson float64": lambda L: L.poisson(L.full((3,), 2.0, dtype=L.float64)),
    "poisson half": lambda L: L.poisson(L.full((3,), 2.0, dtype=L.float16)),
    "poisson bfloat16": lambda L: L.poisson(L.full((3,), 2.0, dtype=L.bfloat16)),
    "poisson zeros": lambda L: L.poisson(L.zeros(4)),
    "poisson 0-d": lambda L: L.poisson(L.tensor(3.0)),
    "binomial": lambda L: L.binomial(L.full((2, 3), 5.0), L.full((2, 3), 0.5)),
    "binomial broadcast": lambda L: L.binomial(L.full((2,), 5.0), L.full((3, 1), 0.5)),
    "binomial float64": lambda L: L.binomial(L.full((2,), 5.0, dtype=L.float64), L.full((2,), 0.5, dtype=L.float64)),
}


@pytest.mark.parametrize("name", list(NORMAL_CASES))
def test_functional_samplers_shapes_dtypes_flags_as_torch(name):
    fn = NORMAL_CASES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # binomial's broadcast draws a resize warning from torch
        t = fn(torch)
    k = fn(kiln)
    assert tuple(k.shape) == tuple(t.shape) and k.dtype is U.T2K[t.dtype] and k.requires_grad == t.requires_grad
    if name == "poisson zeros":
        assert k.tolist() == [0.0] * 4


def test_normal_with_zero_std_is_the_mean():
    m = kiln.tensor([1.0, -2.0, float("inf")])
    assert kiln.normal(m, 0.0).tolist() == [1.0, -2.0, float("inf")]
    assert kiln.empty(3).normal_(5.0, 0.0).tolist() == [5.0] * 3


def test_out_argument():
    out = kiln.empty(5)
    with pytest.warns(UserWarning, match="resized"):
        r = kiln.normal(kiln.zeros(2), kiln.ones(2), out=out)
    assert r is out and out.shape == (2,)
    out = kiln.empty(0, dtype=kiln.float64)
    kiln.normal(0.0, 1.0, (3,), out=out)
    assert out.shape == (3,) and out.dtype is kiln.float64
    out = kiln.empty(3)
    assert kiln.bernoulli(kiln.ones(3), out=out) is out and out.tolist() == [1.0, 1.0, 1.0]
    U.assert_same_error(
        lambda: kiln.normal(kiln.zeros(2), kiln.ones(2), out=kiln.empty(2, dtype=kiln.int64)),
        lambda: torch.normal(torch.zeros(2), torch.ones(2), out=torch.empty(2, dtype=torch.int64)),
    )
    with pytest.raises(RuntimeError, match="don't support automatic differentiation"):
        kiln.normal(kiln.zeros(2, requires_grad=True), 1.0, out=kiln.empty(2))


# ---------------------------------------------------------------------------------------- reproducibility


def test_manual_seed_and_generators_reproduce_every_sampler():
    def draw_all(g=None):
        x = kiln.empty(6, dtype=kiln.float64)
        out = [
            x.clone().uniform_(generator=g),
            x.clone().normal_(generator=g),
            x.clone().bernoulli_(0.5, generator=g),
            x.clone().random_(100, generator=g),
            x.clone().exponential_(generator=g),
            x.clone().geometric_(0.3, generator=g),
            x.clone().cauchy_(generator=g),
            x.clone().log_normal_(generator=g),
            kiln.normal(kiln.zeros(6), 1.0, generator=g),
            kiln.normal(0.0, 1.0, (6,), generator=g),
            kiln.bernoulli(kiln.full((6,), 0.5), generator=g),
            kiln.poisson(kiln.full((6,), 3.0), generator=g),
            kiln.binomial(kiln.full((6,), 9.0), kiln.full((6,), 0.5), generator=g),
        ]
        return [t.tolist() for t in out]

    kiln.manual_seed(11)
    a = draw_all()
    kiln.manual_seed(11)
    assert draw_all() == a
    b = draw_all(kiln.Generator().manual_seed(5))
    kiln.manual_seed(11)
    kiln.rand(100)  # the default stream moves; a generator of its own does not
    assert draw_all(kiln.Generator().manual_seed(5)) == b
    assert a != draw_all()  # later draws of the default stream differ


# ---------------------------------------------------------------------------------------- autograd


def test_in_place_samplers_autograd_as_torch():
    for name, fn in SAMPLERS.items():
        if name.startswith("random_") or name == "geometric_":
            continue
        # a leaf that requires grad: refused
        U.assert_same_error(
            lambda: fn(kiln.zeros(3, requires_grad=True)), lambda: fn(torch.zeros(3, requires_grad=True))
        )
        # a non-leaf: overwritten, the old history gets a zero gradient
        kx, tx = kiln.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)
        ky, ty = fn(kx * 2), fn(tx * 2)
        assert ky.requires_grad and ty.requires_grad
        (ky * 3).sum().backward()
        (ty * 3).sum().backward()
        U.assert_close(kx.grad, tx.grad)
    with kiln.no_grad():  # what nn.init does
        leaf = kiln.zeros(3, requires_grad=True)
        leaf.normal_()
    assert leaf.requires_grad and leaf.grad_fn is None and leaf._version == 1


def test_functional_samplers_gradients_as_torch():
    km, tm = U.both(np.array([0.2, -0.4, 1.0]), requires_grad=True)
    ks, ts = U.both(np.array([1.0, 2.0, 0.5]), requires_grad=True)
    for make in (
        lambda L, m, s: L.normal(m, 1.0),
        lambda L, m, s: L.normal(0.0, s),
        lambda L, m, s: L.normal(m, s),
        lambda L, m, s: L.bernoulli(m.sigmoid()),
        lambda L, m, s: L.poisson(s),
    ):
        k, t = make(kiln, km, ks), make(torch, tm, ts)
        assert k.grad_fn.name() == t.grad_fn.name()
        U.check_backward(k, t, [(km, tm), (ks, ts)])
        km.grad = ks.grad = tm.grad = ts.grad = None
    U.assert_same_error(
        lambda: kiln.binomial(ks, kiln.full((3,), 0.5)).sum().backward(),
        lambda: torch.binomial(ts, torch.full((3,), 0.5)).sum().backward(),
    )
    U.assert_same_error(
        lambda: kiln.bernoulli(km.sigmoid(), 0.5).sum().backward(),
        lambda: torch.bernoulli(tm.sigmoid(), 0.5).sum().backward(),
    )


# ---------------------------------------------------------------------------------------- errors

ERRORS = [
    lambda L: L.empty(3).normal_(0, -1),
    lambda L: L.empty(3).normal_(0, float("nan")),
    lambda L: L.empty(3, dtype=L.int64).normal_(0, -1),
    lambda L: L.empty(3).uniform_(2, 1),
    lambda L: L.empty(3).uniform_(float("inf"), 1),
    lambda L: L.empty(3).uniform_(0, float("nan")),
    lambda L: L.empty(3).uniform_(-3e38, 3e38),
    lambda L: L.empty(3, dtype=L.float16).uniform_(-70000, 70000),
    lambda L: L.empty(3, dtype=L.float16).uniform_(-60000, 60000),
    lambda L: L.empty(3, dtype=L.int64).uniform_(2, 1),
    lambda L: L.empty(3).bernoulli_(1.5),
    lambda L: L.empty(3).bernoulli_(-0.5),
    lambda L: L.empty(3).bernoulli_(float("nan")),
    lambda L: L.zeros(3).bernoulli(1.3),
    lambda L: L.empty(3).exponential_(-1),
    lambda L: L.empty(3).exponential_(0),
    lambda L: L.empty(3).exponential_(float("nan")),
    lambda L: L.empty(3, dtype=L.int64).exponential_(),
    lambda L: L.empty(3, dtype=L.bool).exponential_(),
    lambda L: L.empty(3).geometric_(1.5),
    lambda L: L.empty(3).geometric_(0),
    lambda L: L.empty(3).geometric_(1),
    lambda L: L.empty(3, dtype=L.bool).geometric_(0.5),
    lambda L: L.empty(3, dtype=L.bool).geometric_(1.5),
    lambda L: L.empty(3).cauchy_(0, -1),
    lambda L: L.empty(3).cauchy_(0, 0),
    lambda L: L.empty(3, dtype=L.int64).cauchy_(),
    lambda L: L.empty(3, dtype=L.int32).cauchy_(),
    lambda L: L.empty(3, dtype=L.int16).cauchy_(),
    lambda L: L.empty(3, dtype=L.bool).cauchy_(),
    lambda L: L.empty(3).log_normal_(1, -1),
    lambda L: L.empty(3).log_normal_(1, 0),
    lambda L: L.empty(3, dtype=L.int64).log_normal_(),
    lambda L: L.empty(3).random_(5, 3),
    lambda L: L.empty(3).random_(5, 5),
    lambda L: L.empty(3).random_(-5),
    lambda L: L.empty(3).random_(0),
    lambda L: L.empty(3, dtype=L.uint8).random_(-1, 3),
    lambda L: L.empty(3, dtype=L.uint8).random_(0, 300),
    lambda L: L.empty(3, dtype=L.uint8).random_(500, 3),
    lambda L: L.empty(3, dtype=L.uint8).random_(-5, None),
    lambda L: L.empty(3, dtype=L.int8).random_(-129, 3),
    lambda L: L.empty(3, dtype=L.int16).random_(-40000, 3),
    lambda L: L.empty(3, dtype=L.int32).random_(2**40),
    lambda L: L.empty(3, dtype=L.bool).random_(0, 3),
    lambda L: L.empty(3, dtype=L.float32).random_(2**30, None),
    lambda L: L.empty(3, dtype=L.int64).random_(2**63),
    lambda L: L.normal(L.zeros(3), -1.0),
    lambda L: L.normal(L.zeros(3), L.tensor([1.0, -1.0, 0.0])),
    lambda L: L.normal(0.0, L.tensor([1.0, -1.0, 0.0])),
    lambda L: L.normal(0.0, -1.0, (3,)),
    lambda L: L.normal(0.0, 1.0, (3,), dtype=L.int64),
    lambda L: L.normal(L.zeros(2), L.ones(3)),
    lambda L: L.normal(L.zeros(2, dtype=L.int64), L.ones(2)),
    lambda L: L.normal(L.zeros(2, dtype=L.int64), 1.0),
    lambda L: L.normal(1.0, L.ones(2, dtype=L.int64)),
    lambda L: L.normal("a", L.ones(2)),
    lambda L: L.normal(L.ones(2), std=None),
    lambda L: L.bernoulli(L.tensor([0, 1, 1])),
    lambda L: L.tensor([0.0, 1.0]).bernoulli(L.tensor([0.5, 0.5])),
    lambda L: L.poisson(L.tensor([1.0, 2.0, -1.0])),
    lambda L: L.poisson(L.tensor([float("nan")])),
    lambda L: L.poisson(L.tensor([1, 2])),
    lambda L: L.binomial(L.tensor([10, 5]), L.tensor([0.5, 0.2])),
    lambda L: L.binomial(L.ones(2), L.ones(2, dtype=L.int64)),
    lambda L: L.binomial(L.tensor([10.0, 5.0]), L.tensor([0.5, 0.2]).double()),
    lambda L: L.binomial(L.ones(2, dtype=L.float16), L.ones(2, dtype=L.float16)),
    lambda L: L.binomial(L.ones(2), 0.5),
    lambda L: L.binomial(L.ones(2), L.ones(3)),
]


@pytest.mark.parametrize("i", range(len(ERRORS)))
def test_errors_match_torch(i):
    fn = ERRORS[i]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exc = U.torch_error(lambda: fn(torch))
        if isinstance(exc, TypeError) and "received an invalid combination" in str(exc):
            with pytest.raises(TypeError):  # PyTorch's overload listing: the type only
                fn(kiln)
            return
        U.assert_same_error(lambda: fn(kiln), lambda: fn(torch))


def test_random_float_range_warnings_as_torch():
    for args, dtype in (((0, 2**25), "float32"), ((0, 2**12), "float16"), ((-(2**60), 5), "float64")):
        for lib in (kiln, torch):
            with pytest.warns(UserWarning, match=r"is out of bounds \[-\(2\^\d+\), 2\^\d+\]. Due to precision"):
                lib.empty(3, dtype=getattr(lib, dtype)).random_(*args)


# ---------------------------------------------------------------------------------------- signatures


def _params(fn) -> list[tuple[str, str, object]]:
    sig = inspect.signature(fn)
    return [(p.name, p.kind.name, p.default) for p in sig.parameters.values()]


KW = "KEYWORD_ONLY"
POS = "POSITIONAL_OR_KEYWORD"
SIGNATURES = {  # torch's documented signatures (its builtins expose none); "from" is spelled from_ in Python
    "uniform_": [("self", POS, inspect._empty), ("from_", POS, 0.0), ("to", POS, 1.0), ("generator", KW, None)],
    "normal_": [("self", POS, inspect._empty), ("mean", POS, 0.0), ("std", POS, 1.0), ("generator", KW, None)],
    "bernoulli_": [("self", POS, inspect._empty), ("p", POS, 0.5), ("generator", KW, None)],
    "exponential_": [("self", POS, inspect._empty), ("lambd", POS, 1.0), ("generator", KW, None)],
    "geometric_": [("self", POS, inspect._empty), ("p", POS, inspect._empty), ("generator", KW, None)],
    "cauchy_": [("self", POS, inspect._empty), ("median", POS, 0.0), ("sigma", POS, 1.0), ("generator", KW, None)],
    "log_normal_": [("self", POS, inspect._empty), ("mean", POS, 1.0), ("std", POS, 2.0), ("generator", KW, None)],
    "bernoulli": [("self", POS, inspect._empty), ("p", POS, None), ("generator", KW, None)],
}


@pytest.mark.parametrize("name", list(SIGNATURES))
def test_method_signatures(name):
    params = [p for p in _params(getattr(kiln.Tensor, name)) if p[1] != "VAR_KEYWORD"]
    assert params == SIGNATURES[name]


def test_function_signatures():
    assert [p[0] for p in _params(kiln.normal)][:3] == ["mean", "std", "size"]
    assert _params(kiln.normal)[1][2] == 1.0 and ("generator", KW, None) in _params(kiln.normal)
    assert ("out", KW, None) in _params(kiln.normal)
    assert _params(kiln.bernoulli) == [
        ("input", POS, inspect._empty),
        ("p", POS, None),
        ("generator", KW, None),
        ("out", KW, None),
    ]
    assert [p[:2] for p in _params(kiln.poisson)][:2] == [("input", POS), ("generator", POS)]
    assert [p[0] for p in _params(kiln.binomial)][:3] == ["count", "prob", "generator"]
    # random_'s overloads (from, to) cannot be one Python signature: it takes them positionally or by keyword
    assert "generator" in inspect.signature(kiln.Tensor.random_).parameters


def test_torch_schemas_name_the_same_parameters():
    """The parameter names of PyTorch's schemas (``self`` is kiln's ``input``) are kiln's, in order."""
    for name, fn in (("poisson", kiln.poisson), ("binomial", kiln.binomial)):
        (schema,) = [s for s in torch._C._jit_get_schemas_for_operator(f"aten::{name}") if not s.overload_name]
        names = ["input" if a.name == "self" else a.name for a in schema.arguments]
        assert [p[0] for p in _params(fn)][: len(names)] == names
