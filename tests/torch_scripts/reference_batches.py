"""Print the batches of to_torch_dataloader for configurations given as JSON (or the
error making the loader raised). A config may set ``table`` ("filtered"), ``epoch_len``
(``set_epoch_len`` before the loader is made), ``passes`` and ``reader_seed``; the rest
are the loader's arguments.

Uses only the public API shared by dataset_rt and dataset-rt 0.4.8, so the same script
runs against both (tests/test_torch.py compares the output).

    python reference_batches.py CONFIGS_JSON CACHE_PATH...
"""

import json
import sys
import warnings

import polars as pl
import torch

import dataset_rt as drt


def ids(batch: object) -> list[list[int]]:
    return [[int(c), int(s)] for c, s in zip(batch.cache_id, batch.sample_id)]


def main() -> None:
    configs = json.loads(sys.argv[1])
    paths = sys.argv[2:]
    torch.set_num_threads(1)
    results = []
    for config in configs:
        runtime = drt.DatasetRuntime(num_workers=1)
        reader = drt.ReaderConfig(seed=config.pop("reader_seed", 0), shuffle=False)
        dataset = runtime.cached_dataset(paths, reader_config=reader)
        table = config.pop("table", None)
        if table == "filtered":
            meta = dataset.get_metadata()
            dataset.update_metadata(
                meta.filter(pl.col("sample_id") % 3 != 1).with_columns(
                    weight=(pl.col("sample_id") % 4 + 1).cast(pl.Float64)
                )
            )
        epoch_len = config.pop("epoch_len", None)
        if epoch_len is not None:
            dataset.set_epoch_len(epoch_len)
        passes = config.pop("passes", 2)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                loader = dataset.to_torch_dataloader(verbose=False, **config)
            except Exception as error:
                results.append({"error": f"{type(error).__name__}: {error}"})
                continue
            batches = [[ids(batch) for batch in loader] for _ in range(passes)]
        results.append(
            {
                "len": len(loader),
                "batches": batches,
                "warnings": sorted(str(w.message).split(";")[0] for w in caught),
            }
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
