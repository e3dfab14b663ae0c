"""The gamma sampler and its reparameterised gradient, and the families built on it (Gamma, Chi2, Beta,
Dirichlet, StudentT, FisherSnedecor, InverseGamma), plus the Poisson and binomial samplers.

kiln's gamma draws come from NumPy under the kiln generator's state, so they are not PyTorch's; what is
checked is (1) the implicit gradient ``dx/dalpha = -(dF/dalpha) / f`` against an mpmath evaluation to
near machine precision over seven decades of ``alpha`` and the whole range of quantiles (and against
PyTorch's own approximation, to its accuracy), (2) that every rsample's gradient is unbiased: the mean of
20000 seeded per-sample gradients matches the derivative of the distribution's mean (or second moment),
and (3) reproducibility, dtypes, clamping and the discrete samplers' edge cases.
"""

from __future__ import annotations

import math

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln
import kiln.distributions as KD
from kiln.distributions._gamma import _lower_series, _upper_fraction, standard_gamma_grad

mpmath = pytest.importorskip("mpmath")


def reference_grad(x: float, a: float) -> float:
    """``-(dP/da)(a, x) / f(x; a)`` in 40-digit arithmetic, ``P`` the regularised lower incomplete gamma
    function; right of the mean through the upper one ``Q = 1 - P``, which keeps its digits in the tail."""
    with mpmath.workdps(40):
        x, a = mpmath.mpf(x), mpmath.mpf(a)
        if x <= a:
            dp = mpmath.diff(lambda s: mpmath.gammainc(s, 0, x, regularized=True), a)
        else:
            dp = -mpmath.diff(lambda s: mpmath.gammainc(s, x, mpmath.inf, regularized=True), a)
        f = mpmath.exp(-x + (a - 1) * mpmath.log(x) - mpmath.loggamma(a))
        return float(-dp / f)


ALPHAS = [1e-3, 0.05, 0.5, 1.0, 3.7, 40.0, 900.0, 2e4]


def draws_to_check(a: float) -> np.ndarray:
    """Points across Gamma(a, 1)'s mass and tails, on both sides of ``a + 1`` (where the series gives way to
    the continued fraction): far below the mode, around the mean (within six standard deviations) and out
    in the right tail."""
    sd = math.sqrt(a)
    xs = [a * 1e-6, a * 1e-2, a / 2, a, a + 1, a + 1 + 1e-9, 3 * a + 5, 6 * a + 40]
    xs += [a + k * sd for k in (-6, -3, -1, 1, 3, 6)]
    if a < 0.1:
        xs += [1e-200, 1e-30]
    return np.array(sorted(x for x in xs if x > 0))


@pytest.mark.parametrize("a", ALPHAS)
def test_implicit_gradient_matches_mpmath(a):
    xs = draws_to_check(a)
    expected = [reference_grad(x, a) for x in xs]
    got = standard_gamma_grad(xs, np.full(len(xs), a))
    np.testing.assert_allclose(got, expected, rtol=1e-11 if a < 1e3 else 1e-9)


def test_implicit_gradient_for_huge_alpha_and_extreme_draws():
    # above 1e6 the Wilson–Hilferty quantile is differentiated instead of the expansions (which mpmath
    # checks above): both agree there
    a = 2e6
    xs = np.array([a + k * math.sqrt(a) for k in (-4, -1, 0, 1, 4)])
    lower, upper = xs < a + 1, xs >= a + 1
    exact = np.concatenate(
        [_lower_series(xs[lower], np.full(lower.sum(), a)), _upper_fraction(xs[upper], np.full(upper.sum(), a))]
    )
    np.testing.assert_allclose(standard_gamma_grad(xs, np.full(5, a)), exact, rtol=5e-10)
    # a draw clamped to the smallest normal number, and far tails
    for a, x in ((1e-4, 1e-300), (0.5, 60.0), (3.0, 80.0), (200.0, 110.0)):
        np.testing.assert_allclose(
            standard_gamma_grad(np.array([x]), np.array([a])), [reference_grad(x, a)], rtol=1e-11
        )


