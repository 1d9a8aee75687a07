"""Every module path dataset-rt 0.4.8 installs imports here too (issue 15 item 8), and the
public functions users call in them behave the same.

0.4.8's modules (its wheel's RECORD, checked against the installed reference by
``test_reference_module_list_is_complete``) fall into three groups here:

* :data:`PROVIDED`: import in this package;
* :data:`FROM_BENCHMARK_WORK`: the benchmark entry point (issue 15 item 7, built
  elsewhere); imported here only when present, and their absence is reported as a warning;
* :data:`FROM_INTEGRATIONS_WORK`: 0.4.8's DataLoader internals under
  ``dataset_rt/integrations/`` (the PyTorch integration's area); likewise. This also
  holds ``dataset_rt.integrations.torch``, which 0.4.8 imports without PyTorch and this
  package only with it.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import dataset_rt as drt

PROVIDED = {
    "dataset_rt",
    "dataset_rt.api",
    "dataset_rt.config",
    "dataset_rt.dataset",
    "dataset_rt.integrations",
    "dataset_rt.metadata",
    "dataset_rt.reconstruction",
    "dataset_rt.records",
    "dataset_rt.resources",
    "dataset_rt.runtime",
    "dataset_rt.writer",
}
FROM_BENCHMARK_WORK = {
    "dataset_rt.benchmarks",
    "dataset_rt.benchmarks.config",
    "dataset_rt.benchmarks.distributed",
    "dataset_rt.benchmarks.resources",
    "dataset_rt.run_benchmark",
}
# (0.4.8's integrations.torch imports without PyTorch, loader needs it; here
# integrations.torch needs PyTorch.)
FROM_INTEGRATIONS_WORK = {
    "dataset_rt.integrations.torch",
    "dataset_rt.integrations.loader",
    "dataset_rt.integrations.loader_logging",
    "dataset_rt.integrations.loader_options",
    "dataset_rt.integrations.loading",
}
# 0.4.8's compiled extension: an internal, not a module path users import.
REFERENCE_INTERNAL = {"dataset_rt._dataset_rt"}


def test_provided_module_paths_import() -> None:
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    proc = subprocess.run(
        [sys.executable, "-c", code, *sorted(PROVIDED)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr


def test_modules_with_optional_dependencies_import() -> None:
    """Every one is present and imports, except for a missing optional dependency of
    its own (torch, psutil: 0.4.8 needs them there too)."""
    absent = []
    for name in sorted(FROM_BENCHMARK_WORK | FROM_INTEGRATIONS_WORK):
        try:
            present = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # its parent package is absent
            present = False
        if not present:
            absent.append(name)
            continue
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            assert exc.name and not exc.name.startswith("dataset_rt"), exc
    assert absent == [], f"0.4.8 module paths missing here: {absent}"


def test_public_names_of_the_writer_module() -> None:
    import dataset_rt.writer as writer

    assert writer.Ok is drt.Ok and writer.Err is drt.Err
    assert writer.CacheInput is drt.CacheInput and writer.CacheWriteError is drt.CacheWriteError
    assert writer.validate_source_name("a") == drt.Ok("a")
    assert writer.validate_source_name("Tmp") == drt.Err(
        "CacheSource.name must be a non-reserved plain path segment"
    )


# Run unchanged by both packages: the public functions of 0.4.8's extra module paths.
FUNCTIONS_SCRIPT = r"""
import json, sys, warnings
from pathlib import Path

import pyarrow as pa

import dataset_rt as drt
from dataset_rt import reconstruction, resources
from dataset_rt.writer import Err, Ok, validate_source_name

work = Path(sys.argv[1])
report = {}
names = ["a", "", ".", "..", "tmp", "TMP", "Tmp", "a/b", "a\x00b", "a\\b", "\udcff", "é" * 127,
         "é" * 128, "x" * 255, "x" * 256, " spaced ", "e\u0301", "tmp2"]
report["validate_source_name"] = [repr(validate_source_name(n)) for n in names]
report["ok_err"] = [repr(Ok(1)), repr(Err("no")), Ok(1) == Ok(1), Ok(1) == Err(1)]


def attempt(function, *args, **kwargs):
    try:
        return function(*args, **kwargs)
    except Exception as exc:
        return [type(exc).__name__, str(exc)]


