"""kiln.distributions.kl against torch.distributions.kl: every registered pair, its values and
gradients on random batched parameters, the registry (the same 87 pairs as PyTorch), dispatch by
subclass with the ambiguity warning, and the errors."""

from __future__ import annotations

import zlib

import kiln_testutil as U
import numpy as np
import pytest
import torch
import torch.distributions as TD
import torch.distributions.kl as TKL

import kiln
import kiln.distributions as KD
import kiln.distributions._kl_registry as KREG
import kiln.distributions.kl as KKL


def _spd(r, batch, n):
    a = r.normal(size=batch + (n, n))
    return a @ np.swapaxes(a, -1, -2) + n * np.eye(n)


def params(name, r):
    """Random float64 parameters (batch shape (3,)) of a distribution type, by name."""
    p = lambda *s: r.uniform(0.5, 2.0, size=s or (3,))
    u = lambda: r.uniform(0.1, 0.9, size=(3,))
    n = lambda *s: r.normal(size=s or (3,))
    table = {
        "Bernoulli": lambda: dict(probs=u()),
        "Beta": lambda: dict(concentration1=p(), concentration0=p()),
        "Binomial": lambda: dict(total_count=np.full(3, 5.0), probs=u()),
        "Categorical": lambda: dict(probs=p(3, 4)),
        "OneHotCategorical": lambda: dict(probs=p(3, 4)),
        "ContinuousBernoulli": lambda: dict(probs=u()),
        "Dirichlet": lambda: dict(concentration=p(3, 4)),
        "Exponential": lambda: dict(rate=p()),
        "Gamma": lambda: dict(concentration=p(), rate=p()),
        "Gumbel": lambda: dict(loc=n(), scale=p()),
        "Geometric": lambda: dict(probs=u()),
        "HalfNormal": lambda: dict(scale=p()),
        "Laplace": lambda: dict(loc=n(), scale=p()),
        "Normal": lambda: dict(loc=n(), scale=p()),
        "Pareto": lambda: dict(scale=p(), alpha=p() + 2.0),
        "Poisson": lambda: dict(rate=p()),
        "Uniform": lambda: dict(low=n() - 3.0, high=n() + 3.0),
        "Cauchy": lambda: dict(loc=n(), scale=p()),
        "MultivariateNormal": lambda: dict(loc=n(3, 4), covariance_matrix=_spd(r, (3,), 4)),
        "LowRankMultivariateNormal": lambda: dict(loc=n(3, 4), cov_factor=n(3, 4, 2), cov_diag=p(3, 4)),
    }
    return table[name]()


def make(name, kw, requires_grad=True):
    """(torch dist, kiln dist, torch leaves, kiln leaves); Independent and TransformedDistribution stand
    for themselves through a Normal and a LogNormal."""
    t_kw = {k: torch.tensor(v).requires_grad_(requires_grad and k != "total_count") for k, v in kw.items()}
    k_kw = {k: U.to_kiln(v.detach(), requires_grad=v.requires_grad) for k, v in t_kw.items()}
    wrap_t, wrap_k = (lambda d: d), (lambda d: d)
    base = name
    if name == "Independent":
        base = "Normal"
        wrap_t, wrap_k = (lambda d: TD.Independent(d, 1)), (lambda d: KD.Independent(d, 1))
    elif name == "TransformedDistribution":
        base = "LogNormal"
    td, kd = wrap_t(getattr(TD, base)(**t_kw)), wrap_k(getattr(KD, base)(**k_kw))
    return td, kd, [v for v in t_kw.values() if v.requires_grad], [v for v in k_kw.values() if v.requires_grad]


def kw_for(name, r):
    if name == "Independent":
        return params("Normal", r)
    if name == "TransformedDistribution":
        return params("Normal", r)
    return params(name, r)


PAIRS = sorted(TKL._KL_REGISTRY, key=lambda pq: (pq[0].__name__, pq[1].__name__))
PAIR_IDS = [f"{p.__name__}-{q.__name__}" for p, q in PAIRS]


def test_the_registry_has_torchs_pairs():
    kiln_pairs = {(p.__name__, q.__name__) for p, q in KREG._KL_REGISTRY}
    torch_pairs = {(p.__name__, q.__name__) for p, q in TKL._KL_REGISTRY}
    assert kiln_pairs == torch_pairs
    assert len(kiln_pairs) == 87
    for p, q in KREG._KL_REGISTRY:  # registered under kiln's classes
        assert p.__module__.startswith("kiln.distributions") and q.__module__.startswith("kiln.distributions")
    assert "Normal` and :class:`~kiln.distributions.Normal" in KD.kl_divergence.__doc__