def test_implicit_gradient_agrees_with_torchs_approximation():
    r = np.random.default_rng(0)
    a = np.repeat([0.2, 1.0, 5.0, 30.0], 50)
    x = r.standard_gamma(a)
    ours = standard_gamma_grad(x, a)
    theirs = torch._standard_gamma_grad(torch.tensor(a), torch.tensor(x)).numpy()
    np.testing.assert_allclose(ours, theirs, rtol=2e-2)  # PyTorch's is an approximation (up to ~1% off)


def test_gamma_rsample_gradients_are_the_implicit_ones():
    alpha = kiln.tensor([0.3, 2.0, 15.0], dtype=kiln.float64, requires_grad=True)
    rate = kiln.tensor([2.0, 0.5, 1.0], dtype=kiln.float64, requires_grad=True)
    kiln.manual_seed(1)
    x = KD.Gamma(alpha, rate).rsample((7,))
    assert tuple(x.shape) == (7, 3) and x.requires_grad
    g_alpha, g_rate = kiln.autograd.grad(x.sum(), [alpha, rate])
    xs, a, r = U.kiln_to_np(x), U.kiln_to_np(alpha), U.kiln_to_np(rate)
    expected_alpha = (standard_gamma_grad(xs * r, np.broadcast_to(a, xs.shape)) / r).sum(0)
    np.testing.assert_allclose(U.kiln_to_np(g_alpha), expected_alpha, rtol=1e-12)
    np.testing.assert_allclose(U.kiln_to_np(g_rate), (-xs / r).sum(0), rtol=1e-12)


N = 20000


def mean_gradient(make, params, fn=lambda x: x):
    """The mean and standard error, over ``N`` seeded draws, of the per-draw gradient of ``fn(x)`` with
    respect to each parameter (each parameter repeated ``N`` times, so the gradient stays per draw)."""
    leaves = [
        kiln.full((N,) + tuple(np.shape(p)), 0.0, dtype=kiln.float64) + kiln.tensor(p, dtype=kiln.float64)
        for p in params
    ]
    leaves = [t.detach().requires_grad_() for t in leaves]
    kiln.manual_seed(2)
    x = make(*leaves).rsample()
    grads = kiln.autograd.grad(fn(x).sum(), leaves)
    out = []
    for g in grads:
        g = U.kiln_to_np(g)
        out.append((g.mean(0), g.std(0) / math.sqrt(N)))
    return out


def assert_unbiased(got, expected, what):
    for (mean, se), want in zip(got, expected):
        assert np.all(np.abs(mean - want) < 5 * se + 1e-12), f"{what}: mean gradient {mean} vs {want} (se {se})"


@pytest.mark.parametrize("a,b", [(0.4, 1.5), (3.0, 0.7), (50.0, 2.0)])
def test_gamma_rsample_gradient_is_unbiased(a, b):
    # E[x] = a / b
    got = mean_gradient(KD.Gamma, [a, b])
    assert_unbiased(got, [1 / b, -a / b**2], "Gamma")


@pytest.mark.parametrize("a,b", [(0.5, 0.5), (2.0, 5.0)])
def test_beta_rsample_gradient_is_unbiased(a, b):
    got = mean_gradient(KD.Beta, [a, b])
    assert_unbiased(got, [b / (a + b) ** 2, -a / (a + b) ** 2], "Beta")


def test_dirichlet_rsample_gradient_is_unbiased():
    alpha = np.array([0.5, 2.0, 3.5])
    a0 = alpha.sum()
    for i in range(3):  # d E[x_i] / d alpha_j = (delta_ij a0 - alpha_i) / a0^2
        ((mean, se),) = mean_gradient(KD.Dirichlet, [alpha], fn=lambda x, i=i: x[..., i])
        expected = ((np.arange(3) == i) * a0 - alpha[i]) / a0**2
        assert np.all(np.abs(mean - expected) < 5 * se), f"Dirichlet x_{i}: {mean} vs {expected}"


