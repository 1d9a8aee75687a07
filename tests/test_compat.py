"""Compatibility with dataset-rt 0.4.8, checked against the real release in its own venv.

SPEC sections 3 and 4: the reference reads every cache this project writes, with the same
samples, metadata and order; for the same input, ``index.bin`` and uncompressed shards are
byte-identical to the reference's, manifests differ only in ``metadata_sha256``, LZ4 shards
decode to the same records; and for the same caches, seed and stream position both
implementations draw the same samples in the same order.

How: ``SHARED_PY`` below (the source definitions, the read report and the sampling driver)
is run unchanged by both implementations: exec'd here with this project's ``dataset_rt``,
and in one subprocess of the reference virtualenv (``tests/refenv.py``), which receives it
as a file. One module-scoped fixture writes this project's caches, runs the reference once
(it reads those caches, writes its own from the same definitions and runs every sampling
case), and the tests compare the two reports with each other and with the input data.

The reference's own float parser is not correctly rounded (shared/fixtures/README.md): it
returns ``90.33333333333331`` for ``271 / 3.0`` and then rejects the cache under
``validate_cache=True``. Caches read with ``validate_cache=True`` here avoid such floats; the
full float set is read with ``validate_cache=False`` and compared through
``REFERENCE_FLOAT_DEFECTS``. This project must return every float exactly.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from pathlib import Path
from typing import Any

import pytest
from refenv import (
    ReferenceEnv,
    ReferenceSetupError,
    ReferenceUnavailable,
    ensure_reference,
    skip_or_fail,
)

import dataset_rt as drt

pytestmark = pytest.mark.compat

# The reference's JSON float parsing is not correctly rounded: value written -> value it
# returns in CachedSample.metadata (shared/fixtures/README.md; the only one in our float set,
# probed against the release).
REFERENCE_FLOAT_DEFECTS = {271 / 3.0: 90.33333333333331}

# ----------------------------------------------------------------------------------------
# Code run identically by this project and by the reference. Keep it self-contained
# (stdlib only, plus polars inside run_case for update_metadata).
SHARED_PY = r'''
import hashlib

SAFE_FLOATS = [
    0.0, -0.0, 0.1, 1e-7, 1e16, 5e-324, 1.0, -2.5e-10, 100.0, 1e15, 1e-5, 2e-5, 1.5e-6,
    0.00001234, 123456.789, 1 / 3, 2 / 3, 0.1 + 0.2, 3.141592653589793, 1.2345e16,
    9999000000000000.0, 9.223372036854776e18, 1e20, 1e22, 1e23, 1e100, 1e300, 1e-300,
    1.7976931348623157e308, -1.7976931348623157e308, 2.2250738585072014e-308,
    2.225073858507201e-308, -7.0, 12345678.9,
]
# 271 / 3.0 is the documented case the reference mis-parses (validate_cache=False only).
ALL_FLOATS = SAFE_FLOATS + [271 / 3.0]
INTS = [0, -1, 1, -3, 7, 2**63 - 1, -(2**63), 1234567890123, -9876543210, 2**53 + 1]
STRINGS = [
    "",
    "plain ascii",
    "é中文ü Ünïcødé",
    "emoji 😀🎉 family 👨‍👩‍👧 flag 🇫🇷",
    'quote " backslash \\ both \\" end',
    "controls \x00\x01\x07\x08\x0b\x0c\x1b\x1f tab\t nl\n cr\r end",
    "separators \u2028 and \u2029 nbsp \u00a0 bom \ufeff",
    "del \x7f slash / html <>&' percent %s braces {}",
    "ß" * 300,
    "\U0010ffff max code point",
]
# Payload sizes by row; 0 is an empty payload, several exceed the small shard limits.
SIZES = [0, 1, 37, 0, 300, 900, 2500, 64, 5000, 17, 0, 1200]

SPECS = [
    {"name": "plain_many_shards", "algo": "none", "ratio": 1.0, "max_shard_bytes": 2048,
     "count": 36, "floats": "safe", "big": 4 * 2**20 + 3, "validate": True},
    {"name": "lz4_many_shards", "algo": "lz4", "ratio": 2.0, "max_shard_bytes": 2048,
     "count": 36, "floats": "safe", "big": 4 * 2**20 + 3, "validate": True},
    {"name": "plain_one_shard", "algo": "none", "ratio": 1.0, "max_shard_bytes": None,
     "count": 36, "floats": "safe", "big": 0, "validate": True},
    {"name": "ünïcødé_名前_😀", "algo": "none", "ratio": 1.0, "max_shard_bytes": 4096,
     "count": 12, "floats": "safe", "big": 0, "validate": True},
    {"name": "floats_all", "algo": "none", "ratio": 1.0, "max_shard_bytes": None,
     "count": len(ALL_FLOATS), "floats": "all", "big": 0, "validate": False},
    {"name": "floats_all_lz4", "algo": "lz4", "ratio": 2.0, "max_shard_bytes": 1024,
     "count": len(ALL_FLOATS), "floats": "all", "big": 0, "validate": False},
]
# Small caches for the sampling comparisons (sample i has metadata {"i": i}).
SAMPLING_SPECS = [
    {"name": "src_a", "count": 5, "simple": True},
    {"name": "B", "count": 4, "simple": True},
    {"name": "A", "count": 3, "simple": True},
    {"name": "C_single", "count": 1, "simple": True},
    {"name": "D_seven", "count": 7, "simple": True},
]


def cache_id_of(name):
    """SPEC section 3: first 8 bytes of SHA-256(name), big-endian, top bit cleared."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big") & (2**63 - 1)


