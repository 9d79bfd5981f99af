"""Fast first paint: the store's last checked state, and the full check running in the background.

After every full check (``genshift.leaderboard.store.load_store``) the leaderboard writes an **index** next
to the store's verification cache (in the user's cache folder, never in the store), as one file
written atomically (temporary name, then rename), in three lines:

1. an HMAC-SHA256 of line 2 under the board's own secret key (``leaderboard-index.key`` in the same
   folder, created once, readable by its owner only): an index this board did not write, or one
   edited since, is not used;
2. the **head**: the store source, revision and trust settings it was checked under, the stat key
   (size, mtime_ns, ctime_ns, inode) of every file of every entry, the sha256 of line 3, and the
   **first view**: the default board's table (``aggregate.board_table``, ranks and intervals
   included), its suite and boards, and the store's counts;
3. the **body**: every entry (path, status, reason, stamp, hashes, parsed result, stat keys).

A restarted server reads the head alone (a small fraction of the index) and paints the first view
from it, without hashing or parsing any entry: the head is used only while the store holds exactly
the entries it names and none of their files has another stat key (ctime cannot be set by a user,
so an in-place rewrite that restores size and mtime still shows). The body is read after the
first paint (or as soon as a view needs more than the first view) and gives the whole board, an
entry kept only while its files have the recorded stat keys (changed entries wait for the check);
everything is then checked again in the background, replacing the painted state when done. A
never-seen store has no index: the background check publishes its checked entries as it goes, so
the first rows and a progress bar appear within seconds.

An index under other trusted keys or suites (which change what counts as verified), another
revision or an older format is not used.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import logging
import os
import re
import tempfile
import threading
import time
from pathlib import Path

from genshift.errors import BenchError
from genshift.fsutil import atomic_write_bytes, sha256_bytes
from genshift.leaderboard import store as store_mod
from genshift.leaderboard.store import Entry, Store, assemble, keys_changed, load_store, resolve_source

log = logging.getLogger(__name__)
INDEX_VERSION = 2
MAX_INDEX_BYTES = 256 * 2**20
MAX_HEAD_BYTES = 32 * 2**20
ENTRY_PATH = re.compile(r"^[^/\\]+/[^/\\]+/result\.json$")
STATUSES = ("verified", "accepted", "rejected", "superseded")


def index_path(root: Path, cache_dir: str | None = None) -> Path:
    cache = store_mod._cache_path(root, cache_dir)
    return cache.with_name(cache.name.replace("-cache", "-index"))


def _keys_digest(trusted_keys_file: str | None) -> str:
    return sha256_bytes(Path(trusted_keys_file).read_bytes()) if trusted_keys_file else ""


def _suites_digest(suites_dir: str) -> str:
    """The trusted suites as the check would see them: the folder, and the stat key of every file in it and
    one level down (a manifest added, removed or replaced changes what is rejected)."""
    root = Path(suites_dir).resolve()
    keys = []
    for p in sorted([root, *root.glob("*"), *root.glob("*/*")]):
        try:
            st = p.stat()
        except OSError:
            continue
        keys.append([p.relative_to(root).as_posix(), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino])
    return f"{root}:{sha256_bytes(json.dumps(keys).encode())}"


def _absolute(path: Path) -> Path:
    """Absolute without following links (a Hub snapshot's files link to blobs outside the root): a relative
    ``--results`` and its entries' paths compare as the same folder."""
    return Path(os.path.abspath(path))


def _secret(folder: Path) -> bytes:
    """The board's own key for its index files: 32 random bytes, created once per cache folder with owner-only
    permissions; two boards starting at once keep the first one written (a hard link never overwrites)."""
    path = folder / "leaderboard-index.key"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=folder)  # mode 0600
        try:
            os.write(fd, os.urandom(32))
            os.close(fd)
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
        finally:
            os.unlink(tmp)
    data = path.read_bytes()
    if len(data) != 32:
        raise OSError(f"{path} is not a leaderboard index key (32 bytes); delete it and the board makes a new one")
    return data


def _mac(secret: bytes, data: bytes) -> bytes:
    return hmac.new(secret, data, hashlib.sha256).hexdigest().encode()


def _record(e: Entry, root: Path) -> dict:
    return {"path": _absolute(e.path).relative_to(root).as_posix(), "status": e.status, "reason": e.reason,
            "stamp": e.stamp, "result_sha256": e.result_sha256, "result": e.result,
            "predictions_sha256": e.predictions_sha256, "note": e.note, "suite_checked": e.suite_checked,
            "file_keys": e.file_keys}


def _json_safe(v):
    """A table cell as JSON (NaN stays NaN: Python's json writes and reads it)."""
    if hasattr(v, "item"):  # numpy scalars
        v = v.item()
    return v


