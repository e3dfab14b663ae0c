"""The layer classes of :mod:`kiln.nn`.

Each layer module lists its public names in its own ``__all__``; this package re-exports them and builds its
``__all__`` from theirs, in reading order, so a layer's name is written in one list only. PyTorch's other module
paths (``batchnorm``, ``instancenorm``, ``fold``, ``channelshuffle``, ``upsampling``) re-export classes that
live here in another module; ``lazy`` and ``utils`` hold ``LazyModuleMixin`` and the state-dict helper.
"""

from kiln.nn.modules import (
    activation,
    adaptive,
    attention,
    batchnorm,
    channelshuffle,
    container,
    conv,
    distance,
    dropout,
    flatten,
    fold,
    instancenorm,
    lazy,
    linear,
    linear_cross_entropy,
    linear_cross_entropy_options,
    loss,
    module,
    normalization,
    padding,
    pixelshuffle,
    pooling,
    rnn,
    sparse,
    transformer,
    upsampling,
    utils,
)
from kiln.nn.modules.activation import *  # noqa: F403
from kiln.nn.modules.adaptive import *  # noqa: F403
from kiln.nn.modules.attention import *  # noqa: F403
from kiln.nn.modules.container import *  # noqa: F403
from kiln.nn.modules.conv import *  # noqa: F403
from kiln.nn.modules.distance import *  # noqa: F403
from kiln.nn.modules.dropout import *  # noqa: F403
from kiln.nn.modules.flatten import *  # noqa: F403
from kiln.nn.modules.linear import *  # noqa: F403
from kiln.nn.modules.linear_cross_entropy_options import *  # noqa: F403
from kiln.nn.modules.loss import *  # noqa: F403
from kiln.nn.modules.module import *  # noqa: F403
from kiln.nn.modules.normalization import *  # noqa: F403
from kiln.nn.modules.padding import *  # noqa: F403
from kiln.nn.modules.pixelshuffle import *  # noqa: F403
from kiln.nn.modules.pooling import *  # noqa: F403
from kiln.nn.modules.rnn import *  # noqa: F403
from kiln.nn.modules.sparse import *  # noqa: F403
from kiln.nn.modules.transformer import *  # noqa: F403

__all__ = [  # reading order, each name once (activation names MultiheadAttention as PyTorch's path does)
    *module.__all__,
    *container.__all__,
    *linear.__all__,
    *flatten.__all__,
    *activation.__all__,
    *attention.__all__,
    *conv.__all__,
    *distance.__all__,
    *dropout.__all__,
    *loss.__all__,
    *normalization.__all__,
    *padding.__all__,
    *pixelshuffle.__all__,
    *pooling.__all__,
    *rnn.__all__,
    *sparse.__all__,
    *transformer.__all__,
    *adaptive.__all__,
    *linear_cross_entropy_options.__all__,
]
__all__ = list(dict.fromkeys(__all__))
