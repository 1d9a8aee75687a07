"""``update_manifests(3)`` is all or nothing, as in dataset-rt 0.4.8 (issue 15 item 2).

Every manifest is checked against the one the dataset loaded before any file is written:
a missing, invalid, downgraded, re-identified or otherwise changed manifest, or the same
manifest twice, returns ``Err`` with 0.4.8's message, no entries, and no file touched.

``SCENARIO_SCRIPT`` is run unchanged by this project (a fresh interpreter) and by the
reference (``tests/refenv.py``), on copies of the same caches, and prints what each
scenario returned and which manifests changed, with their bytes' digests.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import dataset_rt as drt

SCENARIO_SCRIPT = r"""
import hashlib, json, os, shutil, sys
from pathlib import Path
import dataset_rt as drt

template, work = Path(sys.argv[1]), Path(sys.argv[2])
runtime = drt.DatasetRuntime(num_workers=1)


def read(d):
    return json.loads((d / "manifest.json").read_text())


def save(d, m, indent=2):
    (d / "manifest.json").write_text(json.dumps(m, indent=indent))


def to_v2(d):
    m = read(d)
    del m["cache_id"]
    m["format_version"] = 2
    m["zz_extra"] = {"b": [1, 2.5, -0.0], "a": None}
    save(d, m)


def edit(**changes):
    def apply(d):
        save(d, {**read(d), **changes})
    return apply


def downgrade(d):
    m = read(d)
    del m["cache_id"]
    save(d, {**m, "format_version": 2})


def share_with_a(d):
    (d / "manifest.json").unlink()
    os.symlink(os.path.abspath("a/manifest.json"), d / "manifest.json")


MUTATIONS = {
    "delete": lambda d: (d / "manifest.json").unlink(),
    "truncate": lambda d: (d / "manifest.json").write_text("{"),
    "directory": lambda d: ((d / "manifest.json").unlink(), (d / "manifest.json").mkdir()),
    "rename": edit(source_name="renamed"),
    "count": edit(sample_count=999),
    "add_key": edit(added=1),
    "extra_int": edit(zz_extra=1),
    "reformat": lambda d: save(d, read(d), indent=None),
    "ratio_int": lambda d: (d / "manifest.json").write_text(
        (d / "manifest.json").read_text().replace('"ratio": 1.0', '"ratio": 1')),
    "nested_key": lambda d: save(
        d, {**read(d), "shards": [{**s, "zz": 1} for s in read(d)["shards"]]}),
    "downgrade": downgrade,
    "other_id": edit(cache_id=12345),
    "v3_position_1": edit(format_version=3, cache_id=1),
    "v3_position_1_renamed": edit(format_version=3, cache_id=1, source_name="renamed"),
    "format_4": edit(format_version=4),
    "format_text": edit(format_version="2"),
    "share_with_a": share_with_a,
}

# name, caches (name, format 2?), paths loaded (by cache index), setup before loading,
# mutations after loading (cache index -> mutation).
SCENARIOS = [
    ("all_pass", [("a", True), ("b", False), ("c", True)], [0, 1, 2], {}, {}),
    ("second_missing", [("a", True), ("b", True)], [0, 1], {}, {1: "delete"}),
    ("second_invalid_json", [("a", True), ("b", True)], [0, 1], {}, {1: "truncate"}),
    ("second_is_a_directory", [("a", True), ("b", True)], [0, 1], {}, {1: "directory"}),
    ("second_renamed", [("a", True), ("b", True)], [0, 1], {}, {1: "rename"}),
    ("second_count_changed", [("a", True), ("b", True)], [0, 1], {}, {1: "count"}),
    ("second_key_added", [("a", True), ("b", True)], [0, 1], {}, {1: "add_key"}),
    ("second_extra_value_changed", [("a", True), ("b", True)], [0, 1], {}, {1: "extra_int"}),
    ("second_reformatted", [("a", True), ("b", True)], [0, 1], {}, {1: "reformat"}),
    ("second_ratio_as_int", [("a", True), ("b", True)], [0, 1], {}, {1: "ratio_int"}),
    ("second_nested_key", [("a", True), ("b", True)], [0, 1], {}, {1: "nested_key"}),
    ("second_downgraded", [("a", True), ("b", False)], [0, 1], {}, {1: "downgrade"}),
    ("second_id_changed", [("a", True), ("b", False)], [0, 1], {}, {1: "other_id"}),
    ("second_migrated_elsewhere", [("a", True), ("b", True)], [0, 1], {}, {1: "v3_position_1"}),
    ("second_migrated_and_renamed", [("a", True), ("b", True)], [0, 1], {},
     {1: "v3_position_1_renamed"}),
    ("second_format_4", [("a", True), ("b", True)], [0, 1], {}, {1: "format_4"}),
    ("second_format_text", [("a", True), ("b", True)], [0, 1], {}, {1: "format_text"}),
    ("first_renamed_second_missing", [("a", True), ("b", True)], [0, 1], {},
     {0: "rename", 1: "delete"}),
    ("loaded_twice", [("a", True), ("b", True)], [0, 1, 0], {}, {}),
    ("twice_before_missing", [("a", True), ("b", True)], [0, 0, 1], {}, {1: "delete"}),
    ("missing_before_twice", [("a", True), ("b", True)], [0, 1, 0], {}, {1: "delete"}),
    ("two_caches_one_manifest", [("a", True), ("b", True)], [0, 1], {1: "share_with_a"}, {}),
]


