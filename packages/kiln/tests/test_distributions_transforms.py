"""kiln.distributions.transforms, constraints, constraint_registry and TransformedDistribution against
PyTorch: forward and inverse values, log-Jacobians and their gradients, shapes, signs, caching,
equality, constraint checks and reprs, the transforms biject_to/transform_to pick, and distributions
built from transforms (including decreasing ones, whose cdf is flipped)."""

from __future__ import annotations

import math

import kiln_testutil as U
import numpy as np
import pytest
import torch
import torch.distributions as TD
import torch.distributions.constraints as TC
import torch.distributions.transforms as TT

import kiln
import kiln.distributions as KD
import kiln.distributions.constraints as KC
import kiln.distributions.transforms as KT
from kiln.distributions.constraint_registry import biject_to, transform_to


def close(k, t, what, rtol=1e-9, atol=1e-11):
    U.assert_close(k, t, rtol=rtol, atol=atol, msg=f"{what}: ")


# name -> (kiln transform, torch transform, an input in the domain (NumPy, shape (4, 3) or as the transform needs))
def transforms_table(r):
    loc, scale = r.normal(size=(3,)), r.uniform(0.5, 2.0, size=(3,)) * np.array([1, -1, 1])
    expo = r.uniform(0.5, 2.0, size=(3,))
    x = r.normal(size=(4, 3))
    k, t = kiln.tensor, torch.tensor
    return {
        "Exp": (KT.ExpTransform(), TT.ExpTransform(), x),
        "Sigmoid": (KT.SigmoidTransform(), TT.SigmoidTransform(), x),
        "Softplus": (KT.SoftplusTransform(), TT.SoftplusTransform(), x * 10),
        "Tanh": (KT.TanhTransform(), TT.TanhTransform(), x),
        "Abs": (KT.AbsTransform(), TT.AbsTransform(), x),
        "Power": (KT.PowerTransform(k(expo)), TT.PowerTransform(t(expo)), np.abs(x) + 0.1),
        "PowerScalar": (KT.PowerTransform(2.0), TT.PowerTransform(2.0), np.abs(x) + 0.1),
        "Affine": (KT.AffineTransform(k(loc), k(scale)), TT.AffineTransform(t(loc), t(scale)), x),
        "AffineScalar": (KT.AffineTransform(1.0, -2.0), TT.AffineTransform(1.0, -2.0), x),
        "AffineEvent": (
            KT.AffineTransform(k(loc), k(scale), event_dim=1),
            TT.AffineTransform(t(loc), t(scale), event_dim=1),
            x,
        ),
        "AffineEvent2": (KT.AffineTransform(0.5, 3.0, event_dim=2), TT.AffineTransform(0.5, 3.0, event_dim=2), x),
        "Softmax": (KT.SoftmaxTransform(), TT.SoftmaxTransform(), x),
        "StickBreaking": (KT.StickBreakingTransform(), TT.StickBreakingTransform(), x),
        "LowerCholesky": (KT.LowerCholeskyTransform(), TT.LowerCholeskyTransform(), r.normal(size=(2, 3, 3))),
        "PositiveDefinite": (KT.PositiveDefiniteTransform(), TT.PositiveDefiniteTransform(), r.normal(size=(2, 3, 3))),
        "CorrCholesky": (KT.CorrCholeskyTransform(), TT.CorrCholeskyTransform(), r.normal(size=(2, 6))),
        "Reshape": (KT.ReshapeTransform((3,), (3, 1)), TT.ReshapeTransform((3,), (3, 1)), x),
        "Independent": (
            KT.IndependentTransform(KT.ExpTransform(), 1),
            TT.IndependentTransform(TT.ExpTransform(), 1),
            x,
        ),
        "Compose": (
            KT.ComposeTransform(
                [KT.AffineTransform(k(loc), 2.0), KT.SigmoidTransform(), KT.AffineTransform(0.0, -1.0)]
            ),
            TT.ComposeTransform(
                [TT.AffineTransform(t(loc), 2.0), TT.SigmoidTransform(), TT.AffineTransform(0.0, -1.0)]
            ),
            x,
        ),
        "ComposeEvent": (
            KT.ComposeTransform([KT.ExpTransform(), KT.StickBreakingTransform()]),
            TT.ComposeTransform([TT.ExpTransform(), TT.StickBreakingTransform()]),
            x,
        ),
        "Identity": (KT.identity_transform, TT.identity_transform, x),
        "Cat": (
            KT.CatTransform(
                [KT.ExpTransform(), KT.identity_transform, KT.SigmoidTransform()], dim=1, lengths=[1, 1, 1]
            ),
            TT.CatTransform(
                [TT.ExpTransform(), TT.identity_transform, TT.SigmoidTransform()], dim=1, lengths=[1, 1, 1]
            ),
            x,
        ),
        "CatEvent": (
            KT.CatTransform(
                [KT.IndependentTransform(KT.SigmoidTransform(), 1), KT.ExpTransform()], dim=-1, lengths=[2, 1]
            ),
            TT.CatTransform(
                [TT.IndependentTransform(TT.SigmoidTransform(), 1), TT.ExpTransform()], dim=-1, lengths=[2, 1]
            ),
            x,
        ),
        "Stack": (
            KT.StackTransform([KT.ExpTransform(), KT.TanhTransform(), KT.AffineTransform(1.0, 2.0)], dim=1),
            TT.StackTransform([TT.ExpTransform(), TT.TanhTransform(), TT.AffineTransform(1.0, 2.0)], dim=1),
            x,
        ),
        "Inverse": (KT.ExpTransform().inv, TT.ExpTransform().inv, np.abs(x) + 0.1),
        "CDF": (
            KT.CumulativeDistributionTransform(KD.Normal(k(loc), k(np.abs(scale)))),
            TT.CumulativeDistributionTransform(TD.Normal(t(loc), t(np.abs(scale)))),
            x,
        ),
    }


