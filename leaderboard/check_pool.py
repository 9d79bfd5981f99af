"""The store's entries checked in a pool of processes (``load_store`` on a large store).

Each entry's check (``store._check_entry``: hashing its files, parsing, recomputing every metric
from its predictions) is independent of the others and CPU-bound, so a pool of processes (one per
core; "spawn": the Streamlit server that runs the check has threads, which forking would copy
mid-flight) checks them in chunks; the calling process checks the first chunk while the workers
start, so a cold board's first rows do not wait for them. Workers get the verification cache as it was read and send
back the outcomes they added, so the parent writes the cache once, as the serial check does. A
store below ``MIN_ENTRIES`` is checked in the calling process: a worker's start-up (a fresh
interpreter importing the checking code, about a second) costs more than it saves there. Workers
run at a lower priority (``NICE``): on a machine with few cores the board's first rows, painted
while the check goes on, get the CPU first.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

MIN_ENTRIES = 48
CHUNK = 4        # entries per task: the first rows of a cold board arrive after one chunk per worker
NICE = 10        # workers yield the CPU to the server and the browser painting what was checked so far
_TRUST: dict = {}  # per worker process: the trust settings, built once
_CACHE: dict = {}  # per worker process: the verification cache as the parent read it


def die_with_parent() -> None:
    """In a child process (Linux): SIGTERM when the parent dies, even by SIGKILL (no orphaned workers or server)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _worker_start(cache: dict) -> None:
    _CACHE.update(cache)
    die_with_parent()  # a stopped board leaves no worker behind
    try:
        os.nice(NICE)
    except (AttributeError, OSError):
        pass


def pool_size(entries: int, workers: int | None) -> int:
    """Processes to check ``entries`` with: ``workers`` if given, else one per core the process may use;
    1 (no pool) for a small store."""
    if workers is None:
        if entries < MIN_ENTRIES:
            return 1
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(workers, entries))


def _check_chunk(paths: list[str], cache: dict | None, trusted_keys: dict, suites, strict: bool,
                 ranks_dir: str | None = None, on_checked=None) -> tuple[list, dict, int]:
    """Check ``paths`` against ``cache`` (None: the worker's copy); returns their entries, the cache outcomes
    added, and this process's id. ``on_checked(entry)``: called as each is done (in the calling process)."""
    from genshift.leaderboard import store

    cache = _CACHE if cache is None else cache
    key = (tuple(sorted(trusted_keys)), tuple(suites) if suites is not None else None)
    if key not in _TRUST:
        _TRUST[key] = store._trust(trusted_keys, suites)[1]
    known = set(cache)
    entries = []
    for p in paths:
        entries.append(store._check_entry(Path(p), cache, trusted_keys=trusted_keys, suites=_TRUST[key],
                                          strict_suites=strict, ranks_dir=Path(ranks_dir) if ranks_dir else None))
        if on_checked is not None:
            on_checked(entries[-1])
    return entries, {k: v for k, v in cache.items() if k not in known}, os.getpid()


def check_in_pool(paths: list[Path], cache: dict, *, trusted_keys: dict, suites, strict: bool, workers: int,
                  on_checked, ranks_dir: Path | None = None) -> dict[int, int]:
    """Check ``paths`` in ``workers`` processes; ``on_checked(entry)`` in the calling thread as each is done
    (chunks complete in any order), ``cache`` updated with what the workers added. The calling process
    checks the first chunk itself while the workers start (a cold board's first rows do not wait for
    them). Returns entries checked per process id (evidence of the split, for logs and tests)."""
    per_pid: dict[int, int] = {}
    ctx = multiprocessing.get_context("spawn")
    suites = [str(s) for s in suites] if suites is not None else None
    snapshot = dict(cache)
    ranks = str(ranks_dir) if ranks_dir else None
    # the cache as read goes to each worker once (initializer), not with every chunk
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_worker_start,
                             initargs=(snapshot,)) as pool:
        futures = [pool.submit(_check_chunk, [str(p) for p in paths[i:i + CHUNK]], None, trusted_keys, suites, strict,
                               ranks) for i in range(CHUNK, len(paths), CHUNK)]
        # each of its own entries is passed on as soon as it is checked: a cold board's first row is one entry's check
        own, added, pid = _check_chunk([str(p) for p in paths[:CHUNK]], dict(snapshot), trusted_keys, suites, strict,
                                        ranks, on_checked)
        cache.update(added)
        per_pid[pid] = len(own)
        for fut in as_completed(futures):
            entries, added, pid = fut.result()
            cache.update(added)
            per_pid[pid] = per_pid.get(pid, 0) + len(entries)
            for e in entries:
                on_checked(e)
    return per_pid
