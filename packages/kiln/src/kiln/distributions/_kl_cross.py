"""KL divergences between distributions of different families (PyTorch's pairs), registered with
:func:`kiln.distributions.kl.register_kl` when :mod:`kiln.distributions.kl` is imported. A pair whose
``q`` does not cover ``p``'s support (``KL(Normal || Exponential)``) is infinite."""

from __future__ import annotations

import math

import kiln
from kiln.distributions._kl_registry import _inf_where, _infinite_like, _x_log_x, register_kl
from kiln.distributions.bernoulli import Bernoulli
from kiln.distributions.beta import Beta
from kiln.distributions.binomial import Binomial
from kiln.distributions.continuous_bernoulli import ContinuousBernoulli
from kiln.distributions.exponential import Exponential
from kiln.distributions.gamma import Gamma
from kiln.distributions.gumbel import Gumbel
from kiln.distributions.laplace import Laplace
from kiln.distributions.normal import Normal
from kiln.distributions.pareto import Pareto
from kiln.distributions.poisson import Poisson
from kiln.distributions.uniform import Uniform
from kiln.distributions.utils import euler_constant

_HALF_LOG_2PI_E = 0.5 * (1 + math.log(2 * math.pi))


def _register_infinite(p_type, q_types, param: str) -> None:
    def infinite(p, q):
        return _infinite_like(getattr(p, param))

    infinite.__name__ = f"_kl_{p_type.__name__.lower()}_infinity"
    for q_type in q_types:
        register_kl(p_type, q_type)(infinite)


_register_infinite(Beta, [Pareto], "concentration1")
_register_infinite(ContinuousBernoulli, [Pareto], "probs")
_register_infinite(Exponential, [Beta, ContinuousBernoulli, Pareto, Uniform], "rate")
_register_infinite(Gamma, [Beta, ContinuousBernoulli, Pareto, Uniform], "concentration")
_register_infinite(Gumbel, [Beta, ContinuousBernoulli, Exponential, Gamma, Pareto, Uniform], "loc")
_register_infinite(Laplace, [Beta, ContinuousBernoulli, Exponential, Gamma, Pareto, Uniform], "loc")
_register_infinite(Normal, [Beta, ContinuousBernoulli, Exponential, Gamma, Pareto, Uniform], "loc")
_register_infinite(Pareto, [Beta, ContinuousBernoulli, Uniform], "scale")
_register_infinite(Poisson, [Bernoulli, Binomial], "rate")


def _beta_mean(p):
    return p.concentration1 / (p.concentration1 + p.concentration0)


@register_kl(Bernoulli, Poisson)
def _kl_bernoulli_poisson(p, q):
    return -p.entropy() - (p.probs * q.rate.log() - q.rate)


@register_kl(Beta, ContinuousBernoulli)
def _kl_beta_continuous_bernoulli(p, q):
    return -p.entropy() - p.mean * q.logits - kiln.log1p(-q.probs) - q._cont_bern_log_norm()


@register_kl(Beta, Exponential)
def _kl_beta_exponential(p, q):
    return -p.entropy() - q.rate.log() + q.rate * _beta_mean(p)


@register_kl(Beta, Gamma)
def _kl_beta_gamma(p, q):
    a, b = p.concentration1, p.concentration0
    e_log_x = kiln.digamma(a) - kiln.digamma(a + b)
    return (
        -p.entropy()
        + q.concentration.lgamma()
        - q.concentration * q.rate.log()
        - (q.concentration - 1) * e_log_x
        + q.rate * _beta_mean(p)
    )


@register_kl(Beta, Normal)
def _kl_beta_normal(p, q):
    mean = _beta_mean(p)
    var_q = q.scale.pow(2)
    second_moment = mean * (1 - mean) / (p.concentration1 + p.concentration0 + 1) + mean.pow(2)
    cross = 0.5 * second_moment - q.loc * mean + 0.5 * q.loc.pow(2)
    return -p.entropy() + 0.5 * (var_q * 2 * math.pi).log() + cross / var_q


@register_kl(Beta, Uniform)
def _kl_beta_uniform(p, q):
    result = -p.entropy() + (q.high - q.low).log()
    return _inf_where((q.low > p.support.lower_bound) | (q.high < p.support.upper_bound), result)


@register_kl(ContinuousBernoulli, Exponential)
def _kl_continuous_bernoulli_exponential(p, q):
    return -p.entropy() - q.rate.log() + q.rate * p.mean


