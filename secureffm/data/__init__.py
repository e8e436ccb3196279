"""Data: 2D distributions, named source/target pairs, partitions into client shards, and a silo's
own table (public schema, file loaders and checks, encoding through the schema)."""

from .encoding import decode, encode
from .files import read_columns, write_table
from .pairs import PAIRS, DataPair, get_pair, make_shards
from .partition import partition
from .schema import Column, Schema, infer_schema
from .tables import CheckReport, ImageFolder, Table, check_table, load_image_folder, load_table
from .toy2d import DISTRIBUTIONS, Distribution

__all__ = ["DataPair", "get_pair", "make_shards", "PAIRS", "partition", "Distribution",
           "DISTRIBUTIONS", "Column", "Schema", "infer_schema", "Table", "CheckReport",
           "check_table", "load_table", "read_columns", "write_table", "ImageFolder",
           "load_image_folder", "encode", "decode"]