@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
def test_kl_values_and_gradients(pair):
    p_type, q_type = pair
    if p_type is TD.ExponentialFamily:
        pytest.skip("the abstract pair: covered by test_exponential_family_bregman_fallback")
    r = np.random.default_rng(zlib.crc32(PAIR_IDS[PAIRS.index(pair)].encode()))
    tp, kp, tpl, kpl = make(p_type.__name__, kw_for(p_type.__name__, r))
    tq, kq, tql, kql = make(q_type.__name__, kw_for(q_type.__name__, r))
    try:
        expected = TD.kl_divergence(tp, tq)
    except NotImplementedError:
        U.assert_same_error(lambda: KD.kl_divergence(kp, kq), lambda: TD.kl_divergence(tp, tq), exact=True)
        return
    got = KD.kl_divergence(kp, kq)
    rtol = 1e-6 if "Binomial" in PAIR_IDS[PAIRS.index(pair)] else 1e-8
    U.assert_close(got, expected, rtol=rtol, atol=1e-9, msg="KL: ")
    finite = torch.isfinite(expected)
    if not expected.requires_grad or not finite.any():
        return
    t_leaves, k_leaves = tpl + tql, kpl + kql
    tg = torch.autograd.grad(expected[finite].sum(), t_leaves, allow_unused=True)
    kg = kiln.autograd.grad(got[U.to_kiln(finite)].sum(), k_leaves, allow_unused=True)
    for i, (a, b) in enumerate(zip(kg, tg)):
        if b is None:
            assert a is None or not np.any(U.kiln_to_np(a)), f"grad {i} should be None or zero"
        else:
            U.assert_close(a, b, rtol=1e-6, atol=1e-8, msg=f"grad {i}: ")


def test_infinite_and_support_masks():
    """The pairs whose q does not cover p's support give inf exactly where PyTorch does."""
    cases = [
        (
            lambda L, M: M.Uniform(L.tensor([0.0, -1.0]), L.tensor([1.0, 1.0])),
            lambda L, M: M.Uniform(L.tensor([0.0, 0.0]), L.tensor([2.0, 2.0])),
        ),
        (
            lambda L, M: M.Pareto(L.tensor([1.0, 3.0]), L.tensor([2.0, 2.0])),
            lambda L, M: M.Pareto(L.tensor([2.0, 2.0]), L.tensor([2.0, 2.0])),
        ),
        (lambda L, M: M.Bernoulli(L.tensor([0.0, 0.5, 1.0])), lambda L, M: M.Bernoulli(L.tensor([0.5, 0.0, 1.0]))),
        (
            lambda L, M: M.Categorical(L.tensor([[0.0, 1.0], [0.5, 0.5]])),
            lambda L, M: M.Categorical(L.tensor([[1.0, 0.0], [1.0, 0.0]])),
        ),
        (
            lambda L, M: M.Binomial(L.tensor([5.0, 3.0]), L.tensor([0.5, 0.5])),
            lambda L, M: M.Binomial(L.tensor([3.0, 3.0]), L.tensor([0.5, 0.2])),
        ),
        (
            lambda L, M: M.Uniform(L.tensor([-1.0, 0.2]), L.tensor([0.5, 0.6])),
            lambda L, M: M.Beta(L.tensor([2.0, 2.0]), L.tensor([2.0, 2.0])),
        ),
        (
            lambda L, M: M.Uniform(L.tensor([-1.0, 0.2]), L.tensor([0.5, 0.6])),
            lambda L, M: M.Exponential(L.tensor([2.0, 2.0])),
        ),
        (
            lambda L, M: M.Pareto(L.tensor([1.0, 1.0]), L.tensor([0.5, 3.0])),
            lambda L, M: M.Exponential(L.tensor([2.0, 2.0])),
        ),
        (lambda L, M: M.Normal(L.tensor([0.0]), L.tensor([1.0])), lambda L, M: M.Exponential(L.tensor([1.0]))),
    ]
    for mp, mq in cases:
        expected = TD.kl_divergence(mp(torch, TD), mq(torch, TD))
        got = KD.kl_divergence(mp(kiln, KD), mq(kiln, KD))
        U.assert_close(got, expected, rtol=1e-6, atol=1e-6, msg="KL: ")


def test_multivariate_normal_kl_broadcasts_batches():
    r = np.random.default_rng(1)
    lp, cp = r.normal(size=(2, 1, 3)), _spd(r, (4,), 3)
    lq, cq = r.normal(size=(3,)), _spd(r, (1, 4), 3)
    tp, tq = (
        TD.MultivariateNormal(torch.tensor(lp), torch.tensor(cp)),
        TD.MultivariateNormal(torch.tensor(lq), torch.tensor(cq)),
    )
    kp, kq = (
        KD.MultivariateNormal(kiln.tensor(lp), kiln.tensor(cp)),
        KD.MultivariateNormal(kiln.tensor(lq), kiln.tensor(cq)),
    )
    U.assert_close(KD.kl_divergence(kp, kq), TD.kl_divergence(tp, tq), rtol=1e-9, atol=1e-10)
    k2, t2 = KD.MultivariateNormal(kiln.zeros(2), kiln.eye(2)), TD.MultivariateNormal(torch.zeros(2), torch.eye(2))
    kl2 = KD.LowRankMultivariateNormal(kiln.zeros(2), kiln.zeros(2, 1), kiln.ones(2))
    tl2 = TD.LowRankMultivariateNormal(torch.zeros(2), torch.zeros(2, 1), torch.ones(2))
    kl3 = KD.LowRankMultivariateNormal(kiln.zeros(3), kiln.zeros(3, 1), kiln.ones(3))
    tl3 = TD.LowRankMultivariateNormal(torch.zeros(3), torch.zeros(3, 1), torch.ones(3))
    for (a, b), (c, d) in [
        ((kp, k2), (tp, t2)),
        ((kl2, kl3), (tl2, tl3)),
        ((k2, kl3), (t2, tl3)),
        ((kl3, k2), (tl3, t2)),
    ]:
        U.assert_same_error(
            lambda a=a, b=b: KD.kl_divergence(a, b), lambda c=c, d=d: TD.kl_divergence(c, d), exact=True
        )


