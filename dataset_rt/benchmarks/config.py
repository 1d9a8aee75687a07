"""The benchmark's inputs: ``BenchmarkConfig`` (options, environment variables and their
validation, equal to dataset-rt 0.4.8's) and ``Topology`` (the identity torchrun gives a
rank). Needs pydantic-settings (the ``benchmark`` extra); never imports torch."""

from __future__ import annotations

from multiprocessing import get_all_start_methods
from pathlib import Path
from typing import Literal

from pydantic import DirectoryPath, Field, model_validator
from pydantic_settings import BaseSettings, CliImplicitFlag, SettingsConfigDict

__all__ = ["BenchmarkConfig", "Topology"]

# Torch computes a loader's length through floating-point division (see _loading).
MAX_SAMPLES_PER_EPOCH = 1 << 53
# Transform output: one SHA-256 digest (32 bytes) repeated to the input width.
DIGEST_FEATURES = 32


class BenchmarkConfig(BaseSettings):
    """A finite benchmark workload: read, transform and train on ``repeats`` passes.

    Every field is a command-line option (``--batch-size 64``, booleans as ``--shuffle`` /
    ``--no-shuffle``) and an environment variable (``DATASETRT_BENCH_BATCH_SIZE=64``);
    options win over variables. ``ranks`` is the number of training processes (torchrun
    ranks on this machine); ``num_workers`` and ``native_num_workers`` are per rank. With
    no ``cache_paths``, each rank writes the same ``caches`` synthetic caches of
    ``samples_per_cache`` samples into a private temporary directory (and checks every
    sample it reads against its position); given caches are only read. ``device="cuda"``
    uses one GPU per local rank with NCCL and fails rather than falling back to CPU.
    Global rank 0 writes the JSON report to ``output`` and prints it on one line.
    """

    model_config = SettingsConfigDict(cli_kebab_case=True, env_prefix="DATASETRT_BENCH_")

    ranks: int = Field(default=1, gt=0)
    num_workers: int = Field(default=0, ge=0)
    device: Literal["cpu", "cuda"] = "cpu"
    worker_context: Literal["spawn", "forkserver", "fork"] = "spawn"
    native_num_workers: int = Field(default=1, gt=0)
    batch_size: int = Field(default=32, gt=0)
    samples_per_epoch: int | None = Field(default=None, gt=0, le=MAX_SAMPLES_PER_EPOCH)
    shuffle: CliImplicitFlag[bool] = True
    worker_partition: Literal["split", "replicate"] = "split"
    drop_last: CliImplicitFlag[bool] = False
    persistent_workers: CliImplicitFlag[bool] = True
    pin_memory: CliImplicitFlag[bool] = False
    seed: int = Field(default=7, ge=0, lt=1 << 64)
    repeats: int = Field(default=3, gt=0)
    samples_per_cache: int = Field(default=512, gt=0)
    caches: int = Field(default=2, gt=0)
    payload_bytes: int = Field(default=4096, ge=16)
    metadata_bytes: int = Field(default=0, ge=0)
    cache_paths: tuple[DirectoryPath, ...] = ()
    input_features: int = Field(default=256, gt=0)
    model_width: int = Field(default=512, gt=0)
    transform_rounds: int = Field(default=0, ge=0)
    prefetch_size: int = Field(default=16, gt=0)
    prefetch_factor: int = Field(default=2, gt=0)
    timeout_seconds: int = Field(default=600, gt=0)
    worker_timeout: float = Field(default=30, gt=0, allow_inf_nan=False)
    output: Path = Path("benchmark-results.json")
    quiet: CliImplicitFlag[bool] = False

    @model_validator(mode="after")
    def _check_workload(self) -> BenchmarkConfig:
        """Reject what would only fail after launch: a start method this platform lacks,
        forked CUDA workers, and an input width the transform cannot fill."""
        if self.worker_context not in get_all_start_methods():
            raise ValueError("worker_context is unavailable on this platform")
        if self.device == "cuda" and self.num_workers > 0 and self.worker_context == "fork":
            raise ValueError("CUDA loading requires spawn or forkserver workers")
        if self.input_features % DIGEST_FEATURES != 0:
            raise ValueError("input_features must be divisible by 32")
        return self


class Topology(BaseSettings):
    """This process's place in the job, from torchrun's ``RANK``, ``LOCAL_RANK``,
    ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE``; read once in the training process (loader
    workers never need it)."""

    model_config = SettingsConfigDict(env_prefix="", extra="ignore")

    rank: int = Field(ge=0)
    local_rank: int = Field(ge=0)
    world_size: int = Field(gt=0)
    local_world_size: int = Field(gt=0)

    @model_validator(mode="after")
    def _check_membership(self) -> Topology:
        """A rank outside its own world is a broken launcher environment."""
        if self.rank >= self.world_size or self.local_rank >= self.local_world_size:
            raise ValueError("rank does not belong to its launcher topology")
        return self
