"""Kullback–Leibler divergences between distributions (``torch.distributions.kl``).

:func:`kl_divergence` looks the pair of types up among the functions :func:`register_kl` registered,
the most specific match first (by subclass, as PyTorch does). The pairs are PyTorch's, among the
distributions kiln has; exponential families of one type fall back to the Bregman divergence of their
log-normaliser.
"""

from __future__ import annotations

import kiln
from kiln._tensor import Tensor
from kiln.distributions._kl_registry import (
    _KL_REGISTRY,
    _half_log_det,
    _inf_where,
    _trace_xxt,
    _zero_where,
    kl_divergence,
    register_kl,
)
from kiln.distributions._linalg import batch_mahalanobis
from kiln.distributions.bernoulli import Bernoulli
from kiln.distributions.beta import Beta
from kiln.distributions.binomial import Binomial
from kiln.distributions.categorical import Categorical
from kiln.distributions.cauchy import Cauchy
from kiln.distributions.continuous_bernoulli import ContinuousBernoulli
from kiln.distributions.dirichlet import Dirichlet
from kiln.distributions.exp_family import ExponentialFamily
from kiln.distributions.exponential import Exponential
from kiln.distributions.gamma import Gamma
from kiln.distributions.geometric import Geometric
from kiln.distributions.gumbel import Gumbel
from kiln.distributions.half_normal import HalfNormal
from kiln.distributions.independent import Independent
from kiln.distributions.laplace import Laplace
from kiln.distributions.lowrank_multivariate_normal import (
    LowRankMultivariateNormal,
    _lowrank_logdet,
    _lowrank_mahalanobis,
)
from kiln.distributions.multivariate_normal import MultivariateNormal
from kiln.distributions.normal import Normal
from kiln.distributions.one_hot_categorical import OneHotCategorical
from kiln.distributions.pareto import Pareto
from kiln.distributions.poisson import Poisson
from kiln.distributions.transformed_distribution import TransformedDistribution
from kiln.distributions.uniform import Uniform
from kiln.distributions.utils import _sum_rightmost, euler_constant
from kiln.nn_functional import softplus

__all__ = ["register_kl", "kl_divergence"]

# ------------------------------------------------------------------------------------------ same family


@register_kl(Bernoulli, Bernoulli)
def _kl_bernoulli_bernoulli(p, q):
    ones = p.probs * (softplus(-q.logits) - softplus(-p.logits))
    ones = _zero_where(p.probs == 0, _inf_where(q.probs == 0, ones))
    zeros = (1 - p.probs) * (softplus(q.logits) - softplus(p.logits))
    zeros = _zero_where(p.probs == 1, _inf_where(q.probs == 1, zeros))
    return ones + zeros


@register_kl(Beta, Beta)
def _kl_beta_beta(p, q):
    a1, b1, a2, b2 = p.concentration1, p.concentration0, q.concentration1, q.concentration0
    s1, s2 = a1 + b1, a2 + b2
    log_betas = a2.lgamma() + b2.lgamma() + s1.lgamma() - (a1.lgamma() + b1.lgamma() + s2.lgamma())
    return log_betas + (a1 - a2) * kiln.digamma(a1) + (b1 - b2) * kiln.digamma(b1) + (s2 - s1) * kiln.digamma(s1)


@register_kl(Binomial, Binomial)
def _kl_binomial_binomial(p, q):
    if bool((p.total_count < q.total_count).any()):
        raise NotImplementedError("KL between Binomials where q.total_count > p.total_count is not implemented")
    kl = p.total_count * (p.probs * (p.logits - q.logits) + (-p.probs).log1p() - (-q.probs).log1p())
    return _inf_where(p.total_count > q.total_count, kl)


@register_kl(Categorical, Categorical)
def _kl_categorical_categorical(p, q):
    t = p.probs * (p.logits - q.logits)
    t = _inf_where((q.probs == 0).expand_as(t), t)
    return _zero_where((p.probs == 0).expand_as(t), t).sum(-1)


@register_kl(ContinuousBernoulli, ContinuousBernoulli)
def _kl_continuous_bernoulli_continuous_bernoulli(p, q):
    return (
        p.mean * (p.logits - q.logits)
        + p._cont_bern_log_norm()
        + kiln.log1p(-p.probs)
        - q._cont_bern_log_norm()
        - kiln.log1p(-q.probs)
    )


@register_kl(Dirichlet, Dirichlet)
def _kl_dirichlet_dirichlet(p, q):
    a, b = p.concentration, q.concentration
    a0, b0 = a.sum(-1), b.sum(-1)
    log_norms = a0.lgamma() - b0.lgamma() - (a.lgamma() - b.lgamma()).sum(-1)
    return log_norms + ((a - b) * (kiln.digamma(a) - kiln.digamma(a0).unsqueeze(-1))).sum(-1)


