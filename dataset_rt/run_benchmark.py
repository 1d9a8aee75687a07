"""``python -m dataset_rt.run_benchmark [options]``: the input-pipeline benchmark of
dataset-rt 0.4.8 (same options, ``DATASETRT_BENCH_*`` variables and JSON report).

Run directly, it parses and validates the options (so a bad option fails before anything
starts), then relaunches itself under torchrun (``python -m torch.distributed.run
--standalone --nproc-per-node <ranks>``) and waits at most ``--timeout-seconds`` for it,
killing the launch (torchrun, ranks, loader workers) on timeout or interruption. Started by torchrun
(``RANK`` set, also under an external ``torchrun``), it runs one rank
(``dataset_rt.benchmarks.distributed.run_rank``). Needs the ``benchmark`` extra; without
it, exits with a message naming the missing package. See ``docs/benchmark.md``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dataset_rt.benchmarks.config import BenchmarkConfig

__all__ = ["kill_launch", "launch", "main"]

# Seconds to reap torchrun after killing its process group.
REAP_TIMEOUT_S = 10


def torchrun_command(config: BenchmarkConfig, arguments: list[str]) -> list[str]:
    """This module under torchrun on this machine: ``config.ranks`` local ranks, a
    rendezvous on 127.0.0.1, no restarts, the same ``arguments``."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--local-addr",
        "127.0.0.1",
        "--nproc-per-node",
        str(config.ranks),
        "--max-restarts",
        "0",
        "--module",
        "dataset_rt.run_benchmark",
        *arguments,
    ]


def kill_launch(pid: int) -> None:
    """SIGKILL the torchrun process ``pid`` (started in a session of its own) with its
    process group, and every process below it with theirs: torchrun starts each rank in
    a new session, so killing torchrun's group alone would leave the ranks and their
    loader workers running (dataset-rt 0.4.8 does that). Never signals this process's
    own group."""
    import psutil  # the benchmark extra; the rank code imported it before any launch

    try:
        below = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        below = []
    own_group = os.getpgrp()
    # torchrun first, so that it starts nothing more; then each rank's group (its workers).
    for target in (pid, *(process.pid for process in below)):
        try:
            group = os.getpgid(target)
            if group != own_group:
                os.killpg(group, signal.SIGKILL)
            os.kill(target, signal.SIGKILL)
        except ProcessLookupError:
            continue


def launch(config: BenchmarkConfig) -> None:
    """Run the job under torchrun in a session of its own; raise ``SystemExit`` with its
    status when it fails. On timeout (``config.timeout_seconds``) or any exception
    (Ctrl-C included) kill the launch (torchrun, its ranks and their loader workers:
    ``kill_launch``), never more, and re-raise."""
    command = torchrun_command(config, sys.argv[1:])
    with subprocess.Popen(command, start_new_session=True) as process:
        try:
            status = process.wait(timeout=config.timeout_seconds)
        except BaseException:
            kill_launch(process.pid)
            process.wait(timeout=REAP_TIMEOUT_S)
            raise
    if status:
        raise SystemExit(status)


def main() -> None:
    """Parse the options (and ``DATASETRT_BENCH_*`` variables), then launch torchrun, or
    run one rank when started by it."""
    try:
        from pydantic_settings import CliApp

        from dataset_rt.benchmarks.config import BenchmarkConfig
        from dataset_rt.benchmarks.distributed import run_rank
    except ModuleNotFoundError as error:
        raise SystemExit(
            f"Missing benchmark dependency {error.name!r}; install dataset-rt[benchmark]."
        ) from error
    config = CliApp.run(BenchmarkConfig)
    if "RANK" in os.environ:
        run_rank(config)
    else:
        launch(config)


if __name__ == "__main__":
    main()
