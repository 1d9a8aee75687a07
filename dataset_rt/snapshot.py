"""``dump_config`` / ``from_config``: a dataset's caches, reader config, active table and
epoch length saved as ``dataset.json`` + ``metadata.arrow`` (dataset-rt 0.4.8's layout)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import DirectoryPath, FilePath, TypeAdapter

from dataset_rt import _native
from dataset_rt.config import DatasetConfiguration, is_url

CONFIG_NAME = "dataset.json"
METADATA_NAME = "metadata.arrow"


def dump_config(dataset: Any, path: str | os.PathLike[str]) -> Path:
    """Export ``dataset`` into the existing directory ``path``; returns the absolute
    path of its ``dataset.json``. ``cache_paths`` are the caches the dataset reads (as
    opened, local ones resolved), not the ``cache_paths`` attribute, which a caller may
    have rebound, as 0.4.8 exports them."""
    import pyarrow as pa

    directory = Path(TypeAdapter(DirectoryPath).validate_python(path))
    names = (CONFIG_NAME, METADATA_NAME, f"{CONFIG_NAME}.partial", f"{METADATA_NAME}.partial")
    if any(os.path.lexists(directory / name) for name in names):
        raise FileExistsError("dataset export already exists; choose an unused directory")
    table = dataset.get_metadata().to_arrow()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    _publish(directory, METADATA_NAME, sink.getvalue())
    config = DatasetConfiguration(
        cache_paths=tuple(p if is_url(p) else Path(p).resolve() for p in _opened_paths(dataset)),
        reader_config=dataset._reader_config,
        num_workers=dataset._runtime.num_workers,
        epoch_len=len(dataset),
        row_count=table.num_rows,
    )
    _publish(directory, CONFIG_NAME, config.model_dump_json(indent=2).encode("utf-8"))
    return directory.resolve() / CONFIG_NAME  # absolute, links resolved (as 0.4.8)


def _opened_paths(dataset: Any) -> list[str]:
    """The paths (or URLs) ``dataset``'s caches were opened from, in order, as the
    library keeps them."""
    handle = dataset._handle
    return [os.fsdecode(handle.cache_info(i).path) for i in range(handle.cache_count())]


def _publish(directory: Path, name: str, data: Any) -> None:
    """Publish ``data`` as ``directory/name`` through the library (temporary file, fsync,
    rename without replacing, directory fsync)."""
    if not _native.file_publish(directory, name, data):
        raise OSError(f"could not fsync {directory} after writing {name}")


def load_config(path: str | os.PathLike[str]) -> tuple[DatasetConfiguration, Any]:
    """The ``dataset.json`` at ``path`` and its active table (a pyarrow Table: no Polars,
    which hangs in a forked child such as a DataLoader worker), checked against each
    other; ``CachedDataset.from_config`` opens the dataset from them.

    A ``path`` or a ``metadata.arrow`` beside it that is not a file (missing, a
    directory, a dangling link) raises pydantic's ``ValidationError`` (``path_not_file``),
    as in 0.4.8."""
    import pyarrow as pa

    file = Path(TypeAdapter(FilePath).validate_python(path))
    config = DatasetConfiguration.model_validate_json(file.read_bytes())
    metadata_file = TypeAdapter(FilePath).validate_python(file.parent / config.metadata_file)
    with pa.OSFile(str(metadata_file), "rb") as source:
        metadata = pa.ipc.open_file(source).read_all()
    if metadata.num_rows != config.row_count:
        raise ValueError("metadata row count does not match dataset configuration")
    return config, metadata
