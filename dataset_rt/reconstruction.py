"""dataset-rt 0.4.8's ``dataset_rt.reconstruction`` module path: the ``dataset.json``
export (``CachedDataset.dump_config`` / ``from_config``) as functions.

A thin layer over :mod:`dataset_rt.snapshot` (which writes and reads the export) and
:class:`dataset_rt.config.DatasetConfiguration` (its schema), so that code written
against 0.4.8's module keeps working:

* :func:`dump_configuration` ``(dataset, directory)`` is ``dataset.dump_config(directory)``;
* :func:`load_configuration` ``(path)`` validates a ``dataset.json`` into a
  :class:`DatasetConfiguration` (pydantic ``ValidationError`` for a missing file or an
  invalid document);
* :func:`load_metadata` ``(path, config)`` reads the export's ``metadata.arrow`` as a
  ``pyarrow.Table`` (``ValueError: metadata row count does not match dataset
  configuration`` when its rows disagree with ``config.row_count``);
* :func:`metadata_ipc` ``(table)`` is a table's bytes as an Arrow IPC file.

0.4.8's loader internals that lived here (row-order files, population selection,
construction artifacts) are not provided: they belong to its DataLoader implementation.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import FilePath, TypeAdapter

from dataset_rt.config import DatasetConfiguration
from dataset_rt.snapshot import CONFIG_NAME, METADATA_NAME, dump_config

__all__ = [
    "CONFIG_NAME",
    "METADATA_NAME",
    "DatasetConfiguration",
    "dump_configuration",
    "load_configuration",
    "load_metadata",
    "metadata_ipc",
]

_FILE_PATH: TypeAdapter[Path] = TypeAdapter(FilePath)


def dump_configuration(dataset: Any, path: str | os.PathLike[str]) -> Path:
    """Export ``dataset`` into the existing directory ``path``; returns the path of its
    ``dataset.json``. The same as ``dataset.dump_config(path)``."""
    return dump_config(dataset, path)


def load_configuration(path: str | os.PathLike[str]) -> DatasetConfiguration:
    """The validated ``dataset.json`` at ``path`` (nothing else is opened)."""
    file = _FILE_PATH.validate_python(path)
    return DatasetConfiguration.model_validate_json(Path(file).read_bytes())


def load_metadata(path: str | os.PathLike[str], config: DatasetConfiguration) -> Any:
    """The active table saved beside the ``dataset.json`` at ``path``, as a
    ``pyarrow.Table`` with ``config.row_count`` rows."""
    import pyarrow as pa

    file = Path(_FILE_PATH.validate_python(path))
    metadata_path = Path(_FILE_PATH.validate_python(file.parent / config.metadata_file))
    with pa.memory_map(str(metadata_path), "r") as source:
        table = pa.ipc.open_file(source).read_all()
    if table.num_rows != config.row_count:
        raise ValueError("metadata row count does not match dataset configuration")
    return table


def metadata_ipc(table: Any) -> bytes:
    """``table`` (a ``pyarrow.Table``) serialized as an Arrow IPC file."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())