def digest(d):
    path = d / "manifest.json"
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


report = {}
for label, caches, order, setup, mutations in SCENARIOS:
    root = work / label
    root.mkdir(parents=True)
    os.chdir(root)
    dirs = []
    for name, v2 in caches:
        shutil.copytree(template / ("a" if name == "b" and setup else name), root / name)
        if v2:
            to_v2(root / name)
        dirs.append(root / name)
    for index, mutation in setup.items():
        MUTATIONS[mutation](dirs[index])
    dataset = runtime.cached_dataset(
        [dirs[i].name for i in order], reader_config=drt.ReaderConfig(seed=0))
    for index, mutation in mutations.items():
        MUTATIONS[mutation](dirs[index])
    before = [digest(d) for d in dirs]
    result = dataset.update_manifests(3)
    after = [digest(d) for d in dirs]
    value = result.value if isinstance(result, drt.Ok) else result.error
    real = str(root.resolve())
    report[label] = {
        "ok": isinstance(result, drt.Ok),
        "path": None if isinstance(result, drt.Ok) else str(value.path),
        "message": None if isinstance(result, drt.Ok) else value.message,
        "entries": [
            [str(e.path).replace(real, "<dir>"), e.cache_id, e.status] for e in value.entries
        ],
        "changed": [d.name for d, b, a in zip(dirs, before, after) if b != a],
        "manifests": after,
    }
