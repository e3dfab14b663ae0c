"""``kiln.optim``: optimizers (``torch.optim``) and, in :mod:`kiln.optim.lr_scheduler`, LR schedulers.

Each optimizer's arithmetic lives in :mod:`kiln.optim._functional`, one list-at-a-time function per
algorithm; :func:`register_fused_update` lets a backend replace it with a fused kernel per device type.
"""

from kiln.optim import lr_scheduler
from kiln.optim._functional import register_fused_update
from kiln.optim._stateless import swap_in_optimizer_params_and_state
from kiln.optim.adadelta import Adadelta
from kiln.optim.adafactor import Adafactor
from kiln.optim.adagrad import Adagrad
from kiln.optim.adam import Adam, AdamW
from kiln.optim.adamax import Adamax
from kiln.optim.asgd import ASGD
from kiln.optim.lbfgs import LBFGS
from kiln.optim.muon import Muon
from kiln.optim.nadam import NAdam
from kiln.optim.optimizer import Optimizer
from kiln.optim.radam import RAdam
from kiln.optim.rmsprop import RMSprop
from kiln.optim.rprop import Rprop
from kiln.optim.sgd import SGD
from kiln.optim.sparse_adam import SparseAdam

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
    "ASGD",
    "Rprop",
    "SparseAdam",
    "Adafactor",
    "Muon",
    "swap_in_optimizer_params_and_state",
    "lr_scheduler",
    "register_fused_update",
]