NAMES = list(transforms_table(np.random.default_rng(0)))
NO_INVERSE_ROUND_TRIP = {"Abs", "Softmax", "PositiveDefinite", "LowerCholesky"}  # not bijective on all inputs


@pytest.mark.parametrize("name", NAMES)
def test_transform_against_torch(name):
    kt, tt, x = transforms_table(np.random.default_rng(1))[name]
    tx = torch.tensor(x, requires_grad=True)
    kx = U.to_kiln(tx.detach(), requires_grad=True)
    ty, ky = tt(tx), kt(kx)
    close(ky, ty, "forward")
    assert kt.bijective == tt.bijective
    try:
        assert kt.event_dim == tt.event_dim
    except ValueError:  # domain and codomain differ: kiln refuses as PyTorch does
        U.assert_same_error(lambda: kt.event_dim, lambda: tt.event_dim, exact=True)
    assert repr(kt.domain) == repr(tt.domain) and repr(kt.codomain) == repr(tt.codomain)
    assert kt.domain.event_dim == tt.domain.event_dim and kt.codomain.event_dim == tt.codomain.event_dim
    assert tuple(kt.forward_shape(kiln.Size(x.shape))) == tuple(tt.forward_shape(torch.Size(x.shape)))
    assert tuple(kt.inverse_shape(kiln.Size(ty.shape))) == tuple(tt.inverse_shape(torch.Size(ty.shape)))
    assert repr(kt) == U.kiln_message(repr(tt))
    # the inverse on the forward's output (recomputed: no cache)
    ty0 = ty.detach()
    close(kt.inv(U.to_kiln(ty0)), tt.inv(ty0), "inverse", rtol=1e-7, atol=1e-9)
    if name not in NO_INVERSE_ROUND_TRIP:
        close(kt.inv(U.to_kiln(ty0)), tx.detach(), "round trip", rtol=1e-6, atol=1e-8)
    try:
        tj = tt.log_abs_det_jacobian(tx, ty)
    except NotImplementedError:
        with pytest.raises(NotImplementedError):
            kt.log_abs_det_jacobian(kx, ky)
        return
    kj = kt.log_abs_det_jacobian(kx, ky)
    close(kj, tj, "log_abs_det_jacobian", rtol=1e-8, atol=1e-10)
    (tg,) = torch.autograd.grad((ty.sum() + tj.sum()), [tx])
    (kg,) = kiln.autograd.grad((ky.sum() + kj.sum()), [kx])
    close(kg, tg, "gradient", rtol=1e-7, atol=1e-9)
    # the inverse's Jacobian is minus the forward's
    close(
        kt.inv.log_abs_det_jacobian(ky, kx),
        tt.inv.log_abs_det_jacobian(ty, tx),
        "inverse jacobian",
        rtol=1e-8,
        atol=1e-10,
    )
    try:
        ts = tt.sign
    except NotImplementedError:
        with pytest.raises(NotImplementedError):
            kt.sign
    else:
        ks = kt.sign
        if isinstance(ts, torch.Tensor):
            close(ks, ts, "sign")
        else:
            assert ks == ts