report["native_worker_count"] = [
    attempt(resources.native_worker_count, cpus, num_workers=w, local_ranks=r)
    for cpus in (0, 1, 2, 3, 8, 64) for w in (-1, 0, 1, 3) for r in (0, 1, 2)
]
report["loading_worker_count"] = [
    attempt(resources.loading_worker_count, cpus, local_ranks=r)
    for cpus in (0, 1, 2, 5, 64) for r in (0, 1, 2, 3)
]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    report["available_cpu_count"] = resources.available_cpu_count()
report["warnings"] = [str(w.message) for w in caught]


class Rows:
    name = "rows"

    def __iter__(self):
        for i in range(4):
            yield drt.CacheInput(bytes([i]), {"i": i, "s": str(i)})


runtime = drt.DatasetRuntime(num_workers=1)
runtime.write_cache(Rows(), work / "caches", writer_config=drt.WriterConfig(show_progress=False))
dataset = runtime.cached_dataset([work / "caches" / "rows"], reader_config=drt.ReaderConfig(seed=5))
dataset.set_epoch_len(3)
(work / "export").mkdir()
config_path = reconstruction.dump_configuration(dataset, work / "export")
config = reconstruction.load_configuration(config_path)
table = reconstruction.load_metadata(config_path, config)
report["reconstruction"] = {
    "names": [reconstruction.CONFIG_NAME, reconstruction.METADATA_NAME],
    "path": str(config_path).replace(str(work), "<work>"),
    "config": json.loads(config.model_dump_json()),
    "columns": table.column_names,
    "rows": table.num_rows,
    "ipc_rows": pa.ipc.open_file(reconstruction.metadata_ipc(table)).read_all().equals(table),
    "missing": attempt(reconstruction.load_configuration, work / "nope.json")[0],
}
report["reconstruction"]["config"]["cache_paths"] = [
    p.replace(str(work.resolve()), "<work>")
    for p in report["reconstruction"]["config"]["cache_paths"]
]
print(json.dumps(report))
"""


def run_here(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120
    )


def run_functions(run, work: Path) -> dict:
    work.mkdir()
    proc = run(FUNCTIONS_SCRIPT, str(work))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_public_functions(tmp_path: Path) -> None:
    report = run_functions(run_here, tmp_path / "ours")
    assert report["validate_source_name"][:8] == [
        "Ok(value='a')",
        "Err(error='CacheSource.name must be a non-reserved plain path segment')",
        "Err(error='CacheSource.name must be a non-reserved plain path segment')",
        "Err(error='CacheSource.name must be a non-reserved plain path segment')",
        "Err(error='CacheSource.name must be a non-reserved plain path segment')",
        "Err(error='CacheSource.name must be a non-reserved plain path segment')",
        "Err(error='CacheSource.name must be a non-reserved plain path segment')",
        "Err(error='CacheSource.name must be a plain path segment')",
    ]
    assert report["native_worker_count"][-1] == 4 and report["loading_worker_count"][-1] == 4
    assert report["native_worker_count"][0] == [
        "ValueError",
        "CPU and rank budgets must be positive; loading workers nonnegative",
    ]
    assert report["available_cpu_count"] >= 1
    assert report["reconstruction"]["rows"] == 4 and report["reconstruction"]["ipc_rows"]
    assert report["reconstruction"]["config"]["epoch_len"] == 3


@pytest.mark.compat
def test_public_functions_match_0_4_8(tmp_path: Path) -> None:
    from refenv import ReferenceUnavailable, ensure_reference, skip_or_fail

    try:
        reference = ensure_reference()
    except ReferenceUnavailable as exc:
        skip_or_fail(f"dataset-rt 0.4.8 reference unavailable: {exc}")
    assert run_functions(run_here, tmp_path / "ours") == run_functions(
        reference.run, tmp_path / "ref"
    )


# The cgroup parsing behind available_cpu_count, on fake /proc files whose cgroup mounts
# are temporary directories: the same limits (or the same error) in both packages.
CGROUP_SCRIPT = r"""
import json, sys
from pathlib import Path
from dataset_rt import resources

root = Path(sys.argv[1])
limits = getattr(resources, sys.argv[2])
out = {}
for case in sorted(p for p in root.iterdir() if p.is_dir()):
    try:
        out[case.name] = [str(limit) for limit in limits(case / "proc")]
    except Exception as exc:
        out[case.name] = [type(exc).__name__, str(exc)]