def payload(tag, i, size):
    """Deterministic bytes: a compressible text half and a SHAKE-256 noise half."""
    noise = hashlib.shake_256(f"{tag}:{i}".encode("utf-8")).digest(size // 2)
    text = (f"{tag}-{i}-" * (size // 4 + 1)).encode("utf-8")[: size - len(noise)]
    return text + noise


def metadata_row(i, floats):
    return {
        "flag": i % 3 == 0,
        "label": INTS[i % len(INTS)],
        "score": floats[i % len(floats)],
        "name": STRINGS[i % len(STRINGS)],
        "Zeta": -i,
        "_u": i % 2 == 1,
        "é_key": f"é{i}😀",
    }


def spec_rows(spec):
    if spec.get("simple"):
        for i in range(spec["count"]):
            yield f"{spec['name']}:{i}".encode("utf-8"), {"i": i}
        return
    floats = ALL_FLOATS if spec["floats"] == "all" else SAFE_FLOATS
    for i in range(spec["count"]):
        size = SIZES[i % len(SIZES)]
        if spec["big"] and i == spec["count"] // 2:
            size = spec["big"]
        yield payload(spec["name"], i, size), metadata_row(i, floats)


class SpecSource:
    def __init__(self, drt, spec):
        self._drt = drt
        self._spec = spec
        self.name = spec["name"]

    def __iter__(self):
        for data, metadata in spec_rows(self._spec):
            yield self._drt.CacheInput(data=data, metadata=metadata)


def writer_config(drt, spec):
    kwargs = {"show_progress": False}
    if spec.get("max_shard_bytes"):
        kwargs["max_shard_bytes"] = spec["max_shard_bytes"]
    if spec.get("algo", "none") != "none" or spec.get("ratio", 1.0) != 1.0:
        kwargs["shard_compression"] = drt.ShardCompression(algo=spec["algo"], ratio=spec["ratio"])
    return drt.WriterConfig(**kwargs)


def write_specs(drt, runtime, specs, base):
    out = []
    for spec in specs:
        config = writer_config(drt, spec)
        results = runtime.write_cache([SpecSource(drt, spec)], base, writer_config=config)
        out.extend([type(r).__name__, str(r[0]), str(r[1])] for r in results)
    return out


def canon(value):
    """A JSON-stable, exact view of a value: floats by repr (keeps -0.0), types kept."""
    if isinstance(value, bool):
        return ["bool", value]
    if isinstance(value, int):
        return ["int", value]
    if isinstance(value, float):
        return ["float", repr(value)]
    if isinstance(value, str):
        return ["str", value]
    if value is None:
        return ["null", None]
    return ["other", type(value).__name__, repr(value)]


def canon_metadata(metadata):
    return [[key, *canon(value)] for key, value in metadata.items()]


def describe(sample):
    data = bytes(sample.data)
    return [sample.cache_id, sample.sample_id, hashlib.sha256(data).hexdigest(), len(data),
            canon_metadata(sample.metadata), type(sample.data).__name__]


def error_text(exc):
    return f"{type(exc).__name__}: {exc}"


def read_report(drt, runtime, paths, validate, reader_extra=None):
    """Ordered read of every sample, get_item of each, and the metadata table."""
    report = {}
    try:
        extra = reader_extra or {}
        config = drt.ReaderConfig(seed=0, shuffle=False, validate_cache=validate, **extra)
        ds = runtime.cached_dataset(paths, reader_config=config)
        report["len"] = len(ds)
    except Exception as exc:
        report["open_error"] = error_text(exc)
        return report
    try:
        samples = list(ds)
        report["samples"] = [describe(s) for s in samples]
    except Exception as exc:
        report["iter_error"] = error_text(exc)
        return report
    try:
        report["items"] = [describe(ds.get_item(s.cache_id, s.sample_id)) for s in samples]
    except Exception as exc:
        report["items_error"] = error_text(exc)
    try:
        report["table"] = table_report(ds.get_metadata())
    except Exception as exc:
        report["table_error"] = error_text(exc)
    return report


def table_report(df):
    return {
        "columns": list(df.columns),
        "dtypes": [str(dtype) for dtype in df.dtypes],
        "rows": [[canon(v) for v in row] for row in df.iter_rows()],
    }


def window(iterator):
    return [[s.cache_id, s.sample_id] for s in iterator]


def run_case(drt, runtime, case, reader_extra=None):
    """Replay one sampling case; returns its observations (or the error it hit)."""
    out = []
    try:
        extra = reader_extra or {}
        config = drt.ReaderConfig(seed=case["seed"], shuffle=case["shuffle"], **extra)
        ds = runtime.cached_dataset(case["paths"], reader_config=config)
        out.append(["len", len(ds)])
        for op in case["ops"]:
            kind = op[0]
            if kind == "epoch":
                ds.set_epoch_len(op[1])
                out.append(["len", len(ds)])
            elif kind == "windows":
                out.append(["windows", [window(ds) for _ in range(op[1])]])
            elif kind == "take":
                it = iter(ds)
                out.append(["take", [[s.cache_id, s.sample_id] for _, s in zip(range(op[1]), it)]])
                it.close()
            elif kind == "interleave":
                first, second = iter(ds), iter(ds)
                got_second = [next(second)]  # the first next() reserves the first window
                got_first = []
                live = [(first, got_first), (second, got_second)]
                while live:
                    for entry in list(live):
                        try:
                            entry[1].append(next(entry[0]))
                        except StopIteration:
                            live.remove(entry)
                out.append(["interleave", window(got_first), window(got_second)])
            elif kind == "update":
                import polars as pl

                df = ds.get_metadata()
                if op[1] is not None:
                    df = df[op[1]]
                if op[2] is not None:
                    df = df.with_columns(pl.Series("weight", op[2], dtype=pl.Float64))
                ds.update_metadata(df)
                out.append(["updated", len(ds)])
            else:
                raise AssertionError(f"unknown op {op!r}")
    except Exception as exc:
        return {"error": error_text(exc), "out": out}
    return {"out": out}
'''

# The reference's side: read this project's caches, write its own, run the sampling cases.
REFERENCE_PY = r"""
import json
import sys
from pathlib import Path

import dataset_rt as drt

shared_path, plan_path, out_path = sys.argv[1:4]
ns = {"__name__": "compat_shared"}
exec(compile(Path(shared_path).read_text(encoding="utf-8"), shared_path, "exec"), ns)
plan = json.loads(Path(plan_path).read_text(encoding="utf-8"))
runtime = drt.DatasetRuntime(num_workers=2)
out = {
    "dataset_rt_file": drt.__file__,
    "write": ns["write_specs"](drt, runtime, ns["SPECS"], plan["ref_base"]),
    "reads": {},
    "cases": {},
}
for read in plan["reads"]:
    out["reads"][read["key"]] = ns["read_report"](drt, runtime, read["paths"], read["validate"])
for case in plan["cases"]:
    out["cases"][case["id"]] = ns["run_case"](drt, runtime, case)
Path(out_path).write_text(json.dumps(out), encoding="utf-8")
"""

SHARED: dict[str, Any] = {"__name__": "compat_shared"}
exec(compile(SHARED_PY, "<compat SHARED_PY>", "exec"), SHARED)
SPECS: list[dict[str, Any]] = SHARED["SPECS"]
SAMPLING_SPECS: list[dict[str, Any]] = SHARED["SAMPLING_SPECS"]
SPEC_NAMES = [spec["name"] for spec in SPECS]
UNCOMPRESSED = [spec["name"] for spec in SPECS if spec["algo"] == "none"]
COMPRESSED = [spec["name"] for spec in SPECS if spec["algo"] != "none"]
BACKENDS = ["threads", "io_uring"]

SEEDS = [0, 42, 2**64 - 1]
# Datasets for sampling: lists of sampling-cache names in `paths` order.
COMBOS = {
    "src_a": ["src_a"],
    "B+A": ["B", "A"],
    "A+B": ["A", "B"],
    "C+D+B": ["C_single", "D_seven", "B"],
    "src_a+C": ["src_a", "C_single"],
}
WEIGHTED_COMBOS = {"src_a": ["src_a"], "B+A": ["B", "A"]}


def _sampling_cases(base: Path) -> list[dict[str, Any]]:
    """Uniform (shuffle=True before any update) and ordered cases, then weighted ones."""
    cases = []
    for combo, names in COMBOS.items():
        paths = [str(base / name) for name in names]
        for seed in SEEDS:
            for shuffle in (True, False):
                mode = "shuffle" if shuffle else "ordered"
                common = {
                    "combo": combo,
                    "paths": paths,
                    "seed": seed,
                    "shuffle": shuffle,
                    "weighted": False,
                }
                for epoch in (3, 7):
                    cases.append(
                        {
                            **common,
                            "id": f"{combo}/{mode}/seed={seed}/E={epoch}",
                            "ops": [["epoch", epoch], ["windows", 4]],
                        }
                    )
                cases.append(
                    {
                        **common,
                        "id": f"{combo}/{mode}/seed={seed}/default-E",
                        "ops": [["windows", 3]],
                    }
                )
                cases.append(
                    {
                        **common,
                        "id": f"{combo}/{mode}/seed={seed}/stream",
                        "ops": [
                            ["epoch", 3],
                            ["take", 1],
                            ["windows", 1],
                            ["epoch", 7],
                            ["interleave"],
                            ["windows", 1],
                            ["epoch", 2],
                            ["take", 5],
                            ["windows", 2],
                        ],
                    }
                )
    for combo, names in WEIGHTED_COMBOS.items():
        paths = [str(base / name) for name in names]
        n = sum(spec["count"] for spec in SAMPLING_SPECS if spec["name"] in names)
        updates = {
            "same-table": [None, None],
            "weights": [None, [float(i + 1) for i in range(n)]],
            "weights-uneven": [None, [1e-3 if i == 1 else 0.5 + i * i for i in range(n)]],
            "subset": [[n - 1, 1], None],
            "duplicates": [[*range(n), 0, 0], None],
            "duplicates-weighted": [[*range(n), 0], [float(i + 1) for i in range(n + 1)]],
            "reordered": [[3, 1, 3], None],
        }
        for seed in SEEDS:
            for shuffle in (True, False):
                mode = "shuffle" if shuffle else "ordered"
                for label, (rows, weights) in updates.items():
                    cases.append(
                        {
                            "combo": combo,
                            "paths": paths,
                            "seed": seed,
                            "shuffle": shuffle,
                            "weighted": True,
                            "id": f"{combo}/{mode}/seed={seed}/update={label}",
                            "ops": [
                                ["windows", 1],
                                ["update", rows, weights],
                                ["windows", 2],
                                ["epoch", 3],
                                ["windows", 3],
                                ["update", None, None],
                                ["windows", 1],
                            ],
                        }
                    )
    return cases


# ----------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="session")
def reference_python() -> ReferenceEnv:
    """The dataset-rt 0.4.8 virtualenv (built on first use; skips when offline)."""
    try:
        return ensure_reference()
    except ReferenceUnavailable as exc:
        print(f"dataset-rt 0.4.8 reference unavailable: {exc}")
        skip_or_fail(f"dataset-rt 0.4.8 reference unavailable: {exc}")
    except ReferenceSetupError as exc:
        pytest.fail(f"could not set up the dataset-rt 0.4.8 reference: {exc}", pytrace=False)


class CompatRun:
    """This project's caches plus everything the reference reported about them."""

    def __init__(
        self,
        ours: Path,
        ref: Path,
        sampling: Path,
        reference: dict[str, Any],
        cases: list[dict[str, Any]],
    ):
        self.ours = ours
        self.ref = ref
        self.sampling = sampling
        self.reference = reference
        self.cases = cases


@pytest.fixture(scope="module")
def compat(reference_python: ReferenceEnv, tmp_path_factory: pytest.TempPathFactory) -> CompatRun:
    base = tmp_path_factory.mktemp("compat")
    ours, ref, sampling = base / "ours", base / "ref", base / "sampling"
    runtime = drt.DatasetRuntime(num_workers=2)
    written = SHARED["write_specs"](drt, runtime, SPECS, ours)
    written += SHARED["write_specs"](drt, runtime, SAMPLING_SPECS, sampling)
    failures = [w for w in written if w[0] != "CacheWriteSuccess"]
    assert not failures, f"this project failed to write the compat caches: {failures}"

    reads = [
        {"key": f"ours/{name}", "paths": [str(ours / name)], "validate": spec["validate"]}
        for name, spec in zip(SPEC_NAMES, SPECS, strict=True)
    ]
    reads += [
        {"key": f"ours-novalidate/{name}", "paths": [str(ours / name)], "validate": False}
        for name in SPEC_NAMES
    ]
    reads += [
        {"key": "ours/all", "paths": [str(ours / name) for name in SPEC_NAMES], "validate": False}
    ]
    # The reference on the floats it mis-parses, on our caches and on its own.
    reads += [
        {"key": f"{side}-validate/{name}", "paths": [str(root / name)], "validate": True}
        for side, root in (("ours", ours), ("ref", ref))
        for name, spec in zip(SPEC_NAMES, SPECS, strict=True)
        if not spec["validate"]
    ]
    cases = _sampling_cases(sampling)
    (base / "shared.py").write_text(SHARED_PY, encoding="utf-8")
    plan = {"ref_base": str(ref), "reads": reads, "cases": cases}
    (base / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    out_path = base / "reference.json"
    proc = reference_python.run(
        REFERENCE_PY, str(base / "shared.py"), str(base / "plan.json"), str(out_path)
    )
    assert proc.returncode == 0, f"reference script failed:\n{proc.stdout}\n{proc.stderr}"
    reference = json.loads(out_path.read_text(encoding="utf-8"))
    return CompatRun(ours, ref, sampling, reference, cases)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, compat: CompatRun) -> str:
    """This project's reads run on both I/O backends; io_uring skips where it is refused."""
    if request.param == "io_uring":
        config = drt.ReaderConfig(seed=0, io_backend="io_uring")
        try:
            drt.DatasetRuntime(num_workers=1).cached_dataset(
                [compat.sampling / "src_a"], reader_config=config
            )
        except ValueError as exc:
            pytest.skip(f"io_uring is not available here: {exc}")
    return request.param


# ----------------------------------------------------------------------------------------
# Expected values from the input data


def _spec(name: str) -> dict[str, Any]:
    return next(spec for spec in SPECS if spec["name"] == name)


def _expected_samples(
    spec: dict[str, Any], float_map: dict[float, float] | None = None
) -> list[list[Any]]:
    """What reading `spec`'s cache in physical order must give (floats through float_map)."""
    cache_id = SHARED["cache_id_of"](spec["name"])
    rows = []
    for i, (data, metadata) in enumerate(SHARED["spec_rows"](spec)):
        if float_map:
            metadata = {
                k: float_map.get(v, v) if type(v) is float else v for k, v in metadata.items()
            }
        ordered = dict(sorted(metadata.items(), key=lambda kv: kv[0].encode("utf-8")))
        rows.append(
            [
                cache_id,
                i,
                hashlib.sha256(data).hexdigest(),
                len(data),
                SHARED["canon_metadata"](ordered),
                "bytes",
            ]
        )
    return rows


def _expected_table(specs: list[dict[str, Any]]) -> dict[str, Any]:
    """get_metadata() before any update: ids, stored columns (sorted), weight 1.0."""
    keys = sorted(SHARED["metadata_row"](0, SHARED["SAFE_FLOATS"]), key=lambda k: k.encode("utf-8"))
    kinds = {bool: "Boolean", int: "Int64", float: "Float64", str: "String"}
    first = SHARED["metadata_row"](0, SHARED["SAFE_FLOATS"])
    rows = []
    for spec in specs:
        cache_id = SHARED["cache_id_of"](spec["name"])
        for i, (_, metadata) in enumerate(SHARED["spec_rows"](spec)):
            rows.append(
                [
                    ["int", cache_id],
                    ["int", i],
                    *(SHARED["canon"](metadata[k]) for k in keys),
                    ["float", "1.0"],
                ]
            )
    return {
        "columns": ["cache_id", "sample_id", *keys, "weight"],
        "dtypes": ["UInt64", "UInt64", *(kinds[type(first[k])] for k in keys), "Float64"],
        "rows": rows,
    }


def _diff(got: list[Any], want: list[Any]) -> str:
    """The first differing position of two sample lists, for assertion messages."""
    for index, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return f"first difference at {index}:\n got  {a!r}\n want {b!r}"
    return f"lengths differ: got {len(got)}, want {len(want)}"


def _check_samples(report: dict[str, Any], want: list[list[Any]], what: str) -> None:
    for key in ("open_error", "iter_error", "items_error"):
        assert key not in report, f"{what}: {report[key]}"
    assert report["len"] == len(want), what
    assert report["samples"] == want, f"{what}: {_diff(report['samples'], want)}"
    assert report["items"] == want, f"{what} (get_item): {_diff(report['items'], want)}"


# ----------------------------------------------------------------------------------------
# The environment itself


def test_reference_env_runs_the_release_not_this_project(reference_python: ReferenceEnv) -> None:
    proc = reference_python.run(
        "import dataset_rt, importlib.metadata, json, sys\n"
        "print(json.dumps([dataset_rt.__file__, importlib.metadata.version('dataset-rt'),"
        " sys.prefix, sys.path]))\n"
    )
    assert proc.returncode == 0, proc.stderr
    file, version, prefix, path = json.loads(proc.stdout)
    assert version == "0.4.8"
    assert Path(file).resolve().is_relative_to(Path(prefix).resolve())
    assert Path(file).resolve().is_relative_to(reference_python.venv.resolve())
    project_root = Path(drt.__file__).resolve().parents[1]
    assert not any(p and Path(p).resolve() == project_root for p in path), path
    assert not Path(drt.__file__).resolve().is_relative_to(reference_python.venv.resolve())


# ----------------------------------------------------------------------------------------
# The reference reads what this project writes


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_reference_reads_our_cache(compat: CompatRun, name: str) -> None:
    spec = _spec(name)
    assert compat.reference["write"], "reference wrote nothing"
    report = compat.reference["reads"][f"ours/{name}"]
    want = _expected_samples(spec, None if spec["validate"] else REFERENCE_FLOAT_DEFECTS)
    _check_samples(
        report, want, f"dataset-rt 0.4.8 reading our {name} (validate_cache={spec['validate']})"
    )
    if not spec["validate"]:
        # The reference did mis-parse something here, so the defect map was exercised.
        assert _expected_samples(spec) != want


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_reference_metadata_table_of_our_cache(compat: CompatRun, name: str) -> None:
    report = compat.reference["reads"][f"ours/{name}"]
    assert "table_error" not in report, report["table_error"]
    assert report["table"] == _expected_table([_spec(name)])


def test_reference_reads_all_our_caches_as_one_dataset(compat: CompatRun) -> None:
    report = compat.reference["reads"]["ours/all"]
    want = [row for spec in SPECS for row in _expected_samples(spec, REFERENCE_FLOAT_DEFECTS)]
    _check_samples(report, want, "dataset-rt 0.4.8 reading all our caches")
    assert "table_error" not in report, report["table_error"]
    assert report["table"] == _expected_table(SPECS)


@pytest.mark.parametrize("name", [spec["name"] for spec in SPECS if not spec["validate"]])
def test_reference_validates_our_floats_like_its_own(compat: CompatRun, name: str) -> None:
    """Its float defect makes it reject our cache under validate_cache exactly as its own."""
    ours = compat.reference["reads"][f"ours-validate/{name}"]
    theirs = compat.reference["reads"][f"ref-validate/{name}"]
    assert ours == theirs
    bad = next(
        i
        for i, (_, m) in enumerate(SHARED["spec_rows"](_spec(name)))
        if m["score"] in REFERENCE_FLOAT_DEFECTS
    )
    assert (
        ours.get("iter_error")
        == f"ValueError: embedded metadata does not match metadata.arrow for sample {bad}"
    )


# ----------------------------------------------------------------------------------------
# This project reads the same caches (its own and the reference's) exactly


def _our_read(paths: list[Path], backend: str, validate: bool = True) -> dict[str, Any]:
    runtime = drt.DatasetRuntime(num_workers=2)
    return SHARED["read_report"](
        drt, runtime, [str(p) for p in paths], validate, {"io_backend": backend}
    )


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_we_read_our_cache_exactly(compat: CompatRun, name: str, backend: str) -> None:
    report = _our_read([compat.ours / name], backend)
    _check_samples(
        report, _expected_samples(_spec(name)), f"reading our {name} with validate_cache=True"
    )
    # Same samples as the reference, apart from the reference's float defect.
    ref = compat.reference["reads"][f"ours-novalidate/{name}"]
    assert "samples" in ref, ref
    assert ref["samples"] == _expected_samples(_spec(name), REFERENCE_FLOAT_DEFECTS)


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_we_read_reference_written_cache_exactly(
    compat: CompatRun, name: str, backend: str
) -> None:
    report = _our_read([compat.ref / name], backend)
    _check_samples(report, _expected_samples(_spec(name)), f"reading the reference's {name}")


def test_we_read_all_our_caches_as_one_dataset(compat: CompatRun, backend: str) -> None:
    report = _our_read([compat.ours / name for name in SPEC_NAMES], backend, validate=False)
    want = [row for spec in SPECS for row in _expected_samples(spec)]
    _check_samples(report, want, "reading all our caches")


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_our_metadata_table_equals_reference(compat: CompatRun, name: str) -> None:
    report = _our_read([compat.ours / name], "threads")
    assert "table_error" not in report, report["table_error"]
    assert report["table"] == compat.reference["reads"][f"ours/{name}"]["table"]
    assert report["table"] == _expected_table([_spec(name)])


# ----------------------------------------------------------------------------------------
# Byte identity with the reference writer


def _manifest_text_without_metadata_hash(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    replaced, count = re.subn(
        r'"metadata_sha256": "[0-9a-f]{64}"', '"metadata_sha256": "<any>"', text
    )
    assert count == 1, f"{path}: metadata_sha256 not found once"
    return replaced


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_reference_wrote_every_cache(compat: CompatRun) -> None:
    want = [["CacheWriteSuccess", name, str(compat.ref / name)] for name in SPEC_NAMES]
    assert compat.reference["write"] == want


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_same_files_as_reference(compat: CompatRun, name: str) -> None:
    ours, ref = compat.ours / name, compat.ref / name
    if _spec(name)["algo"] == "none":
        assert _tree(ours) == _tree(ref)
    else:  # shard rotation depends on the compressed sizes, which may differ
        assert sorted(p.name for p in ours.iterdir()) == sorted(p.name for p in ref.iterdir())


@pytest.mark.parametrize("name", UNCOMPRESSED)
def test_index_and_shards_byte_identical(compat: CompatRun, name: str) -> None:
    ours, ref = compat.ours / name, compat.ref / name
    assert (ours / "index.bin").read_bytes() == (ref / "index.bin").read_bytes()
    shards = sorted(p.name for p in (ref / "shards").iterdir())
    assert sorted(p.name for p in (ours / "shards").iterdir()) == shards
    for shard in shards:
        mine, theirs = (ours / "shards" / shard).read_bytes(), (ref / "shards" / shard).read_bytes()
        assert mine == theirs, f"{name}/shards/{shard}: {_first_byte_difference(mine, theirs)}"


@pytest.mark.parametrize("name", UNCOMPRESSED)
def test_manifest_identical_except_metadata_sha256(compat: CompatRun, name: str) -> None:
    ours = _manifest_text_without_metadata_hash(compat.ours / name / "manifest.json")
    ref = _manifest_text_without_metadata_hash(compat.ref / name / "manifest.json")
    assert ours == ref
    _check_manifest_hashes(compat.ours / name)


def _first_byte_difference(a: bytes, b: bytes) -> str:
    index = next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )
    here, there = a[index : index + 40], b[index : index + 40]
    return f"lengths {len(a)} vs {len(b)}, first difference at byte {index}: {here!r} vs {there!r}"


def _check_manifest_hashes(cache: Path) -> None:
    manifest = json.loads((cache / "manifest.json").read_text(encoding="utf-8"))
    assert (
        manifest["metadata_sha256"]
        == hashlib.sha256((cache / "metadata.arrow").read_bytes()).hexdigest()
    )
    assert (
        manifest["index_sha256"] == hashlib.sha256((cache / "index.bin").read_bytes()).hexdigest()
    )
    for shard in manifest["shards"]:
        data = (cache / "shards" / shard["name"]).read_bytes()
        assert shard["sha256"] == hashlib.sha256(data).hexdigest()
        assert shard["byte_len"] == len(data)


def lz4_block_decode(block: bytes, size: int) -> bytes:
    """A plain LZ4 block decoder (sequences of literals + back-references)."""
    out = bytearray()
    pos, end = 0, len(block)
    while pos < end:
        token = block[pos]
        pos += 1
        literals = token >> 4
        if literals == 15:
            while True:
                extra = block[pos]
                pos += 1
                literals += extra
                if extra != 255:
                    break
        out += block[pos : pos + literals]
        pos += literals
        if pos >= end:
            break  # the last sequence has literals only
        offset = block[pos] | (block[pos + 1] << 8)
        pos += 2
        assert 0 < offset <= len(out), f"bad LZ4 offset {offset} at output {len(out)}"
        length = token & 15
        if length == 15:
            while True:
                extra = block[pos]
                pos += 1
                length += extra
                if extra != 255:
                    break
        length += 4
        start = len(out) - offset
        if offset >= length:
            out += out[start : start + length]
        else:  # overlapping copy repeats the last `offset` bytes
            pattern = bytes(out[start:])
            out += (pattern * (length // offset + 1))[:length]
    assert len(out) == size, f"LZ4 block decoded to {len(out)} bytes, prefix says {size}"
    return bytes(out)


def _records(cache: Path) -> list[tuple[bytes, bytes]]:
    """(embedded JSON, decoded payload) of every record, in index order."""
    manifest = json.loads((cache / "manifest.json").read_text(encoding="utf-8"))
    index = (cache / "index.bin").read_bytes()
    assert len(index) % 24 == 0
    shards = [(cache / "shards" / s["name"]).read_bytes() for s in manifest["shards"]]
    out = []
    for shard_id, offset, length in struct.iter_unpack("<QQQ", index):
        record = shards[shard_id][offset : offset + length]
        assert len(record) == length
        (json_len,) = struct.unpack_from("<Q", record)
        embedded, stored = record[8 : 8 + json_len], record[8 + json_len :]
        algo = manifest["shards"][shard_id]["compression"]["algo"]
        if algo == "lz4":
            (size,) = struct.unpack_from("<I", stored)
            stored = lz4_block_decode(stored[4:], size)
        else:
            assert algo == "none"
        out.append((embedded, stored))
    return out


@pytest.mark.parametrize("name", COMPRESSED)
def test_lz4_cache_decodes_identically(compat: CompatRun, name: str) -> None:
    ours, ref = compat.ours / name, compat.ref / name
    mine, theirs = _records(ours), _records(ref)
    assert len(mine) == len(theirs) == _spec(name)["count"]
    for sample_id, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        assert a[0] == b[0], (
            f"{name} sample {sample_id}: embedded JSON differs: {a[0]!r} vs {b[0]!r}"
        )
        assert a[1] == b[1], f"{name} sample {sample_id}: decoded payload differs"
    payloads = [data for data, _ in SHARED["spec_rows"](_spec(name))]
    assert [p for _, p in mine] == payloads
    # Manifests agree on everything that does not depend on the compressed bytes.
    mine_manifest = json.loads((ours / "manifest.json").read_text(encoding="utf-8"))
    ref_manifest = json.loads((ref / "manifest.json").read_text(encoding="utf-8"))
    assert list(mine_manifest) == list(ref_manifest)
    for key in ("format_version", "cache_id", "source_name", "sample_count", "metadata_schema"):
        assert mine_manifest[key] == ref_manifest[key], key
    for shard in mine_manifest["shards"]:
        assert list(shard) == ["name", "uncompressed_byte_len", "byte_len", "compression", "sha256"]
        assert shard["compression"] == {"algo": "lz4", "ratio": _spec(name)["ratio"]}
    _check_manifest_hashes(ours)
    if all(
        (ours / "shards" / s).read_bytes() == (ref / "shards" / s).read_bytes()
        for s in {p.name for p in (ref / "shards").iterdir()}
        & {p.name for p in (ours / "shards").iterdir()}
    ):
        # Same compressed bytes: then everything but metadata_sha256 must be identical too.
        assert (ours / "index.bin").read_bytes() == (ref / "index.bin").read_bytes()
        assert _manifest_text_without_metadata_hash(
            ours / "manifest.json"
        ) == _manifest_text_without_metadata_hash(ref / "manifest.json")


@pytest.mark.parametrize("name", UNCOMPRESSED)
def test_uncompressed_records_parse_back_to_input(compat: CompatRun, name: str) -> None:
    rows = list(SHARED["spec_rows"](_spec(name)))
    records = _records(compat.ours / name)
    assert [payload for _, payload in records] == [data for data, _ in rows]
    for (embedded, _), (_, metadata) in zip(records, rows, strict=True):
        assert json.loads(embedded) == metadata  # content; exact bytes are checked above


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_metadata_arrow_same_content_as_reference(compat: CompatRun, name: str) -> None:
    import pyarrow as pa

    def read(cache: Path) -> Any:
        with pa.memory_map(str(cache / "metadata.arrow")) as source:
            reader = pa.ipc.open_file(source)
            return reader.schema, reader.read_all()

    mine_schema, mine = read(compat.ours / name)
    ref_schema, ref = read(compat.ref / name)
    assert mine_schema.equals(ref_schema, check_metadata=True), f"{mine_schema}\n!=\n{ref_schema}"
    assert [f.nullable for f in mine_schema] == [f.nullable for f in ref_schema]
    assert mine.equals(ref)
    # Bit-exact floats (Table.equals treats 0.0 == -0.0).
    for column in mine.column_names:
        if pa.types.is_floating(mine.schema.field(column).type):
            mine_bits = [struct.pack("<d", v) for v in mine.column(column).to_pylist()]
            ref_bits = [struct.pack("<d", v) for v in ref.column(column).to_pylist()]
            assert mine_bits == ref_bits, column


# ----------------------------------------------------------------------------------------
# Sampling order


def _compare_cases(compat: CompatRun, cases: list[dict[str, Any]], backend: str) -> None:
    """Run `cases` here; each must give the reference's result."""
    runtime = drt.DatasetRuntime(num_workers=2)
    mismatches = []
    for case in cases:
        want = compat.reference["cases"][case["id"]]
        assert "error" not in want, (case["id"], want)
        got = SHARED["run_case"](drt, runtime, case, {"io_backend": backend})
        if got != want:
            mismatches.append(f"{case['id']}:\n  ours      {got}\n  reference {want}")
    assert not mismatches, f"{len(mismatches)} of {len(cases)} cases differ:\n" + "\n".join(
        mismatches[:8]
    )


@pytest.mark.parametrize("combo", list(COMBOS))
def test_uniform_and_ordered_sampling_match_reference(
    compat: CompatRun, combo: str, backend: str
) -> None:
    cases = [c for c in compat.cases if c["combo"] == combo and not c["weighted"]]
    assert len(cases) == len(SEEDS) * 2 * 4
    _compare_cases(compat, cases, backend)


@pytest.mark.parametrize("combo", list(WEIGHTED_COMBOS))
def test_weighted_sampling_after_update_matches_reference(
    compat: CompatRun, combo: str, backend: str
) -> None:
    cases = [c for c in compat.cases if c["combo"] == combo and c["weighted"]]
    assert cases
    _compare_cases(compat, cases, backend)


def test_reference_sequences_are_the_documented_ones(compat: CompatRun) -> None:
    """Anchor: the reference run here reproduces dataset-rt-0.4.8.md section 3.4."""
    src_a = SHARED["cache_id_of"]("src_a")
    case = compat.reference["cases"]["src_a/shuffle/seed=42/E=3"]
    windows = case["out"][2][1]
    assert [[sid for cid, sid in w] for w in windows] == [
        [3, 2, 2],
        [2, 0, 0],
        [2, 4, 1],
        [0, 4, 4],
    ]
    assert all(cid == src_a for w in windows for cid, _ in w)
    ordered = compat.reference["cases"]["src_a/ordered/seed=0/E=3"]["out"][2][1]
    assert [[sid for _, sid in w] for w in ordered] == [[0, 1, 2], [3, 4, 0], [1, 2, 3], [4, 0, 1]]
    weighted = compat.reference["cases"]["src_a/shuffle/seed=42/update=weights"]["out"]
    assert [sid for _, sid in weighted[3][1][0]] == [4, 3, 3, 3, 1]
