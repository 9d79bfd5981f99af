"""The process split: rank and world under a launcher, and the deterministic share of work items
each process takes."""

from __future__ import annotations

import os


class Distributed:
    """Process rank and world under ``accelerate launch`` / torchrun, through accelerate's
    ``PartialState``; one process otherwise (no process group is created)."""

    def __init__(self) -> None:
        self.world, self.rank, self.local_rank, self.state = 1, 0, 0, None
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            from accelerate import PartialState

            self.state = PartialState()
            self.world, self.rank = self.state.num_processes, self.state.process_index
            self.local_rank = self.state.local_process_index
        self.is_main = self.rank == 0

    def barrier(self) -> None:
        if self.state is not None:
            self.state.wait_for_everyone()


def balance(items: list[dict], world: int) -> list[dict]:
    """Give every item a ``rank``: a deterministic greedy balance of ``cost``, largest first onto the
    least-loaded process, so every process computes the same split from the same state."""
    load = [0] * world
    for it in sorted(items, key=lambda i: (-i["cost"], i["chunk"], i["config"], i["unit"])):
        rank = min(range(world), key=lambda r: (load[r], r))
        it["rank"] = rank
        load[rank] += it["cost"]
    return items