def test_transform_caching_and_identity():
    for cache in (0, 1):
        t = KT.ExpTransform(cache_size=cache)
        x = kiln.tensor([0.5, 1.0])
        y = t(x)
        assert (t(x) is y) == (cache == 1)
        assert (t.inv(y) is x) == (cache == 1)
    t = KT.ExpTransform()
    assert t.inv.inv is t and t.with_cache(0) is t and t.with_cache(1)._cache_size == 1
    assert t.inv.with_cache(1).inv._cache_size == 1
    assert KT.ExpTransform() == KT.ExpTransform() and KT.ExpTransform() != KT.SigmoidTransform()
    assert KT.AffineTransform(1.0, 2.0) == KT.AffineTransform(1.0, 2.0) != KT.AffineTransform(1.0, 3.0)
    assert KT.AffineTransform(kiln.ones(2), 2.0) == KT.AffineTransform(kiln.ones(2), 2.0)
    assert KT.PowerTransform(2.0) == KT.PowerTransform(2.0) != KT.PowerTransform(3.0)
    assert KT.ExpTransform().inv == KT.ExpTransform().inv
    assert KT.ComposeTransform([KT.ExpTransform()]) == KT.ComposeTransform([KT.ExpTransform()])
    c = KT.ComposeTransform([KT.ExpTransform(), KT.AffineTransform(0.0, 2.0)], cache_size=1)
    assert all(p._cache_size == 1 for p in c.parts) and c.inv.inv is c
    assert KT.identity_transform(kiln.ones(2)).tolist() == [1.0, 1.0]
    assert KT.identity_transform.log_abs_det_jacobian(kiln.ones(2), kiln.ones(2)).tolist() == [0.0, 0.0]
    for k, t in [(lambda: KT.ExpTransform(cache_size=2), lambda: TT.ExpTransform(cache_size=2))]:
        U.assert_same_error(k, t, exact=True)
    U.assert_same_error(lambda: KT.ReshapeTransform((2,), (3,)), lambda: TT.ReshapeTransform((2,), (3,)), exact=True)
    U.assert_same_error(
        lambda: KT.ReshapeTransform((3,), (3, 1)).forward_shape(kiln.Size((4, 2))),
        lambda: TT.ReshapeTransform((3,), (3, 1)).forward_shape(torch.Size((4, 2))),
        exact=True,
    )
    U.assert_same_error(
        lambda: KT.IndependentTransform(KT.ExpTransform(), 2)(kiln.ones(3)),
        lambda: TT.IndependentTransform(TT.ExpTransform(), 2)(torch.ones(3)),
        exact=True,
    )
    U.assert_same_error(
        lambda: KT.CorrCholeskyTransform().forward_shape((4,)),
        lambda: TT.CorrCholeskyTransform().forward_shape((4,)),
        exact=True,
    )
    U.assert_same_error(
        lambda: KT.CatTransform([KT.ExpTransform()], lengths=[1, 2]),
        lambda: TT.CatTransform([TT.ExpTransform()], lengths=[1, 2]),
        exact=True,
    )


# ---------------------------------------------------------------------------------------- constraints


