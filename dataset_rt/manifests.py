"""``update_manifests``: migrate format-2 manifests to format 3 in place.

A format-2 cache's id is its position in the dataset's path list; migration writes that
id into the manifest as ``cache_id`` so the cache keeps it wherever it is loaded later.
The rewrite itself is the library's (``drt_manifest_migrate``: the text, and an atomic
replacement of the resolved target), so a crash leaves either the old or the new manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dataset_rt import _native
from dataset_rt.records import (
    AbsentManifestTarget,
    Err,
    ManifestUpdateEntry,
    ManifestUpdateError,
    ManifestUpdateReport,
    Ok,
)


def update_manifests(dataset: Any, version: object) -> Any:
    """See ``CachedDataset.update_manifests``."""
    if type(version) is not int or version != 3:
        return Err(
            ManifestUpdateError(
                AbsentManifestTarget("unsupported migration request"),
                "unsupported manifest migration target; expected integer 3",
                (),
            )
        )
    entries: list[ManifestUpdateEntry] = []
    for index, cache_path in enumerate(dataset.cache_paths):
        cache_id = dataset._handle.cache_info(index).cache_id
        target = (Path(cache_path) / "manifest.json").resolve()
        try:
            outcome = _native.manifest_migrate(target, cache_id)
        except (ValueError, RuntimeError) as exc:
            return Err(ManifestUpdateError(target, str(exc), tuple(entries)))
        entries.append(ManifestUpdateEntry(target, cache_id, outcome.name.lower()))
    return Ok(ManifestUpdateReport(tuple(entries)))