def test_exponential_family_bregman_fallback():
    """Two members of one exponential family without a registered pair: the Bregman divergence of the
    log-normaliser (here Poisson, whose pair is removed for the test), against the closed form."""
    saved = dict(KREG._KL_REGISTRY)
    try:
        del KREG._KL_REGISTRY[KD.Poisson, KD.Poisson]
        KREG._KL_MEMOIZE.clear()
        rp, rq = kiln.tensor([1.5, 3.0], dtype=kiln.float64), kiln.tensor([2.0, 0.5], dtype=kiln.float64)
        got = KD.kl_divergence(KD.Poisson(rp), KD.Poisson(rq))
        expected = TD.kl_divergence(TD.Poisson(U.to_torch(rp)), TD.Poisson(U.to_torch(rq)))
        U.assert_close(got, expected, rtol=1e-9, atol=1e-10)
        U.assert_same_error(
            lambda: KKL._kl_expfamily_expfamily(KD.Poisson(rp), KD.Exponential(rq)),
            lambda: TKL._kl_expfamily_expfamily(TD.Poisson(U.to_torch(rp)), TD.Exponential(U.to_torch(rq))),
            exact=True,
        )
    finally:
        KREG._KL_REGISTRY.clear()
        KREG._KL_REGISTRY.update(saved)
        KREG._KL_MEMOIZE.clear()


def test_unregistered_pairs_raise_torchs_error():
    U.assert_same_error(
        lambda: KD.kl_divergence(KD.StudentT(3.0), KD.Normal(0.0, 1.0)),
        lambda: TD.kl_divergence(TD.StudentT(3.0), TD.Normal(0.0, 1.0)),
        exact=True,
    )
    U.assert_same_error(
        lambda: KD.kl_divergence(
            KD.Independent(KD.Normal(kiln.zeros(2, 2), 1.0), 1), KD.Independent(KD.Normal(kiln.zeros(2, 2), 1.0), 2)
        ),
        lambda: TD.kl_divergence(
            TD.Independent(TD.Normal(torch.zeros(2, 2), 1.0), 1), TD.Independent(TD.Normal(torch.zeros(2, 2), 1.0), 2)
        ),
    )


def test_register_kl_dispatches_to_the_most_specific_pair():
    class MyNormal(KD.Normal):
        pass

    class MyOtherNormal(KD.Normal):
        pass

    saved = dict(KREG._KL_REGISTRY)
    try:
        p, q = MyNormal(0.0, 1.0), KD.Normal(1.0, 1.0)
        assert KD.kl_divergence(p, q).item() == pytest.approx(0.5)  # the (Normal, Normal) pair

        @KD.register_kl(MyNormal, KD.Normal)
        def _mine(p, q):
            return kiln.tensor(42.0)

        assert KD.kl_divergence(p, q).item() == 42.0  # the new, more specific pair (the memo was reset)

        @KD.register_kl(KD.Normal, MyOtherNormal)
        def _other(p, q):
            return kiln.tensor(7.0)

        with pytest.warns(RuntimeWarning, match=r"Ambiguous kl_divergence\(MyNormal, MyOtherNormal\)"):
            KD.kl_divergence(MyNormal(0.0, 1.0), MyOtherNormal(0.0, 1.0))
    finally:
        KREG._KL_REGISTRY.clear()
        KREG._KL_REGISTRY.update(saved)
        KREG._KL_MEMOIZE.clear()


def test_kl_of_transformed_distributions_needs_equal_transforms():
    p = KD.LogNormal(0.0, 1.0)
    q = KD.TransformedDistribution(KD.Normal(0.0, 2.0), [KD.transforms.ExpTransform()])
    tq = TD.TransformedDistribution(TD.Normal(0.0, 2.0), [TD.transforms.ExpTransform()])
    assert KD.kl_divergence(p, q).item() == pytest.approx(TD.kl_divergence(TD.LogNormal(0.0, 1.0), tq).item())
    other = KD.TransformedDistribution(KD.Normal(0.0, 2.0), [KD.transforms.SigmoidTransform()])
    with pytest.raises(NotImplementedError):
        KD.kl_divergence(p, other)
