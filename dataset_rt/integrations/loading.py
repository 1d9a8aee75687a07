"""dataset-rt 0.4.8's module path for the loader's planning arithmetic (worker counts,
budgets, seeds). Those are internals of the loader, here in
``dataset_rt.integrations._loading``; the public surface is
``CachedDataset.to_torch_dataloader``. Kept so that an ``import`` written for 0.4.8 does
not break; it re-exports the helpers whose meaning is the same in both packages."""

from __future__ import annotations

from dataset_rt.integrations._loading import local_rank_count
from dataset_rt.resources import available_cpu_count, loading_worker_count, native_worker_count

__all__ = ["available_cpu_count", "loading_worker_count", "local_rank_count", "native_worker_count"]
