"""The loader's lifecycle events (dataset-rt 0.4.8's module path): INFO records on the
``dataset_rt.loader`` logger, through the application's handlers when it configured any,
else printed once to stderr without registering a handler."""

from __future__ import annotations

import logging
from typing import TypeAlias

LOGGER_NAME = "dataset_rt.loader"
LogValue: TypeAlias = str | int | bool | None


def loader_event(message: str, *args: object) -> None:
    """Emit one INFO event: to the application's handlers (and filters) when configured;
    otherwise, unless the logger's level hides INFO, to stderr as
    ``[dataset_rt.loader] <message>`` through a temporary handler that is never
    registered (so later logging configuration cannot duplicate it)."""
    logger = logging.getLogger(LOGGER_NAME)
    if logger.hasHandlers():
        logger.info(message, *args)
        return
    if logger.level != logging.NOTSET and not logger.isEnabledFor(logging.INFO):
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
    try:
        handler.handle(logger.makeRecord(LOGGER_NAME, logging.INFO, "", 0, message, args, None))
    finally:
        handler.close()
