"""The results store: a folder (or a Hub dataset repo at a pinned revision) of ``bench eval`` runs, read as records:
``<suite id>/<model folder>/{result.json, predictions/<config>.parquet, verification.json}``. Records, verified,
rejected, superseded, boards: ``docs/leaderboard.md`` ("The board record", "What is ranked", "Trust"). Nothing
about one entry can take the board down."""

from __future__ import annotations

import contextlib
import gc
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from genshift.errors import BenchError, IntegrityError
from genshift.eval.diagnose_report import REPORT as DIAGNOSE
from genshift.eval.results import MAX_PREDICTIONS_BYTES, MAX_RESULT_BYTES, RESULT_FILE, entry_dir, parse_result
from genshift.eval.stamps import MAX_STAMP_BYTES, build_record, check_stamp, load_trusted_keys
from genshift.eval.stamps import STAMP_FILE as STAMP
from genshift.eval.suite_trust import TrustedSuites
from genshift.fsutil import canonical_json, read_limited, sha256_bytes
from genshift.identity import identity_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Trust:
    """What the board trusts: maintainers' keys (by key id) and, if given, the suite manifests (sha256)."""

    keys: dict = field(default_factory=dict)
    manifests: frozenset | None = None
    digest: str = ""  # of what they decide: part of every entry's digest


def trust(trusted_keys=None, suites=None) -> Trust:
    """``trusted_keys``: a trusted-keys file or ``load_trusted_keys``'s dict; ``suites``: trusted suite folders or
    manifest files (given: entries on other suite data are rejected)."""
    keys = trusted_keys if isinstance(trusted_keys, dict) else load_trusted_keys(trusted_keys) if trusted_keys else {}
    manifests = None if suites is None else frozenset(TrustedSuites.from_paths(suites, registry=False).by_sha)
    digest = sha256_bytes(canonical_json([sorted(keys), sorted(manifests or []), manifests is None]))
    return Trust(keys, manifests, digest)


@dataclass
class Entry:
    path: Path                  # the result.json
    record: dict | None = None  # the board record (genshift.eval.stamps): signed if verified, else built
    status: str = "rejected"    # "verified" | "accepted" | "rejected" | "superseded"
    reason: str = ""            # rejected or superseded: why
    note: str = ""              # accepted: why it is not verified
    flags: list = field(default_factory=list)
    digest: str = ""            # sha256 of what the record was read from (result.json, stamp, trust)
    hub: tuple | None = None    # (repo, revision) of a Hub store: files not downloaded yet are fetched from it
    _result: dict | None = field(default=None, repr=False)

    model_id = property(lambda self: self.record["model"]["id"] if self.record else "?")
    suite_id = property(lambda self: self.record["suite"]["id"] if self.record else "?")
    verified = property(lambda self: self.status == "verified")
    stamp = property(lambda self: self.record if self.verified else None)  # the signed record of a verified entry
    run_dir = property(lambda self: self.path.parent)
    identity = property(lambda self: identity_of(self.record["model"], strict=False))

    @cached_property
    def board(self) -> str:
        """``<manifest sha256[:12]>-<protocol sha256[:8]>``: results on one board are comparable."""
        protocol = sha256_bytes(canonical_json(self.record["protocol"]))
        return f"{self.record['suite']['manifest_sha256'][:12]}-{protocol[:8]}"

    @property
    def result(self) -> dict | None:
        """The parsed ``result.json`` as the record names it (``IntegrityError`` if it changed); None if rejected."""
        if self._result is None and self.record is not None:
            self._result = parse_result(self.read_file(RESULT_FILE), where=str(self.path))
        return self._result

    def read_file(self, rel: str) -> bytes:
        """A file the record vouches for (from a Hub store's pinned revision if not here yet), hashed:
        ``IntegrityError`` (stale) unless its bytes are the ones the record names."""
        f = self.run_dir / rel
        if rel != RESULT_FILE and not re.fullmatch(r"predictions/[A-Za-z0-9][A-Za-z0-9._-]*\.parquet", rel):
            raise IntegrityError(f"{self.run_dir.name}: its record names a file outside the entry ({rel[:80]!r})")
        try:
            if self.hub is not None and not f.exists():
                from huggingface_hub import hf_hub_download

                f = Path(hf_hub_download(self.hub[0], f"{self.run_dir.parent.name}/{self.run_dir.name}/{rel}",
                                         repo_type="dataset", revision=self.hub[1]))
            limit = MAX_RESULT_BYTES if rel == RESULT_FILE else MAX_PREDICTIONS_BYTES
            data = read_limited(f, max_bytes=limit, what=rel)
        except Exception as e:  # noqa: BLE001 - missing, unreadable or not downloadable: the record no longer holds
            raise IntegrityError(f"{self.run_dir.name}: {rel} cannot be read ({e})") from None
        if sha256_bytes(data) != self.record["files"].get(rel):
            raise IntegrityError(f"{self.run_dir.name}: {rel} is not the file its record names (changed after it "
                                 f"was {'verified' if self.verified else 'submitted'}): stale")
        return data

    def check(self) -> None:
        """Hash every file the record vouches for (``IntegrityError`` naming the first that changed)."""
        for rel in self.record["files"]:
            self.read_file(rel)

    def read_predictions(self, config: str, columns: list[str] | None = None):
        """One predictions table of this entry, hashed against the record first."""
        from genshift.eval.predictions import read_predictions

        rel = f"predictions/{config}.parquet"
        return read_predictions(self.run_dir / rel, columns=columns, data=self.read_file(rel))


