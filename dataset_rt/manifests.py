"""``update_manifests``: migrate format-2 manifests to format 3 in place.

A format-2 cache's id is its position in the dataset's path list; migration writes that
id into the manifest as ``cache_id`` so the cache keeps it wherever it is loaded later.
Each rewrite is atomic (temporary file in the same directory, fsync, rename over the
resolved target, directory fsync), so a crash leaves either the old or the new manifest.
"""

from __future__ import annotations

import json
import os
import tempfile
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

FIELD_ORDER = (
    "format_version",
    "cache_id",
    "source_name",
    "sample_count",
    "metadata_schema",
    "metadata_sha256",
    "index_sha256",
    "shards",
)


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"JSON error: duplicate manifest field {key}")
        result[key] = value
    return result


def migrated_text(manifest: dict[str, Any], cache_id: int) -> str:
    """The format-3 text of a format-2 manifest: known fields in order, then unknown keys sorted."""
    known = {key: manifest[key] for key in FIELD_ORDER[2:] if key in manifest}
    extra = {key: manifest[key] for key in sorted(manifest) if key not in FIELD_ORDER}
    ordered = {"format_version": 3, "cache_id": cache_id, **known, **extra}
    return json.dumps(ordered, indent=2, ensure_ascii=False)


def _replace_atomically(target: Path, text: str) -> str:
    """Replace ``target`` with ``text``; returns the entry status."""
    fd, temporary = tempfile.mkstemp(prefix=".manifest.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
        os.rename(temporary, target)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    try:
        directory = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except OSError:
        return "durability_unknown"
    return "updated"


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
            manifest = json.loads(target.read_bytes(), object_pairs_hook=_reject_duplicates)
            version_found = manifest.get("format_version") if isinstance(manifest, dict) else None
            if version_found == 3:
                if manifest.get("cache_id") != cache_id:
                    raise ValueError("manifest cache_id changed since dataset construction")
                status = "unchanged"
            elif version_found == 2:
                status = _replace_atomically(target, migrated_text(manifest, cache_id))
            else:
                raise ValueError(f"JSON error: unsupported format version {version_found}")
        except OSError as exc:
            message = f"I/O error: {exc.strerror} (os error {exc.errno})"
            return Err(ManifestUpdateError(target, message, tuple(entries)))
        except ValueError as exc:
            text = str(exc)
            message = text if text.startswith(("JSON error", "manifest")) else f"JSON error: {text}"
            return Err(ManifestUpdateError(target, message, tuple(entries)))
        entries.append(ManifestUpdateEntry(target, cache_id, status))
    return Ok(ManifestUpdateReport(tuple(entries)))