def test_chi2_student_t_fisher_snedecor_inverse_gamma_gradients_are_unbiased():
    # Chi2: E[x] = df
    assert_unbiased(mean_gradient(KD.Chi2, [4.0]), [1.0], "Chi2")
    # StudentT: E[(x - loc)^2] = scale^2 df / (df - 2)
    df, loc, scale = 6.0, 0.5, 1.5
    got = mean_gradient(KD.StudentT, [df, loc, scale], fn=lambda x: (x - loc) ** 2)
    assert_unbiased(got[:1] + got[2:], [-2 * scale**2 / (df - 2) ** 2, 2 * scale * df / (df - 2)], "StudentT")
    # FisherSnedecor: E[x] = d2 / (d2 - 2), independent of d1
    d1, d2 = 3.0, 12.0
    assert_unbiased(mean_gradient(KD.FisherSnedecor, [d1, d2]), [0.0, -2 / (d2 - 2) ** 2], "FisherSnedecor")
    # InverseGamma: E[x] = rate / (a - 1)
    a, rate = 6.0, 2.0
    assert_unbiased(mean_gradient(KD.InverseGamma, [a, rate]), [-rate / (a - 1) ** 2, 1 / (a - 1)], "InverseGamma")


def test_gamma_draws_are_reproducible_clamped_and_typed():
    alpha = kiln.tensor([1e-3, 1.0, 1e3])
    kiln.manual_seed(3)
    a = KD.Gamma(alpha, 1.0).sample((1000,))
    kiln.manual_seed(3)
    b = KD.Gamma(alpha, 1.0).sample((1000,))
    np.testing.assert_array_equal(U.kiln_to_np(a), U.kiln_to_np(b))
    assert a.dtype is kiln.float32
    tiny = np.finfo(np.float32).tiny
    assert (U.kiln_to_np(a) >= tiny).all()  # alpha = 1e-3 underflows: clamped as PyTorch clamps
    assert (U.kiln_to_np(a)[:, 0] == tiny).any()
    # the gradient at a clamped draw stays finite
    alpha = kiln.tensor([1e-3], dtype=kiln.float64, requires_grad=True)
    kiln.manual_seed(3)
    x = KD.Gamma(alpha, 1.0).rsample((50,))
    (g,) = kiln.autograd.grad(x.sum(), [alpha])
    assert np.isfinite(U.kiln_to_np(g)).all()
    # a generator's state restores the stream
    state = kiln.get_rng_state()
    c = KD.Dirichlet(kiln.ones(3)).sample((4,))
    kiln.set_rng_state(state)
    np.testing.assert_array_equal(U.kiln_to_np(KD.Dirichlet(kiln.ones(3)).sample((4,))), U.kiln_to_np(c))


def test_discrete_samplers_edge_cases():
    kiln.manual_seed(4)
    p = KD.Poisson(kiln.tensor([0.0, 1e-3, 1e4], dtype=kiln.float64)).sample((2000,))
    s = U.kiln_to_np(p)
    assert (s[:, 0] == 0).all() and s.dtype == np.float64 and (s == np.round(s)).all()
    assert abs(s[:, 2].mean() - 1e4) < 5 * math.sqrt(1e4 / 2000)
    b = KD.Binomial(kiln.tensor([0.0, 4.0, 4.0, 7.0]), kiln.tensor([0.3, 0.0, 1.0, 0.5])).sample((500,))
    s = U.kiln_to_np(b)
    assert (s[:, 0] == 0).all() and (s[:, 1] == 0).all() and (s[:, 2] == 4).all() and s[:, 3].max() <= 7
    nb = KD.NegativeBinomial(kiln.tensor([3.0]), logits=kiln.tensor([0.2])).sample((5,))
    assert tuple(nb.shape) == (5, 1) and nb.dtype is kiln.float32
