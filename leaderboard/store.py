"""The results store: a folder (or a Hub dataset repo at a pinned revision) of ``bench eval`` runs.

Layout (what ``bench eval --out`` writes, and what ``bench submit`` proposes in a pull request)::

    <suite id>/<model slug>/result.json
    <suite id>/<model slug>/predictions/<config>.parquet
    <suite id>/<model slug>/verification.json     optional: signed by `bench verify --recheck N --sign KEY`

Loading checks every entry on its own, the way ``bench verify`` does (schema under size and
depth limits, predictions hashes and rows, the predictions against the suite's trusted manifest,
counts and flags recomputed, every metric recomputed). Any failure puts that entry in the
**rejected** list with the reason; nothing about one entry can take the board down. An entry is
**verified** only when its ``verification.json`` is signed by a key in ``trusted_keys`` and names
the result and predictions files exactly as they are now; otherwise it is accepted and unverified,
with the reason (unsigned, unknown key, bad signature, stale).

Suites: an entry is checked against the manifest with its ``suite.manifest_sha256`` among the
trusted ones (``suites``: suite folders / manifest files the maintainers keep, plus registry
suites pinned to a sha whose manifest is in the local Hub cache; ``genshift.eval.suite_trust``). With
``suites`` given, entries on any other suite data are rejected; without it, they are accepted
and marked as not checked against their suite (``Entry.note``).

Results are compared only on one **board**: the same suite data (manifest hash) scored under
the same protocol (filter, reference, top-k, limits). A suite with results on several revisions
or protocols has several boards, never mixed; the one with the most verified entries is the default.

**Superseding** is decided only by what a submitter cannot set (:func:`precedence`): of several
entries for one model on one board, a verified one wins over an unverified one; among verified
ones the one whose stamp was signed last (the stamp's ``verified_at``, covered by the maintainer's
signature); then the entry path that sorts first. Result fields (``finished_at`` ...) play no part.
The others are listed as superseded. Two shown entries with the same ``model.weights_sha256`` under
different model ids are **flagged** (``Entry.flags``): one set of weights submitted twice.

**The badge follows the files**: each entry records a stat key of every file it
depends on (result.json, predictions, verification.json, diagnose.json) when it is checked
(size, mtime_ns, ctime_ns, inode);
:func:`refresh_store` stats them again (cheap) and re-checks only the entries whose keys changed
(hashing their files), so a running board never shows a swapped file under an old badge.

Verification outcomes are cached by content (sha256 of the result and of every predictions file,
and the trusted manifest used) in the user's cache folder, never in the store (whose files are
the submitters'). A running app calls :meth:`Entry.recheck` before it reads an entry's files for
a view, so a file replaced after loading is refused, not shown under the old badge.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from genshift.errors import BenchError
from genshift.fsutil import atomic_write_json, cache_root, canonical_json, sha256_bytes, sha256_file
from genshift.eval.diagnose_report import REPORT as DIAGNOSE
from genshift.eval.results import MAX_PREDICTIONS_BYTES, MAX_RESULT_BYTES, RESULT_FILE
from genshift.eval.stamps import STAMP_FILE as STAMP

log = logging.getLogger(__name__)
CACHE_VERSION = 2
RACY_NS = 2 * 10**9  # a file's stat key is trusted once its times are this much older than the key (timestamp ticks)


@dataclass
class Entry:
    path: Path                  # the result.json
    result: dict | None = None
    status: str = "rejected"    # "verified" | "accepted" | "rejected" | "superseded"
    reason: str = ""
    stamp: dict | None = None
    result_sha256: str = ""
    predictions_sha256: dict = field(default_factory=dict)  # path -> sha256, as checked at load
    note: str = ""              # why an accepted entry is not verified / not checked against its suite
    suite_checked: bool = False
    cache_dir: Path | None = None
    file_keys: dict = field(default_factory=dict)  # file name -> [size, mtime_ns, ctime_ns, inode] (None: absent)
    flags: list = field(default_factory=list)       # board warnings, e.g. weights shared with another model id
    checked_ns: int = 0         # wall time just before the check took file_keys (0: not checked here, e.g. from an index)
    _ranks: dict | None = field(default=None, repr=False)
    _hashed: dict = field(default_factory=dict, repr=False)  # file -> stat key when it last hashed as checked

    @property
    def model_id(self) -> str:
        return self.result["model"]["id"] if self.result else "?"

    @property
    def suite_id(self) -> str:
        return self.result["suite"]["id"] if self.result else "?"

    @property
    def content_key(self) -> str:
        """sha256 over the result's and every predictions file's sha256: what the entry's numbers are."""
        return sha256_bytes(canonical_json([self.result_sha256, self.predictions_sha256]))

    def recheck(self) -> None:
        """Raise ``IntegrityError`` unless the result and predictions files still have the content
        checked at load (the app calls this before reading an entry's files for a view). A file is
        hashed again only when its stat key (size, mtime_ns, inode, ctime_ns) differs from the one it
        had when it last hashed right (at first: the key taken at the check, before its hashing), so a view
        re-reads only what changed on disk; ctime catches an in-place rewrite whose mtime was set back (it
        cannot be set). A key is trusted only if the file's times are older than ``RACY_NS`` before the key
        was taken (git's "racy clean" rule): a rewrite of the same size within the same timestamp tick,
        right after the hashing, would otherwise keep the key."""
        files = [(RESULT_FILE, self.result_sha256, MAX_RESULT_BYTES)] + [
            (rel, sha, MAX_PREDICTIONS_BYTES) for rel, sha in self.predictions_sha256.items()]
        try:
            for rel, sha, limit in files:
                f = self.run_dir / rel
                now = time.time_ns()
                st = f.stat()  # before hashing: a write during the hash changes the key seen next time
                key = (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
                settled = max(st.st_mtime_ns, st.st_ctime_ns) < now - RACY_NS
                at_check = self.file_keys.get(rel) == [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino] and \
                    max(st.st_mtime_ns, st.st_ctime_ns) < self.checked_ns - RACY_NS
                if self._hashed.get(f) == key or at_check:
                    continue
                if _file_sha256(f, limit) != sha:
                    raise self._changed()
                if settled:
                    self._hashed[f] = key
        except (OSError, BenchError):
            raise self._changed() from None

    def _changed(self):
        """The one error for an entry whose files no longer have the content checked at load."""
        from genshift.errors import IntegrityError

        return IntegrityError(f"{self.run_dir.name}: its files changed since the leaderboard loaded them; "
                              "reload the leaderboard to check them again")

    @property
    def verified(self) -> bool:
        return self.status == "verified"

    def files_changed(self) -> bool:
        """Whether any file the entry depends on has another stat key than when it was checked (runs on
        every repaint for every entry)."""
        return keys_changed(self.path.parent, self.file_keys)

    @cached_property
    def board(self) -> str:
        """``<manifest sha256[:12]>-<protocol sha256[:8]>``: results on one board are comparable."""
        r = self.result or {}
        protocol = sha256_bytes(canonical_json(r.get("protocol", {})))
        return f"{r.get('suite', {}).get('manifest_sha256', '?')[:12]}-{protocol[:8]}"

    @property
    def run_dir(self) -> Path:
        return self.path.parent

    def true_ranks(self, config: str) -> tuple[str, "np.ndarray"]:
        """Rank of the true class (uint8, 255 = 255 or worse) for the scored rows of ``config`` (sorted
        by image id), and a digest of their image ids: top-k hits are ``ranks < k``. All configs of an
        entry are cached together in one ``.npz`` keyed by the result's sha256, so ranking hundreds
        of models reads hundreds of small files."""
        if self._ranks is None:
            self._ranks = self._load_ranks()
        return self._ranks[config]

    def read_predictions(self, config: str, columns: list[str] | None = None):
        """One predictions table of this entry, after :meth:`recheck` (the way views should read them)."""
        from genshift.eval.predictions import read_predictions

        p = next(p for p in self.result["predictions"] if p["config"] == config)
        self.recheck()
        return read_predictions(self.run_dir / p["path"], columns=columns)

    def pair_ids(self, config: str) -> list:
        """``pair_id`` of the scored rows of ``config``, in the order of :meth:`true_ranks`."""
        t = self.read_predictions(config, ["keep", "pair_id"])
        if self.result["protocol"]["scoring"]["filter"]:
            t = t.filter(t["keep"])
        return t["pair_id"].to_pylist()

    def _ranks_file(self) -> Path | None:
        return self.cache_dir / f"{self.content_key[:32]}-ranks.npz" if self.cache_dir else None

    def _load_ranks(self) -> dict:
        import numpy as np

        from genshift.fsutil import read_limited
        from genshift.eval.predictions import read_predictions

        cache = self._ranks_file()
        if cache is not None and cache.is_file():
            self.recheck()  # cached ranks are the checked content's: served only while the files still have it
            with np.load(cache, allow_pickle=False) as z:
                configs, ids, n, ranks = z["configs"].tolist(), z["ids"].tolist(), z["n"], z["ranks"]
            starts = np.concatenate([[0], np.cumsum(n)])
            return {c: (ids[i], ranks[starts[i]:starts[i + 1]]) for i, c in enumerate(configs)}
        tables = {}
        for p in self.result["predictions"]:  # the bytes hashed are the bytes read: the ranks are cached by content
            f = self.run_dir / p["path"]
            data = read_limited(f, max_bytes=MAX_PREDICTIONS_BYTES, what="predictions file")
            if sha256_bytes(data) != self.predictions_sha256.get(p["path"]):
                raise self._changed()
            tables[p["config"]] = read_predictions(f, columns=["image_id", "keep", "true_rank"], data=data)
        out = self.ranks_from_tables(tables)
        self.save_ranks(out)
        return out

    def ranks_from_tables(self, tables: dict) -> dict:
        """:meth:`true_ranks` of every config, from its predictions tables (config -> table)."""
        import numpy as np

        out = {}
        for p in self.result["predictions"]:
            t = tables[p["config"]]
            if self.result["protocol"]["scoring"]["filter"]:
                t = t.filter(t["keep"])
            out[p["config"]] = (sha256_bytes("\n".join(t["image_id"].to_pylist()).encode()),
                                np.minimum(t["true_rank"].to_numpy(), 255).astype(np.uint8))
        return out

    def save_ranks(self, ranks: dict) -> None:
        """Write ``ranks`` (:meth:`ranks_from_tables`) to the entry's ranks cache file, if it has a cache folder."""
        import numpy as np

        from genshift.fsutil import atomic_path

        cache = self._ranks_file()
        if cache is None:
            return
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(cache) as tmp, open(tmp, "wb") as f:
                np.savez(f, configs=np.array(list(ranks)), ids=np.array([d for d, _ in ranks.values()]),
                         n=np.array([r.size for _, r in ranks.values()]),
                         ranks=np.concatenate([r for _, r in ranks.values()]) if ranks else np.zeros(0, np.uint8))
        except OSError:
            pass


@dataclass
class Store:
    source: str
    root: Path
    revision: str | None
    entries: list[Entry] = field(default_factory=list)      # shown: one per (model, suite)
    rejected: list[Entry] = field(default_factory=list)
    superseded: list[Entry] = field(default_factory=list)
    checked_by: dict = field(default_factory=dict, repr=False)  # process id -> entries it checked (load_store)

    @property
    def fingerprint(self) -> str:
        """Content key for caches: changes whenever any accepted entry or stamp changes."""
        keys = sorted(f"{e.path}|{e.status}|{e.content_key}" for e in self.entries)
        return sha256_bytes("\n".join([self.revision or "", *keys]).encode())

    def suites(self) -> list[str]:
        """Suite ids, the one with the most verified entries first (ties: most entries, then by id)."""
        n: dict[str, list[int]] = {}
        for e in self.entries:
            c = n.setdefault(e.suite_id, [0, 0])
            c[0] += e.verified
            c[1] += 1
        return sorted(n, key=lambda s: (-n[s][0], -n[s][1], s))

    def boards(self, suite_id: str) -> list[str]:
        """The suite's boards, the one with the most verified entries first (ties: most entries, then
        the board id); never ordered by a field a submitter writes."""
        groups: dict[str, list[Entry]] = {}
        for e in self.entries:
            if e.suite_id == suite_id:
                groups.setdefault(e.board, []).append(e)
        return sorted(groups, key=lambda b: (-sum(e.verified for e in groups[b]), -len(groups[b]), b))

    def for_suite(self, suite_id: str, board: str | None = None) -> list[Entry]:
        """The entries of one board of the suite (default: its main board), sorted by model id."""
        boards = self.boards(suite_id)
        if not boards:
            return []
        board = board if board in boards else boards[0]
        return sorted((e for e in self.entries if e.suite_id == suite_id and e.board == board), key=lambda e: e.model_id)


def resolve_source(source: str, *, cache_dir: str | None = None) -> tuple[Path, str | None]:
    """A local folder, or ``ORG/NAME[@rev]`` of a Hub dataset repo (downloaded at a sha)."""
    path = Path(source)
    if path.exists():
        if not path.is_dir():
            raise BenchError(f"results store {source!r} is not a folder")
        return path, None
    repo, _, rev = source.partition("@")
    if repo.count("/") == 1 and not source.startswith((".", "/")):
        from genshift.hub import resolve_revision, snapshot

        sha = resolve_revision(repo, rev or None)
        root = snapshot(repo, revision=sha, patterns=["**/result.json", "**/predictions/*.parquet", f"**/{STAMP}"],
                        cache_dir=cache_dir)
        return root, sha
    raise BenchError(f"results store {source!r} does not exist; give a folder of bench eval runs (--out) or a Hub "
                     "dataset repo ORG/NAME[@sha]")


def _cache_path(root: Path, cache_dir: str | None) -> Path:
    """Outside the store: a store's files are the submitters', a cache there could claim anything."""
    base = Path(cache_dir) if cache_dir else cache_root()
    return base / f"leaderboard-cache-{sha256_bytes(str(root.resolve()).encode())[:16]}.json"


def _file_sha256(path: Path, limit: int) -> str:
    st = path.stat()
    if st.st_size > limit:
        raise BenchError(f"{path.name} is over the {limit >> 20} MiB limit")
    return sha256_file(path)


def misfiled(path: Path, result: dict) -> str:
    """Why an entry's folder is not the one its result names (``genshift.eval.results.entry_dir``), or ``""``:
    a folder is owned by one (suite, model), so a result filed under another model's folder (or an
    arbitrary one) is refused instead of taking that entry's place."""
    from genshift.eval.results import entry_dir

    want, have = entry_dir(result), f"{path.parent.parent.name}/{path.parent.name}"
    if have == want:
        return ""
    return (f"filed under {have}/, but its result is {result['model']['id']} on {result['suite']['id']}, which "
            f"belongs under {want}/; move the entry there")


DEPENDS = (RESULT_FILE, STAMP, DIAGNOSE)  # besides the predictions files the result lists


def _stat_keys(run_dir: Path, names) -> dict:
    """``name -> [size, mtime_ns, ctime_ns, inode]`` (None if absent) for files of an entry folder: a cheap
    change key (ctime too: an in-place rewrite that restores size and mtime still moves it)."""
    out = {}
    for name in names:
        try:
            st = (run_dir / name).stat()
            out[name] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        except OSError:
            out[name] = None
    return out


def keys_changed(run_dir: Path, file_keys: dict) -> bool:
    """Whether any file of ``file_keys`` (``name -> [size, mtime_ns, ctime_ns, inode]`` or None: absent, as
    :func:`_stat_keys` records them) has another stat key in ``run_dir`` now; no keys: changed. Plain
    ``os.stat`` on strings, first difference wins (it runs for every entry on every repaint)."""
    if not file_keys:
        return True
    base = str(run_dir) + os.sep
    for name, key in file_keys.items():
        try:
            st = os.stat(base + name)
        except OSError:
            if key is not None:
                return True
            continue
        try:
            if key is None or key[0] != st.st_size or key[1] != st.st_mtime_ns or key[2] != st.st_ctime_ns \
                    or key[3] != st.st_ino:
                return True
        except (TypeError, IndexError, KeyError):  # a key from an older index: check again
            return True
    return False


def _check_entry(path: Path, cache: dict, *, trusted_keys: dict, suites, strict_suites: bool,
                 ranks_dir: Path | None = None) -> Entry:
    """Check one result.json on its own (cached by content); never raises. ``ranks_dir``: the entry's
    cache folder; a verification that read the predictions leaves their true-class ranks there
    (``Entry.true_ranks``), so ranking the board does not read every predictions file again."""
    from genshift.eval.results import parse_result
    from genshift.eval.stamps import check_stamp
    from genshift.eval.verify import verify_result

    entry = Entry(path, cache_dir=ranks_dir, checked_ns=time.time_ns())
    # stat before reading: a change after this point shows as a changed key on the next refresh
    entry.file_keys = _stat_keys(path.parent, DEPENDS)
    try:
        if not path.is_file():  # a fifo or device would block or never end
            entry.reason = "result.json is not a regular file"
            return entry
        size = path.stat().st_size
        if size > MAX_RESULT_BYTES:
            entry.reason = f"result file is {size / 2**20:.1f} MiB, over the {MAX_RESULT_BYTES // 2**20} MiB limit"
            return entry
        raw = path.read_bytes()
        entry.result_sha256 = sha256_bytes(raw)
        result = parse_result(raw, where=str(path))
        if why := misfiled(path, result):
            entry.reason = why
            return entry
        entry.file_keys.update(_stat_keys(path.parent, [p["path"] for p in result["predictions"]]))
        for p in result["predictions"]:
            f = path.parent / p["path"]
            if not f.is_file():
                entry.reason = f"{p['path']} is missing"
                return entry
            entry.predictions_sha256[p["path"]] = _file_sha256(f, MAX_PREDICTIONS_BYTES)
        entry.result = result
        ref = suites.lookup(result["suite"])
        key = f"{entry.content_key}|{ref.sha256 if ref else '-'}"
        if key in cache:
            ok, reason, checked = cache[key]
        else:
            report = verify_result(path, suites=suites, use_recorded_suite=False, require_suite=False, raw=raw,
                                   result=result)
            # verify hashed the files itself: a swap between our hashing and its reading is a mismatch
            if report.predictions_sha256 != entry.predictions_sha256:
                report.problems.append("a predictions file changed while it was being checked")
            ok, reason, checked = report.ok, "; ".join(report.problems[:3]), report.suite_checked
            cache[key] = (ok, reason, checked)
            if ok:  # the tables verify hashed and parsed from the same bytes: their ranks are the checked content's
                try:
                    entry.save_ranks(entry.ranks_from_tables(report.tables))
                except Exception as e:  # noqa: BLE001 - only a cache (read again when needed); never the entry's status
                    log.debug("ranks of %s not cached: %s", path, e)
        if not ok:
            entry.reason = f"does not verify: {reason}"
            return entry
        entry.suite_checked = checked
        if not checked:
            why = (f"made on suite data this leaderboard does not trust (manifest {result['suite']['manifest_sha256'][:12]}…); "
                   "maintainers add the suite with --suites")
            if strict_suites:
                entry.reason = why
                return entry
            entry.note = f"not checked against its suite: {why}"
        entry.status = "accepted"
        sp = path.parent / STAMP
        if not sp.is_file():
            entry.note = entry.note or "no verification stamp"
            return entry
        if sp.stat().st_size > 1 << 20:
            entry.note = "the verification stamp is over 1 MiB; not a stamp"
            return entry
        stamp, why = check_stamp(sp.read_bytes(), result_sha256=entry.result_sha256,
                                 predictions_sha256=entry.predictions_sha256, trusted=trusted_keys)
        if stamp is None:
            entry.note = f"unverified: {why}"
        else:
            entry.stamp, entry.status = stamp, "verified"
    except BenchError as e:
        entry.result = None
        entry.reason = str(e)
    except Exception as e:  # noqa: BLE001 - whatever one hostile entry does, it never takes the board down
        log.debug("entry %s", path, exc_info=True)
        entry.result = None
        entry.reason = f"unreadable ({type(e).__name__}: {str(e)[:200]})"
    return entry


def _signed_time(e: Entry) -> float:
    """The stamp's ``verified_at`` (signed by the maintainer) as a POSIX time; -inf if none or unreadable."""
    from datetime import datetime, timezone

    try:
        t = datetime.fromisoformat(str((e.stamp or {})["verified_at"]))
        return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()
    except (KeyError, TypeError, ValueError, OverflowError):
        return float("-inf")


def precedence(e: Entry) -> tuple:
    """Sort key, first wins: verified before unverified, then the latest signed stamp time, then the
    entry path. Nothing in it is a field a submitter writes (``finished_at`` is not used)."""
    return (not e.verified, -_signed_time(e) if e.verified else 0.0, e.path.as_posix())


def assemble(store: Store, checked: list[Entry]) -> Store:
    """Sort checked entries into the store's shown / rejected / superseded lists (one shown entry per
    model and board, by :func:`precedence`), and flag shown entries whose weights sha256 is also
    under another model id."""
    candidates: dict[tuple[str, str, str], list[Entry]] = {}
    for e in checked:
        e.flags = []
        if e.status == "rejected":
            store.rejected.append(e)
        else:
            e.status, e.reason = ("verified" if e.stamp is not None else "accepted"), ""  # a stamp is set only if checked
            candidates.setdefault((e.suite_id, e.board, e.model_id), []).append(e)
    for group in candidates.values():
        group.sort(key=precedence)
        store.entries.append(group[0])
        for other in group[1:]:
            other.reason = (f"another entry of {other.model_id} wins ({group[0].path.parent.name}: "
                            + ("verified, stamp signed later" if group[0].verified and other.verified else
                               "verified" if group[0].verified else "first path") + ")")
            other.status = "superseded"
            store.superseded.append(other)
    by_weights: dict[str, list[Entry]] = {}
    for e in store.entries:
        sha = e.result["model"].get("weights_sha256")
        if sha:
            by_weights.setdefault(sha, []).append(e)
    for sha, group in by_weights.items():
        ids = sorted({e.model_id for e in group})
        if len(ids) > 1:
            for e in group:
                others = [m for m in ids if m != e.model_id]
                e.flags.append(f"same weights (sha256 {sha[:12]}…) as {', '.join(others[:3])}"
                               + (f" and {len(others) - 3} more" if len(others) > 3 else ""))
    return store


def _trust(trusted_keys, suites):
    """(trusted keys by id, TrustedSuites, whether suites were given) from load_store's arguments."""
    from genshift.eval.stamps import load_trusted_keys
    from genshift.eval.suite_trust import TrustedSuites

    if trusted_keys is None:
        keys = {}
    elif isinstance(trusted_keys, dict):
        keys = trusted_keys
    else:
        keys = load_trusted_keys(trusted_keys)
    strict = suites is not None
    if not isinstance(suites, TrustedSuites):
        suites = TrustedSuites.from_paths(suites or (), registry=True, download=False)
    return keys, suites, strict


def _read_cache(cache_file: Path) -> dict:
    try:
        if cache_file.is_file():
            data = json.loads(cache_file.read_text())
            if data.get("version") == CACHE_VERSION:
                return {k: tuple(v) for k, v in data["entries"].items()}
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        pass
    return {}


def refresh_store(store: Store, *, trusted_keys=None, suites=None, cache_dir: str | None = None) -> Store:
    """``store`` itself if no file of any entry changed since it was checked (a stat per file), else a
    new store in which the changed entries are checked again (``trusted_keys``/``suites`` as for
    :func:`load_store`) and everything is assembled anew (superseding and flags may change)."""
    every = store.entries + store.superseded + store.rejected
    changed = {id(e) for e in every if e.files_changed()}
    if not changed:
        return store
    keys, suites, strict = _trust(trusted_keys, suites)
    cache = _read_cache(_cache_path(store.root, cache_dir))
    checked = []
    for e in every:
        if id(e) in changed:
            fresh = _check_entry(e.path, cache, trusted_keys=keys, suites=suites, strict_suites=strict,
                                 ranks_dir=e.cache_dir)
            log.info("entry %s changed on disk: checked again (%s)", e.run_dir.name, fresh.status)
            checked.append(fresh)
        else:
            checked.append(dataclasses.replace(e))  # a copy: the old store stays as it was for its readers
    return assemble(Store(source=store.source, root=store.root, revision=store.revision), checked)


def load_store(source: str, *, cache_dir: str | None = None, trusted_keys=None, suites=None, progress=None,
               workers: int | None = None) -> Store:
    """Load and check every entry of a store; never raises for a bad entry (it is rejected).
    ``progress(done, total, entry)`` is called after each entry is checked (in the calling thread).

    ``trusted_keys``: a trusted-keys file or ``genshift.eval.stamps.load_trusted_keys``'s dict; stamps signed
    by other keys (or none given) leave entries unverified. ``suites``: trusted suite folders or
    manifest files (paths), or an ``genshift.eval.suite_trust.TrustedSuites``; given, entries on other suite
    data are rejected. ``workers``: processes checking entries (``genshift.leaderboard.check_pool``; default:
    one per core for a large store, none for a small one; a ``TrustedSuites`` object is checked in
    this process). ``Store.checked_by``: entries checked per process id.
    """
    from genshift.leaderboard import check_pool

    suite_paths = suites  # paths (or None) can go to worker processes; a TrustedSuites object stays here
    keys, suites, strict = _trust(trusted_keys, suites)
    root, revision = resolve_source(source, cache_dir=cache_dir)
    cache_file = _cache_path(root, cache_dir)
    cache = _read_cache(cache_file)
    before = dict(cache)
    store = Store(source=source, root=root, revision=revision)
    hits_dir = cache_file.parent / (cache_file.stem + "-hits")
    paths = sorted(root.glob("*/*/result.json"))
    by_path: dict[Path, Entry] = {}

    def checked(e: Entry) -> None:
        e.cache_dir = hits_dir
        by_path[e.path] = e
        if progress is not None:
            progress(len(by_path), len(paths), e)

    n = check_pool.pool_size(len(paths), workers)
    if n > 1 and (suite_paths is None or isinstance(suite_paths, (list, tuple))):
        store.checked_by = check_pool.check_in_pool(paths, cache, trusted_keys=keys, suites=suite_paths,
                                                    strict=strict, workers=n, on_checked=checked, ranks_dir=hits_dir)
    else:
        for path in paths:
            checked(_check_entry(path, cache, trusted_keys=keys, suites=suites, strict_suites=strict,
                                 ranks_dir=hits_dir))
        store.checked_by = {os.getpid(): len(paths)} if paths else {}
    assemble(store, [by_path[p] for p in paths])
    if cache != before:
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(cache_file, {"version": CACHE_VERSION, "entries": {k: list(v) for k, v in cache.items()}})
        except OSError as ex:
            log.warning("could not write the leaderboard cache %s (%s)", cache_file, ex)
    return store