print(json.dumps(out))
"""


def fake_cgroups(root: Path) -> None:
    """Cases: v2 quota on the leaf and a CPU set on an ancestor; v1 cpu+cpuset; a
    namespaced path; malformed quota; incomplete v1 quota."""

    def case(name: str, cgroup: str, mounts: list[tuple[str, str, str, str]], files: dict) -> None:
        base = root / name
        (base / "proc").mkdir(parents=True)
        (base / "proc" / "cgroup").write_text(cgroup)
        lines = []
        for i, (mount_root, where, fstype, options) in enumerate(mounts):
            point = base / where
            point.mkdir(parents=True, exist_ok=True)
            lines.append(
                f"{30 + i} 25 0:{26 + i} {mount_root} {point} rw,nosuid"
                f" - {fstype} {fstype} {options}"
            )
        (base / "proc" / "mountinfo").write_text("\n".join(lines) + "\n")
        for relative, text in files.items():
            path = base / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

    case(
        "v2",
        "0::/job/task\n",
        [("/", "cg", "cgroup2", "rw,nsdelegate")],
        {
            "cg/job/task/cpu.max": "150000 100000\n",
            "cg/job/cpu.max": "max 100000\n",
            "cg/job/cpuset.cpus.effective": "0-2,4\n",
            "cg/cpuset.cpus.effective": "0-7\n",
        },
    )
    case(
        "v1",
        "4:cpu,cpuacct:/docker/x\n3:cpuset:/docker/x\n1:name=systemd:/docker/x\n",
        [
            ("/docker/x", "cpu", "cgroup", "rw,cpu,cpuacct"),
            ("/", "cpuset", "cgroup", "rw,cpuset"),
            ("/", "other", "tmpfs", "rw"),
        ],
        {
            "cpu/cpu.cfs_quota_us": "250000\n",
            "cpu/cpu.cfs_period_us": "100000\n",
            "cpuset/docker/x/cpuset.cpus": "1,3-4\n",
        },
    )
    case("bad_quota", "0::/\n", [("/", "cg", "cgroup2", "rw")], {"cg/cpu.max": "0 100000\n"})
    case(
        "incomplete_v1",
        "2:cpu:/\n",
        [("/", "cpu", "cgroup", "rw,cpu")],
        {"cpu/cpu.cfs_quota_us": "-1\n"},
    )
    case("bad_set", "0::/\n", [("/", "cg", "cgroup2", "rw")], {"cg/cpuset.cpus.effective": "3,1\n"})


def test_cgroup_limits(tmp_path: Path) -> None:
    fake_cgroups(tmp_path)
    proc = run_here(CGROUP_SCRIPT, str(tmp_path), "_cgroup_limits")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {
        "bad_quota": ["ValueError", "invalid cgroup CPU quota"],
        "bad_set": ["ValueError", "invalid cgroup CPU set"],
        "incomplete_v1": ["ValueError", "incomplete cgroup CPU quota"],
        "v1": ["5/2", "3"],
        "v2": ["3/2", "4", "8"],
    }


@pytest.mark.compat
def test_cgroup_limits_match_0_4_8(tmp_path: Path) -> None:
    from refenv import ReferenceUnavailable, ensure_reference, skip_or_fail

    try:
        reference = ensure_reference()
    except ReferenceUnavailable as exc:
        skip_or_fail(f"dataset-rt 0.4.8 reference unavailable: {exc}")
    fake_cgroups(tmp_path)
    ours = run_here(CGROUP_SCRIPT, str(tmp_path), "_cgroup_limits")
    theirs = reference.run(CGROUP_SCRIPT, str(tmp_path), "_linux_limits")
    assert ours.returncode == theirs.returncode == 0, ours.stderr + theirs.stderr
    assert json.loads(ours.stdout) == json.loads(theirs.stdout)


@pytest.mark.compat
def test_reference_module_list_is_complete() -> None:
    from refenv import ReferenceUnavailable, ensure_reference, skip_or_fail

    try:
        reference = ensure_reference()
    except ReferenceUnavailable as exc:
        skip_or_fail(f"dataset-rt 0.4.8 reference unavailable: {exc}")
    script = (
        "import importlib.metadata, json\n"
        "files = importlib.metadata.files('dataset-rt')\n"
        "print(json.dumps(sorted(str(f) for f in files if f.parts[0] == 'dataset_rt'"
        " and f.suffix in ('.py', '.so'))))\n"
    )
    proc = reference.run(script)
    assert proc.returncode == 0, proc.stderr
    modules = set()
    for file in json.loads(proc.stdout):
        parts = list(Path(file).with_suffix("").parts)
        parts[-1] = parts[-1].split(".")[0]  # _dataset_rt.abi3
        if parts[-1] == "__init__":
            parts.pop()
        modules.add(".".join(parts))
    assert modules == PROVIDED | FROM_BENCHMARK_WORK | FROM_INTEGRATIONS_WORK | REFERENCE_INTERNAL
