"""Writing sources in spawned processes (``WriterConfig(num_processes=N)``).

Each source is pickled and written by its own child process (spawn start method, so no
native state crosses a fork); at most N children run at once. Each child opens its own
native runtime of ``num_workers`` threads and writes with the serial writer
(``dataset_rt.writer``, ``show_progress`` off), staging exactly as a serial write does,
so a killed child leaves only a staging directory whose lock died with it, which the
parent sweeps.

Results keep source order. A child that does not finish within
``process_timeout_seconds`` is killed, and it and every unfinished source report
``writer process timeout exceeded``. A ``KeyboardInterrupt`` or ``SystemExit`` in a child
(or in the parent while waiting) stops every child and is re-raised in the parent.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import sys
import time
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from dataset_rt import _native
from dataset_rt.config import WriterConfig
from dataset_rt.records import CacheWriteError, CacheWriteResult, CacheWriteSuccess
from dataset_rt.writer import write_sources

TIMEOUT_MESSAGE = "writer process timeout exceeded"


def _child(payload: bytes, base: str, config_json: str, num_workers: int, conn: Connection) -> None:
    """Child process entry: unpickle the source, write it, send the result back."""
    try:
        try:
            source = pickle.loads(payload)
        except Exception as exc:
            conn.send(("error", f"source deserialization failed: {type(exc).__name__}: {exc}"))
            return
        config = WriterConfig.model_validate_json(config_json).model_copy(
            update={"show_progress": False, "num_processes": 0}
        )
        with _native.Runtime.open(num_workers) as runtime:
            [result] = write_sources(runtime, source, base, config)
        conn.send(("result", tuple(result), type(result).__name__))
    except (KeyboardInterrupt, SystemExit) as exc:
        conn.send(("interrupt", type(exc).__name__, exc.args))
    except BaseException as exc:
        conn.send(("error", f"Python error: {type(exc).__name__}: {exc}"))
    finally:
        conn.close()


class _Running:
    def __init__(self, position: int, name: str, process: Any, conn: Connection) -> None:
        self.position = position
        self.name = name
        self.process = process
        self.conn = conn
        self.started = time.monotonic()


def _stop(running: list[_Running]) -> None:
    for job in running:
        if job.process.is_alive():
            job.process.kill()
    for job in running:
        job.process.join()
        job.conn.close()


def _sweep(base: Path) -> None:
    _native.staging_sweep(base)  # best effort: a failed sweep is retried by the next writer


def write_in_processes(
    plans: list[Any], base: Path, config: Any, num_workers: int
) -> dict[int, CacheWriteResult]:
    """Write planned sources in up to ``config.num_processes`` spawned processes."""
    context = multiprocessing.get_context("spawn")
    limit = int(config.num_processes)
    timeout = float(config.process_timeout_seconds)
    config_json = config.model_dump_json()
    results: dict[int, CacheWriteResult] = {}
    pending = list(plans)
    running: list[_Running] = []
    completed = 0
    interrupt: tuple[str, tuple[Any, ...]] | None = None
    try:
        while pending or running:
            while pending and len(running) < limit and interrupt is None:
                plan = pending.pop(0)
                try:
                    payload = pickle.dumps(plan.source)
                except Exception as exc:
                    results[plan.position] = CacheWriteError(
                        plan.name, f"source serialization failed: {type(exc).__name__}: {exc}"
                    )
                    continue
                receive, send = context.Pipe(duplex=False)
                process = context.Process(
                    target=_child,
                    args=(payload, os.fspath(base), config_json, num_workers, send),
                    name=f"dataset-rt-writer-{plan.name}",
                    daemon=True,
                )
                process.start()
                send.close()
                running.append(_Running(plan.position, plan.name, process, receive))
            if not running:
                break
            now = time.monotonic()
            deadline = min(job.started + timeout for job in running)
            ready = wait([job.conn for job in running], timeout=max(0.0, deadline - now))
            if not ready:
                # A source ran out of time: it and every unfinished source fail.
                for job in running:
                    results[job.position] = CacheWriteError(job.name, TIMEOUT_MESSAGE)
                for plan in pending:
                    results[plan.position] = CacheWriteError(plan.name, TIMEOUT_MESSAGE)
                pending = []
                _stop(running)
                running = []
                _sweep(base)
                break
            for job in [j for j in running if j.conn in ready]:
                try:
                    message = job.conn.recv()
                except EOFError:
                    message = ("error", f"writer process exited with code {job.process.exitcode}")
                running.remove(job)
                job.process.join()
                job.conn.close()
                if message[0] == "interrupt":
                    interrupt = (message[1], tuple(message[2]))
                    results[job.position] = CacheWriteError(
                        job.name, f"{message[1]} in writer process"
                    )
                elif message[0] == "error":
                    results[job.position] = CacheWriteError(job.name, message[1])
                else:
                    fields, kind = message[1], message[2]
                    if kind == "CacheWriteSuccess":
                        results[job.position] = CacheWriteSuccess(fields[0], base / fields[0])
                    else:
                        results[job.position] = CacheWriteError(*fields)
                completed += 1
                if config.show_progress:
                    print(f"DatasetRT sources completed: {completed}/{len(plans)}", file=sys.stderr)
            if interrupt is not None and not running:
                break
    except BaseException:
        _stop(running)
        _sweep(base)
        raise
    if interrupt is not None:
        _stop(running)
        _sweep(base)
        kind, args = interrupt
        raise (KeyboardInterrupt(*args) if kind == "KeyboardInterrupt" else SystemExit(*args))
    return results
