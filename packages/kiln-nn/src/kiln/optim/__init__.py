"""``kiln.optim``: optimizers (``torch.optim``) and, in :mod:`kiln.optim.lr_scheduler`, LR schedulers.

Each optimizer's arithmetic lives in :mod:`kiln.optim._functional`, one list-at-a-time function per
algorithm; :func:`register_fused_update` lets a backend replace it with a fused kernel per device type.
"""

from kiln.optim import lr_scheduler
from kiln.optim._functional import register_fused_update
from kiln.optim.adadelta import Adadelta
from kiln.optim.adagrad import Adagrad
from kiln.optim.adam import Adam, AdamW
from kiln.optim.adamax import Adamax
from kiln.optim.lbfgs import LBFGS
from kiln.optim.nadam import NAdam
from kiln.optim.optimizer import Optimizer
from kiln.optim.radam import RAdam
from kiln.optim.rmsprop import RMSprop
from kiln.optim.sgd import SGD

__all__ = [
    "Optimizer",
    "SGD",
    "Adam",
    "AdamW",
    "RMSprop",
    "Adagrad",
    "Adadelta",
    "Adamax",
    "NAdam",
    "RAdam",
    "LBFGS",
    "lr_scheduler",
    "register_fused_update",
]