def first_view(store: Store) -> dict | None:
    """What the app's first run paints, computed from a fully checked store: the default suite and board
    (``Store.suites``/``boards``), that board's table (``aggregate.board_table``, with rank intervals)
    and what the view draws around it; None for a store without entries."""
    from genshift.leaderboard import aggregate

    suites = store.suites()
    if not suites:
        return None
    suite = suites[0]
    boards = store.boards(suite)
    df, meta = aggregate.board_table(store.for_suite(suite, boards[0]), intervals=True)
    return {"suite": suite, "suites": suites, "board": boards[0], "boards": boards,
            "board_counts": {b: [len(es := store.for_suite(suite, b)), sum(e.verified for e in es)] for b in boards},
            "counts": {"results": len(store.entries), "verified": sum(e.verified for e in store.entries),
                       "rejected": len(store.rejected), "superseded": len(store.superseded)},
            "meta": meta, "columns": list(df.columns), "dtypes": [str(t) for t in df.dtypes],
            "rows": [[_json_safe(v) for v in row] for row in df.itertuples(index=False, name=None)]}


def _first_view_or_none(store: Store) -> dict | None:
    try:
        return first_view(store)
    # BenchError: an entry's files changed since the check (Entry.recheck); the next check writes the view
    except (BenchError, KeyError, TypeError, ValueError, IndexError, AttributeError) as ex:  # no first view: the body paints
        log.warning("no first view for the leaderboard index (%s: %s)", type(ex).__name__, ex)
        return None


def view_frame(view: dict):
    """The first view's table as the DataFrame ``aggregate.board_table`` returned."""
    import pandas as pd

    df = pd.DataFrame(view["rows"], columns=view["columns"])
    return df.astype(dict(zip(view["columns"], view["dtypes"]))) if len(df) else df


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
        body = json.dumps({"entries": records}, separators=(",", ":")).encode()
        head = json.dumps({"version": INDEX_VERSION, "source": store.source, "revision": store.revision,
                           "keys": keys_digest, "written_at": time.time(), "body_sha256": sha256_bytes(body),
                           "files": {r["path"].rsplit("/", 1)[0]: r["file_keys"] for r in records},
                           "view": _first_view_or_none(store)}, separators=(",", ":")).encode()
        atomic_write_bytes(path, _mac(_secret(path.parent), head) + b"\n" + head + b"\n" + body)
    except (OSError, TypeError, ValueError) as ex:
        log.warning("could not write the leaderboard index %s (%s)", path, ex)
        return None
    return path


def _entry_dirs(root: Path) -> set[str]:
    return {p.parent.relative_to(root).as_posix() for p in root.glob("*/*/result.json")}


def _signed_head(f, path: Path, revision: str | None, keys_digest: str) -> dict | None:
    """Lines 1-2 of the open index file ``f``: the head, if its HMAC is this board's and it was written
    under this format, revision and trust settings; None otherwise. ``f`` is left at the body."""
    mac = f.readline(100).rstrip(b"\n")
    head = f.readline(MAX_HEAD_BYTES + 1)
    if not head.endswith(b"\n") or not hmac.compare_digest(mac, _mac(_secret(path.parent), head[:-1])):
        return None
    data = json.loads(head)
    if (not isinstance(data, dict) or data.get("version") != INDEX_VERSION or data.get("revision") != revision
            or data.get("keys") != keys_digest):
        return None
    return data


def read_head(root: Path, revision: str | None, *, keys_digest: str = "") -> tuple[dict, int] | None:
    """The index's head, if this board wrote it (HMAC), under the same revision and trust settings, and
    the store still holds exactly its entries with every file's stat key unchanged; with the offset
    of the body in the file. None otherwise (a changed store is painted from the body or the check)."""
    path = index_path(root)
    try:
        with open(path, "rb") as f:
            data = _signed_head(f, path, revision, keys_digest)
            offset = f.tell()
        if data is None or not isinstance(data.get("files"), dict):
            return None
        files = data["files"]
        root_abs = _absolute(root)
        if set(files) != _entry_dirs(root_abs):
            return None
        for rel, keys in files.items():
            if not isinstance(keys, dict) or keys_changed(root_abs / rel, keys):
                return None
    except (OSError, ValueError, RecursionError):
        return None
    return data, offset


