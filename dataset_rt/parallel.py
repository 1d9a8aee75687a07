"""Writing sources in a pool of spawned processes (``WriterConfig(num_processes=N)``).

``min(N, number of sources)`` worker processes are spawned (spawn start method, so no
native state crosses a fork) and each is reused for many sources: a worker opens one
native runtime of ``num_workers`` threads, says it is ready, then writes the sources the
parent hands it one at a time with the serial writer (``dataset_rt.writer``,
``show_progress`` off), staging exactly as a serial write does. Sources are handed out
dynamically, in source order, to whichever worker is idle, so a slow source holds back
only its own worker. A killed worker leaves only a staging directory whose lock died with
it, which the parent sweeps.

Each source is pickled when it is handed out (``source serialization failed: ...`` if it
cannot be) and unpickled in its worker. Results keep source order and carry the same
values and bytes as in-process writing. Failures of the pool:

* a source that does not finish within ``process_timeout_seconds`` of being handed out (or
  a worker not ready within that time of being spawned) stops the pool: every child is
  killed and every source not finished reports ``writer process timeout exceeded``;
* a worker that dies stops the pool: every child is killed and every source not
  finished reports ``writer child exited with code N`` (nothing is retried), as 0.4.8;
* a ``KeyboardInterrupt`` or ``SystemExit`` in a worker (or in the parent while waiting)
  stops every child and is raised again in the parent, with the same arguments.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import pickle
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from dataset_rt import _native
from dataset_rt.config import WriterConfig
from dataset_rt.records import CacheWriteError, CacheWriteResult, CacheWriteSuccess
from dataset_rt.writer import python_error, write_sources

TIMEOUT_MESSAGE = "writer process timeout exceeded"
# 0.4.8's bound on an exception's text in (de)serialization failures.
DIAGNOSTIC_CHARS = 2048
# How long an idle worker gets to exit after being told to stop, before it is killed.
STOP_GRACE_SECONDS = 2.0


def _worker(conn: Connection, base: str, config_json: str, num_workers: int) -> None:
    """Worker process entry: open one runtime, report ready, then write each source the
    parent sends (a pickled source; an empty message means stop) and send its result."""
    try:
        config = WriterConfig.model_validate_json(config_json).model_copy(
            update={"show_progress": False, "num_processes": 0}
        )
        with _native.Runtime.open(num_workers) as runtime:
            conn.send(("ready",))
            while True:
                try:
                    payload = conn.recv_bytes()
                except EOFError:  # the parent went away
                    return
                if not payload:
                    return
                conn.send(_write_job(runtime, payload, base, config))
    except (KeyboardInterrupt, SystemExit) as exc:
        # Arguments that cannot be pickled travel as their reprs (nothing is written
        # until pickling succeeds); a parent that is gone sees nothing.
        for args in (exc.args, tuple(map(repr, exc.args))):
            try:
                conn.send(("interrupt", type(exc).__name__, args))
            except OSError:
                break
            except Exception:
                continue
            break
    finally:
        conn.close()


def _diagnostic(exc: BaseException) -> str:
    """0.4.8's ``<name>: <str(exc)>`` for a source that fails to pickle or unpickle, at
    most DIAGNOSTIC_CHARS characters; only the class name when ``str(exc)`` raises."""
    try:
        return f"{type(exc).__name__}: {exc}"[:DIAGNOSTIC_CHARS]
    except Exception:
        return type(exc).__name__


def _write_job(
    runtime: _native.Runtime, payload: bytes, base: str, config: WriterConfig
) -> tuple[Any, ...]:
    """Write one pickled source; the message for the parent (interrupts propagate)."""
    try:
        source = pickle.loads(payload)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        return ("error", f"source deserialization failed: {_diagnostic(exc)}")
    try:
        [result] = write_sources(runtime, source, base, config)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        return ("error", python_error(exc))
    return ("result", tuple(result), type(result).__name__)


@dataclass
class _Worker:
    """One pool process, its end of the pipe, and the source it is writing."""

    process: Any
    conn: Connection
    deadline: float  # the start deadline, then the current job's
    ready: bool = False
    job: Any = None  # the _Plan being written
    closed: bool = field(default=False)

    @property
    def waiting(self) -> bool:
        """Starting or writing: a deadline applies."""
        return not self.closed and (not self.ready or self.job is not None)


def _start(context: Any, base: Path, config_json: str, num_workers: int, timeout: float) -> _Worker:
    parent_end, child_end = context.Pipe(duplex=True)
    process = context.Process(
        target=_worker,
        args=(child_end, os.fspath(base), config_json, num_workers),
        name="dataset-rt-writer",
        daemon=True,
    )
    try:
        process.start()
    finally:
        child_end.close()
    return _Worker(process, parent_end, time.monotonic() + timeout)


def _stop(workers: list[_Worker], *, graceful: bool) -> None:
    """End every worker: idle ones (also those still starting) are asked to exit
    (``graceful``); the rest, and any not gone after ``STOP_GRACE_SECONDS``, are killed."""
    if graceful:
        for worker in workers:
            if not worker.closed and worker.job is None:
                try:
                    worker.conn.send_bytes(b"")
                except OSError:
                    pass
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for worker in workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
    for worker in workers:
        if worker.process.is_alive():
            worker.process.kill()
    for worker in workers:
        worker.process.join()
        worker.conn.close()
        worker.closed = True


def _sweep(base: Path) -> None:
    _native.staging_sweep(base)  # best effort: a failed sweep is retried by the next writer


def _abort(workers: list[_Worker], base: Path) -> None:
    """Kill every worker and sweep the staging directories they leave. A Ctrl-C that
    lands meanwhile does not cut this short: the cleanup starts again (each step can be
    repeated) and the interrupt is raised once it is done."""
    interrupted: KeyboardInterrupt | None = None
    while True:
        try:
            _stop(workers, graceful=False)
            _sweep(base)
        except KeyboardInterrupt as exc:
            interrupted = exc
            continue
        break
    if interrupted is not None:
        raise interrupted


def _result(message: tuple[Any, ...], plan: Any, base: Path) -> CacheWriteResult:
    """A worker's message about ``plan`` as the result of that source."""
    if message[0] == "error":
        return CacheWriteError(plan.name, message[1])
    fields, kind = message[1], message[2]
    if kind == "CacheWriteSuccess":
        return CacheWriteSuccess(fields[0], base / fields[0])
    return CacheWriteError(*fields)