@register_kl(ContinuousBernoulli, Normal)
def _kl_continuous_bernoulli_normal(p, q):
    cross = 0.5 * (math.log(2.0 * math.pi) + (q.loc / q.scale).square()) + q.scale.log()
    moments = (p.variance + p.mean.square() - 2.0 * q.loc * p.mean) / (2.0 * q.scale.square())
    return -p.entropy() + cross + moments


@register_kl(ContinuousBernoulli, Uniform)
def _kl_continuous_bernoulli_uniform(p, q):
    result = -p.entropy() + (q.high - q.low).log()
    return _inf_where((q.low >= p.support.lower_bound) | (q.high <= p.support.upper_bound), result)


@register_kl(Exponential, Gamma)
def _kl_exponential_gamma(p, q):
    ratio = q.rate / p.rate
    a = q.concentration
    return -a * ratio.log() + ratio + a.lgamma() + a * euler_constant - (1 + euler_constant)


@register_kl(Exponential, Gumbel)
def _kl_exponential_gumbel(p, q):
    prod = p.rate * q.scale
    ratio = q.loc / q.scale
    return prod.log() - 1 - ratio + kiln.exp(ratio) * prod / (prod + 1) + prod.reciprocal()


@register_kl(Exponential, Normal)
def _kl_exponential_normal(p, q):
    var_q = q.scale.pow(2)
    rate2 = p.rate.pow(2)
    moments = rate2.reciprocal() - q.loc / p.rate + 0.5 * q.loc.pow(2)
    return 0.5 * (rate2 * var_q * 2 * math.pi).log() - 1 + moments / var_q


@register_kl(Gamma, Exponential)
def _kl_gamma_exponential(p, q):
    return -p.entropy() - q.rate.log() + q.rate * p.concentration / p.rate


@register_kl(Gamma, Gumbel)
def _kl_gamma_gumbel(p, q):
    a = p.concentration
    prod = p.rate * q.scale
    ratio = q.loc / q.scale
    neg_entropy_part = (a - 1) * kiln.digamma(a) - a.lgamma() - a
    return neg_entropy_part + prod.log() + a / prod + kiln.exp(ratio) * (1 + prod.reciprocal()).pow(-a) - ratio


@register_kl(Gamma, Normal)
def _kl_gamma_normal(p, q):
    a = p.concentration
    var_q = q.scale.pow(2)
    rate2 = p.rate.pow(2)
    moments = 0.5 * (a.pow(2) + a) / rate2 - q.loc * a / p.rate + 0.5 * q.loc.pow(2)
    return 0.5 * (rate2 * var_q * 2 * math.pi).log() - a - a.lgamma() + (a - 1) * kiln.digamma(a) + moments / var_q


@register_kl(Gumbel, Normal)
def _kl_gumbel_normal(p, q):
    ratio = p.scale / q.scale
    t1 = (ratio / math.sqrt(2 * math.pi)).log()
    t2 = (math.pi * ratio * 0.5).pow(2) / 3
    t3 = ((p.loc + p.scale * euler_constant - q.loc) / q.scale).pow(2) * 0.5
    return -t1 + t2 + t3 - (euler_constant + 1)


@register_kl(Laplace, Normal)
def _kl_laplace_normal(p, q):
    var_q = q.scale.pow(2)
    ratio = p.scale.pow(2) / var_q
    moments = 0.5 * p.loc.pow(2) - p.loc * q.loc + 0.5 * q.loc.pow(2)
    return -0.5 * (2 * ratio / math.pi).log() + ratio + moments / var_q - 1


@register_kl(Normal, Gumbel)
def _kl_normal_gumbel(p, q):
    mean_ratio = p.loc / q.scale
    var_ratio = (p.scale / q.scale).pow(2)
    loc_ratio = q.loc / q.scale
    return (
        -0.5 * var_ratio.log()
        + mean_ratio
        - loc_ratio
        + kiln.exp(-mean_ratio + 0.5 * var_ratio + loc_ratio)
        - _HALF_LOG_2PI_E
    )


@register_kl(Normal, Laplace)
def _kl_normal_laplace(p, q):
    gap = p.loc - q.loc
    z = gap / p.scale
    expected_abs = math.sqrt(2 / math.pi) * p.scale * kiln.exp(-0.5 * z.pow(2)) + gap * kiln.erf(math.sqrt(0.5) * z)
    return -(p.scale / q.scale).log() + expected_abs / q.scale - 0.5 * (1 + math.log(0.5 * math.pi))


