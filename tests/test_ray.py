"""Ray integration (dataset_rt.integrations.ray) on a local Ray instance (num_cpus=2).

Ray never enters the uv environment: ``tests/refenv.py`` builds a pip virtualenv with the
``ray`` extra, and ``tests/ray_script.py`` runs there (one ``ray.init`` for every check)
and prints a JSON object that the tests below assert on. Skipped, with the reason, only
when the extra cannot be installed (no registry).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from refenv import ReferenceUnavailable, ensure_extra, ensure_reference, skip_or_fail
from remote_server import S3Server, require_remote_packages

RAY_REQUIREMENTS = ("ray[data]==2.60.0",)
SCRIPT = Path(__file__).with_name("ray_script.py")


@pytest.fixture(scope="module")
def ray_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    try:
        env = ensure_extra(
            "ray-2.60.0", RAY_REQUIREMENTS, "import ray, ray.data, dataset_rt; print('ok')"
        )
    except ReferenceUnavailable as exc:
        skip_or_fail(f"the ray extra cannot be installed: {exc}")
    work = tmp_path_factory.mktemp("ray")
    # The URL checks run against moto's S3 server, started here (moto lives in the uv
    # environment, which the script sees on PYTHONPATH, as it sees obstore); the client
    # environment reaches Ray's workers through the driver's environment.
    require_remote_packages()
    server = S3Server()
    server.start()
    try:
        server.create_bucket("ray")
        # Ray would start its workers through `uv run` when the driver's ancestors include
        # uv (its uv runtime-env hook); the workers must use the extra virtualenv as is.
        proc = env.run(
            [str(SCRIPT), str(work)],
            cwd=work,
            timeout=300,
            env={
                "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
                "DRT_TEST_S3_BASE": "s3://ray/base",
                "DATASET_RT_CACHE_DIR": str(work / "local-cache"),
                **server.env(),
            },
        )
    finally:
        server.stop()
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(lines[-1][len("RESULT ") :]), work


def test_tasks_per_source_are_byte_identical_to_write_cache(ray_run):
    out, _ = ray_run
    assert out["sources_results"] == out["sources_expected"]
    assert out["local_results_ok"] and out["sources_nonempty"]
    assert out["sources_identical"] == {"a": True, "b": True, "c": True}


def test_a_raising_task_leaves_no_cache_and_no_staging(ray_run):
    out, _ = ray_run
    assert out["mixed_results"][0].startswith("CacheWriteSuccess(source_name='good'")
    assert out["mixed_results"][1] == (
        "CacheWriteError(source_name='bad', message='Python error: RuntimeError: task failure')"
    )
    assert out["mixed_bad_exists"] is False and out["mixed_leftovers"] == []
    # The Datasink job whose task raises: the job fails, nothing published, no staging.
    assert out["failed_raised"] and "boom in a write task" in out["failed_raised"]
    assert out["failed_exists"] is False and out["failed_leftovers"] == []
    assert out["exists_raised"].startswith("cache path already exists: ")


def test_datasink_holds_every_row_once_in_order(ray_run):
    out, work = ray_run
    assert out["sink_result"] == repr_success("rows", work / "sink" / "rows")
    expected = [
        [i, f"row-{i}", {"even": i % 2 == 0, "i": i, "s": f"s{i % 5}", "score": i / 7}]
        for i in range(300)
    ]
    assert out["sink_rows"] == expected  # read back with validate_cache=True
    assert out["sink_shards"] > 6  # several fragments, each with shards of its own
    assert out["sink_leftovers"] == []


def repr_success(name: str, path: Path) -> str:
    return f"CacheWriteSuccess(source_name={name!r}, path=PosixPath({str(path)!r}))"


def test_datasink_cache_validates_in_the_reference(ray_run):
    out, work = ray_run
    try:
        env = ensure_reference()
    except ReferenceUnavailable as exc:
        skip_or_fail(f"dataset-rt 0.4.8 unavailable: {exc}")
    assert env.read_validated(work / "sink" / "rows") == out["sink_rows"]


def test_write_sources_to_a_url_uploads_the_write_cache_bytes(ray_run):
    out, _ = ray_run
    assert out["url_sources_results"] == [
        f"CacheWriteSuccess(source_name={n!r}, path='s3://ray/base/sources/{n}')"
        for n in ("a", "b", "c")
    ]
    assert out["url_sources_identical"] == {"a": True, "b": True, "c": True}
    assert out["url_sources_again"] == [
        "CacheWriteError(source_name='a', message='cache path already exists: "
        "s3://ray/base/sources/a')"
    ]
    # Duplicate names are refused on the driver, naming the URL as given.
    assert out["url_duplicate_raised"] == (
        "ValueError: duplicate generated cache path: s3://ray/base/dup/a"
    )


def test_datasink_to_a_url_publishes_the_local_commit_and_nothing_else(ray_run):
    out, _ = ray_run
    assert out["url_sink_result"] == (
        "CacheWriteSuccess(source_name='rows', path='s3://ray/base/sink/rows')"
    )
    assert out["url_sink_rows"] == out["sink_rows"]  # read from the URL, validated
    assert out["url_sink_identical"] is True
    # A failing job publishes nothing, and no fragment object is left under the base.
    assert out["url_failed_raised"] and "boom in a write task" in out["url_failed_raised"]
    assert out["url_objects"] == ["rows"]
    assert out["url_exists_raised"].startswith("cache path already exists: s3://ray/base/sink/rows")
    assert "cannot replace a cache on object storage" in out["url_replace_raised"]
    assert out["url_staging_left"] == []


ORDER_REFUSED = "ValueError: CacheDatasink assigns sample ids in block order, but this dataset"


def test_datasink_order_check_uses_the_context_the_dataset_executes_with(ray_run):
    out, _ = ray_run
    # Built without preserve_order, written after turning it on globally: Ray executes
    # with the dataset's context, so the write is refused, before anything is written.
    raised = out["order_late_raised"] or "(nothing raised)"
    assert raised.startswith(ORDER_REFUSED) and "\x1b[" not in raised, raised
    assert out["order_late_exists"] is False and out["order_late_leftovers"] == []
    # Built with preserve_order, written after turning it off globally: in order.
    assert out["order_early_raised"] is None, out["order_early_raised"]
    assert out["order_early_result"].startswith("CacheWriteSuccess(source_name='early'")
    assert out["order_early_rows"] == list(range(60))
    # ordered=False: accepted without preserve_order, every row once.
    assert out["order_unordered_raised"] is None, out["order_unordered_raised"]
    assert out["order_unordered_rows"] == list(range(60))


def test_write_sources_unpicklable_source_is_a_ray_error_of_its_own(ray_run):
    out, _ = ray_run
    assert out["pickle_raised"] is None, out["pickle_raised"]
    (first, locked, last) = out["pickle_results"]
    assert first[:2] == ["CacheWriteSuccess", "first"] and last[:2] == ["CacheWriteSuccess", "last"]
    assert locked[:2] == ["CacheWriteError", "locked"]
    assert locked[2].startswith("Ray error: TypeError: Could not serialize the argument"), locked
    assert "cannot pickle '_thread.lock' object" in locked[2]
    assert "\x1b" not in locked[2]  # no terminal colour codes


def test_datasink_name_is_checked_when_the_sink_is_created(ray_run):
    out, _ = ray_run
    plain = "ValueError: CacheSource.name must be a plain path segment"
    assert out["sink_names"] == {
        "": "ValueError: CacheSource.name must not be empty",
        ".": plain,
        "..": plain,
        "tmp": "ValueError: CacheSource.name must be a non-reserved plain path segment",
        "a/b": plain,
    }
    assert out["sink_names_left"] is False


def test_num_workers_is_checked_on_the_driver_and_always_schedulable(ray_run):
    out, _ = ray_run
    # DatasetRuntime(num_workers=...)'s exceptions and messages, before any task.
    assert out["num_workers_raised"] == {
        "0": "ValueError: num_workers must be greater than zero",
        "1.5": "TypeError: 'float' object cannot be interpreted as an integer",
        "-1": "OverflowError: can't convert negative int to unsigned",
    }
    assert out["num_workers_left"] is False
    assert out["sink_num_workers_raised"] == "ValueError: num_workers must be greater than zero"
    # 3 threads on a 2-CPU cluster: the default request fits the largest node.
    assert [r[:2] for r in out["num_workers_big"]] == [
        ["CacheWriteSuccess", "a"],
        ["CacheWriteSuccess", "b"],
    ]


def test_write_sources_profile_lists_every_source_like_write_cache(ray_run):
    out, _ = ray_run
    ray_profile, local = out["profiles"]["ray"], out["profiles"]["local"]
    assert ray_profile["keys"] == local["keys"] == ["elapsed_ns", "format_version", "sources"]
    assert [name for name, _ in ray_profile["sources"]] == ["a", "b", "c"]
    assert ray_profile["sources"] == local["sources"]  # same stages per source
    assert all(stages for _, stages in ray_profile["sources"])
    assert out["profile_partials"] == []  # written atomically, nothing left beside it
