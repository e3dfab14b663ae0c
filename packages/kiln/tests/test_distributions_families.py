"""kiln.distributions against torch.distributions: every other family, from one table.

Each entry builds the same distribution in both libraries from float64 parameters (one of them
broadcast against the other where there are two) for several batch shapes, with scalar numbers too,
and checks log_prob on PyTorch's own samples (so on values in the support, with sample dimensions),
cdf/icdf where PyTorch has them (and ``NotImplementedError`` where it has not), entropy, the moments,
the gradients of log_prob and entropy, sample shapes and supports, expand(), enumerate_support(),
seeded sample statistics, and one invalid parameter per family (same ``ValueError`` and message).
Reparameterised samples are checked against the gradient their CDF implies (univariate families)
or by gradcheck of the seeded sample map in float64.
"""

from __future__ import annotations

import math

import kiln_testutil as U
import numpy as np
import pytest
import torch
import torch.distributions as TD

import kiln
import kiln.distributions as KD

pytestmark = pytest.mark.filterwarnings("ignore:.*does not define.*:UserWarning")


def pos(r, shape, low=0.5, high=2.0):
    return r.uniform(low, high, size=shape)


def unit(r, shape):
    return r.uniform(0.1, 0.9, size=shape)


def last(shape):
    """The rightmost dimension of a batch shape (the shape a broadcast second parameter gets)."""
    return shape[-1:]


# name -> (parameters for a batch shape, an invalid set of parameters (numbers or lists))
CASES = {
    "Laplace": (lambda r, b: (r.normal(size=b), pos(r, last(b))), (0.0, -1.0)),
    "Cauchy": (lambda r, b: (r.normal(size=b), pos(r, last(b))), (0.0, 0.0)),
    "Exponential": (lambda r, b: (pos(r, b),), ([1.0, -2.0],)),
    "Gumbel": (lambda r, b: (r.normal(size=b), pos(r, last(b))), (0.0, -1.0)),
    "LogNormal": (lambda r, b: (r.normal(size=b) * 0.5, pos(r, last(b), 0.3, 1.0)), (0.0, -1.0)),
    "HalfNormal": (lambda r, b: (pos(r, b),), (-1.0,)),
    "HalfCauchy": (lambda r, b: (pos(r, b),), ([-1.0],)),
    "Gamma": (lambda r, b: (pos(r, b, 0.5, 4.0), pos(r, last(b))), ([1.0, -1.0], 1.0)),
    "Chi2": (lambda r, b: (pos(r, b, 1.0, 6.0),), (-2.0,)),
    "InverseGamma": (lambda r, b: (pos(r, b, 2.5, 6.0), pos(r, last(b))), (1.0, -1.0)),
    "Beta": (lambda r, b: (pos(r, b, 0.5, 4.0), pos(r, last(b), 0.5, 4.0)), (0.0, 1.0)),
    "Kumaraswamy": (lambda r, b: (pos(r, b, 0.8, 3.0), pos(r, last(b), 0.8, 3.0)), (1.0, -1.0)),
    "StudentT": (lambda r, b: (pos(r, b, 2.5, 8.0), r.normal(size=last(b)), pos(r, last(b))), (-1.0,)),
    "FisherSnedecor": (lambda r, b: (pos(r, b, 1.0, 6.0), pos(r, last(b), 5.0, 10.0)), (1.0, 0.0)),
    "Pareto": (lambda r, b: (pos(r, b), pos(r, last(b), 4.5, 6.0)), (1.0, -1.0)),
    "Weibull": (lambda r, b: (pos(r, b), pos(r, last(b), 0.8, 3.0)), (-1.0, 1.0)),
    "Poisson": (lambda r, b: (pos(r, b, 0.5, 8.0),), ([-1.0],)),
    "Geometric": (lambda r, b: (unit(r, b),), ([0.5, 1.5],)),
    "ContinuousBernoulli": (lambda r, b: (unit(r, b),), ([math.nan],)),
    "Dirichlet": (lambda r, b: (pos(r, b + (4,), 0.5, 3.0),), ([[1.0, -1.0]],)),
    "LogisticNormal": (lambda r, b: (r.normal(size=b + (3,)), pos(r, (3,))), ([0.0, 0.0], [1.0, -1.0])),
    "LowRankMultivariateNormal": (
        lambda r, b: (r.normal(size=b + (3,)), r.normal(size=(3, 2)), pos(r, (3,))),
        ([0.0, 0.0], [[1.0], [1.0]], [1.0, -1.0]),
    ),
}


def _kw(name, r, b):
    """Keyword parameters of the entries that take ``probs``/``logits``/``temperature`` (or a count)."""
    if name == "Binomial":
        return dict(total_count=r.integers(1, 8, size=b).astype(np.float64), probs=unit(r, b))
    if name == "BinomialLogits":
        return dict(total_count=np.full(b, 5.0), logits=r.normal(size=b))
    if name == "NegativeBinomial":
        return dict(total_count=pos(r, b, 0.5, 5.0), probs=unit(r, last(b)))
    if name == "NegativeBinomialLogits":
        return dict(total_count=pos(r, b, 0.5, 5.0), logits=r.normal(size=last(b)))
    if name == "GeometricLogits":
        return dict(logits=r.normal(size=b))
    if name == "ContinuousBernoulliLogits":
        return dict(logits=r.normal(size=b) * 3)
    if name == "Multinomial":
        return dict(total_count=5, probs=pos(r, b + (4,)))
    if name == "MultinomialLogits":
        return dict(total_count=3, logits=r.normal(size=b + (4,)))
    if name == "RelaxedBernoulli":
        return dict(temperature=np.array(0.7), probs=unit(r, b))
    if name == "RelaxedBernoulliLogits":
        return dict(temperature=pos(r, last(b)), logits=r.normal(size=b))
    if name == "RelaxedOneHotCategorical":
        return dict(temperature=np.array(0.5), probs=pos(r, b + (4,)))
    if name == "RelaxedOneHotCategoricalLogits":
        return dict(temperature=np.asarray(pos(r, ())), logits=r.normal(size=b + (4,)))
    if name == "OneHotCategorical":
        return dict(probs=pos(r, b + (4,)))
    if name == "OneHotCategoricalStraightThrough":
        return dict(logits=r.normal(size=b + (4,)))
    raise KeyError(name)