def constraint_pairs():
    k, t = kiln.tensor, torch.tensor
    return [
        (KC.real, TC.real),
        (KC.positive, TC.positive),
        (KC.nonnegative, TC.nonnegative),
        (KC.boolean, TC.boolean),
        (KC.unit_interval, TC.unit_interval),
        (KC.nonnegative_integer, TC.nonnegative_integer),
        (KC.positive_integer, TC.positive_integer),
        (KC.greater_than(0.5), TC.greater_than(0.5)),
        (KC.greater_than_eq(0.5), TC.greater_than_eq(0.5)),
        (KC.less_than(0.5), TC.less_than(0.5)),
        (KC.interval(-1.0, 0.5), TC.interval(-1.0, 0.5)),
        (KC.half_open_interval(-1.0, 0.5), TC.half_open_interval(-1.0, 0.5)),
        (KC.integer_interval(0, 2), TC.integer_interval(0, 2)),
        (KC.interval(k([-1.0, 0.0, 1.0]), k([0.0, 1.0, 2.0])), TC.interval(t([-1.0, 0.0, 1.0]), t([0.0, 1.0, 2.0]))),
        (KC.real_vector, TC.real_vector),
        (KC.simplex, TC.simplex),
        (KC.one_hot, TC.one_hot),
        (KC.multinomial(3), TC.multinomial(3)),
        (KC.independent(KC.positive, 1), TC.independent(TC.positive, 1)),
        (KC.independent(KC.real, 2), TC.independent(TC.real, 2)),
        (KC.lower_triangular, TC.lower_triangular),
        (KC.lower_cholesky, TC.lower_cholesky),
        (KC.corr_cholesky, TC.corr_cholesky),
        (KC.square, TC.square),
        (KC.symmetric, TC.symmetric),
        (KC.positive_semidefinite, TC.positive_semidefinite),
        (KC.positive_definite, TC.positive_definite),
        (
            KC.cat([KC.positive, KC.real, KC.unit_interval], 1, [1, 1, 1]),
            TC.cat([TC.positive, TC.real, TC.unit_interval], 1, [1, 1, 1]),
        ),
        (KC.stack([KC.positive, KC.real, KC.unit_interval], 1), TC.stack([TC.positive, TC.real, TC.unit_interval], 1)),
        (KC.MixtureSameFamilyConstraint(KC.positive), TC.MixtureSameFamilyConstraint(TC.positive)),
    ]


def constraint_inputs(r):
    """Values that hit both sides of every constraint: reals with NaN, integers, 0/1, simplex rows, one-hot
    rows, count rows, and matrices (triangular, symmetric, correlation factors, square or not)."""
    x = np.round(r.normal(size=(5, 3)) * 2, 1)
    x[0, 0] = math.nan
    simplex = r.dirichlet(np.ones(3), size=5)
    simplex[0] = [0.5, 0.6, -0.1]
    onehot = np.eye(3)[r.integers(0, 3, size=5)]
    onehot[1] = [1.0, 1.0, 0.0]
    counts = np.array([[1.0, 2.0, 0.0], [3.0, 1.0, 0.0], [0.0, 0.0, 0.0], [-1.0, 1.0, 1.0], [0.5, 0.5, 0.0]])
    a = r.normal(size=(4, 3, 3))
    mats = np.stack([a[0] @ a[0].T + np.eye(3), np.tril(a[1]), a[2], np.diag([1.0, -1.0, 2.0])])
    corr = np.linalg.cholesky(np.array([[1.0, 0.3, 0.1], [0.3, 1.0, 0.2], [0.1, 0.2, 1.0]]))
    mats = np.concatenate([mats, corr[None], np.abs(np.tril(a[3]))[None] + 0.1])
    return [
        x,
        np.abs(x),
        np.round(np.abs(x)),
        (x > 0).astype(np.float64),
        simplex,
        onehot,
        counts,
        mats,
        r.normal(size=(2, 3, 4)),
    ]


