"""What a run needs, checked before its folder is made: a failed start leaves no files behind
(a stub folder would then block the corrected command as "not empty").

:func:`preflight` reads the protocol spec, the threat model, the schema, and checks that the
clients' files and the image files exist and that a 2D pair has a label group for each client of
a disjoint partition; it trains nothing and writes nothing. What only the drawn data shows (a
dirichlet shard below the batch size, the budget) is refused later, and
:func:`~.scaffold.starting_run_folder` then removes what the start wrote. Each failure is
the loader's own :class:`~secureffm.errors.SecureFFMError`, naming what to change.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..config import RunConfig
from ..data.images import check_image_files
from ..data.pairs import get_pair
from ..data.partition import partition
from ..data.schema import Schema
from ..errors import ConfigError, TableError
from ..federation.faults import load_threat_model
from ..names import CLIENT_DATA, PAIRS
from ..protocols.protocol import load_protocol

__all__ = ["preflight"]

# Image data sets read from local files (the others are made or shipped with scikit-learn).
FILE_IMAGES = ("cifar10", "mnist", "colored-mnist")


def preflight(config: RunConfig) -> None:
    """Raise what a run of ``config`` would raise on its inputs, before any file is written."""
    protocol = load_protocol(config.protocol)
    if protocol.dp is None:
        config.require_no_dp_options(protocol.name)
    else:
        config.dp_overrides(protocol.dp.settings)  # refuses a weak target epsilon
    if config.threat_model:
        load_threat_model(config.threat_model)
    if config.data in PAIRS and config.partition == "disjoint":
        # one point per label group: refused exactly when the drawn pool's split would be
        order = get_pair(config.data).target.disjoint_order
        partition(np.asarray(order), config.clients, "disjoint", np.random.default_rng(0),
                  disjoint_order=order)
    if config.data in FILE_IMAGES:
        check_image_files(config.data, config.data_dir)
    if config.data == CLIENT_DATA:
        schema = Schema.load(config.schema)
        if config.target_column and config.target_column not in schema.names:
            raise ConfigError(f"target_column = {config.target_column!r} is not a column of "
                              f"{config.schema}; choose one of {', '.join(schema.names)}")
        for path in config.client_data:
            if not Path(path).exists():
                raise TableError(f"no data file at {path!r} (--client-data); give each "
                                 "client's own file, in client order")
