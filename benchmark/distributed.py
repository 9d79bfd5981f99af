"""This process's place in a multi-process run (eval sweeps and suite builds) and the deterministic split of work over
processes. The launcher's environment (torchrun's, ``accelerate launch``'s, an MPI launch's) is read strictly and must
agree with accelerate's ``PartialState``; anything inconsistent is one line."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from genshift.errors import BenchError

T = TypeVar("T")
MAX_WORLD = 4096
# (variable names, in accelerate's order of precedence) for each quantity
RANK_VARS = ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK")
WORLD_VARS = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
LOCAL_RANK_VARS = ("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK")
LOCAL_WORLD_VARS = ("LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE")
HINT = "start the processes with torchrun or accelerate launch, which set them consistently"


def _env_int(names: tuple[str, ...], env) -> tuple[str, int] | None:
    """The first of ``names`` that is set, as ``(name, value)``; not a small whole number: refused."""
    for name in names:
        text = env.get(name)
        if text is None or text.strip() == "":
            continue
        if not text.strip().isdigit() or len(text.strip()) > 6:
            raise BenchError(f"launcher variable {name}={text[:40]!r} is not a whole number in 0..{MAX_WORLD}; {HINT}")
        return name, int(text)
    return None


def read_launcher_env(env=None) -> tuple[int, int, int]:
    """``(world, rank, local_rank)`` from the launcher's environment; ``(1, 0, 0)`` when none."""
    env = os.environ if env is None else env
    world, rank = _env_int(WORLD_VARS, env), _env_int(RANK_VARS, env)
    local, local_world = _env_int(LOCAL_RANK_VARS, env), _env_int(LOCAL_WORLD_VARS, env)
    if world is None:
        if rank is not None and rank[1] != 0:
            raise BenchError(f"launcher variable {rank[0]}={rank[1]} is set but no world size ({WORLD_VARS[0]}); "
                             f"{HINT}")
        return 1, 0, 0
    if not 1 <= world[1] <= MAX_WORLD:
        raise BenchError(f"launcher variable {world[0]}={world[1]}: the world size must be in 1..{MAX_WORLD}; {HINT}")
    if world[1] == 1:
        return 1, 0, 0
    if rank is None:
        raise BenchError(f"launcher variable {world[0]}={world[1]} is set but no rank ({RANK_VARS[0]}); {HINT}")
    if rank[1] >= world[1]:
        raise BenchError(f"launcher variables {rank[0]}={rank[1]} and {world[0]}={world[1]} disagree (a rank is "
                         f"below the world size); {HINT}")
    if local is None:
        raise BenchError(f"launcher variable {world[0]}={world[1]} is set but no local rank ({LOCAL_RANK_VARS[0]}); "
                         f"{HINT}")
    size = local_world[1] if local_world is not None else world[1]
    if not 1 <= size <= world[1] or local[1] >= size:
        raise BenchError(f"launcher variables {local[0]}={local[1]} and local world size {size} of world "
                         f"{world[1]} disagree; {HINT}")
    return world[1], rank[1], local[1]


@dataclass
class Process:
    """This process's place: ``index`` of ``count`` processes, ``local_index`` on its node (its GPU)."""

    index: int = 0
    count: int = 1
    local_index: int = 0
    state: object = field(default=None, repr=False, compare=False)  # accelerate's PartialState when count > 1

    @property
    def is_main(self) -> bool:
        return self.index == 0

    def wait(self) -> None:
        """Barrier across processes (a no-op when alone)."""
        if self.state is not None:
            self.state.wait_for_everyone()

    def device(self, requested: str | None = None, *, cpu: bool = False) -> str:
        """``requested`` if given; else this process's GPU (``cuda:<local index>``) or the CPU."""
        if requested:
            return requested
        import torch

        if cpu or not torch.cuda.is_available():
            return "cpu"
        return f"cuda:{self.local_index}" if self.count > 1 else "cuda"

    def owns(self, shard: int) -> bool:
        """Whether shard number ``shard`` is this process's (round-robin by process index)."""
        return shard % self.count == self.index

    def my_shards(self, shards: Sequence[Hashable]) -> list:
        return [s for i, s in enumerate(shards) if self.owns(i)]


def current_process(device: str | None = None) -> Process:
    """This process under a launcher; ``device``: where the work runs (``cpu``: a gloo group; ``None``: CUDA if any)."""
    world, rank, local = read_launcher_env()
    cuda = device.startswith("cuda") if device else None
    if os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true" and cuda:
        raise BenchError(f"launched with `accelerate launch --cpu` but device {device}; drop --cpu from the launch "
                         "or use the cpu device")
    if world == 1:
        return Process()
    from accelerate import PartialState

    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    # cpu=True: without it accelerate ignores the launcher on a machine without GPUs (a world of one)
    state = PartialState(cpu=not cuda)
    got = (state.num_processes, state.process_index, state.local_process_index)
    if got != (world, rank, local):
        raise BenchError(f"the launcher says process {rank} (local {local}) of {world}, accelerate set up process "
                         f"{got[1]} (local {got[2]}) of {got[0]}; {HINT}")
    return Process(rank, world, local, state)


def shard_of(key: str, num_shards: int) -> int:
    """Shard index of a work item's key: ``sha256(key) mod num_shards``, whatever else is in the build."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") % num_shards


def plan_shards(items: Iterable[T], num_shards: int, key: Callable[[T], str]) -> list[list[T]]:
    """Group items into ``num_shards`` lists by ``shard_of(key(item))``, keeping their order."""
    shards: list[list[T]] = [[] for _ in range(num_shards)]
    for item in items:
        shards[shard_of(key(item), num_shards)].append(item)
    return shards


def plan_nonempty_shards(items: Sequence[T], num_shards: int, key: Callable[[T], str]) -> list[list[T]]:
    """``plan_shards`` with the largest shard count <= ``num_shards`` leaving no shard empty (the format needs all)."""
    for n in range(max(1, min(num_shards, len(items))), 0, -1):
        shards = plan_shards(items, n, key)
        if all(shards):
            return shards
    return [list(items)]


def balance(items: list[dict], count: int) -> list[dict]:
    """A ``rank`` for each item (``cost``, ``key``): largest first onto the least-loaded process, deterministic."""
    load = [0] * count
    for it in sorted(items, key=lambda i: (-i["cost"], i["key"])):
        rank = min(range(count), key=lambda r: (load[r], r))
        it["rank"] = rank
        load[rank] += it["cost"]
    return items