def read_index(source: str, root: Path, revision: str | None, *, keys_digest: str = "",
               head: tuple[dict, int] | None = None) -> tuple[Store, int] | None:
    """The last checked state of the store, for the entries whose files have their recorded stat keys
    (nothing is hashed), and how many index entries were dropped as changed or gone; None without a
    usable index. ``head``: what :func:`read_head` returned, if it was read already."""
    path = index_path(root)
    try:
        if path.stat().st_size > MAX_INDEX_BYTES:
            return None
        with open(path, "rb") as f:
            if head is None:
                data = _signed_head(f, path, revision, keys_digest)
                if data is None:
                    return None
            else:  # checked by read_head already: straight to the body
                data = head[0]
                f.seek(head[1])
            body = f.read()
        if sha256_bytes(body) != data.get("body_sha256"):
            return None
        entries = json.loads(body).get("entries")
        if not isinstance(entries, list):
            return None
    except (OSError, ValueError, RecursionError, AttributeError):
        return None
    cache = store_mod._cache_path(root, None)
    hits = cache.parent / (cache.stem + "-hits")
    root_abs = _absolute(root)
    checked, dropped = [], 0
    for rec in entries:
        try:
            rel = rec["path"]
            keys = rec["file_keys"]
            if (not (isinstance(rel, str) and ENTRY_PATH.match(rel)) or ".." in rel.split("/")
                    or not isinstance(keys, dict) or keys_changed((root_abs / rel).parent, keys)):
                dropped += 1
                continue
            status = rec["status"] if rec["status"] in STATUSES else "rejected"
            checked.append(Entry(root / rel, result=rec["result"], status="accepted" if status == "superseded" else status,
                                 reason=str(rec.get("reason") or ""), stamp=rec.get("stamp"),
                                 result_sha256=rec["result_sha256"], cache_dir=hits,
                                 predictions_sha256=dict(rec.get("predictions_sha256") or {}),
                                 note=str(rec.get("note") or ""), suite_checked=bool(rec.get("suite_checked")),
                                 file_keys=keys))
        except (OSError, KeyError, TypeError):
            dropped += 1
    store = assemble(Store(source=source, root=root, revision=revision), checked)
    return store, dropped


_PRELOADED: dict[tuple, "Loader"] = {}
_PRELOADING: dict[tuple, threading.Event] = {}  # set once that preload has ended (a loader, or an error)


def announce_preload(source: str, trusted_keys_file: str | None, suites_dir: str | None) -> None:
    """Say that :func:`preload` will open this loader, before it starts: a page asking for it meanwhile
    waits for that one instead of opening (and checking, or downloading) the store a second time."""
    _PRELOADING.setdefault((source, trusted_keys_file, suites_dir), threading.Event())


def preload(source: str, trusted_keys_file: str | None, suites_dir: str | None) -> None:
    """Open the store's loader before any page asks for it (``genshift.leaderboard.serve``, once the server listens)."""
    key = (source, trusted_keys_file, suites_dir)
    done = _PRELOADING.setdefault(key, threading.Event())
    try:
        _PRELOADED[key] = Loader(source, trusted_keys_file=trusted_keys_file, suites_dir=suites_dir)
    finally:
        done.set()


def open_loader(source: str, trusted_keys_file: str | None = None, suites_dir: str | None = None) -> "Loader":
    """The preloaded loader for these settings (once; waiting for a preload under way), else a new one."""
    key = (source, trusted_keys_file, suites_dir)
    if key in _PRELOADING:
        _PRELOADING[key].wait()
    found = _PRELOADED.pop(key, None)
    return found or Loader(source, trusted_keys_file=trusted_keys_file, suites_dir=suites_dir)


