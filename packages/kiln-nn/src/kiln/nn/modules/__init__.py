"""The layer classes of :mod:`kiln.nn`.

Each layer module lists its public names in its own ``__all__``; this package re-exports them and builds its
``__all__`` from theirs, in reading order, so a layer's name is written in one list only.
"""

from kiln.nn.modules import (
    activation,
    attention,
    container,
    conv,
    distance,
    dropout,
    flatten,
    linear,
    loss,
    module,
    normalization,
    padding,
    pixelshuffle,
    pooling,
    rnn,
    sparse,
    transformer,
)
from kiln.nn.modules.activation import *  # noqa: F403
from kiln.nn.modules.attention import *  # noqa: F403
from kiln.nn.modules.container import *  # noqa: F403
from kiln.nn.modules.conv import *  # noqa: F403
from kiln.nn.modules.distance import *  # noqa: F403
from kiln.nn.modules.dropout import *  # noqa: F403
from kiln.nn.modules.flatten import *  # noqa: F403
from kiln.nn.modules.linear import *  # noqa: F403
from kiln.nn.modules.loss import *  # noqa: F403
from kiln.nn.modules.module import *  # noqa: F403
from kiln.nn.modules.normalization import *  # noqa: F403
from kiln.nn.modules.padding import *  # noqa: F403
from kiln.nn.modules.pixelshuffle import *  # noqa: F403
from kiln.nn.modules.pooling import *  # noqa: F403
from kiln.nn.modules.rnn import *  # noqa: F403
from kiln.nn.modules.sparse import *  # noqa: F403
from kiln.nn.modules.transformer import *  # noqa: F403

__all__ = [
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
]
