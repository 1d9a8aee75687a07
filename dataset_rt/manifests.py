"""``update_manifests``: migrate format-2 manifests to format 3 in place, all or nothing.

A format-2 cache's id is its position in the dataset's path list; migration writes that
id into the manifest as ``cache_id`` so the cache keeps it wherever it is loaded later.
The library does the work (``drt_dataset_migrate_manifests``): it checks every cache's
manifest against the one the dataset loaded before writing any file, then rewrites each
format-2 manifest atomically. This module only turns its result into 0.4.8's values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dataset_rt.records import (
    AbsentManifestTarget,
    Err,
    ManifestUpdateEntry,
    ManifestUpdateError,
    ManifestUpdateReport,
    Ok,
)


def update_manifests(dataset: Any, version: object) -> Any:
    """See ``CachedDataset.update_manifests``.

    ``Ok(ManifestUpdateReport(entries))``: one entry per cache, in dataset order, with
    its resolved manifest path. ``Err(ManifestUpdateError(path, message, entries))``:
    ``path`` is ``<cache path>/manifest.json`` of the cache that failed, as the dataset
    names it; ``entries`` are the caches finished before it (none when a check failed:
    then no file was written).
    """
    if type(version) is not int or version != 3:
        return Err(
            ManifestUpdateError(
                AbsentManifestTarget("unsupported migration request"),
                "unsupported manifest migration target; expected integer 3",
                (),
            )
        )
    outcome = dataset._handle.migrate_manifests()
    entries = tuple(
        ManifestUpdateEntry(Path(path), cache_id, status.name.lower())
        for path, cache_id, status in outcome.entries
    )
    if outcome.failed is None:
        return Ok(ManifestUpdateReport(entries))
    target = Path(dataset.cache_paths[outcome.failed]) / "manifest.json"
    return Err(ManifestUpdateError(target, outcome.message, entries))
