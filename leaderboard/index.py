"""Fast first paint: the store's last checked state, and the full check running in the background.

After every full check (``leaderboard.store.load_store``) the leaderboard writes a small
**index** next to the store's verification cache (in the user's cache folder, never in the store): for each entry its path, status, reason,
stamp, the sha256 of its ``result.json`` and the parsed result. A restarted server paints its
table from the index at once; an index entry is used only while its ``result.json`` still has
the recorded sha256 (new or changed entries wait for the check), and everything is checked
again in the background, replacing the painted state when done. A never-seen store has no
index: the background check publishes its checked entries as it goes, so the first rows and a
progress bar appear within seconds.

The index is keyed by the store source, its revision and the trusted keys: another key set
(which changes what counts as verified) ignores it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import threading
import time
from pathlib import Path

from benchmark.fsutil import atomic_write_json, sha256_bytes
from leaderboard import store as store_mod
from leaderboard.store import Entry, Store, assemble, load_store, resolve_source

log = logging.getLogger(__name__)
INDEX_VERSION = 1
MAX_INDEX_BYTES = 256 * 2**20
ENTRY_PATH = re.compile(r"^[^/\\]+/[^/\\]+/result\.json$")


def index_path(root: Path, cache_dir: str | None = None) -> Path:
    cache = store_mod._cache_path(root, cache_dir)
    return cache.with_name(cache.name.replace("-cache", "-index"))


def _keys_digest(trusted_keys_file: str | None) -> str:
    return sha256_bytes(Path(trusted_keys_file).read_bytes()) if trusted_keys_file else ""


def _absolute(path: Path) -> Path:
    """Absolute without following links (a Hub snapshot's files link to blobs outside the root): a relative
    ``--results`` and its entries' paths compare as the same folder."""
    return Path(os.path.abspath(path))


def _record(e: Entry, root: Path) -> dict:
    return {"path": _absolute(e.path).relative_to(root).as_posix(), "status": e.status, "reason": e.reason,
            "stamp": e.stamp, "result_sha256": e.result_sha256, "result": e.result,
            "predictions_sha256": e.predictions_sha256, "note": e.note, "suite_checked": e.suite_checked,
            "file_keys": e.file_keys}


def write_index(store: Store, *, keys_digest: str = "") -> Path | None:
    """Record a fully checked store (called after each full check); None if it cannot be written."""
    root = _absolute(store.root)
    records = []
    for e in store.entries + store.superseded + store.rejected:
        try:
            records.append(_record(e, root))
        except ValueError:  # an entry outside the root (never for load_store's glob)
            continue
    path = index_path(store.root)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, {"version": INDEX_VERSION, "source": store.source, "revision": store.revision,
                                 "keys": keys_digest, "written_at": time.time(), "entries": records})
    except (OSError, TypeError, ValueError) as ex:
        log.warning("could not write the leaderboard index %s (%s)", path, ex)
        return None
    return path


def read_index(source: str, root: Path, revision: str | None, *, keys_digest: str = "") -> tuple[Store, int] | None:
    """The last checked state of the store, for the entries whose result.json is unchanged, and how
    many index entries were dropped as changed or gone; None without a usable index."""
    path = index_path(root)
    try:
        if not path.is_file() or path.stat().st_size > MAX_INDEX_BYTES:
            return None
        data = json.loads(path.read_bytes())
        if (not isinstance(data, dict) or data.get("version") != INDEX_VERSION or data.get("revision") != revision
                or data.get("keys") != keys_digest or not isinstance(data.get("entries"), list)):
            return None
    except (OSError, ValueError, RecursionError):
        return None
    cache = store_mod._cache_path(root, None)
    hits = cache.parent / (cache.stem + "-hits")
    checked, dropped = [], 0
    for rec in data["entries"]:
        try:
            rel = rec["path"]
            if not (isinstance(rel, str) and ENTRY_PATH.match(rel)) or ".." in rel.split("/"):
                dropped += 1
                continue
            p = root / rel
            if sha256_bytes(p.read_bytes()) != rec["result_sha256"]:
                dropped += 1
                continue
            status = rec["status"] if rec["status"] in ("verified", "accepted", "rejected", "superseded") else "rejected"
            checked.append(Entry(p, result=rec["result"], status="accepted" if status == "superseded" else status,
                                 reason=str(rec.get("reason") or ""), stamp=rec.get("stamp"),
                                 result_sha256=rec["result_sha256"], cache_dir=hits,
                                 predictions_sha256=dict(rec.get("predictions_sha256") or {}),
                                 note=str(rec.get("note") or ""), suite_checked=bool(rec.get("suite_checked")),
                                 file_keys=rec["file_keys"] if isinstance(rec.get("file_keys"), dict) else {}))
        except (OSError, KeyError, TypeError):
            dropped += 1
    store = assemble(Store(source=source, root=root, revision=revision), checked)
    return store, dropped


