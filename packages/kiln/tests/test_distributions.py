"""kiln.distributions against torch.distributions: the base class and the five most used distributions
(Normal, Categorical, Bernoulli, Uniform, MultivariateNormal).

Every case builds the same distribution in both libraries from the same float64 parameters (scalars,
broadcast batch shapes, non-contiguous views) and compares log_prob, cdf, icdf, entropy, the moments,
the gradients of log_prob and entropy, shapes, expand(), enumerate_support() and the ValueErrors of
argument validation (type and exact message, with ``torch.`` read as ``kiln.``). kiln's random streams
are not PyTorch's, so samples are checked by shape, support and seeded statistics, and the gradient of
each reparameterised sample against the one the distribution's CDF implies at that sample
(``dx/dθ = -(∂F/∂θ) / f``, computed by PyTorch), or against PyTorch's formula on the same base noise.
"""

from __future__ import annotations

import math
import warnings

import kiln_testutil as U
import numpy as np
import pytest
import torch
import torch.distributions as TD

import kiln
import kiln.distributions as KD

TOL = dict(rtol=1e-9, atol=1e-11)


def k_of(t):
    """A kiln tensor with ``t``'s values, dtype and ``requires_grad`` (numbers pass through)."""
    if isinstance(t, torch.Tensor):
        return U.to_kiln(t.detach(), requires_grad=t.requires_grad)
    return t


def close(k, t, what="", **tol):
    """kiln result ``k`` equals torch's ``t``: shape, dtype and values."""
    U.assert_close(k, t, msg=f"{what}: ", **(tol or TOL))


def leaves(args):
    return [a for a in args if isinstance(a, (torch.Tensor, kiln.Tensor)) and a.requires_grad]


def grads_close(k_out, t_out, k_args, t_args, what=""):
    """The gradients of ``sum(out)`` with respect to every parameter that requires grad agree."""
    kl, tl = leaves(k_args), leaves(t_args)
    tg = torch.autograd.grad(t_out.sum(), tl, allow_unused=True, retain_graph=True)
    kg = kiln.autograd.grad(k_out.sum(), kl, allow_unused=True, retain_graph=True)
    for i, (a, b) in enumerate(zip(kg, tg)):
        if b is None:
            assert a is None or not np.any(U.kiln_to_np(a)), f"{what}: grad {i} should be None or zero"
        else:
            close(a, b, f"{what} grad {i}", rtol=1e-8, atol=1e-10)


def rng(seed=0):
    return np.random.default_rng(seed)


def param(a, requires_grad=True):
    """A float64 torch leaf holding the NumPy values ``a``."""
    return torch.tensor(np.asarray(a, dtype=np.float64)).requires_grad_(requires_grad)


def both_params(*arrays):
    """(torch leaves, kiln leaves) with the same float64 values."""
    t = [param(a) for a in arrays]
    return t, [k_of(x) for x in t]


def implied_rsample_grad(t_dist_fn, t_params, x):
    """``dx/dθ = -(∂F/∂θ)(x) / f(x)`` for every parameter, by PyTorch's autograd on its own cdf and
    log_prob at the sample values ``x`` (a torch tensor): the gradient any quantile-preserving
    reparameterisation gives, summed over samples."""
    d = t_dist_fn(*t_params)
    density = d.log_prob(x).exp().detach()
    grads = torch.autograd.grad(d.cdf(x), leaves(t_params), grad_outputs=1 / density, allow_unused=True)
    return [None if g is None else -g for g in grads]


# ---------------------------------------------------------------------------------------- Normal


NORMAL_SHAPES = [((), ()), ((3,), ()), ((2, 1), (4,)), ((4,), (2, 1)), ((0,), ()), ((2, 3), (2, 3))]


@pytest.mark.parametrize("loc_shape,scale_shape", NORMAL_SHAPES)
def test_normal_values_and_gradients(loc_shape, scale_shape):
    r = rng(1)
    targs, kargs = both_params(r.normal(size=loc_shape), r.uniform(0.5, 2.0, size=scale_shape))
    td, kd = TD.Normal(*targs), KD.Normal(*kargs)
    assert tuple(kd.batch_shape) == tuple(td.batch_shape) and tuple(kd.event_shape) == ()
    x = torch.tensor(r.normal(size=(5,) + tuple(td.batch_shape)))
    q = torch.tensor(r.uniform(0.01, 0.99, size=tuple(td.batch_shape)))
    for name, kv, tv in [
        ("log_prob", kd.log_prob(k_of(x)), td.log_prob(x)),
        ("cdf", kd.cdf(k_of(x)), td.cdf(x)),
        ("icdf", kd.icdf(k_of(q)), td.icdf(q)),
        ("entropy", kd.entropy(), td.entropy()),
        ("perplexity", kd.perplexity(), td.perplexity()),
    ]:
        close(kv, tv, name)
        grads_close(kv, tv, kargs, targs, name)
    for prop in ("mean", "mode", "variance", "stddev"):
        close(getattr(kd, prop), getattr(td, prop), prop)


