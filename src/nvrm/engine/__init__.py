"""The preprocessing engine: the release contract and encoding, run in workers.

``Engine`` is the one place inputs are prepared; see ``core.py``.
"""

from .codec import PixelCodec
from .core import Engine, PreparedGroup
from .encode import Encoded, GroupEncoded, RopeSpec
from .tasks import PreparedItem

__all__ = ["Engine", "PreparedGroup", "PreparedItem", "Encoded", "GroupEncoded", "RopeSpec", "PixelCodec"]
