"""What a run needs, checked before its folder is made: a failed start leaves no files behind
(a stub folder would then block the corrected command as "not empty").

:func:`preflight` reads the protocol spec, the threat model, the schema, and checks that the
clients' files and the image files exist; it trains nothing and writes nothing. Each failure is
the loader's own :class:`~secureffm.errors.SecureFFMError`, naming what to change.
"""

from __future__ import annotations

from pathlib import Path

from ..config import RunConfig
from ..data.images import check_image_files
from ..data.schema import Schema
from ..errors import ConfigError, TableError
from ..federation.faults import load_threat_model
from ..names import CLIENT_DATA
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