KW_CASES = {
    "Binomial": "Binomial",
    "BinomialLogits": "Binomial",
    "NegativeBinomial": "NegativeBinomial",
    "NegativeBinomialLogits": "NegativeBinomial",
    "GeometricLogits": "Geometric",
    "ContinuousBernoulliLogits": "ContinuousBernoulli",
    "Multinomial": "Multinomial",
    "MultinomialLogits": "Multinomial",
    "RelaxedBernoulli": "RelaxedBernoulli",
    "RelaxedBernoulliLogits": "RelaxedBernoulli",
    "RelaxedOneHotCategorical": "RelaxedOneHotCategorical",
    "RelaxedOneHotCategoricalLogits": "RelaxedOneHotCategorical",
    "OneHotCategorical": "OneHotCategorical",
    "OneHotCategoricalStraightThrough": "OneHotCategoricalStraightThrough",
}
NAMES = sorted(CASES) + sorted(KW_CASES)
BATCHES = [(), (3,), (2, 3)]
# parameters that are integers in meaning: not differentiated
NOT_DIFFERENTIABLE = {"total_count"}


def build(name, batch, seed=0, requires_grad=True, dtype=torch.float64):
    """(torch distribution, kiln distribution, torch leaves, kiln leaves) for a table entry."""
    r = np.random.default_rng(seed)
    if name in CASES:
        args = CASES[name][0](r, batch)
        t_args = [torch.tensor(np.asarray(a), dtype=dtype).requires_grad_(requires_grad) for a in args]
        k_args = [U.to_kiln(t.detach(), requires_grad=requires_grad) for t in t_args]
        return getattr(TD, name)(*t_args), getattr(KD, name)(*k_args), t_args, k_args
    cls = KW_CASES[name]
    kw = _kw(name, r, batch)
    t_kw, k_kw = {}, {}
    for key, v in kw.items():
        if isinstance(v, (np.ndarray, np.floating)):
            grad = requires_grad and key not in NOT_DIFFERENTIABLE
            t_kw[key] = torch.tensor(np.asarray(v), dtype=dtype).requires_grad_(grad)
            k_kw[key] = U.to_kiln(t_kw[key].detach(), requires_grad=grad)
        else:
            t_kw[key] = k_kw[key] = v
    t_leaves = [v for v in t_kw.values() if isinstance(v, torch.Tensor) and v.requires_grad]
    k_leaves = [v for v in k_kw.values() if isinstance(v, kiln.Tensor) and v.requires_grad]
    return getattr(TD, cls)(**t_kw), getattr(KD, cls)(**k_kw), t_leaves, k_leaves


def close(k, t, what, rtol=1e-8, atol=1e-10):
    U.assert_close(k, t, rtol=rtol, atol=atol, msg=f"{what}: ")


def grads_close(k_out, t_out, k_leaves, t_leaves, what):
    if not t_out.requires_grad:
        return
    try:
        tg = torch.autograd.grad(t_out.sum(), t_leaves, allow_unused=True, retain_graph=True)
    except NotImplementedError:  # Gamma.cdf in its concentration (igamma's): kiln refuses as PyTorch does
        U.assert_same_error(
            lambda: kiln.autograd.grad(k_out.sum(), k_leaves, allow_unused=True, retain_graph=True),
            lambda: torch.autograd.grad(t_out.sum(), t_leaves, allow_unused=True, retain_graph=True),
            exact=True,
        )
        return
    kg = kiln.autograd.grad(k_out.sum(), k_leaves, allow_unused=True, retain_graph=True)
    for i, (a, b) in enumerate(zip(kg, tg)):
        if b is None:
            assert a is None or not np.any(U.kiln_to_np(a)), f"{what}: grad {i} should be None or zero"
        else:
            close(a, b, f"{what} grad {i}", rtol=1e-7, atol=1e-9)


def torch_or_not_implemented(fn):
    """``fn()`` or the NotImplementedError it raised."""
    try:
        return fn()
    except NotImplementedError as e:
        return e


# ---------------------------------------------------------------------------------------- values