def test_normal_scalar_parameters_give_an_empty_batch_shape():
    kd, td = KD.Normal(0.0, 1.0), TD.Normal(0.0, 1.0)
    assert kd.batch_shape == kiln.Size([]) and isinstance(kd.batch_shape, kiln.Size)
    assert kd.loc.dtype is kiln.get_default_dtype()
    close(kd.log_prob(kiln.tensor(0.3)), td.log_prob(torch.tensor(0.3)), "scalar", rtol=1e-6, atol=1e-7)
    # a number and a tensor: the number takes the tensor's dtype; the batch shape is the tensor's
    kd = KD.Normal(kiln.zeros(3, dtype=kiln.float64), 2)
    assert kd.scale.dtype is kiln.float64 and tuple(kd.batch_shape) == (3,)
    kd = KD.Normal(kiln.tensor(0.0), 1.0)  # a 0-d tensor: batch shape ()
    assert tuple(kd.batch_shape) == ()


def test_normal_non_contiguous_parameters():
    r = rng(2)
    loc, scale = r.normal(size=(3, 4)), r.uniform(0.5, 2, size=(3, 4))
    kl = kiln.tensor(loc.T.copy()).t()  # transposed kiln views holding the same values
    ks = kiln.tensor(scale.T.copy()).t()
    assert not kl.is_contiguous() and not ks.is_contiguous()
    x = torch.tensor(r.normal(size=(5, 3, 4)))
    kd, td = KD.Normal(kl, ks), TD.Normal(torch.tensor(loc), torch.tensor(scale))
    close(kd.log_prob(k_of(x)), td.log_prob(x), "transposed")
    close(kd.cdf(k_of(x)), td.cdf(x), "transposed cdf")


def test_normal_rsample_gradient_is_the_reparameterisation_gradient():
    r = rng(3)
    loc, scale = param(r.normal(size=(3,))), param(r.uniform(0.5, 2, size=(3,)))
    kloc, kscale = k_of(loc), k_of(scale)
    kiln.manual_seed(0)
    x = KD.Normal(kloc, kscale).rsample((50,))
    assert tuple(x.shape) == (50, 3) and x.requires_grad
    kg = kiln.autograd.grad(x.sum(), [kloc, kscale])
    tg = implied_rsample_grad(TD.Normal, [loc, scale], U.to_torch(x.detach()))
    for a, b in zip(kg, tg):
        close(a, b, "rsample grad", rtol=1e-8, atol=1e-10)
    # sample() records no gradient, rsample reproduces under the same seed
    assert not KD.Normal(kloc, kscale).sample((2,)).requires_grad
    kiln.manual_seed(0)
    again = KD.Normal(kloc, kscale).rsample((50,))
    np.testing.assert_array_equal(U.kiln_to_np(again), U.kiln_to_np(x))


def test_normal_sample_statistics():
    kiln.manual_seed(1234)
    d = KD.Normal(kiln.tensor([0.0, 3.0], dtype=kiln.float64), kiln.tensor([1.0, 0.5], dtype=kiln.float64))
    s = U.kiln_to_np(d.sample((20000,)))
    assert s.shape == (20000, 2) and s.dtype == np.float64
    assert (np.abs(s.mean(0) - [0.0, 3.0]) < 4 * np.array([1.0, 0.5]) / np.sqrt(20000)).all()
    np.testing.assert_allclose(s.var(0), [1.0, 0.25], rtol=0.05)


# ---------------------------------------------------------------------------------------- Uniform


