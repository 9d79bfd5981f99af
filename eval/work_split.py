"""The process split: rank and world under a launcher, and the deterministic share of work items
each process takes.

Launchers tell a process its place through the environment: torchrun and ``accelerate launch``
(``--multi_gpu``, or a multi-GPU config) set ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; an MPI
launch (``accelerate launch --cpu --mpirun_hostfile ...``) sets its ``PMI_*`` / ``OMPI_COMM_WORLD_*``
variables. The environment is read here, strictly, and accelerate's ``PartialState`` (``cpu=True``
for ``--device cpu``, so a CPU run gets a gloo group instead of silently running as one process)
must agree with it; anything that cannot be read consistently is refused with one line.
``accelerate launch --cpu --num_processes N`` without an MPI host file starts one process
(accelerate's simple launcher): that process is a world of one and does all the work.
"""

from __future__ import annotations

import os

from genshift.errors import BenchError

MAX_WORLD = 4096
# (variable names, in accelerate's order of precedence) for each quantity
RANK_VARS = ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK")
WORLD_VARS = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
LOCAL_RANK_VARS = ("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK")
LOCAL_WORLD_VARS = ("LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE")
HINT = "start the processes with torchrun or accelerate launch, which set them consistently"


def _env_int(names: tuple[str, ...], env) -> tuple[str, int] | None:
    """The first of ``names`` that is set, as ``(name, value)``; a value that is not a small whole
    number is refused."""
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
            raise BenchError(f"launcher variable {rank[0]}={rank[1]} is set but no world size ({WORLD_VARS[0]}); {HINT}")
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


class Distributed:
    """This process's rank and the world under a launcher; one process otherwise (no process
    group is created then)."""

    def __init__(self, device: str = "cpu") -> None:
        self.world, self.rank, self.local_rank = read_launcher_env()
        self.state = None
        if os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true" and device.startswith("cuda"):
            raise BenchError(f"launched with `accelerate launch --cpu` but --device {device}; drop --cpu from the "
                             "launch or use --device cpu")
        if self.world > 1:
            from accelerate import PartialState

            # cpu=True: without it accelerate ignores the launcher on a machine without GPUs (world of one)
            self.state = PartialState(cpu=not device.startswith("cuda"))
            got = (self.state.num_processes, self.state.process_index, self.state.local_process_index)
            if got != (self.world, self.rank, self.local_rank):
                raise BenchError(f"the launcher says process {self.rank} (local {self.local_rank}) of {self.world}, "
                                 f"accelerate set up process {got[1]} (local {got[2]}) of {got[0]}; {HINT}")
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
