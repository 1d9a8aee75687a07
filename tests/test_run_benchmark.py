"""``python -m dataset_rt.run_benchmark`` and ``dataset_rt.benchmarks`` against dataset-rt
0.4.8's (issue 15, item 7).

The benchmark needs its extra (torch, pydantic-settings, psutil), which never enters the uv
environment: ``refenv.ensure_extra`` builds a virtualenv with CPU torch and the two
packages (this checkout on ``PYTHONPATH``), and ``refenv.ensure_reference`` one with
dataset-rt 0.4.8 and the same three. Both skip (fail under CI) only when pip cannot reach
the package registry.

- Without the extra, the modules import (nothing heavy) and the entry point exits with
  0.4.8's message.
- Options, defaults, ``DATASETRT_BENCH_*`` variables, ``--help`` and every validation
  message equal 0.4.8's (the same cases run in both).
- A real run with 2 CPU ranks under torchrun (gloo) on small synthetic caches: the report's
  values are consistent (samples read = the budget, rates = samples / slowest pass,
  checks passed), the same run of 0.4.8 has the same report fields, and both read the
  same samples (equal counts and prefix digests).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from refenv import (
    REPO_ROOT,
    ExtraEnv,
    ReferenceEnv,
    ReferenceSetupError,
    ReferenceUnavailable,
    ensure_extra,
    ensure_reference,
    skip_or_fail,
)

TORCH = "torch==2.13.0"
BENCHMARK_EXTRA = (TORCH, "pydantic-settings==2.15.0", "psutil==7.2.2")
SCRIPTS = Path(__file__).parent / "torch_scripts"
MISSING = "Missing benchmark dependency 'pydantic_settings'; install dataset-rt[benchmark]."

# Run the entry point in the reference virtualenv as ``python -m dataset_rt.run_benchmark``
# would (its relaunch under torchrun repeats sys.argv[1:]); argv[1] holds extra variables.
REFERENCE_ENTRY = """
import json, os, runpy, sys
os.environ.update(json.loads(sys.argv[1]))
sys.argv = ["run_benchmark", *sys.argv[2:]]
runpy.run_module("dataset_rt.run_benchmark", run_name="__main__", alter_sys=True)
"""

# Two ranks with one (forked, persistent) loader worker each, 2 caches of 40 samples, a
# budget of 50 (25 per rank: batches 8, 8, 8, 1), sequential "split" reading (every sample
# checked against its planned position; the worker continues its rows in the second pass).
RUN_ARGS = [
    "--ranks",
    "2",
    "--caches",
    "2",
    "--samples-per-cache",
    "40",
    "--payload-bytes",
    "64",
    "--batch-size",
    "8",
    "--samples-per-epoch",
    "50",
    "--no-shuffle",
    "--num-workers",
    "1",
    "--worker-context",
    "fork",
    "--input-features",
    "32",
    "--model-width",
    "8",
    "--quiet",
]
# Given as a variable, to check that variables reach the ranks.
RUN_ENV = {"DATASETRT_BENCH_REPEATS": "2", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def bench_env() -> ExtraEnv:
    try:
        return ensure_extra(
            "benchmark-torch-2.13.0",
            BENCHMARK_EXTRA,
            "import torch, pydantic_settings, psutil, dataset_rt; print('ok')",
        )
    except ReferenceUnavailable as exc:
        skip_or_fail(f"the benchmark extra cannot be installed here: {exc}")
    except ReferenceSetupError as exc:
        pytest.fail(f"could not set up the benchmark virtualenv: {exc}", pytrace=False)


@pytest.fixture(scope="module")
def reference() -> ReferenceEnv:
    try:
        return ensure_reference(extra=BENCHMARK_EXTRA)
    except ReferenceUnavailable as exc:
        skip_or_fail(f"dataset-rt 0.4.8 with the benchmark extra unavailable: {exc}")
    except ReferenceSetupError as exc:
        pytest.fail(f"could not set up dataset-rt 0.4.8 with its extra: {exc}", pytrace=False)


def last_json(proc: subprocess.CompletedProcess[str]) -> Any:
    if proc.returncode != 0:
        # pytest.fail, not an assertion message: pytest shortens those, and a rank's
        # crash (a native panic, its stack) must reach the CI log whole.
        pytest.fail(
            f"exit status {proc.returncode}\n--- stdout (end)\n{proc.stdout[-3000:]}"
            f"\n--- stderr (end)\n{proc.stderr[-12000:]}",
            pytrace=False,
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


# libstdc++'s message when a rank dies in torch's teardown (std::terminate).
TEARDOWN_ABORT = "terminate called without an active exception"


def reference_report(proc: subprocess.CompletedProcess[str], output: Path) -> Any:
    """0.4.8's report from its run: the file its rank 0 wrote.

    0.4.8's ranks destroy the gloo group without a barrier, so one rank can tear it down
    while another still uses it; torch then aborts the ranks after the report was written
    (seen in CI: both ranks SIGABRT with ``TEARDOWN_ABORT``; our ranks meet at a barrier
    first). That abort alone is the reference's defect, not a difference in what it read:
    the complete report is compared. Any other failure fails the test with its output.
    """
    torn_down = proc.returncode != 0 and TEARDOWN_ABORT in proc.stderr and output.is_file()
    if not torn_down:
        return last_json(proc)
    report = json.loads(output.read_text(encoding="utf-8"))
    assert len(report["ranks"]) == report["world_size"], "0.4.8 aborted before its report"
    return report


# ------------------------------------------------------------------ without the extra


def test_modules_import_without_the_extra(tmp_path: Path) -> None:
    """In the uv environment (no torch, no pydantic-settings): the modules import without
    importing torch, and the entry point exits with 0.4.8's message."""
    script = (
        "import sys, dataset_rt, dataset_rt.benchmarks, dataset_rt.run_benchmark\n"
        "print(sorted(m for m in ('torch', 'pydantic_settings', 'psutil') if m in sys.modules))"
    )
    env = {"PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    proc = subprocess.run(
        [sys.executable, "-m", "dataset_rt.run_benchmark", "--ranks", "2"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert (proc.returncode, proc.stderr.strip()) == (1, MISSING)


@pytest.mark.compat
def test_missing_extra_message_matches_0_4_8() -> None:
    try:
        plain = ensure_reference()
    except ReferenceUnavailable as exc:
        skip_or_fail(f"dataset-rt 0.4.8 unavailable: {exc}")
    proc = plain.run(REFERENCE_ENTRY, "{}", "--ranks", "2")
    assert (proc.returncode, proc.stderr.strip().splitlines()[-1]) == (1, MISSING)


def test_config_module_never_imports_torch(bench_env: ExtraEnv, tmp_path: Path) -> None:
    """Parsing options does not pay for torch; only a rank imports it."""
    script = (
        "import sys\n"
        "from dataset_rt.benchmarks.config import BenchmarkConfig\n"
        "import dataset_rt.run_benchmark\n"
        "BenchmarkConfig()\n"
        "print('torch' in sys.modules)"
    )
    proc = bench_env.run(["-c", script], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


# ------------------------------------------------------------------ options


CASES: list[dict[str, Any]] = [
    {"args": []},
    {"args": ["--ranks", "2", "--no-shuffle", "--drop-last", "--pin-memory", "--quiet"]},
    {"args": ["--cache-paths", '["/", "/tmp"]', "--output", "r/out.json"]},
    {"args": ["--samples-per-epoch", str(1 << 53), "--seed", str((1 << 64) - 1)]},
    {"args": [], "env": {"DATASETRT_BENCH_BATCH_SIZE": "64", "DATASETRT_BENCH_SHUFFLE": "0"}},
    {"args": ["--batch-size", "16"], "env": {"DATASETRT_BENCH_BATCH_SIZE": "64"}},
    {"args": ["--device", "cuda", "--num-workers", "2", "--worker-context", "forkserver"]},
    # Field constraints, one per field.
    {"args": ["--ranks", "0"]},
    {"args": ["--num-workers", "-1"]},
    {"args": ["--device", "tpu"]},
    {"args": ["--worker-context", "thread"]},
    {"args": ["--native-num-workers", "0"]},
    {"args": ["--batch-size", "0"]},
    {"args": ["--samples-per-epoch", "0"]},
    {"args": ["--samples-per-epoch", str((1 << 53) + 1)]},
    {"args": ["--worker-partition", "global"]},
    {"args": ["--seed", "-1"]},
    {"args": ["--seed", str(1 << 64)]},
    {"args": ["--repeats", "0"]},
    {"args": ["--samples-per-cache", "0"]},
    {"args": ["--caches", "0"]},
    {"args": ["--payload-bytes", "15"]},
    {"args": ["--metadata-bytes", "-1"]},
    {"args": ["--cache-paths", "/nonexistent-dataset-rt-cache"]},
    {"args": ["--model-width", "0"]},
    {"args": ["--transform-rounds", "-1"]},
    {"args": ["--prefetch-size", "0"]},
    {"args": ["--prefetch-factor", "0"]},
    {"args": ["--timeout-seconds", "0"]},
    {"args": ["--worker-timeout", "0"]},
    {"args": ["--worker-timeout", "inf"]},
    {"args": ["--batch-size", "many"]},
    {"args": ["--cache-paths", "/", "--cache-paths", "/tmp"]},  # a tuple takes JSON
    {"args": [], "env": {"DATASETRT_BENCH_PAYLOAD_BYTES": "3"}},
    # The workload checks, in their order.
    {"args": ["--input-features", "33"]},
    {"args": ["--device", "cuda", "--num-workers", "1", "--worker-context", "fork"]},
    {"args": ["--device", "cuda", "--worker-context", "fork", "--input-features", "48"]},
    {"args": ["--ranks", "0", "--input-features", "33"]},
    # Argparse: unknown option, missing value.
    {"args": ["--no-such-option", "1"]},
    {"args": ["--batch-size"]},
    # The torchrun environment.
    {"topology": {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}},
    {"topology": {"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}},
    {"topology": {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "0", "LOCAL_WORLD_SIZE": "1"}},
]


@pytest.mark.compat
def test_options_and_messages_match_0_4_8(
    bench_env: ExtraEnv, reference: ReferenceEnv, tmp_path: Path
) -> None:
    script = SCRIPTS / "benchmark_config.py"
    argument = json.dumps(CASES)
    ours = last_json(bench_env.run([str(script), argument], cwd=tmp_path))
    theirs = last_json(reference.run(script.read_text(), argument))
    assert ours["fields"] == theirs["fields"]
    assert ours["help"] == theirs["help"]
    assert len(ours["cases"]) == len(theirs["cases"]) == len(CASES)
    for case, mine, ref in zip(CASES, ours["cases"], theirs["cases"]):
        assert mine == ref, case
    # The cases exercise what they claim: each constraint case fails, the others pass.
    outcomes = [next(iter(result)) for result in ours["cases"]]
    assert outcomes.count("ok") == 8, outcomes
    messages = [e[1] for result in ours["cases"] for e in result.get("errors", [])]
    for expected in (
        "Value error, input_features must be divisible by 32",
        "Value error, CUDA loading requires spawn or forkserver workers",
        "Value error, rank does not belong to its launcher topology",
    ):
        assert expected in messages
    assert ours["cases"][2]["ok"]["cache_paths"] == ["/", "/tmp"]
    assert ours["cases"][4]["ok"]["batch_size"] == 64
    assert ours["cases"][4]["ok"]["shuffle"] is False
    assert ours["cases"][5]["ok"]["batch_size"] == 16


# ------------------------------------------------------------------ a 2-rank CPU run


def check_report(report: dict[str, Any]) -> None:
    """The values of a report of RUN_ARGS + RUN_ENV are consistent with each other and
    with the workload."""
    settings = report["settings"]
    assert settings["repeats"] == 2 and settings["ranks"] == 2 and settings["shuffle"] is False
    assert settings["num_workers"] == 1
    assert (report["world_size"], report["backend"], report["synthetic"]) == (2, "gloo", True)
    ranks = report["ranks"]
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    assert sorted(r["local_rank"] for r in ranks) == [0, 1]
    for rank in ranks:
        assert rank["device"] == "cpu"
        assert rank["population"] == 80
        assert rank["global_requested_samples"] == 50
        assert rank["global_effective_samples"] == 50
        assert rank["loader_batches"] == 4  # 25 samples per rank in batches of 8
        assert rank["replay_verified"] is True
        assert rank["sequential_fixture_order_verified"] is True
        assert 0 <= rank["parameter_max_difference"] <= 1e-6
        assert rank["reader_sha256"] == ranks[0]["reader_sha256"]
        assert len(rank["passes"]) == 2
        for result in rank["passes"]:
            assert (result["batches"], result["samples"]) == (4, 25)
            assert 0 < result["first_batch_seconds"] <= result["elapsed_seconds"]
            total = result["batch_wait_seconds"] + result["training_seconds"]
            assert total <= result["elapsed_seconds"]
            assert result["resources"]["processes"] >= 2  # the rank and its worker
            assert result["resources"]["rss_bytes"] > 0
            assert result["gpu_peak_allocated_bytes"] == 0
        # The two passes read different samples (the consumer continues its rows).
        assert rank["passes"][0]["prefix_digest"] != rank["passes"][1]["prefix_digest"]
    # Both ranks read the same number of samples, but not the same samples.
    assert ranks[0]["passes"][0]["prefix_digest"] != ranks[1]["passes"][0]["prefix_digest"]
    rates = report["global_samples_per_second"]
    assert len(rates) == 2
    for k, rate in enumerate(rates):
        samples = sum(r["passes"][k]["samples"] for r in ranks)
        assert samples == 50
        slowest = max(r["passes"][k]["elapsed_seconds"] for r in ranks)
        assert rate == pytest.approx(samples / slowest)


def fields(value: Any, path: str = "") -> set[str]:
    """Every key path of a JSON value (list items under ``[]``)."""
    if isinstance(value, dict):
        out = set()
        for key, item in value.items():
            out.add(f"{path}.{key}")
            out |= fields(item, f"{path}.{key}")
        return out
    if isinstance(value, list):
        return set().union(*(fields(item, f"{path}[]") for item in value))
    return set()


@pytest.fixture(scope="module")
def our_run(bench_env: ExtraEnv, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("benchmark")
    output = work / "report.json"
    proc = bench_env.run(
        ["-m", "dataset_rt.run_benchmark", *RUN_ARGS, "--output", str(output)],
        cwd=work,
        env=RUN_ENV,
        timeout=300,
    )
    printed = last_json(proc)
    assert json.loads(output.read_text()) == printed
    return printed


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes containing ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, UnicodeDecodeError):
            continue
        if text in command:
            found.append(command)
    return found


def test_timeout_kills_the_whole_launch(bench_env: ExtraEnv, tmp_path: Path) -> None:
    """``--timeout-seconds`` ends torchrun, its ranks (each in a session of its own) and
    their loader workers: the command fails, no report is written and none of its
    processes is left. (0.4.8 kills torchrun's process group only; its ranks live on.)"""
    output = tmp_path / "never.json"
    args = ["--ranks", "2", "--timeout-seconds", "30", "--repeats", "1000000"]
    args += ["--num-workers", "1", "--worker-context", "fork", "--samples-per-cache", "64"]
    proc = bench_env.run(
        [
            "-m",
            "dataset_rt.run_benchmark",
            *args,
            "--input-features",
            "32",
            "--output",
            str(output),
        ],
        cwd=tmp_path,
        env={"OMP_NUM_THREADS": "1"},
        timeout=120,
    )
    # The ranks (and their workers) were measuring when the timeout struck: rank 0
    # prints each pass it starts.
    assert "pass 1/1000000" in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 1
    assert "TimeoutExpired" in proc.stderr
    assert not output.exists()
    assert processes_mentioning(str(output)) == []


def test_two_cpu_ranks_report(our_run: dict[str, Any]) -> None:
    check_report(our_run)
    for rank in our_run["ranks"]:
        assert rank["dataset_rt_version"] != "0.4.8"
        assert rank["torch_version"].startswith("2.13.0")


@pytest.mark.compat
def test_report_matches_0_4_8(
    our_run: dict[str, Any], reference: ReferenceEnv, tmp_path: Path
) -> None:
    output = tmp_path / "report.json"
    proc = reference.run(
        REFERENCE_ENTRY, json.dumps(RUN_ENV), *RUN_ARGS, "--output", str(output), timeout=300
    )
    theirs = reference_report(proc, output)
    check_report(theirs)
    assert fields(our_run) == fields(theirs)
    assert our_run["settings"] | {"output": None} == theirs["settings"] | {"output": None}
    # The same samples in the same order: equal counts and digests of the first batches.
    for mine, ref in zip(our_run["ranks"], theirs["ranks"]):
        for key in ("population", "global_effective_samples", "loader_batches"):
            assert mine[key] == ref[key]
        for pass_mine, pass_ref in zip(mine["passes"], ref["passes"]):
            for key in ("batches", "samples", "prefix_digest"):
                assert pass_mine[key] == pass_ref[key]
