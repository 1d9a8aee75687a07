"""Cache pickled training dictionaries and unpack delivered records."""

import pickle
from collections.abc import Iterator
from pathlib import Path

from pydantic import TypeAdapter
from typing_extensions import TypedDict

import dataset_rt as drt


class TrainingRecord(TypedDict):
    """Keep the serialized record shape explicit at the decoding boundary."""

    text: str
    tokens: list[int]


RECORD_ADAPTER = TypeAdapter(TrainingRecord)


class TextSamples:
    """Keep the source version in its name so reuse has an explicit boundary."""

    name = "text_records_v1"

    def __iter__(self) -> Iterator[drt.CacheInput]:
        """Pack each preprocessed dictionary without retaining the full source."""
        for text, label in [("  Hello world  ", 0), ("Dataset caching", 1)]:
            normalized = text.strip().lower()
            record = TrainingRecord(
                text=normalized, tokens=[ord(char) for char in normalized]
            )
            yield drt.CacheInput(
                data=pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL),
                metadata={"label": label, "split": "train"},
            )


def main() -> None:
    """Reuse complete caches and report failures before consuming samples."""
    runtime = drt.DatasetRuntime(num_workers=2)
    result = runtime.from_cache_sources(
        TextSamples(),
        Path("cache_text"),
        reader_config=drt.ReaderConfig(seed=42, shuffle=False),
    )
    match result:
        case drt.CacheSourcesDatasetSuccess(dataset=dataset, results=results):
            print(results)
        case failure:
            raise RuntimeError(failure)

    for sample in dataset:
        record = RECORD_ADAPTER.validate_python(pickle.loads(sample.data))
        print(record["text"], record["tokens"], sample.metadata["label"])


if __name__ == "__main__":
    main()