@dataclass
class Store:
    source: str
    root: Path
    revision: str | None
    entries: list[Entry] = field(default_factory=list)      # shown: one per (model, board)
    rejected: list[Entry] = field(default_factory=list)
    superseded: list[Entry] = field(default_factory=list)

    def suites(self) -> list[str]:
        """Suite ids, the one with the most verified entries first (ties: most entries, then by id)."""
        return _most_verified_first(self.entries, lambda e: e.suite_id)

    def boards(self, suite_id: str) -> list[str]:
        """The suite's boards, ordered as :meth:`suites`; never by a field a submitter writes."""
        return _most_verified_first([e for e in self.entries if e.suite_id == suite_id], lambda e: e.board)

    def for_suite(self, suite_id: str, board: str | None = None) -> list[Entry]:
        """The entries of one board of the suite (default: its main board), sorted by model id."""
        boards = self.boards(suite_id)
        board = board if board in boards else (boards or [None])[0]
        shown = [e for e in self.entries if e.suite_id == suite_id and e.board == board]
        return sorted(shown, key=lambda e: e.model_id)


def _most_verified_first(entries: list[Entry], key) -> list[str]:
    """The values of ``key`` over ``entries``: most verified entries first, then most entries, then by value."""
    total, verified = Counter(map(key, entries)), Counter(key(e) for e in entries if e.verified)
    return sorted(total, key=lambda k: (-verified[k], -total[k], k))


def resolve_source(source: str, *, cache_dir: str | None = None, probe_s: float = 4.0) -> tuple[Path, str | None]:
    """A local folder, or ``ORG/NAME[@rev]`` of a Hub dataset repo: its records downloaded at a commit sha
    (``docs/leaderboard.md``, "The board record": "A Hub store")."""
    from genshift.errors import OfflineError
    from genshift.hubio import SHA_RE, _endpoint, _offline, is_repo_id, resolve_revision, snapshot

    path = Path(source)
    if path.exists():
        if not path.is_dir():
            raise BenchError(f"results store {source!r} is not a folder")
        return path, None
    repo, _, rev = source.partition("@")
    if not is_repo_id(repo) or source.startswith((".", "/")):
        raise BenchError(f"results store {source!r} does not exist; give a folder of bench eval runs (--out) or a Hub "
                         "dataset repo ORG/NAME[@sha]")
    patterns = [f"*/*/{name}" for name in (RESULT_FILE, STAMP, DIAGNOSE)]
    if SHA_RE.match(rev):
        with contextlib.suppress(BenchError):  # else not cached yet
            return snapshot(repo, revision=rev, patterns=patterns, cache_dir=cache_dir, local_only=True), rev
    if _offline() or not _reachable(_endpoint(None), probe_s):
        raise OfflineError(f"the Hugging Face Hub ({_endpoint(None)}) does not answer (or HF_HUB_OFFLINE is set) and "
                           f"no copy of the results repository {source} is cached here, so it cannot be read now")
    sha = resolve_revision(repo, rev or None)
    return snapshot(repo, revision=sha, patterns=patterns, cache_dir=cache_dir), sha