@pytest.mark.parametrize("index", range(len(constraint_pairs())))
def test_constraint_checks_against_torch(index):
    kc, tc = constraint_pairs()[index]
    assert repr(kc) == U.kiln_message(repr(tc))
    assert kc.event_dim == tc.event_dim and kc.is_discrete == tc.is_discrete
    for v in constraint_inputs(np.random.default_rng(2)):
        tv = torch.tensor(v)
        try:
            expected = tc.check(tv)
        except Exception as exc:  # noqa: BLE001 - the check itself refuses: kiln must too, with the same type
            with pytest.raises(type(exc)):
                kc.check(U.to_kiln(tv))
            continue
        close(kc.check(U.to_kiln(tv)), expected, f"{tc!r} on {v.shape}")


def test_dependent_constraints():
    assert KC.is_dependent(KC.dependent) and not KC.is_dependent(KC.real)
    U.assert_same_error(lambda: KC.dependent.check(kiln.ones(1)), lambda: TC.dependent.check(torch.ones(1)), exact=True)
    U.assert_same_error(lambda: KC.dependent.event_dim, lambda: TC.dependent.event_dim, exact=True)
    U.assert_same_error(lambda: KC.dependent.is_discrete, lambda: TC.dependent.is_discrete, exact=True)
    d = KC.dependent(is_discrete=True, event_dim=1)
    assert d.is_discrete is True and d.event_dim == 1
    assert KC.is_dependent(KD.Uniform.support) and KD.Uniform.support.event_dim == 0
    assert repr(KD.Uniform(0.0, 2.0).support) == repr(TD.Uniform(0.0, 2.0).support)
    assert KD.Binomial.support.is_discrete and KC.is_dependent(KD.Categorical.support)
    U.assert_same_error(lambda: KC.independent(KC.real, -1), lambda: TC.independent(TC.real, -1), exact=True)
    U.assert_same_error(lambda: KC.independent("x", 1), lambda: TC.independent("x", 1), exact=True)
    U.assert_same_error(
        lambda: KC.independent(KC.real, 2).check(kiln.ones(3)),
        lambda: TC.independent(TC.real, 2).check(torch.ones(3)),
        exact=True,
    )
    U.assert_same_error(lambda: KC.cat([KC.real, 1]), lambda: TC.cat([TC.real, 1]), exact=True)
    with pytest.raises(NotImplementedError):
        KC.Constraint().check(kiln.ones(1))


@pytest.mark.parametrize("registry", ["biject_to", "transform_to"])
def test_constraint_registry(registry):
    k_reg = biject_to if registry == "biject_to" else transform_to
    t_reg = getattr(TD, registry)
    r = np.random.default_rng(3)
    for kc, tc in constraint_pairs():
        try:
            tt = t_reg(tc)
        except NotImplementedError:
            U.assert_same_error(lambda kc=kc: k_reg(kc), lambda tc=tc: t_reg(tc), exact=True)
            continue
        kt = k_reg(kc)
        assert repr(kt).replace("kiln", "torch") == repr(tt), f"{tc!r}: {kt!r} vs {tt!r}"
        shape = (2, 6) if tc is TC.corr_cholesky else (2, 3, 3) if tc.event_dim == 2 else (2, 3)
        x = torch.tensor(r.normal(size=shape))
        y = kt(U.to_kiln(x))
        close(y, tt(x), f"{registry}({tc!r})", rtol=1e-8, atol=1e-10)
        assert bool(kc.check(y).all()), f"{registry}({tc!r}) left the region"
    with pytest.raises(NotImplementedError, match="Cannot transform _Boolean constraints"):
        k_reg(KC.boolean)
    U.assert_same_error(
        lambda: k_reg.register(3, lambda c: None), lambda: t_reg.register(3, lambda c: None), exact=True
    )


def test_registering_a_new_constraint():
    class _Odd(KC.Constraint):
        """Odd integers."""

    reg = KD.constraint_registry.ConstraintRegistry()
    reg.register(_Odd, lambda c: KT.ExpTransform())
    assert isinstance(reg(_Odd()), KT.ExpTransform)

    @reg.register(_Odd())
    def _factory(c):
        return KT.SigmoidTransform()

    assert isinstance(reg(_Odd()), KT.SigmoidTransform)


# ---------------------------------------------------------------------------------------- TransformedDistribution