def write_in_processes(
    plans: list[Any], base: Path, config: Any, num_workers: int
) -> dict[int, CacheWriteResult]:
    """Write planned sources with a pool of ``config.num_processes`` spawned workers;
    returns their results by source position (see the module docstring).

    The workers write under ``base`` resolved (absolute, symbolic links resolved), so
    their messages name that path (``cache path already exists: /abs/base/name``), as
    0.4.8's parallel writer does; a success's path is ``base / name`` as given."""
    if not plans:
        return {}
    public_base = base
    try:
        base = Path(base).resolve()
    except (OSError, RuntimeError):  # e.g. a symbolic link loop: name it as given
        base = Path(base).absolute()
    context = multiprocessing.get_context("spawn")
    timeout = float(config.process_timeout_seconds)
    config_json = config.model_dump_json()
    results: dict[int, CacheWriteResult] = {}
    pending = collections.deque(plans)
    workers: list[_Worker] = []
    interrupt: tuple[str, tuple[Any, ...]] | None = None
    killed = False

    def report(position: int, result: CacheWriteResult) -> None:
        results[position] = result
        if config.show_progress:
            print(f"DatasetRT sources completed: {len(results)}/{len(plans)}", file=sys.stderr)

    def fail_all(message: str) -> None:
        for worker in workers:
            if worker.job is not None:
                results[worker.job.position] = CacheWriteError(worker.job.name, message)
                worker.job = None
        while pending:
            plan = pending.popleft()
            results[plan.position] = CacheWriteError(plan.name, message)

    try:
        for _ in range(min(int(config.num_processes), len(plans))):
            workers.append(_start(context, base, config_json, num_workers, timeout))
        while interrupt is None:
            # Hand the next sources, in order, to idle workers.
            for worker in workers:
                while not worker.closed and worker.ready and worker.job is None and pending:
                    plan = pending.popleft()
                    try:
                        payload = pickle.dumps(plan.source)
                    except Exception as exc:
                        report(
                            plan.position,
                            CacheWriteError(
                                plan.name,
                                f"source serialization failed: {_diagnostic(exc)}",
                            ),
                        )
                        continue
                    worker.job = plan
                    worker.deadline = time.monotonic() + timeout
                    try:
                        worker.conn.send_bytes(payload)
                    except OSError:
                        break  # it died: its end of file is read below
            busy = [worker for worker in workers if worker.waiting]
            if not busy:
                break
            now = time.monotonic()
            expired = [worker for worker in busy if worker.deadline <= now]
            if expired:
                fail_all(TIMEOUT_MESSAGE)
                killed = True
                break
            deadline = min(worker.deadline for worker in busy)
            # (At most an hour per wait: the platform's wait takes no timeout beyond
            # about 24.8 days, and process_timeout_seconds may be any finite value.)
            ready = wait(
                [worker.conn for worker in busy], timeout=min(max(0.0, deadline - now), 3600.0)
            )
            dead: _Worker | None = None
            for worker in [w for w in busy if w.conn in ready]:
                try:
                    message = worker.conn.recv()
                except (EOFError, OSError):
                    message = None
                if message is None:
                    # It died: the pool stops, nothing is retried (0.4.8), once the
                    # results the other workers have sent are taken.
                    dead = dead or worker
                    continue
                if message[0] == "ready":
                    worker.ready = True
                elif message[0] == "interrupt":
                    interrupt = (message[1], tuple(message[2]))
                    if worker.job is not None:
                        results[worker.job.position] = CacheWriteError(
                            worker.job.name, f"{message[1]} in writer process"
                        )
                        worker.job = None
                    break
                else:
                    plan, worker.job = worker.job, None
                    report(plan.position, _result(message, plan, public_base))
            if dead is not None and interrupt is None:
                dead.process.join()
                fail_all(f"writer child exited with code {dead.process.exitcode}")
                killed = True
                break
    except BaseException:
        _abort(workers, base)
        raise
    if interrupt is not None or killed:
        _abort(workers, base)
    else:
        _stop(workers, graceful=True)
    if interrupt is not None:
        kind, args = interrupt
        raise (KeyboardInterrupt(*args) if kind == "KeyboardInterrupt" else SystemExit(*args))
    return results