def _reachable(url: str, timeout: float) -> bool:
    """Whether a TCP connection to the endpoint opens within ``timeout`` seconds (name lookup included)."""
    import socket
    import threading
    from urllib.parse import urlsplit

    u, done = urlsplit(url), threading.Event()

    def connect():  # on a thread: the name lookup has no timeout of its own
        with contextlib.suppress(OSError):
            socket.create_connection((u.hostname, u.port or (443 if u.scheme == "https" else 80)), timeout).close()
            done.set()
    threading.Thread(target=connect, daemon=True).start()
    return done.wait(timeout)


def misfiled(path: Path, doc: dict) -> str:
    """Why an entry's folder is not the one its result (or record) names (``genshift.eval.results.entry_dir``),
    or ``""``: a folder is owned by one (suite, model), so a result filed elsewhere never takes an entry's place."""
    want, have = entry_dir(doc), f"{path.parent.parent.name}/{path.parent.name}"
    if have == want:
        return ""
    return (f"filed under {have}/, but its result is {doc['model']['id']} on {doc['suite']['id']}, which "
            f"belongs under {want}/; move the entry there")


def read_files(path: Path, t: Trust) -> tuple[bytes | str, bytes | None, str]:
    """An entry's ``result.json`` bytes (or why they cannot be read), its stamp's bytes (None if absent), and the
    digest of both under ``t`` (what :func:`read_entry` makes of them depends on nothing else)."""
    raw, stamp = "result.json is not a regular file", None  # a fifo or device would block or never end
    try:
        if path.is_file() and (size := path.stat().st_size) > MAX_RESULT_BYTES:
            raw = f"result file is {size / 2**20:.1f} MiB, over the {MAX_RESULT_BYTES >> 20} MiB limit"
        elif path.is_file():
            raw = read_limited(path, max_bytes=MAX_RESULT_BYTES, what="result file")
            sp = path.parent / STAMP
            stamp = read_limited(sp, max_bytes=MAX_STAMP_BYTES, what="stamp") if sp.is_file() else None
    except (OSError, BenchError) as e:
        raw = str(e)
    parts = [raw if isinstance(raw, bytes) else raw.encode(), stamp or b""]
    return raw, stamp, sha256_bytes(canonical_json([sha256_bytes(b) for b in parts] + [t.digest]))


def read_entry(path: Path, raw: bytes | str, stamp: bytes | None, digest: str, t: Trust) -> Entry:
    """One entry from its files (:func:`read_files`): the signed record if it checks out, else a record built from
    the result (its identity checked first); never raises."""
    if isinstance(raw, str):
        return Entry(path, digest=digest, reason=raw)
    entry = Entry(path, digest=digest)
    try:
        record, why = (None, "no verification stamp") if stamp is None else \
            check_stamp(stamp, result_sha256=sha256_bytes(raw), trusted=t.keys)
        if record is None:  # a community entry
            result = parse_result(raw, where=str(path))
            record = build_record(result, result_sha256=sha256_bytes(raw),
                                  predictions_sha256={p["path"]: p["sha256"] for p in result["predictions"]})
            why = "this board trusts no maintainer key" if stamp is not None and not t.keys else why
            entry._result, entry.note = result, f"not verified: {why}"
        manifest = record["suite"]["manifest_sha256"]
        entry.reason = misfiled(path, record) or ("" if t.manifests is None or manifest in t.manifests else
                                                  f"made on suite data this leaderboard does not trust (manifest "
                                                  f"{manifest[:12]}…); maintainers add the suite with --suites")
        if not entry.reason:
            entry.record, entry.status = record, "accepted" if entry.note else "verified"
    except (BenchError, ValueError) as e:
        entry.reason = str(e)
    except Exception as e:  # noqa: BLE001 - whatever one hostile entry does, it never takes the board down
        log.debug("entry %s", path, exc_info=True)
        entry.reason = f"unreadable ({type(e).__name__}: {str(e)[:200]})"
    if entry.reason:
        entry._result = None
    return entry


