"""Integrations over caches on object storage: PyTorch's loader reading caches from
moto's S3 server (tests/remote_server.py) must yield exactly the batches of the same
loader over the local copies. The Ray integration's URL base is tested in
tests/test_ray.py (inside its own virtualenv run).

torch runs in the pip-made virtualenv of tests/test_torch.py (``refenv.ensure_extra``);
the script gets the S3 client environment and a fresh ``DATASET_RT_CACHE_DIR`` shared by
the loader's worker processes.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from refenv import ExtraEnv, ReferenceSetupError, ReferenceUnavailable, ensure_extra, skip_or_fail
from remote_server import S3Server
from sources import Mixed

import dataset_rt as drt

TORCH = "torch==2.13.0"
SCRIPT = Path(__file__).parent / "torch_scripts" / "url_batches.py"


@pytest.fixture(scope="module")
def torch_env() -> ExtraEnv:
    try:
        return ensure_extra("torch-2.13.0", (TORCH,), "import torch, dataset_rt; print('ok')")
    except ReferenceUnavailable as exc:
        skip_or_fail(f"PyTorch cannot be installed here: {exc}")
    except ReferenceSetupError as exc:
        pytest.fail(f"could not set up the PyTorch virtualenv: {exc}", pytrace=False)


def test_torch_loaders_over_urls_yield_the_local_batches(
    torch_env: ExtraEnv, s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    runtime = drt.DatasetRuntime(num_workers=2)
    # Many small shards, so workers and fetch-ahead share and pin several of them.
    writer = drt.WriterConfig(show_progress=False, max_shard_bytes=600)
    sources = [Mixed("a", 120, longest=40), Mixed("b", 70, longest=40)]
    local = runtime.write_cache(sources, tmp_path / "local", writer_config=writer)
    remote = runtime.write_cache(sources, s3_bucket + "/caches", writer_config=writer)
    assert all(isinstance(r, drt.CacheWriteSuccess) for r in local + remote), local + remote
    try:
        proc = torch_env.run(
            [
                str(SCRIPT),
                json.dumps([str(r.path) for r in local]),
                json.dumps([str(r.path) for r in remote]),
            ],
            cwd=tmp_path,
            timeout=900,
            env={**s3_server.env(), "DATASET_RT_CACHE_DIR": str(tmp_path / "shard-cache")},
        )
    except subprocess.TimeoutExpired as exc:  # say which loader was still running
        stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr
        pytest.fail(f"url_batches.py timed out; its progress:\n{(stderr or '')[-4000:]}")
    assert proc.returncode == 0, proc.stderr[-6000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) >= 13
    failures = {name: detail for name, (ok, detail) in results.items() if not ok}
    assert not failures, json.dumps(failures, indent=1)[:8000]


def test_a_forked_child_of_an_obstore_user_fails_fast(s3_server: S3Server, s3_bucket: str) -> None:
    """obstore is not fork safe: its requests would hang in a child forked after the
    parent used it. The transport refuses them there with a message naming the cure."""
    import os

    from dataset_rt import remote

    assert remote.exists(s3_bucket + "/none") is False  # this process uses obstore
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        os.close(read)
        try:
            import signal

            signal.alarm(30)  # a hang would end here, with no report
            remote.exists(s3_bucket + "/none")
            text = "no error"
        except BaseException as exc:
            text = f"{type(exc).__name__}: {exc}"
        os.write(write, text.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        text = pipe.read().decode()
    os.waitpid(pid, 0)
    assert text.startswith(f"RuntimeError: cannot check {s3_bucket}/none: the object store client")
    assert "'spawn' or 'forkserver'" in text
    assert remote.exists(s3_bucket + "/none") is False  # the parent is unaffected
