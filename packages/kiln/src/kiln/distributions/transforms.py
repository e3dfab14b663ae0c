"""Invertible transforms with log-Jacobian determinants (``torch.distributions.transforms``).

A :class:`Transform` maps ``x`` to ``y = t(x)``; ``t.inv`` is its inverse, ``t.log_abs_det_jacobian(x, y)``
the log of the absolute Jacobian determinant, and ``domain``/``codomain`` the constraints on ``x`` and
``y``. :class:`~kiln.distributions.TransformedDistribution` pushes a distribution through a chain of them.
"""

from __future__ import annotations

from kiln.distributions._transform_base import (
    AbsTransform,
    AffineTransform,
    ComposeTransform,
    CumulativeDistributionTransform,
    ExpTransform,
    IndependentTransform,
    PowerTransform,
    ReshapeTransform,
    SigmoidTransform,
    SoftplusTransform,
    TanhTransform,
    Transform,
    identity_transform,
)
from kiln.distributions._transforms_structured import (
    CatTransform,
    CorrCholeskyTransform,
    LowerCholeskyTransform,
    PositiveDefiniteTransform,
    SoftmaxTransform,
    StackTransform,
    StickBreakingTransform,
)

__all__ = [
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

for _name in __all__:  # PyTorch's module path, for reprs and pickles
    _obj = globals()[_name]
    if isinstance(_obj, type):
        _obj.__module__ = __name__
del _name, _obj
