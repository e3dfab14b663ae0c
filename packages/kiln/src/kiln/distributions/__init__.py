"""``kiln.distributions``: probability distributions with sampling, log-densities and KL divergences
(``torch.distributions``' names, parameters and semantics).

Every distribution is built from kiln ops, so gradients flow through ``log_prob``, ``entropy``, ``cdf``
and the reparameterised samples of ``rsample`` to the parameters; ``sample`` draws without recording
gradients. Random draws come from kiln's generators (:func:`kiln.manual_seed` makes them reproducible),
not from PyTorch's streams.

>>> import kiln
>>> from kiln.distributions import Normal, kl_divergence
>>> p, q = Normal(0.0, 1.0), Normal(1.0, 2.0)
>>> p.log_prob(kiln.tensor(0.5)), kl_divergence(p, q)
(tensor(-1.0439), tensor(0.4431))
"""

from __future__ import annotations

from kiln.distributions import constraint_registry, constraints, kl, transforms, utils
from kiln.distributions.bernoulli import Bernoulli
from kiln.distributions.beta import Beta
from kiln.distributions.binomial import Binomial
from kiln.distributions.categorical import Categorical
from kiln.distributions.cauchy import Cauchy
from kiln.distributions.chi2 import Chi2
from kiln.distributions.constraint_registry import biject_to, transform_to
from kiln.distributions.continuous_bernoulli import ContinuousBernoulli
from kiln.distributions.dirichlet import Dirichlet
from kiln.distributions.distribution import Distribution
from kiln.distributions.exp_family import ExponentialFamily
from kiln.distributions.exponential import Exponential
from kiln.distributions.fishersnedecor import FisherSnedecor
from kiln.distributions.gamma import Gamma
from kiln.distributions.generalized_pareto import GeneralizedPareto
from kiln.distributions.geometric import Geometric
from kiln.distributions.gumbel import Gumbel
from kiln.distributions.half_cauchy import HalfCauchy
from kiln.distributions.half_normal import HalfNormal
from kiln.distributions.independent import Independent
from kiln.distributions.inverse_gamma import InverseGamma
from kiln.distributions.kl import kl_divergence, register_kl
from kiln.distributions.kumaraswamy import Kumaraswamy
from kiln.distributions.laplace import Laplace
from kiln.distributions.lkj_cholesky import LKJCholesky
from kiln.distributions.log_normal import LogNormal
from kiln.distributions.logistic_normal import LogisticNormal
from kiln.distributions.lowrank_multivariate_normal import LowRankMultivariateNormal
from kiln.distributions.mixture_same_family import MixtureSameFamily
from kiln.distributions.multinomial import Multinomial
from kiln.distributions.multivariate_normal import MultivariateNormal
from kiln.distributions.negative_binomial import NegativeBinomial
from kiln.distributions.normal import Normal
from kiln.distributions.one_hot_categorical import OneHotCategorical, OneHotCategoricalStraightThrough
from kiln.distributions.pareto import Pareto
from kiln.distributions.poisson import Poisson
from kiln.distributions.relaxed_bernoulli import RelaxedBernoulli
from kiln.distributions.relaxed_categorical import RelaxedOneHotCategorical
from kiln.distributions.studentT import StudentT
from kiln.distributions.transformed_distribution import TransformedDistribution
from kiln.distributions.transforms import (
    AbsTransform,
    AffineTransform,
    CatTransform,
    ComposeTransform,
    CorrCholeskyTransform,
    CumulativeDistributionTransform,
    ExpTransform,
    IndependentTransform,
    LowerCholeskyTransform,
    PositiveDefiniteTransform,
    PowerTransform,
    ReshapeTransform,
    SigmoidTransform,
    SoftmaxTransform,
    SoftplusTransform,
    StackTransform,
    StickBreakingTransform,
    TanhTransform,
    Transform,
    identity_transform,
)
from kiln.distributions.uniform import Uniform
from kiln.distributions.von_mises import VonMises
from kiln.distributions.weibull import Weibull
from kiln.distributions.wishart import Wishart

__all__ = [
    "Bernoulli",
    "Beta",
    "Binomial",
    "Categorical",
    "Cauchy",
    "Chi2",
    "ContinuousBernoulli",
    "Dirichlet",
    "Distribution",
    "Exponential",
    "FisherSnedecor",
    "ExponentialFamily",
    "Gamma",
    "GeneralizedPareto",
    "Geometric",
    "Gumbel",
    "HalfCauchy",
    "HalfNormal",
    "Independent",
    "InverseGamma",
    "Kumaraswamy",
    "LKJCholesky",
    "Laplace",
    "LogNormal",
    "LogisticNormal",
    "LowRankMultivariateNormal",
    "MixtureSameFamily",
    "Multinomial",
    "MultivariateNormal",
    "NegativeBinomial",
    "Normal",
    "OneHotCategorical",
    "OneHotCategoricalStraightThrough",
    "Pareto",
    "Poisson",
    "RelaxedBernoulli",
    "RelaxedOneHotCategorical",
    "StudentT",
    "TransformedDistribution",
    "Uniform",
    "VonMises",
    "Weibull",
    "Wishart",
    "biject_to",
    "kl_divergence",
    "register_kl",
    "transform_to",
    "AbsTransform",
    "AffineTransform",
    "CatTransform",
    "ComposeTransform",
    "CorrCholeskyTransform",
    "CumulativeDistributionTransform",
    "ExpTransform",
    "IndependentTransform",
    "LowerCholeskyTransform",
    "PositiveDefiniteTransform",
    "PowerTransform",
    "ReshapeTransform",
    "SigmoidTransform",
    "SoftplusTransform",
    "TanhTransform",
    "SoftmaxTransform",
    "StackTransform",
    "StickBreakingTransform",
    "Transform",
    "identity_transform",
]
