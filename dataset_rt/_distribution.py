"""Which distribution this package is, and the check that no other one owns it too.

The import name ``dataset_rt`` is shared with the reference release, the distribution
``dataset-rt`` (0.4.8, Rust core); this project is the distribution :data:`DISTRIBUTION`.
pip installs both into one environment without complaint: their files then overwrite each
other in one ``dataset_rt/`` directory, and uninstalling either one deletes files that the
other still needs. :func:`check_single_owner` runs in ``import dataset_rt`` and turns
that state into an :class:`ImportError` that says what to uninstall and how to repair.

The check reads the installed-files lists (``RECORD``) of just the two distributions, in
the one directory that holds the package, and only when a listing of that directory shows
both: it costs one directory listing, not a scan of every installed distribution.
"""

from __future__ import annotations

import os
from pathlib import Path

DISTRIBUTION = "dataset-rt-zig"
REFERENCE = "dataset-rt"
REFERENCE_VERSION = "0.4.8"
PACKAGE_DIR = Path(__file__).resolve().parent


class DistributionConflictError(ImportError):
    """Both this project and the reference release are installed into one package
    directory."""


def owners(name: str, package_dir: Path) -> list[tuple[str, int]]:
    """The installed distributions called ``name`` in ``package_dir``'s parent directory,
    as (version, number of their files inside ``package_dir``). A distribution without an
    installed-files list counts as owning one file there (it cannot be ruled out)."""
    from importlib import metadata

    found = []
    for dist in metadata.distributions(name=name, path=[str(package_dir.parent)]):
        files = dist.files
        if files is None:
            owned = 1
        else:
            owned = sum(1 for f in files if f.parts and f.parts[0] == package_dir.name)
        found.append((dist.version, owned))
    return found


def conflict_message(package_dir: Path, ours: str, reference: str) -> str:
    """What to do when both distributions own ``package_dir`` (versions as installed)."""
    return (
        f"two distributions are installed into {package_dir}: {DISTRIBUTION} {ours} "
        f"(this implementation, Zig core) and {REFERENCE} {reference} (the reference "
        "release, Rust core). Their files overwrite each other, so neither works reliably. "
        f"Uninstall {REFERENCE}, then reinstall {DISTRIBUTION} (uninstalling one deletes "
        "files the other had written over):\n"
        f"    pip uninstall -y {REFERENCE} && pip install --force-reinstall --no-deps "
        f"{DISTRIBUTION}\n"
        f"or, to keep the reference instead, uninstall {DISTRIBUTION}:\n"
        f"    pip uninstall -y {DISTRIBUTION} && pip install --force-reinstall --no-deps "
        f"{REFERENCE}=={REFERENCE_VERSION}\n"
        "Caches written by either one are read by the other: nothing needs rewriting."
    )


def check_single_owner(package_dir: Path = PACKAGE_DIR) -> None:
    """Raise :class:`DistributionConflictError` when both :data:`DISTRIBUTION` and
    :data:`REFERENCE` have files in ``package_dir`` (by their installed-files lists);
    return quietly otherwise, including for a checkout's editable install, whose files
    are not under a site directory."""
    # A directory listing first: importlib.metadata is read only when both distributions
    # have metadata there, which keeps `import dataset_rt` fast.
    try:
        names = [name.lower() for name in os.listdir(package_dir.parent)]
    except OSError:
        return
    infos = [name.removesuffix(".dist-info") for name in names if name.endswith(".dist-info")]
    ours_prefix, reference_prefix = (f"{d.replace('-', '_')}-" for d in (DISTRIBUTION, REFERENCE))
    if not any(i.startswith(ours_prefix) for i in infos):
        return
    if not any(i.startswith(reference_prefix) for i in infos):
        return
    ours = [version for version, owned in owners(DISTRIBUTION, package_dir) if owned]
    if not ours:
        return
    reference = [version for version, owned in owners(REFERENCE, package_dir) if owned]
    if reference:
        raise DistributionConflictError(conflict_message(package_dir, ours[0], reference[0]))
