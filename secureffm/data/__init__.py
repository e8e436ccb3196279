"""Data: 2D distributions, named source/target pairs, partitions into client shards."""

from .pairs import PAIRS, DataPair, get_pair, make_shards
from .partition import partition
from .toy2d import DISTRIBUTIONS, Distribution

__all__ = ["DataPair", "get_pair", "make_shards", "PAIRS", "partition", "Distribution",
           "DISTRIBUTIONS"]
