"""Deterministic sharding of builder work, and which shards this process owns.

The same work item always lands in the same shard (``shard_of`` hashes its key), whatever else
is in the build; ``accelerate launch`` spreads shards over processes round-robin by process
index. Each shard is written atomically by ``genshift.writer.SuiteWriter``, so a crash loses at
most the shards in flight and a rerun skips the finished ones.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


def shard_of(key: str, num_shards: int) -> int:
    """Shard index of a work item's key: ``sha256(key) mod num_shards``."""
    if num_shards <= 0:
        raise ValueError(f"num_shards must be positive, got {num_shards}")
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") % num_shards


def plan_shards(items: Iterable[T], num_shards: int, key: Callable[[T], str]) -> list[list[T]]:
    """Group items into ``num_shards`` lists by ``shard_of(key(item))``, keeping their order."""
    shards: list[list[T]] = [[] for _ in range(num_shards)]
    for item in items:
        shards[shard_of(key(item), num_shards)].append(item)
    return shards


def plan_nonempty_shards(items: Sequence[T], num_shards: int, key: Callable[[T], str]) -> list[list[T]]:
    """``plan_shards`` with the largest shard count <= ``num_shards`` that leaves no shard empty.

    Small builds (a few classes) can hash two items into one shard; the format needs every shard
    ``0..N-1`` to exist, so the count is lowered deterministically until each holds an item.
    """
    for n in range(max(1, min(num_shards, len(items))), 0, -1):
        shards = plan_shards(items, n, key)
        if all(shards):
            return shards
    return [list(items)]


@dataclass(frozen=True)
class Process:
    """This process's place in a (possibly distributed) run."""

    index: int = 0
    count: int = 1
    local_index: int = 0  # index among the processes of this node (its GPU)

    @property
    def is_main(self) -> bool:
        return self.index == 0

    def device(self, requested: str | None = None, *, cpu: bool = False) -> str:
        """``requested`` if given; else this process's GPU (``cuda:<local index>``) or the CPU."""
        if requested:
            return requested
        import torch

        if cpu or not torch.cuda.is_available():
            return "cpu"
        return f"cuda:{self.local_index}" if self.count > 1 else "cuda"

    def owns(self, shard: int) -> bool:
        return shard % self.count == self.index

    def my_shards(self, shards: Sequence[Hashable]) -> list:
        return [s for i, s in enumerate(shards) if i % self.count == self.index]

    def wait(self) -> None:
        """Barrier across processes (a no-op when alone)."""
        if self.count > 1:
            from accelerate import PartialState
            PartialState().wait_for_everyone()


def current_process() -> Process:
    """This process as seen by ``accelerate`` (a single process when not launched by it)."""
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return Process()
    from accelerate import PartialState

    state = PartialState()
    return Process(index=state.process_index, count=state.num_processes, local_index=state.local_process_index)
