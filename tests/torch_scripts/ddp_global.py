"""One rank of a torchrun job reading worker_partition="global" (run by
tests/test_torch.py): records every batch it receives with its pass and step.

    torchrun --nproc-per-node N ddp_global.py CONFIG_JSON
CONFIG: paths, out (directory), seed, batch_size, samples, workers, passes,
load_state (file or null), stop_after (steps or null; rank 0 then saves state.json),
batch_format (optional, the loader's; default "samples").
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

import dataset_rt as drt


def main() -> None:
    config = json.loads(sys.argv[1])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    runtime = drt.DatasetRuntime(num_workers=1)
    dataset = runtime.cached_dataset(config["paths"], reader_config=drt.ReaderConfig(seed=0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = dataset.to_torch_dataloader(
            batch_size=config["batch_size"],
            shuffle=True,
            seed=config["seed"],
            worker_partition="global",
            samples_per_epoch=config["samples"],
            num_workers=config["workers"],
            multiprocessing_context="fork",
            native_num_workers=1,
            verbose=False,
            batch_format=config.get("batch_format", "samples"),
        )
    if config["load_state"]:
        loader.load_state_dict(json.loads(Path(config["load_state"]).read_text()))
    out = Path(config["out"])
    seen = []
    steps = 0
    stop = config["stop_after"]
    for pass_number in range(config["passes"]):
        for step, batch in enumerate(loader):
            seen.append(
                {
                    "pass": pass_number,
                    "step": step,
                    "ids": [[int(c), int(s)] for c, s in zip(batch.cache_id, batch.sample_id)],
                    "type": type(batch).__name__,
                }
            )
            steps += 1
            dist.barrier()  # lockstep, as DDP's gradient all-reduce would keep them
            if stop is not None and steps == stop:
                break
        if stop is not None and steps == stop:
            break
    state = loader.state_dict()
    if rank == 0 and stop is not None:
        (out / "state.json").write_text(json.dumps(state))
    (out / f"rank{rank}.json").write_text(
        json.dumps({"world": world, "len": len(loader), "batches": seen, "state": state})
    )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