print(json.dumps(report))
"""


def run_here(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300
    )


class Rows:
    def __init__(self, name: str) -> None:
        self.name = name

    def __iter__(self):
        for i in range(3):
            yield drt.CacheInput(bytes([i]) * i, {"i": i, "f": i / 3})


@pytest.fixture
def template(runtime, tmp_path: Path) -> Path:
    """Caches "a", "b", "c" written by this project (both packages read them)."""
    base = tmp_path / "template"
    results = runtime.write_cache(
        [Rows("a"), Rows("b"), Rows("c")], base, writer_config=drt.WriterConfig(show_progress=False)
    )
    assert all(isinstance(r, drt.CacheWriteSuccess) for r in results)
    return base


def run_scenarios(run, template: Path, work: Path) -> dict:
    proc = run(SCENARIO_SCRIPT, str(template), str(work))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def failure(path: str, message: str) -> dict:
    return {"ok": False, "path": path, "message": message, "entries": [], "changed": []}


CHANGED = "manifest changed since dataset construction"
# What each scenario returns, as observed with dataset-rt 0.4.8 (JSON syntax errors: the
# prefix; their detail is the parser's own wording).
EXPECTED = {
    "second_missing": failure(
        "b/manifest.json", "I/O error: No such file or directory (os error 2)"
    ),
    "second_invalid_json": failure("b/manifest.json", "JSON error: "),
    "second_is_a_directory": failure("b/manifest.json", "I/O error: Is a directory (os error 21)"),
    "second_renamed": failure("b/manifest.json", CHANGED),
    "second_count_changed": failure("b/manifest.json", CHANGED),
    "second_key_added": failure("b/manifest.json", CHANGED),
    "second_extra_value_changed": failure("b/manifest.json", CHANGED),
    "second_downgraded": failure(
        "b/manifest.json", "manifest was downgraded since dataset construction"
    ),
    "second_id_changed": failure(
        "b/manifest.json", "manifest cache_id changed since dataset construction"
    ),
    "second_migrated_and_renamed": failure("b/manifest.json", CHANGED),
    "second_format_4": failure("b/manifest.json", "JSON error: unsupported format version 4"),
    "second_format_text": failure(
        "b/manifest.json", "JSON error: manifest requires integer format_version"
    ),
    "first_renamed_second_missing": failure("a/manifest.json", CHANGED),
    "loaded_twice": failure("a/manifest.json", "duplicate migration target or cache_id"),
    "twice_before_missing": failure("a/manifest.json", "duplicate migration target or cache_id"),
    "missing_before_twice": failure(
        "b/manifest.json", "I/O error: No such file or directory (os error 2)"
    ),
    "two_caches_one_manifest": failure("b/manifest.json", "duplicate migration target or cache_id"),
}
PASSING = {
    "all_pass": ["a", "c"],
    "second_reformatted": ["a", "b"],
    "second_ratio_as_int": ["a", "b"],
    "second_nested_key": ["a", "b"],
    "second_migrated_elsewhere": ["a"],
}


def test_update_manifests_is_all_or_nothing(template: Path, tmp_path: Path) -> None:
    report = run_scenarios(run_here, template, tmp_path / "ours")
    assert set(report) == set(EXPECTED) | set(PASSING)
    for label, want in EXPECTED.items():
        got = {key: report[label][key] for key in want}
        if want["message"] == "JSON error: ":
            assert got.pop("message").startswith("JSON error: "), label
            want = {key: value for key, value in want.items() if key != "message"}
        assert got == want, label
    for label, changed in PASSING.items():
        result = report[label]
        assert result["ok"] and result["changed"] == changed, (label, result)
        assert [entry[0] for entry in result["entries"]] == [
            f"<dir>/{name}/manifest.json" for name in ("a", "b", "c")[: len(result["entries"])]
        ]
    all_pass = report["all_pass"]["entries"]
    assert [(cache_id, status) for _, cache_id, status in all_pass][0::2] == [
        (0, "updated"),
        (2, "updated"),
    ]
    assert all_pass[1][2] == "unchanged"


def test_migrated_text_keeps_unknown_keys(template: Path, tmp_path: Path, runtime) -> None:
    report = run_scenarios(run_here, template, tmp_path / "ours")
    migrated = tmp_path / "ours" / "second_nested_key" / "b" / "manifest.json"
    text = migrated.read_text()
    manifest = json.loads(text)
    assert list(manifest)[:2] == ["format_version", "cache_id"] and manifest["cache_id"] == 1
    assert list(manifest)[-1] == "zz_extra" and manifest["zz_extra"] == {
        "a": None,
        "b": [1, 2.5, -0.0],
    }
    assert '"a": null,\n    "b": [' in text  # nested object keys sorted, as serde_json does
    assert "zz" not in manifest["shards"][0]  # unknown keys inside known fields are dropped
    assert report["second_nested_key"]["ok"]
    dataset = runtime.cached_dataset([migrated.parent], reader_config=drt.ReaderConfig(seed=0))
    assert {s.cache_id for s in dataset} == {1}


@pytest.mark.compat
def test_update_manifests_matches_0_4_8(template: Path, tmp_path: Path) -> None:
    """Every scenario, run by both packages on copies of the same caches: the same
    results, the same files changed, and byte-identical migrated manifests."""
    from refenv import ReferenceUnavailable, ensure_reference, skip_or_fail

    try:
        reference = ensure_reference()
    except ReferenceUnavailable as exc:
        skip_or_fail(f"dataset-rt 0.4.8 reference unavailable: {exc}")
    ours = run_scenarios(run_here, template, tmp_path / "ours")
    theirs = run_scenarios(reference.run, template, tmp_path / "ref")
    for label in ("second_invalid_json",):  # the parser's own wording after the prefix
        for report in (ours, theirs):
            assert report[label]["message"].startswith("JSON error: ")
            report[label]["message"] = "JSON error: ..."
    assert ours == theirs


def test_a_format_2_cache_id_key_does_not_make_a_second_call_fail(fixture_copy, runtime) -> None:
    """A format-2 manifest may carry a `cache_id` key (ignored there): migration makes it
    the field, and a second call reports the cache unchanged, as in 0.4.8."""
    cache = fixture_copy("plain_one_shard")
    manifest = json.loads((cache / "manifest.json").read_text())
    manifest["format_version"] = 2
    manifest["cache_id"] = 77
    (cache / "manifest.json").write_text(json.dumps(manifest, indent=2))
    dataset = runtime.cached_dataset([cache], reader_config=drt.ReaderConfig(seed=0))
    first = dataset.update_manifests(3)
    assert isinstance(first, drt.Ok), first
    assert [e.status for e in first.value.entries] == ["updated"]
    second = dataset.update_manifests(3)
    assert isinstance(second, drt.Ok), second
    assert [(e.cache_id, e.status) for e in second.value.entries] == [(0, "unchanged")]