def test_transformed_distribution_against_torch():
    r = np.random.default_rng(4)
    loc, scale = r.normal(size=(3,)), r.uniform(0.5, 1.5, size=(3,))
    chains = [
        (lambda M, T, lib: [T.ExpTransform(), T.AffineTransform(1.0, -2.0)], False),  # decreasing: flipped cdf
        (lambda M, T, lib: [T.SigmoidTransform(), T.AffineTransform(lib.tensor([0.0, 1.0, 2.0]), 3.0)], False),
        (lambda M, T, lib: T.TanhTransform(), False),
        (lambda M, T, lib: [T.StickBreakingTransform()], True),  # raises the event dimension
        (lambda M, T, lib: [T.ReshapeTransform((3,), (1, 3))], True),
    ]
    for make, event in chains:
        tl, ts = torch.tensor(loc, requires_grad=True), torch.tensor(scale, requires_grad=True)
        kl, ks = U.to_kiln(tl.detach(), requires_grad=True), U.to_kiln(ts.detach(), requires_grad=True)
        td = TD.TransformedDistribution(TD.Normal(tl, ts), make(TD, TT, torch))
        kd = KD.TransformedDistribution(KD.Normal(kl, ks), make(KD, KT, kiln))
        assert tuple(kd.batch_shape) == tuple(td.batch_shape) and tuple(kd.event_shape) == tuple(td.event_shape)
        assert repr(kd.support) == repr(td.support) and kd.has_rsample
        torch.manual_seed(5)
        x = td.sample((4,))
        kv, tv = kd.log_prob(U.to_kiln(x)), td.log_prob(x)
        close(kv, tv, "log_prob", rtol=1e-8, atol=1e-9)
        tg = torch.autograd.grad(tv.sum(), [tl, ts])
        kg = kiln.autograd.grad(kv.sum(), [kl, ks])
        for a, b in zip(kg, tg):
            close(a, b, "log_prob grad", rtol=1e-7, atol=1e-9)
        if not event:
            close(kd.cdf(U.to_kiln(x)), td.cdf(x), "cdf", rtol=1e-8, atol=1e-10)
            q = torch.tensor(r.uniform(0.1, 0.9, size=(3,)))
            close(kd.icdf(U.to_kiln(q)), td.icdf(q), "icdf", rtol=1e-8, atol=1e-10)
        kiln.manual_seed(5)
        s = kd.sample((6,))
        assert tuple(s.shape) == tuple(td.sample((6,)).shape) and bool(kd.support.check(s).all())
        ke, te = kd.expand((2, 3)), td.expand((2, 3))
        assert tuple(ke.batch_shape) == tuple(te.batch_shape) and tuple(ke.sample().shape) == tuple(te.sample().shape)


def test_transformed_distribution_errors():
    U.assert_same_error(
        lambda: KD.TransformedDistribution(KD.Normal(0.0, 1.0), [KT.ExpTransform(), 3]),
        lambda: TD.TransformedDistribution(TD.Normal(0.0, 1.0), [TT.ExpTransform(), 3]),
        exact=True,
    )
    U.assert_same_error(
        lambda: KD.TransformedDistribution(KD.Normal(0.0, 1.0), "exp"),
        lambda: TD.TransformedDistribution(TD.Normal(0.0, 1.0), "exp"),
        exact=True,
    )
    U.assert_same_error(
        lambda: KD.TransformedDistribution(KD.Normal(0.0, 1.0), [KT.StickBreakingTransform()]),
        lambda: TD.TransformedDistribution(TD.Normal(0.0, 1.0), [TT.StickBreakingTransform()]),
        message="base_distribution needs to have shape with size at least 1, but got kiln.Size([]).",
        exact=True,
    )
    d = KD.TransformedDistribution(KD.Normal(kiln.zeros(2), 1.0), [])
    assert repr(d.support) == "Real()" and tuple(d.event_shape) == ()
    # a value outside the transformed support is refused by validation
    U.assert_same_error(
        lambda: KD.LogNormal(0.0, 1.0).log_prob(kiln.tensor(-1.0)),
        lambda: TD.LogNormal(0.0, 1.0).log_prob(torch.tensor(-1.0)),
        exact=True,
    )
