"""Batch-size back-off on accelerator out-of-memory errors (eval and every builder): a batch that runs out of memory is
retried at half the size until it fits; the size that worked is kept for the rest of the run."""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

from genshift.errors import BenchError

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")


def is_oom(exc: BaseException) -> bool:
    import torch

    oom_text = isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()
    return isinstance(exc, torch.cuda.OutOfMemoryError) or oom_text


class BatchBackoff:
    """Run a function over a sequence in batches, halving ``batch_size`` on out-of-memory (``what``: for messages)."""

    def __init__(self, batch_size: int, *, what: str = "batch") -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.what = what

    def call(self, fn: Callable[[Sequence[T]], list[R]], items: Sequence[T], *, batches_per_call: int = 1) -> list[R]:
        """``fn`` over chunks of ``items`` (results concatenated); a chunk out of memory runs again at half size."""
        out: list[R] = []
        start = 0
        while start < len(items):
            chunk = items[start:start + self.batch_size * max(1, batches_per_call)]
            try:
                out.extend(fn(chunk))
            except Exception as e:  # noqa: BLE001 - only OOM is handled, the rest re-raised
                if not is_oom(e):
                    raise
                import torch

                gc.collect()
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                if self.batch_size == 1:
                    raise BenchError(f"out of accelerator memory even with a {self.what} of 1; use a smaller "
                                     "model or resolution, or free the device") from None
                self.batch_size = max(1, self.batch_size // 2)
                log.warning("out of memory: %s size lowered to %d", self.what, self.batch_size)
                continue
            start += len(chunk)
        return out