class Loader:
    """One store, checked in a background thread; :meth:`snapshot` gives the best state to paint now."""

    PUBLISH_EVERY_S = 1.0
    # each publish repaints the whole board (seconds of CPU at 500 models, taken from the check itself):
    # publish again only once the checked count doubled, so a cold store of 500 repaints ~10 times (the
    # progress bar counts every entry)
    PUBLISH_GROWTH = 2.0
    HEAD_GRACE_S = 1.5   # painted from the head: the body's parse (GIL-bound) waits until the first page rendered
    INDEX_GRACE_S = 3.0  # painted from the index: let the first page render before the check competes for CPU
    UNSERVED_S = 30.0    # a preloaded loader no page asked for reads its body and checks the store after this

    def __init__(self, source: str, *, trusted_keys_file: str | None = None, suites_dir: str | None = None):
        self.source, self.trusted_keys_file, self.suites_dir = source, trusted_keys_file, suites_dir
        self.root, self.revision = resolve_source(source)
        # an index is reused only under the same trust settings (keys and trusted suites)
        self.keys_digest = _keys_digest(trusted_keys_file) + (f"|suites:{_suites_digest(suites_dir)}" if suites_dir else "")
        self.trusted = None
        if trusted_keys_file:
            from genshift.eval.stamps import load_trusted_keys

            self.trusted = load_trusted_keys(trusted_keys_file)
        self.lock = threading.Lock()
        self.done = 0
        self.total = 0
        self.finished = False
        self.error: str | None = None
        self.version = 0
        self.kind = "none"       # what is painted now: "head" | "index" | "partial" | "full" | "none"
        self._checked: list[Entry] = []
        self._last_publish = 0.0
        self._published_done = 0
        self._store_wanted = threading.Event()
        self._store_read = threading.Event()  # set once nothing is painted from the head any more
        self._served = threading.Event()      # set once a page was painted from the head
        self.started = time.monotonic()
        self.store: Store | None = None
        self.head = read_head(self.root, self.revision, keys_digest=self.keys_digest)
        if self.head is not None and self.head[0].get("view") is not None:
            self.kind, self.total = "head", len(self.head[0]["files"])
        else:  # no usable head (a changed store): the body's unchanged entries, or nothing
            self.head = None
            self._store_read.set()
            found = read_index(source, self.root, self.revision, keys_digest=self.keys_digest)
            if found:
                self.store, self.kind = found[0], "index"
        self.thread = threading.Thread(target=self._run, name="genshift-store-check", daemon=True)
        self.thread.start()

    def first_view(self) -> dict | None:
        """The head's first view (``first_view``) while the store is not loaded yet and every file the head
        names still has its stat key; else None."""
        with self.lock:
            head = self.head if self.store is None else None
        if head is None:
            return None
        root = _absolute(self.root)
        if set(head[0]["files"]) != _entry_dirs(root) or any(keys_changed(root / rel, keys)
                                                           for rel, keys in head[0]["files"].items()):
            self.want_store()
            return None
        self._served.set()
        return head[0]["view"]

    def want_store(self, wait: float = 0.0) -> None:
        """A view needs the whole store (more than the first view): read the index's body now (and wait up
        to ``wait`` seconds until it was read)."""
        self._served.set()
        self._store_wanted.set()
        if wait:
            self._store_read.wait(wait)

    def _load_kwargs(self) -> dict:
        return {"progress": self._progress, "trusted_keys": self.trusted,
                "suites": [self.suites_dir] if self.suites_dir else None}

    def _progress(self, done: int, total: int, entry: Entry) -> None:
        with self.lock:
            self.done, self.total = done, total
            self._checked.append(dataclasses.replace(entry))  # a copy: assembling marks losers superseded
            now = time.monotonic()
            due = now - self._last_publish >= self.PUBLISH_EVERY_S and done >= self._published_done * self.PUBLISH_GROWTH
            # the last entry is not published as partial: the full store follows at once, and each publish
            # costs a whole repaint
            if self.kind in ("none", "partial") and due and done < total:
                self.store = assemble(Store(source=self.source, root=self.root, revision=self.revision),
                                      [dataclasses.replace(e) for e in self._checked])
                self.kind = "partial"
                self.version += 1
                self._last_publish, self._published_done = now, done

    def _run(self) -> None:
        if self.kind == "head":
            self._served.wait(self.UNSERVED_S)  # preloaded: the grace counts from the first page
            self._store_wanted.wait(self.HEAD_GRACE_S)
            found = read_index(self.source, self.root, self.revision, keys_digest=self.keys_digest, head=self.head)
            with self.lock:
                self.store, self.kind = (found[0], "index") if found else (None, "none")
                self.head = None
                self.version += 1
            self._store_read.set()
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
        with self.lock:
            changed = self.store is None or self.store.fingerprint != full.fingerprint or self.kind != "index"
            self.store, self.kind, self.finished = full, "full", True
            self.done = self.total = max(self.total, len(full.entries) + len(full.rejected) + len(full.superseded))
            if changed:
                self.version += 1
        # for the next start, after the board was published: the index's first view ranks the default board
        # (seconds at 500 models) and the page need not wait for it (``wait`` still does: it joins this thread)
        write_index(full, keys_digest=self.keys_digest)

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

    def wait_first_paint(self, within: float) -> None:
        """Wait until the check has finished, or has published a partial store and, at its rate so far,
        would not finish ``within`` seconds of the loader's start: a small store is painted complete, a
        large one as soon as it has rows (not after the whole ``within``), at most until then."""
        while (left := self.started + within - time.monotonic()) > 0:
            with self.lock:
                if self.finished or self.kind in ("head", "index"):
                    return
                elapsed = time.monotonic() - self.started
                if self.kind == "partial" and self.done and elapsed * self.total / self.done > within:
                    return
            self.thread.join(min(left, 0.02))

    def snapshot(self) -> tuple[Store | None, dict]:
        with self.lock:
            return self.store, {"done": self.done, "total": self.total, "finished": self.finished,
                                "kind": self.kind, "version": self.version, "error": self.error}
