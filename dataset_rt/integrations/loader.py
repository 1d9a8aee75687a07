"""dataset-rt 0.4.8's module path of its DataLoader builder. Like 0.4.8's, it needs
PyTorch. ``make_dataloader(dataset, **options)`` is what
``CachedDataset.to_torch_dataloader(**options)`` calls: the same options, defaults,
checks and results (see ``dataset_rt.integrations.torch``)."""

from __future__ import annotations

from typing import Any

from dataset_rt.integrations.torch import DatasetRTDataLoader, to_torch_dataloader

__all__ = ["make_dataloader"]


def make_dataloader(dataset: Any, **options: Any) -> DatasetRTDataLoader:
    """The DataLoader ``dataset.to_torch_dataloader(**options)`` returns."""
    return to_torch_dataloader(dataset, **options)