class Loader:
    """One store, checked in a background thread; :meth:`snapshot` gives the best state to paint now."""

    PUBLISH_EVERY_S = 1.0
    # each publish repaints the whole board (seconds of CPU at 500 models, taken from the check itself):
    # publish again only once the checked count grew by this factor, so a cold store repaints ~30 times
    PUBLISH_GROWTH = 1.25
    INDEX_GRACE_S = 3.0  # painted from the index: let the first page render before the check competes for CPU

    def __init__(self, source: str, *, trusted_keys_file: str | None = None, suites_dir: str | None = None):
        self.source, self.trusted_keys_file, self.suites_dir = source, trusted_keys_file, suites_dir
        self.root, self.revision = resolve_source(source)
        # an index is reused only under the same trust settings (keys and trusted suites)
        self.keys_digest = _keys_digest(trusted_keys_file) + (f"|suites:{Path(suites_dir).resolve()}" if suites_dir else "")
        self.trusted = None
        if trusted_keys_file:
            from eval.stamps import load_trusted_keys

            self.trusted = load_trusted_keys(trusted_keys_file)
        self.lock = threading.Lock()
        self.done = 0
        self.total = 0
        self.finished = False
        self.error: str | None = None
        self.version = 0
        self.kind = "none"       # what the current store is: "index" | "partial" | "full" | "none"
        self._checked: list[Entry] = []
        self._last_publish = 0.0
        self._published_done = 0
        self.started = time.monotonic()
        found = read_index(source, self.root, self.revision, keys_digest=self.keys_digest)
        self.store: Store | None = found[0] if found else None
        if found:
            self.kind = "index"
        self.thread = threading.Thread(target=self._run, name="genshift-store-check", daemon=True)
        self.thread.start()

    def _load_kwargs(self) -> dict:
        return {"progress": self._progress, "trusted_keys": self.trusted,
                "suites": [self.suites_dir] if self.suites_dir else None}

    def _progress(self, done: int, total: int, entry: Entry) -> None:
        with self.lock:
            self.done, self.total = done, total
            self._checked.append(dataclasses.replace(entry))  # a copy: assembling marks losers superseded
            now = time.monotonic()
            due = now - self._last_publish >= self.PUBLISH_EVERY_S and done >= self._published_done * self.PUBLISH_GROWTH
            if self.kind in ("none", "partial") and (due or done == total):
                self.store = assemble(Store(source=self.source, root=self.root, revision=self.revision),
                                      [dataclasses.replace(e) for e in self._checked])
                self.kind = "partial"
                self.version += 1
                self._last_publish, self._published_done = now, done

    def _run(self) -> None:
        if self.kind == "index":
            time.sleep(self.INDEX_GRACE_S)
        try:
            full = load_store(self.source, **self._load_kwargs())
        except Exception as e:  # noqa: BLE001 - shown in the app, never a dead thread without a word
            with self.lock:
                self.error = f"{type(e).__name__}: {e}"
                self.finished = True
                self.version += 1
            return
        write_index(full, keys_digest=self.keys_digest)
        with self.lock:
            changed = self.store is None or self.store.fingerprint != full.fingerprint or self.kind != "index"
            self.store, self.kind, self.finished = full, "full", True
            self.done = self.total = max(self.total, len(full.entries) + len(full.rejected) + len(full.superseded))
            if changed:
                self.version += 1

    def refresh(self) -> Store | None:
        """The store to paint, after re-checking the entries whose files changed on disk since they were
        checked (``store.refresh_store``: a stat per file; hashing and checks only for changed ones)."""
        with self.lock:
            current = self.store
        if current is None:
            return None
        fresh = store_mod.refresh_store(current, trusted_keys=self.trusted or {},
                                        suites=[self.suites_dir] if self.suites_dir else None)
        if fresh is not current:
            with self.lock:
                if self.store is current:  # else the background check replaced it meanwhile: keep that one
                    self.store = fresh
                    self.version += 1
                else:
                    fresh = self.store
        return fresh

    def wait(self, timeout: float) -> bool:
        self.thread.join(timeout)
        return self.finished

    def snapshot(self) -> tuple[Store | None, dict]:
        with self.lock:
            return self.store, {"done": self.done, "total": self.total, "finished": self.finished,
                                "kind": self.kind, "version": self.version, "error": self.error}
