"""dataset-rt 0.4.8's module path for the DataLoader's option checks. The checks
themselves are internals of the loader (here in ``dataset_rt.integrations._loading``);
the public surface is ``CachedDataset.to_torch_dataloader``. This module keeps the one
constant users may read: the largest sample budget a loader accepts."""

from __future__ import annotations

from dataset_rt.integrations._loading import MAX_SAMPLE_BUDGET

__all__ = ["MAX_SAMPLE_BUDGET"]