def precedence(e: Entry) -> tuple:
    """Sort key, first wins: verified, then Hub weights over local ones, then the latest signed stamp (its
    ``verified_at``; an unreadable one is the oldest), then the entry path. Nothing in it is a field a submitter
    writes (``finished_at`` is not used)."""
    from datetime import UTC, datetime

    signed = float("-inf")
    with contextlib.suppress(KeyError, TypeError, ValueError, OverflowError):
        t = datetime.fromisoformat(str((e.stamp or {})["verified_at"]))
        signed = (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()
    return (not e.verified, e.identity.local, -signed if e.verified else 0.0, e.path.as_posix())


def _why(win: Entry, other: Entry) -> str:
    """What decided between two entries: the first part of their :func:`precedence` that differs."""
    reasons = ("verified", "Hub weights win over a local copy", "stamp signed later", "first path")
    return next(why for why, a, b in zip(reasons, precedence(win), precedence(other)) if a != b)


def assemble(store: Store, entries: list[Entry], stale: dict | None = None) -> Store:
    """Sort read entries into the store's shown / rejected / superseded lists (one shown per identity and per
    model id on each board, by :func:`precedence`). ``stale``: entry digest -> why it is no longer verified."""
    shown = []
    for e in entries:
        e.flags = []
        if e.status == "rejected":
            store.rejected.append(e)
        else:
            if (stale or {}).get(e.digest):
                e.status, e.note = "accepted", f"not verified: {stale[e.digest]}"
            shown.append(e)
    for key in (lambda e: (e.suite_id, e.board, e.identity.key), lambda e: (e.suite_id, e.board, e.model_id)):
        groups: dict[tuple, list[Entry]] = {}
        for e in shown:
            groups.setdefault(key(e), []).append(e)
        shown = []
        for group in groups.values():
            win, *others = sorted(group, key=precedence)
            shown.append(win)
            for o in others:
                same = "the same weights" if o.model_id != win.model_id else "another entry of the same model"
                o.reason, o.status = f"{same} as {win.model_id} ({win.run_dir.name}) wins: {_why(win, o)}", "superseded"
                win.flags.append(f"same weights also submitted as {o.model_id}: listed and ranked once, as this entry"
                                 if o.model_id != win.model_id else f"one of {len(group)} entries of this model")
                store.superseded.append(o)
    store.entries = shown
    return store


@contextlib.contextmanager
def _collector_paused():
    """Python's cycle collector paused: records are trees (no cycles to find), and the collector's passes over the
    thousands of objects each parsed record adds took a third of a 500-entry store's reading
    (``benchmarks/leaderboard_load.py``). Re-enabled after, unless something else had paused it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def read_entries(paths: list[Path], files: list[tuple], t: Trust) -> list[Entry]:
    """:func:`read_entry` of each path with its :func:`read_files`."""
    return [read_entry(path, *f, t) for path, f in zip(paths, files)]


def load_store(source: str, *, trusted_keys=None, suites=None, cache_dir: str | None = None, stale=None,
               read=read_entries, chunk: int = 25, progress=None) -> Store:
    """Read every entry of a store (see the module docstring); never raises for a bad entry (it is rejected).
    ``read``: :func:`read_entries` or a cached version of it (the page's), given ``chunk`` entries at a time;
    ``progress(done, total)`` after each chunk."""
    t = trust(trusted_keys, suites)
    root, revision = resolve_source(source, cache_dir=cache_dir)
    paths = sorted(root.glob(f"*/*/{RESULT_FILE}"))
    entries = []
    with _collector_paused():
        for i in range(0, len(paths), chunk):
            entries += read(paths[i:i + chunk], [read_files(p, t) for p in paths[i:i + chunk]], t)
            if progress is not None:
                progress(len(entries), len(paths))
    for e in entries:
        e.hub = (source.partition("@")[0], revision) if revision else None
    return assemble(Store(source=source, root=root, revision=revision), entries, stale)