@pytest.mark.parametrize("batch", BATCHES, ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_values_and_gradients(name, batch):
    td, kd, tl, kl = build(name, batch)
    assert type(kd).__name__ == type(td).__name__
    assert tuple(kd.batch_shape) == tuple(td.batch_shape) and tuple(kd.event_shape) == tuple(td.event_shape)
    torch.manual_seed(0)
    x = td.sample((3,))  # values in the support, with a sample dimension
    kx = U.to_kiln(x)
    close(kd.log_prob(kx), td.log_prob(x), "log_prob")
    grads_close(kd.log_prob(kx), td.log_prob(x), kl, tl, "log_prob")
    q = torch.rand(tuple(td.batch_shape), dtype=torch.float64) * 0.9 + 0.05
    for what, kf, tf in [
        ("entropy", kd.entropy, td.entropy),
        ("cdf", lambda: kd.cdf(kx), lambda: td.cdf(x)),
        ("icdf", lambda: kd.icdf(U.to_kiln(q)), lambda: td.icdf(q)),
    ]:
        expected = torch_or_not_implemented(tf)
        if isinstance(expected, NotImplementedError):
            with pytest.raises(NotImplementedError):
                kf()
            continue
        got = kf()
        close(got, expected, what, rtol=1e-6 if name.startswith("Multinomial") else 1e-8)
        grads_close(got, expected, kl, tl, what)
    for prop in ("mean", "mode", "variance", "stddev"):
        expected = torch_or_not_implemented(lambda prop=prop: getattr(td, prop))
        if isinstance(expected, NotImplementedError):
            with pytest.raises(NotImplementedError):
                getattr(kd, prop)
        else:
            close(getattr(kd, prop), expected, prop)


@pytest.mark.parametrize(
    "name,args",
    [
        ("Laplace", (0.5, 2.0)),
        ("Cauchy", (0.5, 2.0)),
        ("Exponential", (1.5,)),
        ("Gumbel", (0.5, 2.0)),
        ("LogNormal", (0.5, 0.7)),
        ("HalfNormal", (1.5,)),
        ("HalfCauchy", (1.5,)),
        ("Gamma", (2.5, 1.5)),
        ("Chi2", (3.0,)),
        ("Beta", (2.0, 3.0)),
        ("Kumaraswamy", (2.0, 3.0)),
        ("StudentT", (4.0, 1.0, 2.0)),
        ("FisherSnedecor", (3.0, 7.0)),
        ("Pareto", (1.0, 5.0)),
        ("Weibull", (1.0, 2.0)),
        ("Poisson", (3.0,)),
        ("Geometric", (0.3,)),
        ("ContinuousBernoulli", (0.3,)),
        ("InverseGamma", (3.0, 2.0)),
    ],
)
def test_scalar_parameters(name, args):
    td, kd = getattr(TD, name)(*args), getattr(KD, name)(*args)
    assert tuple(kd.batch_shape) == tuple(td.batch_shape)
    torch.manual_seed(1)
    x = td.sample((4,))
    close(kd.log_prob(U.to_kiln(x)), td.log_prob(x), "log_prob", rtol=1e-6, atol=1e-6)
    assert kd.sample().dtype is U.T2K[td.sample().dtype]
    assert tuple(kd.sample((2,)).shape) == tuple(td.sample((2,)).shape)


@pytest.mark.parametrize("name", ["Laplace", "Gamma", "Beta", "StudentT", "Dirichlet", "LowRankMultivariateNormal"])
def test_float32_parameters(name):
    td, kd, _, _ = build(name, (3,), dtype=torch.float32, requires_grad=False)
    torch.manual_seed(2)
    x = td.sample((2,))
    got = kd.log_prob(U.to_kiln(x))
    assert got.dtype is kiln.float32
    close(got, td.log_prob(x), "float32 log_prob", rtol=2e-5, atol=1e-5)
    assert kd.sample((2,)).dtype is kiln.float32


def test_generalized_pareto():
    """In float32 only: PyTorch's GeneralizedPareto compares its concentration with a float32 zero."""
    r = np.random.default_rng(3)
    loc, scale, conc = r.normal(size=(3,)), pos(r, (3,)), np.array([-0.3, 0.0, 0.4])
    t = [torch.tensor(a, dtype=torch.float32, requires_grad=True) for a in (loc, scale, conc)]
    k = [U.to_kiln(a.detach(), requires_grad=True) for a in t]
    td, kd = TD.GeneralizedPareto(*t), KD.GeneralizedPareto(*k)
    torch.manual_seed(3)
    x = td.sample((4,))
    kx = U.to_kiln(x)
    tol = dict(rtol=1e-5, atol=1e-5)
    for what, kv, tv in [
        ("log_prob", kd.log_prob(kx), td.log_prob(x)),
        ("cdf", kd.cdf(kx), td.cdf(x)),
        ("icdf", kd.icdf(kiln.tensor([0.1, 0.5, 0.9])), td.icdf(torch.tensor([0.1, 0.5, 0.9]))),
        ("entropy", kd.entropy(), td.entropy()),
        ("log_survival_function", kd.log_survival_function(kx), td.log_survival_function(x)),
    ]:
        close(kv, tv, what, **tol)
        tg = torch.autograd.grad(tv.sum(), t, allow_unused=True, retain_graph=True)
        kg = kiln.autograd.grad(kv.sum(), k, allow_unused=True, retain_graph=True)
        for a, b in zip(kg, tg):
            if b is not None:
                close(a, b, what + " grad", rtol=1e-4, atol=1e-5)
    for prop in ("mean", "variance", "mode"):
        close(getattr(kd, prop), getattr(td, prop), prop, **tol)
    close(kd.support.upper_bound, td.support.upper_bound, "support bound", **tol)


def test_lkj_cholesky():
    for dim, conc in [(2, 0.5), (3, torch.tensor([1.0, 2.5], dtype=torch.float64)), (4, 3.0)]:
        kconc = U.to_kiln(conc) if isinstance(conc, torch.Tensor) else conc
        td, kd = TD.LKJCholesky(dim, conc), KD.LKJCholesky(dim, kconc)
        assert tuple(kd.batch_shape) == tuple(td.batch_shape) and tuple(kd.event_shape) == (dim, dim)
        torch.manual_seed(4)
        x = td.sample((3,))
        close(kd.log_prob(U.to_kiln(x)), td.log_prob(x), f"LKJ {dim}", rtol=1e-6, atol=1e-6)
        kiln.manual_seed(4)
        s = kd.sample((5,))
        assert tuple(s.shape) == (5,) + tuple(td.batch_shape) + (dim, dim)
        assert bool(kd.support.check(s).all())
        ke = kd.expand((2,) + tuple(kd.batch_shape))
        assert tuple(ke.sample().shape) == (2,) + tuple(kd.batch_shape) + (dim, dim)
    U.assert_same_error(lambda: KD.LKJCholesky(1), lambda: TD.LKJCholesky(1), exact=True)


# ---------------------------------------------------------------------------------------- shapes, support


@pytest.mark.parametrize("sample_shape", [(), (5,), (2, 3)], ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_sample_shapes_dtypes_and_support(name, sample_shape):
    td, kd, _, _ = build(name, (2, 3))
    kiln.manual_seed(5)
    torch.manual_seed(5)
    expected = td.sample(sample_shape)
    got = kd.sample(sample_shape)
    assert tuple(got.shape) == tuple(expected.shape) and got.dtype is U.T2K[expected.dtype]
    assert not got.requires_grad
    assert bool(kd.support.check(got).all()), f"{name} drew values outside its support"
    assert kd.has_rsample == td.has_rsample and kd.has_enumerate_support == td.has_enumerate_support
    if kd.has_rsample:
        assert tuple(kd.rsample(sample_shape).shape) == tuple(expected.shape)
    else:
        with pytest.raises(NotImplementedError):
            kd.rsample(sample_shape)
    if td.has_enumerate_support:
        for expand in (True, False):
            expected = torch_or_not_implemented(lambda expand=expand: td.enumerate_support(expand))
            if isinstance(expected, NotImplementedError):  # a Binomial of several total counts
                U.assert_same_error(
                    lambda expand=expand: kd.enumerate_support(expand),
                    lambda expand=expand: td.enumerate_support(expand),
                    exact=True,
                )
            else:
                close(kd.enumerate_support(expand), expected, "support")


@pytest.mark.parametrize("name", NAMES)
def test_expand(name):
    td, kd, _, _ = build(name, (3,))
    te, ke = td.expand((2, 3)), kd.expand((2, 3))
    assert type(ke) is type(kd) and tuple(ke.batch_shape) == tuple(te.batch_shape) == (2, 3)
    assert tuple(ke.event_shape) == tuple(te.event_shape)
    torch.manual_seed(6)
    x = te.sample((2,))
    close(ke.log_prob(U.to_kiln(x)), te.log_prob(x), "expanded log_prob")
    assert tuple(ke.sample((4,)).shape) == tuple(te.sample((4,)).shape)
    assert ke._validate_args == kd._validate_args
    if ke.has_rsample:
        assert tuple(ke.rsample().shape) == tuple(te.rsample().shape)


# ---------------------------------------------------------------------------------------- statistics

# the families whose mean and variance a sample of 20000 estimates well (finite fourth moments)
STATISTICS = [
    ("Laplace", (0.5, 2.0)),
    ("Exponential", (1.5,)),
    ("Gumbel", (0.5, 2.0)),
    ("LogNormal", (0.2, 0.4)),
    ("HalfNormal", (1.5,)),
    ("Gamma", (2.5, 1.5)),
    ("Gamma", (0.3, 2.0)),
    ("Chi2", (3.0,)),
    ("Beta", (2.0, 3.0)),
    ("Beta", (0.4, 0.6)),
    ("Kumaraswamy", (2.0, 3.0)),
    ("StudentT", (9.0, 1.0, 2.0)),
    ("FisherSnedecor", (6.0, 12.0)),
    ("Pareto", (1.0, 9.0)),
    ("Weibull", (1.0, 2.0)),
    ("Poisson", (3.0,)),
    ("Poisson", (250.0,)),
    ("Geometric", (0.3,)),
    ("ContinuousBernoulli", (0.3,)),
    ("InverseGamma", (9.0, 2.0)),
    ("Binomial", (10, 0.3)),
    ("NegativeBinomial", (4.0, 0.4)),
    ("Uniform", (-1.0, 3.0)),
]


@pytest.mark.parametrize("name,args", STATISTICS, ids=[f"{n}{a}" for n, a in STATISTICS])
def test_sample_statistics(name, args):
    n = 20000
    targs = [torch.tensor(float(a), dtype=torch.float64) for a in args]
    kargs = [U.to_kiln(a) for a in targs]
    td, kd = getattr(TD, name)(*targs), getattr(KD, name)(*kargs)
    kiln.manual_seed(7)
    s = U.kiln_to_np(kd.sample((n,))).astype(np.float64)
    mean, var = td.mean.item(), td.variance.item()
    assert abs(s.mean() - mean) < 5 * math.sqrt(var / n), f"{name}: sample mean {s.mean()} vs {mean}"
    assert abs(s.var() - var) < 0.08 * var, f"{name}: sample variance {s.var()} vs {var}"
    if kd.has_rsample:
        kiln.manual_seed(7)
        np.testing.assert_array_equal(U.kiln_to_np(kd.rsample((n,)).detach()), s)  # the same stream


@pytest.mark.parametrize("name", ["Dirichlet", "Multinomial", "OneHotCategorical", "LowRankMultivariateNormal"])
def test_multivariate_sample_statistics(name):
    td, kd, _, _ = build(name, ())
    kiln.manual_seed(8)
    s = U.kiln_to_np(kd.sample((20000,))).astype(np.float64)
    mean, var = U.torch_to_np(td.mean), U.torch_to_np(td.variance)
    assert (np.abs(s.mean(0) - mean) < 5 * np.sqrt(var / 20000)).all(), name
    np.testing.assert_allclose(s.var(0), var, rtol=0.08)
    if name == "LowRankMultivariateNormal":
        np.testing.assert_allclose(np.cov(s.T), U.torch_to_np(td.covariance_matrix), atol=0.1)


def test_samples_are_reproducible_under_manual_seed():
    for name in NAMES:
        _, kd, _, _ = build(name, (3,))
        kiln.manual_seed(9)
        a = U.kiln_to_np(kd.sample((4,)))
        kiln.manual_seed(9)
        np.testing.assert_array_equal(U.kiln_to_np(kd.sample((4,))), a, err_msg=name)


# ---------------------------------------------------------------------------------------- rsample gradients


IMPLIED = [
    ("Laplace", (np.array([0.3, -1.0]), np.array([1.5, 0.7]))),
    ("Cauchy", (np.array([0.3, -1.0]), np.array([1.5, 0.7]))),
    ("Exponential", (np.array([0.4, 2.0]),)),
    ("Gumbel", (np.array([0.3, -1.0]), np.array([1.5, 0.7]))),
    ("LogNormal", (np.array([0.3, -1.0]), np.array([0.5, 0.7]))),
    ("HalfNormal", (np.array([0.4, 2.0]),)),
    ("HalfCauchy", (np.array([0.4, 2.0]),)),
    ("Pareto", (np.array([0.4, 2.0]), np.array([1.5, 3.0]))),
    ("Weibull", (np.array([0.4, 2.0]), np.array([1.5, 3.0]))),
    ("Kumaraswamy", (np.array([0.6, 2.0]), np.array([1.5, 3.0]))),
    ("ContinuousBernoulli", (np.array([0.2, 0.7]),)),
]


@pytest.mark.parametrize("name,args", IMPLIED, ids=[n for n, _ in IMPLIED])
def test_rsample_gradient_is_the_one_the_cdf_implies(name, args):
    """``dx/dθ = -(∂F/∂θ)(x) / f(x)`` at kiln's samples ``x``, by PyTorch's autograd on its own cdf and
    density: the gradient of every quantile-preserving reparameterisation."""
    t = [torch.tensor(a).requires_grad_() for a in args]
    k = [U.to_kiln(a.detach(), requires_grad=True) for a in t]
    kiln.manual_seed(10)
    x = getattr(KD, name)(*k).rsample((30,))
    assert x.requires_grad
    kg = kiln.autograd.grad(x.sum(), k)
    td = getattr(TD, name)(*t)
    tx = U.to_torch(x.detach())
    density = td.log_prob(tx).exp().detach()
    tg = torch.autograd.grad(td.cdf(tx), t, grad_outputs=1 / density)
    for a, b in zip(kg, tg):
        close(a, -b, f"{name} rsample grad", rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize(
    "name",
    [
        "RelaxedBernoulli",
        "RelaxedBernoulliLogits",
        "RelaxedOneHotCategorical",
        "RelaxedOneHotCategoricalLogits",
        "LowRankMultivariateNormal",
        "LogisticNormal",
    ],
)
def test_rsample_gradcheck_on_fixed_noise(name):
    """With the noise fixed by the seed, ``rsample`` is a smooth function of the parameters: gradcheck it
    in float64."""
    _, _, _, kl = build(name, (2,))
    cls = type(build(name, (2,))[1])
    keys = list(_kw(name, np.random.default_rng(0), (2,))) if name in KW_CASES else None

    def sample(*params):
        kiln.manual_seed(11)
        d = cls(**dict(zip([k for k in keys if k not in NOT_DIFFERENTIABLE], params))) if keys else cls(*params)
        return d.rsample((3,))

    assert kiln.autograd.gradcheck(sample, tuple(kl), eps=1e-6, atol=1e-5, rtol=1e-4)


def test_straight_through_gradient_matches_torch():
    """The straight-through sample's gradient is that of ``probs`` times the number of samples, whatever
    the samples are: the same as PyTorch's for the same weights."""
    r = np.random.default_rng(16)
    logits, w = r.normal(size=(2, 4)), r.normal(size=(4,))
    t = torch.tensor(logits, requires_grad=True)
    k = U.to_kiln(t.detach(), requires_grad=True)
    kiln.manual_seed(16)
    ks = KD.OneHotCategoricalStraightThrough(logits=k).rsample((5,))
    ts = TD.OneHotCategoricalStraightThrough(logits=t).rsample((5,))
    assert tuple(ks.shape) == tuple(ts.shape) and ((ks == 0) | (ks == 1)).all().item()
    (kg,) = kiln.autograd.grad((ks * kiln.tensor(w)).sum(), [k])
    (tg,) = torch.autograd.grad((ts * torch.tensor(w)).sum(), [t])
    close(kg, tg, "straight-through grad")


# ---------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize("name", sorted(CASES))
def test_invalid_parameters_raise_torchs_value_error(name):
    bad = CASES[name][1]

    def args(lib):
        return [lib.tensor(a, dtype=lib.float64) if isinstance(a, list) else a for a in bad]

    U.assert_same_error(lambda: getattr(KD, name)(*args(kiln)), lambda: getattr(TD, name)(*args(torch)), exact=True)


@pytest.mark.parametrize(
    "name,kw",
    [
        ("Binomial", dict(total_count=[2.0, 3.5], probs=[0.5, 0.5])),
        ("Binomial", dict(total_count=[2.0], probs=[1.5])),
        ("NegativeBinomial", dict(total_count=[-1.0], probs=[0.5])),
        ("NegativeBinomial", dict(total_count=[1.0], probs=[1.0])),
        ("Multinomial", dict(total_count=3, probs=[0.5, -0.5])),
        ("RelaxedBernoulli", dict(temperature=[0.5], probs=[1.5])),
        ("RelaxedOneHotCategorical", dict(temperature=[0.5], probs=[0.5, -0.5])),
        ("OneHotCategorical", dict(probs=[0.5, -0.5])),
        ("Geometric", dict(probs=[0.0, 0.5])),
        ("ContinuousBernoulli", dict(probs=[1.5], validate_args=True)),
    ],
)
def test_invalid_keyword_parameters(name, kw):
    def make(lib, mod):
        return getattr(mod, name)(**{k: lib.tensor(v) if isinstance(v, list) else v for k, v in kw.items()})

    U.assert_same_error(lambda: make(kiln, KD), lambda: make(torch, TD), exact=True)


def test_value_outside_support():
    cases = [
        ("Exponential", (1.0,), -1.0),
        ("Poisson", (1.0,), 0.5),
        ("Beta", (1.0, 1.0), 1.5),
        ("Binomial", (3, 0.5), 4.0),
        ("Dirichlet", ([1.0, 1.0],), [0.3, 0.3]),
        ("Pareto", (2.0, 1.0), 1.0),
    ]
    for name, args, value in cases:

        def score(lib, mod, name=name, args=args, value=value):
            a = [lib.tensor(x) if isinstance(x, list) else x for x in args]
            return getattr(mod, name)(*a).log_prob(lib.tensor(value))

        U.assert_same_error(lambda score=score: score(kiln, KD), lambda score=score: score(torch, TD), exact=True)


def test_structural_errors():
    pairs = [
        (lambda: KD.Dirichlet(kiln.tensor(1.0)), lambda: TD.Dirichlet(torch.tensor(1.0))),
        (lambda: KD.Multinomial(kiln.tensor(3), kiln.ones(2)), lambda: TD.Multinomial(torch.tensor(3), torch.ones(2))),
        (
            lambda: KD.LowRankMultivariateNormal(kiln.zeros(3), kiln.zeros(2, 1), kiln.ones(3)),
            lambda: TD.LowRankMultivariateNormal(torch.zeros(3), torch.zeros(2, 1), torch.ones(3)),
        ),
        (
            lambda: KD.LowRankMultivariateNormal(kiln.zeros(3), kiln.zeros(3), kiln.ones(3)),
            lambda: TD.LowRankMultivariateNormal(torch.zeros(3), torch.zeros(3), torch.ones(3)),
        ),
        (
            lambda: KD.LowRankMultivariateNormal(kiln.zeros(3), kiln.zeros(3, 1), kiln.ones(2)),
            lambda: TD.LowRankMultivariateNormal(torch.zeros(3), torch.zeros(3, 1), torch.ones(2)),
        ),
        (
            lambda: KD.LowRankMultivariateNormal(kiln.zeros(2, 3), kiln.zeros(4, 3, 1), kiln.ones(3)),
            lambda: TD.LowRankMultivariateNormal(torch.zeros(2, 3), torch.zeros(4, 3, 1), torch.ones(3)),
        ),
        (
            lambda: KD.Binomial(3, kiln.tensor([1.0, 2.0])).entropy(),
            lambda: TD.Binomial(3, torch.tensor([1.0, 2.0])).entropy(),
        ),
        (
            lambda: KD.Binomial(kiln.tensor([2.0, 3.0]), kiln.tensor([0.5, 0.5])).enumerate_support(),
            lambda: TD.Binomial(torch.tensor([2.0, 3.0]), torch.tensor([0.5, 0.5])).enumerate_support(),
        ),
        (
            lambda: KD.Independent(KD.Normal(kiln.zeros(2), 1.0), 2),
            lambda: TD.Independent(TD.Normal(torch.zeros(2), 1.0), 2),
        ),
        (
            lambda: KD.MixtureSameFamily(KD.Normal(0.0, 1.0), KD.Normal(kiln.zeros(2), 1.0)),
            lambda: TD.MixtureSameFamily(TD.Normal(0.0, 1.0), TD.Normal(torch.zeros(2), 1.0)),
        ),
        (
            lambda: KD.MixtureSameFamily(KD.Categorical(kiln.ones(3)), KD.Normal(kiln.zeros(2), 1.0)),
            lambda: TD.MixtureSameFamily(TD.Categorical(torch.ones(3)), TD.Normal(torch.zeros(2), 1.0)),
        ),
        (
            lambda: KD.MixtureSameFamily(KD.Categorical(kiln.ones(3, 2)), KD.Normal(kiln.zeros(4, 2), 1.0)),
            lambda: TD.MixtureSameFamily(TD.Categorical(torch.ones(3, 2)), TD.Normal(torch.zeros(4, 2), 1.0)),
        ),
        (
            lambda: KD.MixtureSameFamily(KD.Categorical(kiln.ones(2)), "x"),
            lambda: TD.MixtureSameFamily(TD.Categorical(torch.ones(2)), "x"),
        ),
    ]
    for kf, tf in pairs:
        U.assert_same_error(kf, tf, exact=True)


# ---------------------------------------------------------------------------------------- composites


def test_independent():
    r = np.random.default_rng(12)
    loc, scale = r.normal(size=(2, 3, 4)), pos(r, (2, 3, 4))
    for n in (0, 1, 2):
        td = TD.Independent(TD.Normal(torch.tensor(loc), torch.tensor(scale)), n)
        kd = KD.Independent(KD.Normal(kiln.tensor(loc), kiln.tensor(scale)), n)
        assert tuple(kd.batch_shape) == tuple(td.batch_shape) and tuple(kd.event_shape) == tuple(td.event_shape)
        x = td.sample((2,))
        close(kd.log_prob(U.to_kiln(x)), td.log_prob(x), f"Independent {n}")
        close(kd.entropy(), td.entropy(), "entropy")
        for prop in ("mean", "mode", "variance"):
            close(getattr(kd, prop), getattr(td, prop), prop)
        assert repr(kd) == U.kiln_message(repr(td)) and kd.has_rsample and repr(kd.support) == repr(td.support)
        ke, te = kd.expand((5,) + tuple(kd.batch_shape)), td.expand((5,) + tuple(td.batch_shape))
        assert tuple(ke.batch_shape) == tuple(te.batch_shape) and tuple(ke.sample().shape) == tuple(te.sample().shape)
    kd = KD.Independent(KD.Bernoulli(kiln.full((2, 3), 0.5)), 1)
    assert not kd.has_enumerate_support
    U.assert_same_error(
        kd.enumerate_support, TD.Independent(TD.Bernoulli(torch.full((2, 3), 0.5)), 1).enumerate_support, exact=True
    )
    kd = KD.Independent(KD.Bernoulli(kiln.full((2, 3), 0.5)), 0)
    assert kd.has_enumerate_support and tuple(kd.enumerate_support().shape) == (2, 2, 3)


def test_mixture_same_family():
    r = np.random.default_rng(13)
    logits = r.normal(size=(3, 5))
    loc, scale = r.normal(size=(3, 5, 2)), pos(r, (3, 5, 2))
    t = [torch.tensor(a, requires_grad=True) for a in (logits, loc, scale)]
    k = [U.to_kiln(a.detach(), requires_grad=True) for a in t]
    for event in (False, True):
        tc, kc = TD.Normal(t[1], t[2]), KD.Normal(k[1], k[2])
        if event:
            tc, kc = TD.Independent(tc, 1), KD.Independent(kc, 1)
        else:
            tc, kc = TD.Normal(t[1][..., 0], t[2][..., 0]), KD.Normal(k[1][..., 0], k[2][..., 0])
        td, kd = (
            TD.MixtureSameFamily(TD.Categorical(logits=t[0]), tc),
            KD.MixtureSameFamily(KD.Categorical(logits=k[0]), kc),
        )
        assert tuple(kd.batch_shape) == tuple(td.batch_shape) and tuple(kd.event_shape) == tuple(td.event_shape)
        torch.manual_seed(14)
        x = td.sample((4,))
        kx = U.to_kiln(x)
        for what, kv, tv in [
            ("log_prob", kd.log_prob(kx), td.log_prob(x)),
            ("mean", kd.mean, td.mean),
            ("variance", kd.variance, td.variance),
        ]:
            close(kv, tv, what)
            grads_close(kv, tv, k, t, what)
        if not event:
            close(kd.cdf(kx), td.cdf(x), "cdf")
        kiln.manual_seed(14)
        s = kd.sample((6,))
        assert tuple(s.shape) == tuple(td.sample((6,)).shape)
        assert tuple(kd.expand((2, 3)).sample().shape) == tuple(td.expand((2, 3)).sample().shape)
        assert repr(kd) == U.kiln_message(repr(td))
    # the mixture's statistics: a two-component normal mixture
    kd = KD.MixtureSameFamily(
        KD.Categorical(kiln.tensor([0.3, 0.7], dtype=kiln.float64)),
        KD.Normal(kiln.tensor([-2.0, 1.0], dtype=kiln.float64), kiln.tensor([0.5, 1.0], dtype=kiln.float64)),
    )
    kiln.manual_seed(15)
    s = U.kiln_to_np(kd.sample((20000,)))
    assert abs(s.mean() - kd.mean.item()) < 5 * math.sqrt(kd.variance.item() / 20000)
    assert abs(s.var() - kd.variance.item()) < 0.05 * kd.variance.item()


# ---------------------------------------------------------------------------------------- Wishart


def _spd(r, batch, n):
    a = r.normal(size=batch + (n, n))
    return a @ np.swapaxes(a, -1, -2) + n * np.eye(n)


# PyTorch 2.13 warns of singular samples on every Wishart draw (it tests the support check the wrong way round)
@pytest.mark.filterwarnings("ignore:Singular sample detected:UserWarning")
@pytest.mark.parametrize("by", ["covariance_matrix", "precision_matrix", "scale_tril"])
def test_wishart(by):
    r = np.random.default_rng(17)
    m = _spd(r, (2,), 3)
    if by == "scale_tril":
        m = np.linalg.cholesky(m)
    t = [torch.tensor(a, requires_grad=True) for a in (np.array([4.5, 7.0]), m)]
    k = [U.to_kiln(a.detach(), requires_grad=True) for a in t]
    td, kd = TD.Wishart(t[0], **{by: t[1]}), KD.Wishart(k[0], **{by: k[1]})
    assert tuple(kd.batch_shape) == tuple(td.batch_shape) and tuple(kd.event_shape) == tuple(td.event_shape)
    torch.manual_seed(17)
    x = td.sample((4,))
    for what, kv, tv in [
        ("log_prob", kd.log_prob(U.to_kiln(x)), td.log_prob(x)),
        ("entropy", kd.entropy(), td.entropy()),
    ]:
        close(kv, tv, what, rtol=1e-9, atol=1e-9)
        tg = torch.autograd.grad(tv.sum(), t, retain_graph=True)
        kg = kiln.autograd.grad(kv.sum(), k, retain_graph=True)
        close(kg[0], tg[0], what + " df grad", rtol=1e-8, atol=1e-9)
        close(kg[1], tg[1], what + " matrix grad", rtol=1e-8, atol=1e-9)
    for prop in ("mean", "mode", "variance", "covariance_matrix", "precision_matrix", "scale_tril"):
        close(getattr(kd, prop), getattr(td, prop), prop, rtol=1e-9, atol=1e-10)
    kiln.manual_seed(17)
    s = kd.rsample((5,))
    assert tuple(s.shape) == (5, 2, 3, 3) and bool(kd.support.check(s).all())
    assert all(np.isfinite(U.kiln_to_np(g)).all() for g in kiln.autograd.grad(s.sum(), k))
    ke, te = kd.expand((3, 2)), td.expand((3, 2))
    assert tuple(ke.batch_shape) == tuple(te.batch_shape) and tuple(ke.sample().shape) == tuple(te.sample().shape)
    close(ke.log_prob(U.to_kiln(x[:, None])), te.log_prob(x[:, None]), "expanded log_prob", rtol=1e-9, atol=1e-9)


def test_wishart_statistics_and_errors():
    cov = np.array([[2.0, 0.5], [0.5, 1.0]])
    kd = KD.Wishart(kiln.tensor(5.0, dtype=kiln.float64), covariance_matrix=kiln.tensor(cov))
    kiln.manual_seed(18)
    s = U.kiln_to_np(kd.sample((20000,)))
    mean, var = U.kiln_to_np(kd.mean), U.kiln_to_np(kd.variance)
    assert (np.abs(s.mean(0) - mean) < 5 * np.sqrt(var / 20000)).all()
    np.testing.assert_allclose(s.var(0), var, rtol=0.08)
    pairs = [
        (lambda M, L: M.Wishart(L.tensor(1.0), covariance_matrix=L.eye(2))),
        (lambda M, L: M.Wishart(L.tensor(3.0))),
        (lambda M, L: M.Wishart(L.tensor(3.0), covariance_matrix=L.ones(2))),
        (lambda M, L: M.Wishart(L.tensor(3.0), covariance_matrix=L.tensor([[1.0, 2.0], [2.0, 1.0]]))),
        (lambda M, L: M.Wishart(L.tensor(3.0), covariance_matrix=L.eye(2)).log_prob(L.ones(2, 2))),
    ]
    for f in pairs:
        U.assert_same_error(lambda f=f: f(KD, kiln), lambda f=f: f(TD, torch), exact=True)
    with pytest.warns(UserWarning, match="Low df values detected"):
        KD.Wishart(kiln.tensor(1.5), covariance_matrix=kiln.eye(2))

    class FirstDrawSingular(KD.Wishart):
        """The first Bartlett draw of sample 1 is singular; later draws are not."""

        draws = 0

        def _bartlett_sampling(self, sample_shape):
            out = super()._bartlett_sampling(sample_shape)
            FirstDrawSingular.draws += 1
            if FirstDrawSingular.draws == 1:
                out = kiln.where(kiln.arange(3).reshape(3, 1, 1) == 1, kiln.zeros(2, 2), out)
            return out

    d = FirstDrawSingular(kiln.tensor(4.0), covariance_matrix=kiln.eye(2))
    kiln.manual_seed(19)
    with pytest.warns(UserWarning, match="Singular sample detected"):
        s = d.rsample((3,))
    assert FirstDrawSingular.draws == 2 and bool(d.support.check(s).all())
    FirstDrawSingular.draws = 0
    with pytest.warns(UserWarning, match="Singular sample detected"):
        s = d.rsample((3,), max_try_correction=0)  # no retry: the singular draw is returned
    assert not bool(d.support.check(s)[1])


# ---------------------------------------------------------------------------------------- VonMises


def test_von_mises():
    r = np.random.default_rng(20)
    t = [torch.tensor(a, requires_grad=True) for a in (r.normal(size=(2, 3)) * 3, np.array([1e-3, 0.7, 40.0]))]
    k = [U.to_kiln(a.detach(), requires_grad=True) for a in t]
    td, kd = TD.VonMises(*t), KD.VonMises(*k)
    assert tuple(kd.batch_shape) == tuple(td.batch_shape) and not kd.has_rsample
    x = torch.tensor(r.uniform(-10, 10, size=(4, 2, 3)))
    # PyTorch's Bessel functions are polynomial approximations (relative error near 1e-7); kiln's are
    # Cephes' Chebyshev series, exact to double precision
    for what, kv, tv in [
        ("log_prob", kd.log_prob(U.to_kiln(x)), td.log_prob(x)),
        ("variance", kd.variance, td.variance),
    ]:
        close(kv, tv, what, rtol=1e-6, atol=1e-6)
        tg = torch.autograd.grad(tv.sum(), t, retain_graph=True, allow_unused=True)
        kg = kiln.autograd.grad(kv.sum(), k, retain_graph=True, allow_unused=True)
        for a, b in zip(kg, tg):
            if b is None:
                assert a is None or not np.any(U.kiln_to_np(a))
            else:
                close(a, b, what + " grad", rtol=1e-5, atol=1e-6)
    close(kd.mean, td.mean, "mean")
    close(kd.mode, td.mode, "mode")
    with pytest.raises(NotImplementedError):
        kd.entropy()
    kiln.manual_seed(20)
    s = kd.sample((3000,))
    assert tuple(s.shape) == (3000, 2, 3) and s.dtype is kiln.float64 and not s.requires_grad
    s = U.kiln_to_np(s)
    assert (s >= -math.pi).all() and (s < math.pi).all()
    # the circular mean and variance of the draws
    loc, var = U.kiln_to_np(kd.loc), U.kiln_to_np(kd.variance)
    resultant = np.exp(1j * (s - loc)).mean(0)
    assert np.all(np.abs(1 - np.abs(resultant) - var) < 0.05)
    assert np.all(np.abs(np.angle(resultant)[:, 1:]) < 0.1)  # the concentrated ones point at loc
    ke, te = kd.expand((4, 2, 3)), td.expand((4, 2, 3))
    assert type(ke) is KD.VonMises and tuple(ke.batch_shape) == tuple(te.batch_shape)
    close(ke.log_prob(U.to_kiln(x)), te.log_prob(x), "expanded", rtol=1e-6, atol=1e-6)
    assert KD.VonMises(kiln.tensor([0.0]), kiln.tensor([1e-4]), validate_args=True).sample((5,)).dtype is kiln.float32
    U.assert_same_error(
        lambda: KD.VonMises(kiln.tensor([0.0]), kiln.tensor([-1.0])),
        lambda: TD.VonMises(torch.tensor([0.0]), torch.tensor([-1.0])),
        exact=True,
    )


def test_log_prob_gradients_where_a_coefficient_of_a_log_is_zero():
    """``xlogy(a - 1, x)`` at ``a = 1`` still depends on ``a``: its gradient there is ``log(x)``."""
    cases = [
        (KD.Gamma, TD.Gamma, ([1.0, 2.0], [1.5, 1.5]), [0.5, 2.0]),
        (KD.Dirichlet, TD.Dirichlet, ([[1.0, 2.0, 1.0]],), [[0.2, 0.5, 0.3]]),
        (KD.Beta, TD.Beta, ([1.0, 3.0], [1.0, 1.0]), [0.3, 0.6]),
        (KD.Poisson, TD.Poisson, ([1.5, 2.0],), [0.0, 3.0]),
    ]
    for kcls, tcls, args, value in cases:
        t = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in args]
        k = [U.to_kiln(a.detach(), requires_grad=True) for a in t]
        tv = tcls(*t).log_prob(torch.tensor(value, dtype=torch.float64))
        kv = kcls(*k).log_prob(kiln.tensor(value, dtype=kiln.float64))
        close(kv, tv, kcls.__name__)
        for a, b in zip(kiln.autograd.grad(kv.sum(), k), torch.autograd.grad(tv.sum(), t)):
            close(a, b, kcls.__name__ + " grad")