@pytest.mark.parametrize("low_shape,high_shape", [((), ()), ((3,), ()), ((2, 1), (4,))])
def test_uniform_values_and_gradients(low_shape, high_shape):
    r = rng(4)
    targs, kargs = both_params(r.uniform(-2, -1, size=low_shape), r.uniform(1, 2, size=high_shape))
    (low, high), (klow, khigh) = targs, kargs
    td, kd = TD.Uniform(low, high), KD.Uniform(klow, khigh)
    x = torch.tensor(r.uniform(-0.9, 0.9, size=(5,) + tuple(td.batch_shape)))
    q = torch.tensor(r.uniform(0, 1, size=tuple(td.batch_shape)))
    for name, kv, tv in [
        ("log_prob", kd.log_prob(k_of(x)), td.log_prob(x)),
        ("cdf", kd.cdf(k_of(x)), td.cdf(x)),
        ("icdf", kd.icdf(k_of(q)), td.icdf(q)),
        ("entropy", kd.entropy(), td.entropy()),
    ]:
        close(kv, tv, name)
        grads_close(kv, tv, kargs, targs, name)
    for prop in ("mean", "mode", "variance", "stddev"):
        close(getattr(kd, prop), getattr(td, prop), prop)
    # outside the support (validation off): log_prob is -inf, the cdf clamps
    kd, td = KD.Uniform(klow, khigh, validate_args=False), TD.Uniform(low, high, validate_args=False)
    out = torch.full(tuple(td.batch_shape), 5.0, dtype=torch.float64)
    close(kd.log_prob(k_of(out)), td.log_prob(out), "outside")
    close(kd.cdf(k_of(out)), td.cdf(out), "cdf outside")


def test_uniform_rsample_gradient_and_statistics():
    low, high = param([-1.0, 2.0]), param([1.0, 5.0])
    kl, kh = k_of(low), k_of(high)
    kiln.manual_seed(5)
    x = KD.Uniform(kl, kh).rsample((40,))
    kg = kiln.autograd.grad(x.sum(), [kl, kh])
    tg = implied_rsample_grad(TD.Uniform, [low, high], U.to_torch(x.detach()))
    for a, b in zip(kg, tg):
        close(a, b, "uniform rsample grad", rtol=1e-8, atol=1e-10)
    kiln.manual_seed(6)
    s = U.kiln_to_np(KD.Uniform(kl, kh).sample((20000,)))
    assert ((s >= [-1, 2]) & (s < [1, 5])).all()
    np.testing.assert_allclose(s.mean(0), [0.0, 3.5], atol=0.03)
    np.testing.assert_allclose(s.var(0), [4 / 12, 9 / 12], rtol=0.05)


# ---------------------------------------------------------------------------------------- Bernoulli


@pytest.mark.parametrize("by", ["probs", "logits"])
@pytest.mark.parametrize("shape", [(), (3,), (2, 3)])
def test_bernoulli_values_and_gradients(by, shape):
    r = rng(7)
    (p,), (kp,) = both_params(r.uniform(0.05, 0.95, size=shape) if by == "probs" else r.normal(size=shape))
    td, kd = TD.Bernoulli(**{by: p}), KD.Bernoulli(**{by: kp})
    x = torch.tensor(r.integers(0, 2, size=(4,) + shape).astype(np.float64))
    for name, kv, tv in [("log_prob", kd.log_prob(k_of(x)), td.log_prob(x)), ("entropy", kd.entropy(), td.entropy())]:
        close(kv, tv, name)
        grads_close(kv, tv, [kp], [p], name)
    for prop in ("mean", "mode", "variance", "stddev", "probs", "logits", "param_shape"):
        close(getattr(kd, prop), getattr(td, prop), prop)
    close(kd.enumerate_support(), td.enumerate_support(), "support")
    close(kd.enumerate_support(expand=False), td.enumerate_support(expand=False), "support unexpanded")