@register_kl(Exponential, Exponential)
def _kl_exponential_exponential(p, q):
    ratio = q.rate / p.rate
    return -ratio.log() + ratio - 1


@register_kl(ExponentialFamily, ExponentialFamily)
def _kl_expfamily_expfamily(p, q):
    if type(p) is not type(q):
        raise NotImplementedError(
            f"The cross KL-divergence between different exponential families cannot{' ' * 29}be computed using "
            "Bregman divergences"
        )
    with kiln.enable_grad():
        p_params = [t.detach().requires_grad_() for t in p._natural_params]
        p_norm = p._log_normalizer(*p_params)
        grads = kiln.autograd.grad(p_norm.sum(), p_params, create_graph=True)
    result = q._log_normalizer(*q._natural_params) - p_norm
    for pt, qt, g in zip(p_params, q._natural_params, grads):
        result = result - _sum_rightmost((qt - pt) * g, len(q.event_shape))
    return result


@register_kl(Gamma, Gamma)
def _kl_gamma_gamma(p, q):
    a1, r1, a2, r2 = p.concentration, p.rate, q.concentration, q.rate
    return a2 * (r1 / r2).log() + a2.lgamma() - a1.lgamma() + (a1 - a2) * kiln.digamma(a1) + (r2 - r1) * (a1 / r1)


@register_kl(Gumbel, Gumbel)
def _kl_gumbel_gumbel(p, q):
    ratio = p.scale / q.scale
    q_loc, p_loc = q.loc / q.scale, p.loc / q.scale
    return (
        -ratio.log()
        - q_loc
        + p_loc
        + ratio * euler_constant
        + kiln.exp(q_loc + (1 + ratio).lgamma() - p_loc)
        - (1 + euler_constant)
    )


@register_kl(Geometric, Geometric)
def _kl_geometric_geometric(p, q):
    return -p.entropy() - kiln.log1p(-q.probs) / p.probs - q.logits


@register_kl(HalfNormal, HalfNormal)
def _kl_halfnormal_halfnormal(p, q):
    return _kl_normal_normal(p.base_dist, q.base_dist)


@register_kl(Laplace, Laplace)
def _kl_laplace_laplace(p, q):
    ratio = p.scale / q.scale
    gap = (p.loc - q.loc).abs()
    return -ratio.log() + gap / q.scale + ratio * kiln.exp(-gap / p.scale) - 1


def _check_event_shapes(p, q, what: str) -> None:
    if tuple(p.event_shape) != tuple(q.event_shape):
        # PyTorch's message, run of spaces included (a line continuation inside its string literal)
        raise ValueError(f"KL-divergence between two {what} with{' ' * 26}different event shapes cannot be computed")


def _solve_lower(lower: Tensor, rhs: Tensor) -> Tensor:
    return kiln.linalg.solve_triangular(lower, rhs, upper=False)


def _woodbury_factor(q) -> Tensor:
    """``A = C^-1 W^T D^-1`` for ``q``'s capacitance factor ``C``, so ``Sigma_q^-1 = D^-1 - A^T A``."""
    wt_dinv = q._unbroadcasted_cov_factor.mT / q._unbroadcasted_cov_diag.unsqueeze(-2)
    return _solve_lower(q._capacitance_tril, wt_dinv)


def _lowrank_q_terms(p, q) -> tuple[Tensor, Tensor]:
    log_det_q = _lowrank_logdet(q._unbroadcasted_cov_factor, q._unbroadcasted_cov_diag, q._capacitance_tril)
    maha = _lowrank_mahalanobis(
        q._unbroadcasted_cov_factor, q._unbroadcasted_cov_diag, q.loc - p.loc, q._capacitance_tril
    )
    return log_det_q, maha


@register_kl(LowRankMultivariateNormal, LowRankMultivariateNormal)
def _kl_lowrank_lowrank(p, q):
    _check_event_shapes(p, q, "Low Rank Multivariate Normals")
    log_det_q, maha = _lowrank_q_terms(p, q)
    log_det_p = _lowrank_logdet(p._unbroadcasted_cov_factor, p._unbroadcasted_cov_diag, p._capacitance_tril)
    a = _woodbury_factor(q)
    pw, pd, qd = p._unbroadcasted_cov_factor, p._unbroadcasted_cov_diag, q._unbroadcasted_cov_diag
    trace = (
        (pd / qd).sum(-1)
        + _trace_xxt(pw * qd.rsqrt().unsqueeze(-1))
        - _trace_xxt(a * pd.sqrt().unsqueeze(-2))
        - _trace_xxt(a.matmul(pw))
    )
    return 0.5 * (log_det_q - log_det_p + trace + maha - p.event_shape[0])