@register_kl(Pareto, Exponential)
def _kl_pareto_exponential(p, q):
    prod = p.scale * q.rate
    result = (p.alpha / prod).log() - p.alpha.reciprocal() + p.alpha * prod / (p.alpha - 1) - 1
    return _inf_where(p.alpha <= 1, result)


@register_kl(Pareto, Gamma)
def _kl_pareto_gamma(p, q):
    e_log_x = p.scale.log() + p.alpha.reciprocal()
    a = q.concentration
    result = (
        p.alpha.log()
        - e_log_x
        + a.lgamma()
        - a * q.rate.log()
        + (1 - a) * e_log_x
        + q.rate * p.alpha * p.scale / (p.alpha - 1)
        - 1
    )
    return _inf_where(p.alpha <= 1, result)


@register_kl(Pareto, Normal)
def _kl_pareto_normal(p, q):
    two_var = 2 * q.scale.pow(2)
    c = p.scale / (p.alpha - 1)
    t1 = (math.sqrt(2 * math.pi) * q.scale * p.alpha / p.scale).log()
    spread = p.alpha * c.pow(2) / (p.alpha - 2) + (p.alpha * c - q.loc).pow(2)
    result = t1 - p.alpha.reciprocal() + spread / two_var - 1
    return _inf_where(p.alpha <= 2, result)


@register_kl(Uniform, Beta)
def _kl_uniform_beta(p, q):
    width = p.high - p.low
    e_log_x = (_x_log_x(p.high) - _x_log_x(p.low) - width) / width
    e_log_1mx = (_x_log_x(1 - p.high) - _x_log_x(1 - p.low) + width) / width
    log_beta = q.concentration1.lgamma() + q.concentration0.lgamma() - (q.concentration1 + q.concentration0).lgamma()
    result = (q.concentration0 - 1) * e_log_1mx + log_beta - width.log() - (q.concentration1 - 1) * e_log_x
    return _inf_where((p.high > q.support.upper_bound) | (p.low < q.support.lower_bound), result)


@register_kl(Uniform, ContinuousBernoulli)
def _kl_uniform_continuous_bernoulli(p, q):
    result = -p.entropy() - p.mean * q.logits - kiln.log1p(-q.probs) - q._cont_bern_log_norm()
    return _inf_where((p.high >= q.support.upper_bound) | (p.low <= q.support.lower_bound), result)


@register_kl(Uniform, Exponential)
def _kl_uniform_exponential(p, q):
    result = q.rate * (p.high + p.low) / 2 - ((p.high - p.low) * q.rate).log()
    return _inf_where(p.low < q.support.lower_bound, result)


@register_kl(Uniform, Gamma)
def _kl_uniform_gamma(p, q):
    width = p.high - p.low
    e_log_x = (_x_log_x(p.high) - _x_log_x(p.low) - width) / width
    a = q.concentration
    result = -width.log() + a.lgamma() - a * q.rate.log() + (1 - a) * e_log_x + q.rate * (p.high + p.low) / 2
    return _inf_where(p.low < q.support.lower_bound, result)


@register_kl(Uniform, Gumbel)
def _kl_uniform_gumbel(p, q):
    c = q.scale / (p.high - p.low)
    hi, lo = (p.high - q.loc) / q.scale, (p.low - q.loc) / q.scale
    return c.log() + 0.5 * (hi + lo) - c * (kiln.exp(-hi) - kiln.exp(-lo))


@register_kl(Uniform, Normal)
def _kl_uniform_normal(p, q):
    width = p.high - p.low
    t1 = (math.sqrt(math.pi * 2) * q.scale / width).log()
    return t1 + 0.5 * (width.pow(2) / 12 + ((p.high + p.low - 2 * q.loc) / 2).pow(2)) / q.scale.pow(2)


@register_kl(Uniform, Pareto)
def _kl_uniform_pareto(p, q):
    width = p.high - p.low
    t1 = (q.alpha * q.scale.pow(q.alpha) * width).log()
    e_log_x = (_x_log_x(p.high) - _x_log_x(p.low) - width) / width
    return _inf_where(p.low < q.support.lower_bound, e_log_x * (q.alpha + 1) - t1)