def test_bernoulli_mode_at_one_half_and_extreme_probabilities():
    p = torch.tensor([0.0, 0.5, 1.0, 0.2], dtype=torch.float64)
    kd, td = KD.Bernoulli(k_of(p)), TD.Bernoulli(p)
    close(kd.mode, td.mode, "mode")
    x = torch.tensor([0.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    close(kd.log_prob(k_of(x)), td.log_prob(x), "log_prob at 0 and 1")
    close(kd.logits, td.logits, "clamped logits")


def test_bernoulli_sample_statistics():
    kiln.manual_seed(8)
    d = KD.Bernoulli(probs=kiln.tensor([0.1, 0.5, 0.9], dtype=kiln.float64))
    s = U.kiln_to_np(d.sample((20000,)))
    assert set(np.unique(s)) <= {0.0, 1.0} and s.dtype == np.float64
    np.testing.assert_allclose(s.mean(0), [0.1, 0.5, 0.9], atol=0.015)


def test_probs_and_logits_are_exclusive():
    for make_k, make_t in [
        (KD.Bernoulli, TD.Bernoulli),
        (KD.Categorical, TD.Categorical),
        (KD.Geometric, TD.Geometric),
        (KD.OneHotCategorical, TD.OneHotCategorical),
    ]:
        U.assert_same_error(lambda make_k=make_k: make_k(), lambda make_t=make_t: make_t(), exact=True)
        U.assert_same_error(
            lambda make_k=make_k: make_k(kiln.ones(2) / 2, kiln.ones(2)),
            lambda make_t=make_t: make_t(torch.ones(2) / 2, torch.ones(2)),
            exact=True,
        )


# ---------------------------------------------------------------------------------------- Categorical


@pytest.mark.parametrize("by", ["probs", "logits"])
@pytest.mark.parametrize("shape", [(4,), (3, 4), (2, 1, 5)])
def test_categorical_values_and_gradients(by, shape):
    r = rng(9)
    (p,), (kp,) = both_params(r.uniform(0.1, 2.0, size=shape) if by == "probs" else r.normal(size=shape))
    td, kd = TD.Categorical(**{by: p}), KD.Categorical(**{by: kp})
    assert tuple(kd.batch_shape) == tuple(td.batch_shape) and kd.event_shape == kiln.Size([])
    x = torch.tensor(r.integers(0, shape[-1], size=(3,) + tuple(td.batch_shape)))
    for name, kv, tv in [("log_prob", kd.log_prob(k_of(x)), td.log_prob(x)), ("entropy", kd.entropy(), td.entropy())]:
        close(kv, tv, name)
        grads_close(kv, tv, [kp], [p], name)
    for prop in ("probs", "logits", "mean", "variance", "mode", "param_shape"):
        close(getattr(kd, prop), getattr(td, prop), prop)
    close(kd.enumerate_support(), td.enumerate_support(), "support")
    close(kd.enumerate_support(False), td.enumerate_support(False), "support unexpanded")
    # a value that broadcasts against the batch (one index for every batch member)
    one = torch.tensor(1)
    close(kd.log_prob(k_of(one)), td.log_prob(one), "broadcast value")


def test_categorical_zero_probability_entropy_and_sampling():
    p = torch.tensor([[0.0, 0.3, 0.7], [1.0, 0.0, 0.0]], dtype=torch.float64)
    kd, td = KD.Categorical(k_of(p)), TD.Categorical(p)
    close(kd.entropy(), td.entropy(), "entropy with zeros")
    kiln.manual_seed(10)
    s = U.kiln_to_np(kd.sample((20000,)))
    assert s.dtype == np.int64 and s.shape == (20000, 2)
    assert (s[:, 0] != 0).all() and (s[:, 1] == 0).all()
    np.testing.assert_allclose(np.bincount(s[:, 0], minlength=3) / 20000, [0.0, 0.3, 0.7], atol=0.015)


def test_categorical_needs_an_event_dimension():
    for by in ("probs", "logits"):
        U.assert_same_error(
            lambda by=by: KD.Categorical(**{by: kiln.tensor(0.5)}),
            lambda by=by: TD.Categorical(**{by: torch.tensor(0.5)}),
            exact=True,
        )


# ---------------------------------------------------------------------------------------- MultivariateNormal


def spd(r, batch, n):
    a = r.normal(size=batch + (n, n))
    return a @ np.swapaxes(a, -1, -2) + n * np.eye(n)


@pytest.mark.parametrize("by", ["covariance_matrix", "precision_matrix", "scale_tril"])
@pytest.mark.parametrize("loc_batch,mat_batch", [((), ()), ((3,), ()), ((2, 1), (3,)), ((), (2,))])
def test_multivariate_normal_values_and_gradients(by, loc_batch, mat_batch):
    r = rng(11)
    n = 3
    m = spd(r, mat_batch, n)
    if by == "scale_tril":
        m = np.linalg.cholesky(m)
    targs, kargs = both_params(r.normal(size=loc_batch + (n,)), m)
    td, kd = TD.MultivariateNormal(targs[0], **{by: targs[1]}), KD.MultivariateNormal(kargs[0], **{by: kargs[1]})
    assert tuple(kd.batch_shape) == tuple(td.batch_shape) and tuple(kd.event_shape) == (n,)
    x = torch.tensor(r.normal(size=(4,) + tuple(td.batch_shape) + (n,)))
    for name, kv, tv in [("log_prob", kd.log_prob(k_of(x)), td.log_prob(x)), ("entropy", kd.entropy(), td.entropy())]:
        close(kv, tv, name, rtol=1e-9, atol=1e-10)
        grads_close(kv, tv, kargs, targs, name)
    for prop in ("mean", "mode", "variance", "stddev", "covariance_matrix", "precision_matrix", "scale_tril"):
        close(getattr(kd, prop), getattr(td, prop), prop, rtol=1e-9, atol=1e-10)


def test_multivariate_normal_value_with_fewer_batch_dims_and_broadcast_value():
    r = rng(12)
    loc = torch.tensor(r.normal(size=(2, 3)))
    cov = torch.tensor(spd(r, (2,), 3))
    kd, td = KD.MultivariateNormal(k_of(loc), k_of(cov)), TD.MultivariateNormal(loc, cov)
    x = torch.tensor(r.normal(size=(3,)))  # broadcasts over the batch
    close(kd.log_prob(k_of(x)), td.log_prob(x), "broadcast value")
    x = torch.tensor(r.normal(size=(5, 1, 3)))
    close(kd.log_prob(k_of(x)), td.log_prob(x), "sample dims and a size-1 batch dim")


def test_multivariate_normal_rsample_matches_torch_on_the_same_noise():
    r = rng(13)
    loc = param(r.normal(size=(2, 3)))
    tril = param(np.linalg.cholesky(spd(r, (), 3)))
    kloc, ktril = k_of(loc), k_of(tril)
    kiln.manual_seed(14)
    x = KD.MultivariateNormal(kloc, scale_tril=ktril).rsample((6,))
    assert tuple(x.shape) == (6, 2, 3)
    kiln.manual_seed(14)
    eps = kiln.randn(6, 2, 3, dtype=kiln.float64)  # the noise rsample drew
    t_eps = U.to_torch(eps)
    tx = loc + (tril @ t_eps.unsqueeze(-1)).squeeze(-1)  # PyTorch's rsample on that noise
    close(x, tx, "rsample values")
    grads_close(x, tx, [kloc, ktril], [loc, tril], "rsample")


def test_multivariate_normal_sample_statistics():
    cov = np.array([[2.0, 0.6], [0.6, 1.0]])
    kiln.manual_seed(15)
    d = KD.MultivariateNormal(kiln.tensor([1.0, -1.0], dtype=kiln.float64), kiln.tensor(cov))
    s = U.kiln_to_np(d.sample((20000,)))
    np.testing.assert_allclose(s.mean(0), [1.0, -1.0], atol=0.05)
    np.testing.assert_allclose(np.cov(s.T), cov, atol=0.06)


def test_multivariate_normal_argument_errors():
    two = torch.eye(2)
    cases = [
        (
            lambda: KD.MultivariateNormal(kiln.tensor(0.0), kiln.eye(2)),
            lambda: TD.MultivariateNormal(torch.tensor(0.0), two),
        ),
        (lambda: KD.MultivariateNormal(kiln.zeros(2)), lambda: TD.MultivariateNormal(torch.zeros(2))),
        (
            lambda: KD.MultivariateNormal(kiln.zeros(2), kiln.eye(2), scale_tril=kiln.eye(2)),
            lambda: TD.MultivariateNormal(torch.zeros(2), two, scale_tril=two),
        ),
        (
            lambda: KD.MultivariateNormal(kiln.zeros(2), kiln.ones(2)),
            lambda: TD.MultivariateNormal(torch.zeros(2), torch.ones(2)),
        ),
        (
            lambda: KD.MultivariateNormal(kiln.zeros(2), precision_matrix=kiln.ones(2)),
            lambda: TD.MultivariateNormal(torch.zeros(2), precision_matrix=torch.ones(2)),
        ),
        (
            lambda: KD.MultivariateNormal(kiln.zeros(2), scale_tril=kiln.ones(2)),
            lambda: TD.MultivariateNormal(torch.zeros(2), scale_tril=torch.ones(2)),
        ),
        (  # not positive definite
            lambda: KD.MultivariateNormal(kiln.zeros(2), kiln.tensor([[1.0, 2.0], [2.0, 1.0]])),
            lambda: TD.MultivariateNormal(torch.zeros(2), torch.tensor([[1.0, 2.0], [2.0, 1.0]])),
        ),
        (  # not lower triangular
            lambda: KD.MultivariateNormal(kiln.zeros(2), scale_tril=kiln.ones(2, 2)),
            lambda: TD.MultivariateNormal(torch.zeros(2), scale_tril=torch.ones(2, 2)),
        ),
        (  # a value of the wrong event size
            lambda: KD.MultivariateNormal(kiln.zeros(2), kiln.eye(2)).log_prob(kiln.zeros(3)),
            lambda: TD.MultivariateNormal(torch.zeros(2), two).log_prob(torch.zeros(3)),
        ),
    ]
    for kf, tf in cases:
        U.assert_same_error(kf, tf, exact=True)
    # batch shapes that do not broadcast: RuntimeError, from broadcast_shapes (which names kiln.Size, not torch.Size)
    with pytest.raises(RuntimeError):
        TD.MultivariateNormal(torch.zeros(3, 2), two.expand(4, 2, 2))
    with pytest.raises(RuntimeError, match="broadcast"):
        KD.MultivariateNormal(kiln.zeros(3, 2), kiln.eye(2).expand(4, 2, 2))


# ---------------------------------------------------------------------------------------- shapes, expand


def five(r):
    """The five required distributions with batch shape (2, 3), in both libraries."""
    n = 2
    loc, scale = r.normal(size=(2, 3)), r.uniform(0.5, 1.5, size=(2, 3))
    probs = r.uniform(0.1, 0.9, size=(2, 3))
    cat = r.uniform(0.1, 1.0, size=(2, 3, 4))
    mvn_loc, cov = r.normal(size=(2, 3, n)), spd(r, (2, 3), n)
    t = torch.tensor
    return [
        (KD.Normal(kiln.tensor(loc), kiln.tensor(scale)), TD.Normal(t(loc), t(scale))),
        (KD.Uniform(kiln.tensor(loc - 2), kiln.tensor(loc + 2)), TD.Uniform(t(loc - 2), t(loc + 2))),
        (KD.Bernoulli(kiln.tensor(probs)), TD.Bernoulli(t(probs))),
        (KD.Categorical(kiln.tensor(cat)), TD.Categorical(t(cat))),
        (KD.MultivariateNormal(kiln.tensor(mvn_loc), kiln.tensor(cov)), TD.MultivariateNormal(t(mvn_loc), t(cov))),
    ]


@pytest.mark.parametrize("sample_shape", [(), (4,), (2, 5), (0,)])
def test_sample_shapes(sample_shape):
    kiln.manual_seed(16)
    for kd, td in five(rng(16)):
        try:
            expected = tuple(td.sample(sample_shape).shape)
        except RuntimeError:  # Categorical cannot draw zero samples (multinomial's rule): neither can kiln
            U.assert_same_error(
                lambda kd=kd: kd.sample(sample_shape), lambda td=td: td.sample(sample_shape), exact=True
            )
            continue
        got = kd.sample(sample_shape)
        assert tuple(got.shape) == expected, type(kd).__name__
        assert got.dtype is U.T2K[td.sample().dtype], type(kd).__name__
        assert tuple(kd._extended_shape(sample_shape)) == expected
        if kd.has_rsample:
            assert tuple(kd.rsample(sample_shape).shape) == expected
        assert bool(kd.support.check(got).all()) if got.numel() else True
    assert kiln.Size([2]) == KD.Normal(kiln.zeros(2), 1.0).sample(kiln.Size([])).shape


@pytest.mark.parametrize("batch", [(2, 3), (4, 2, 3), (5, 1, 1)])
def test_expand(batch):
    r = rng(17)
    for kd, td in five(r):
        try:
            te = td.expand(batch)
        except RuntimeError:  # a batch PyTorch cannot expand to: kiln must refuse too
            with pytest.raises(RuntimeError):
                kd.expand(batch)
            continue
        ke = kd.expand(batch)
        assert type(ke) is type(kd) and tuple(ke.batch_shape) == tuple(te.batch_shape)
        assert tuple(ke.event_shape) == tuple(te.event_shape) and ke._validate_args == te._validate_args
        x = te.sample()
        close(ke.log_prob(U.to_kiln(x)), te.log_prob(x), f"expanded {type(kd).__name__}")
        assert tuple(ke.sample((2,)).shape) == tuple(te.sample((2,)).shape)
        close(ke.mean, te.mean, "expanded mean", rtol=1e-12, atol=1e-12)


def test_expand_keeps_the_parameters_as_views():
    loc = kiln.zeros(3)
    d = KD.Normal(loc, 1.0).expand((4, 3))
    assert d.loc.data_ptr() == loc.data_ptr() and tuple(d.loc.stride()) == (0, 1)


def test_expand_of_a_subclass_with_its_own_init_needs_its_own_expand():
    class Shifted(KD.Normal):
        def __init__(self, loc):
            super().__init__(loc, 1.0)

    kiln_shifted = Shifted

    class Shifted(TD.Normal):  # the same name: the message names the class
        def __init__(self, loc):
            super().__init__(loc, 1.0)

    U.assert_same_error(
        lambda: kiln_shifted(kiln.zeros(2)).expand((3, 2)), lambda: Shifted(torch.zeros(2)).expand((3, 2)), exact=True
    )


# ---------------------------------------------------------------------------------------- validation


def test_parameter_validation_errors_match_torch():
    neg = [1.0, -1.0, 2.0]
    cases = [
        (lambda: KD.Normal(kiln.zeros(3), kiln.tensor(neg)), lambda: TD.Normal(torch.zeros(3), torch.tensor(neg))),
        (  # float64 and requires_grad show in the printed values
            lambda: KD.Normal(0.0, kiln.tensor(neg, dtype=kiln.float64, requires_grad=True)),
            lambda: TD.Normal(0.0, torch.tensor(neg, dtype=torch.float64, requires_grad=True)),
        ),
        (lambda: KD.Normal(kiln.tensor(math.nan), 1.0), lambda: TD.Normal(torch.tensor(math.nan), 1.0)),
        (lambda: KD.Normal(0.0, 0.0), lambda: TD.Normal(0.0, 0.0)),
        (lambda: KD.Uniform(1.0, 0.0), lambda: TD.Uniform(1.0, 0.0)),
        (
            lambda: KD.Uniform(kiln.zeros(2), kiln.tensor([1.0, -1.0])),
            lambda: TD.Uniform(torch.zeros(2), torch.tensor([1.0, -1.0])),
        ),
        (lambda: KD.Bernoulli(kiln.tensor([[0.5, 1.1]])), lambda: TD.Bernoulli(torch.tensor([[0.5, 1.1]]))),
        (lambda: KD.Bernoulli(logits=kiln.tensor([math.nan])), lambda: TD.Bernoulli(logits=torch.tensor([math.nan]))),
        (lambda: KD.Categorical(kiln.tensor([0.5, -0.1, 0.6])), lambda: TD.Categorical(torch.tensor([0.5, -0.1, 0.6]))),
        (
            lambda: KD.Categorical(logits=kiln.tensor([0.0, math.nan])),
            lambda: TD.Categorical(logits=torch.tensor([0.0, math.nan])),
        ),
    ]
    for kf, tf in cases:
        U.assert_same_error(kf, tf, exact=True)


def test_value_validation_errors_match_torch():
    cases = [
        (
            lambda: KD.Normal(0.0, 1.0).log_prob(kiln.tensor([math.nan])),
            lambda: TD.Normal(0.0, 1.0).log_prob(torch.tensor([math.nan])),
        ),
        (lambda: KD.Normal(0.0, 1.0).log_prob(0.5), lambda: TD.Normal(0.0, 1.0).log_prob(0.5)),
        (lambda: KD.Normal(0.0, 1.0).cdf([0.5]), lambda: TD.Normal(0.0, 1.0).cdf([0.5])),
        (
            lambda: KD.Normal(kiln.zeros(3), 1.0).log_prob(kiln.zeros(2)),
            lambda: TD.Normal(torch.zeros(3), 1.0).log_prob(torch.zeros(2)),
        ),
        (
            lambda: KD.Uniform(0.0, 1.0).log_prob(kiln.tensor(2.0)),
            lambda: TD.Uniform(0.0, 1.0).log_prob(torch.tensor(2.0)),
        ),
        (lambda: KD.Uniform(0.0, 1.0).cdf(kiln.tensor(-1.0)), lambda: TD.Uniform(0.0, 1.0).cdf(torch.tensor(-1.0))),
        (
            lambda: KD.Bernoulli(0.3).log_prob(kiln.tensor([2.0])),
            lambda: TD.Bernoulli(0.3).log_prob(torch.tensor([2.0])),
        ),
        (
            lambda: KD.Bernoulli(0.3).log_prob(kiln.tensor([0.5])),
            lambda: TD.Bernoulli(0.3).log_prob(torch.tensor([0.5])),
        ),
        (
            lambda: KD.Categorical(kiln.ones(3)).log_prob(kiln.tensor([3])),
            lambda: TD.Categorical(torch.ones(3)).log_prob(torch.tensor([3])),
        ),
        (
            lambda: KD.Categorical(kiln.ones(2, 3)).log_prob(kiln.tensor([0, 1, 2])),
            lambda: TD.Categorical(torch.ones(2, 3)).log_prob(torch.tensor([0, 1, 2])),
        ),
        (
            lambda: KD.MultivariateNormal(kiln.zeros(2), kiln.eye(2)).log_prob(kiln.tensor([0.0, math.nan])),
            lambda: TD.MultivariateNormal(torch.zeros(2), torch.eye(2)).log_prob(torch.tensor([0.0, math.nan])),
        ),
    ]
    for kf, tf in cases:
        U.assert_same_error(kf, tf, exact=True)


def test_broadcast_errors_of_parameters():
    U.assert_same_error(
        lambda: KD.Normal(kiln.zeros(3), kiln.ones(2)), lambda: TD.Normal(torch.zeros(3), torch.ones(2)), exact=True
    )
    U.assert_same_error(lambda: KD.Normal("0", 1.0), lambda: TD.Normal("0", 1.0), message=None)
    U.assert_same_error(lambda: KD.Normal(None, 1.0), lambda: TD.Normal(None, 1.0))


def test_validate_args_false_and_the_default_switch():
    d = KD.Normal(0.0, -1.0, validate_args=False)  # not checked
    assert not d._validate_args
    assert math.isnan(d.log_prob(kiln.tensor(0.0)).item())
    try:
        KD.Distribution.set_default_validate_args(False)
        assert not KD.Normal(0.0, -1.0)._validate_args  # no error
        with pytest.raises(ValueError):
            KD.Normal(0.0, -1.0, validate_args=True)
    finally:
        KD.Distribution.set_default_validate_args(True)
    with pytest.raises(ValueError):
        KD.Normal(0.0, -1.0)
    U.assert_same_error(
        lambda: KD.Distribution.set_default_validate_args(2), lambda: TD.Distribution.set_default_validate_args(2)
    )
    # validation off: a value outside the support is scored, not refused
    assert KD.Uniform(0.0, 1.0, validate_args=False).log_prob(kiln.tensor(2.0)).item() == -math.inf


def test_a_subclass_without_arg_constraints_or_support_warns():
    class Bare(KD.Distribution):
        pass

    class TBare(TD.Distribution):
        pass

    for cls in (Bare, TBare):
        with pytest.warns(UserWarning, match="does not define `arg_constraints`"):
            cls()
    with pytest.warns(UserWarning, match="does not define `arg_constraints`"):
        bare = Bare(validate_args=True)
    with pytest.warns(UserWarning, match="does not define `support`"):
        bare._validate_sample(kiln.zeros(()))


# ---------------------------------------------------------------------------------------- base class API


def test_base_class_defaults_raise_not_implemented_like_torch():
    kd, td = KD.Distribution(validate_args=False), TD.Distribution(validate_args=False)
    for name in ("mean", "variance", "support", "arg_constraints"):
        with pytest.raises(NotImplementedError):
            getattr(kd, name)
        with pytest.raises(NotImplementedError):
            getattr(td, name)
    U.assert_same_error(lambda: kd.mode, lambda: td.mode, message=f"{KD.Distribution} does not implement mode")
    for name, args in [("rsample", ()), ("sample", ()), ("log_prob", (None,)), ("cdf", (None,)), ("icdf", (None,))]:
        with pytest.raises(NotImplementedError):
            getattr(kd, name)(*args)
    for name in ("entropy", "enumerate_support", "perplexity"):
        with pytest.raises(NotImplementedError):
            getattr(kd, name)()
    with pytest.raises(NotImplementedError):
        kd.expand((2,))
    assert KD.Distribution.has_rsample is False and KD.Distribution.has_enumerate_support is False
    assert kd.batch_shape == kiln.Size([]) and kd.event_shape == kiln.Size([])


def test_sample_n_is_deprecated_as_in_torch():
    d = KD.Normal(kiln.zeros(2), 1.0)
    with pytest.warns(FutureWarning, match=r"`sample_n\(n\)` will be deprecated. Use `sample\(\(n,\)\)` instead."):
        s = d.sample_n(3)
    assert tuple(s.shape) == (3, 2)


def test_repr_matches_torch():
    pairs = [
        (KD.Normal(kiln.zeros(2), 1.0), TD.Normal(torch.zeros(2), 1.0)),
        (KD.Normal(0.0, 2.0), TD.Normal(0.0, 2.0)),
        (KD.Categorical(kiln.ones(3)), TD.Categorical(torch.ones(3))),
        (KD.Bernoulli(logits=kiln.zeros(2)), TD.Bernoulli(logits=torch.zeros(2))),
        (KD.MultivariateNormal(kiln.zeros(2), kiln.eye(2)), TD.MultivariateNormal(torch.zeros(2), torch.eye(2))),
        (KD.Uniform(0.0, 1.0), TD.Uniform(0.0, 1.0)),
    ]
    for kd, td in pairs:
        assert repr(kd) == U.kiln_message(repr(td))


def test_lazy_parameters_are_computed_once_and_with_gradients():
    logits = kiln.tensor([0.0, 1.0], requires_grad=True)
    d = KD.Categorical(logits=logits)
    assert "probs" not in d.__dict__
    with kiln.no_grad():
        p = d.probs  # lazy properties compute with gradients on, as PyTorch's
    assert p.requires_grad and d.probs is p


def test_no_grad_sampling_and_rsample_flags():
    for kd, td in five(rng(18)):
        assert kd.has_rsample == td.has_rsample and kd.has_enumerate_support == td.has_enumerate_support
    d = KD.Bernoulli(kiln.tensor([0.5]))
    with pytest.raises(NotImplementedError):
        d.rsample()
    assert not KD.Categorical(kiln.ones(3, requires_grad=True)).sample().requires_grad


def test_warnings_free_in_normal_use():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d = KD.Normal(kiln.zeros(3), kiln.ones(3))
        d.log_prob(d.sample((2,)))
        KD.Categorical(logits=kiln.zeros(4)).sample((3,))