@register_kl(MultivariateNormal, LowRankMultivariateNormal)
def _kl_multivariatenormal_lowrank(p, q):
    _check_event_shapes(p, q, "(Low Rank) Multivariate Normals")
    log_det_q, maha = _lowrank_q_terms(p, q)
    pl = p._unbroadcasted_scale_tril
    a = _woodbury_factor(q)
    trace = _trace_xxt(pl * q._unbroadcasted_cov_diag.rsqrt().unsqueeze(-1)) - _trace_xxt(a.matmul(pl))
    return 0.5 * (log_det_q - 2 * _half_log_det(pl) + trace + maha - p.event_shape[0])


@register_kl(LowRankMultivariateNormal, MultivariateNormal)
def _kl_lowrank_multivariatenormal(p, q):
    _check_event_shapes(p, q, "(Low Rank) Multivariate Normals")
    ql = q._unbroadcasted_scale_tril
    log_det_p = _lowrank_logdet(p._unbroadcasted_cov_factor, p._unbroadcasted_cov_diag, p._capacitance_tril)
    maha = batch_mahalanobis(ql, q.loc - p.loc)
    pd_sqrt = p._unbroadcasted_cov_diag.sqrt()
    trace = _trace_xxt(_solve_lower(ql, p._unbroadcasted_cov_factor)) + _trace_xxt(
        _solve_lower(ql, pd_sqrt.unsqueeze(-1) * kiln.eye(pd_sqrt.shape[-1], dtype=ql.dtype, device=ql.device))
    )
    return 0.5 * (2 * _half_log_det(ql) - log_det_p + trace + maha - p.event_shape[0])


@register_kl(MultivariateNormal, MultivariateNormal)
def _kl_multivariatenormal_multivariatenormal(p, q):
    _check_event_shapes(p, q, "Multivariate Normals")
    pl, ql = p._unbroadcasted_scale_tril, q._unbroadcasted_scale_tril
    n = p.event_shape[0]
    trace = _trace_xxt(_solve_lower(ql, pl))
    return _half_log_det(ql) - _half_log_det(pl) + 0.5 * (trace + batch_mahalanobis(ql, q.loc - p.loc) - n)


@register_kl(Normal, Normal)
def _kl_normal_normal(p, q):
    var_ratio = (p.scale / q.scale).pow(2)
    t1 = ((p.loc - q.loc) / q.scale).pow(2)
    return 0.5 * (var_ratio + t1 - 1 - var_ratio.log())


@register_kl(OneHotCategorical, OneHotCategorical)
def _kl_onehotcategorical_onehotcategorical(p, q):
    return _kl_categorical_categorical(p._categorical, q._categorical)


@register_kl(Pareto, Pareto)
def _kl_pareto_pareto(p, q):
    scale_ratio, alpha_ratio = p.scale / q.scale, q.alpha / p.alpha
    result = q.alpha * scale_ratio.log() - alpha_ratio.log() + alpha_ratio - 1
    return _inf_where(p.support.lower_bound < q.support.lower_bound, result)


@register_kl(Poisson, Poisson)
def _kl_poisson_poisson(p, q):
    return p.rate * (p.rate.log() - q.rate.log()) - (p.rate - q.rate)


@register_kl(TransformedDistribution, TransformedDistribution)
def _kl_transformed_transformed(p, q):
    if p.transforms != q.transforms:
        raise NotImplementedError
    if tuple(p.event_shape) != tuple(q.event_shape):
        raise NotImplementedError
    return kl_divergence(p.base_dist, q.base_dist)


@register_kl(Uniform, Uniform)
def _kl_uniform_uniform(p, q):
    result = ((q.high - q.low) / (p.high - p.low)).log()
    return _inf_where((q.low > p.low) | (q.high < p.high), result)


@register_kl(Independent, Independent)
def _kl_independent_independent(p, q):
    if p.reinterpreted_batch_ndims != q.reinterpreted_batch_ndims:
        raise NotImplementedError
    return _sum_rightmost(kl_divergence(p.base_dist, q.base_dist), p.reinterpreted_batch_ndims)


@register_kl(Cauchy, Cauchy)
def _kl_cauchy_cauchy(p, q):
    return ((p.scale + q.scale).pow(2) + (p.loc - q.loc).pow(2)).log() - (4 * p.scale * q.scale).log()


from kiln.distributions import _kl_cross  # noqa: E402,F401 - registers the pairs of different families

kl_divergence.__module__ = register_kl.__module__ = __name__  # PyTorch's module path


def _add_kl_info() -> None:
    rows = ["KL divergence is implemented for these pairs of distributions:", ""]
    for p, q in sorted(_KL_REGISTRY, key=lambda pq: (pq[0].__name__, pq[1].__name__)):
        rows.append(f"* :class:`~kiln.distributions.{p.__name__}` and :class:`~kiln.distributions.{q.__name__}`")
    kl_divergence.__doc__ += "\n" + "\n".join("    " + r if r else "" for r in rows) + "\n"


_add_kl_info()
