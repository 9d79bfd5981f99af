"""The results store: a folder (or a Hub dataset repo at a pinned revision) of ``bench eval`` runs, read as records.

Layout (what ``bench eval --out`` writes, and what ``bench submit`` proposes in a pull request)::

    <suite id>/<model slug>/result.json
    <suite id>/<model slug>/predictions/<config>.parquet
    <suite id>/<model slug>/verification.json     the signed board record (`bench verify --sign`, `bench review`)

Each entry becomes one **record** (``genshift.eval.stamps``): a **verified** entry's is its
``verification.json``, signed by a key in ``trusted_keys`` and naming ``result.json`` as it is now; any
other entry's is built from its ``result.json`` (a community entry: shown, never ranked, with the
reason). Reading a store opens two small files per entry and verifies one signature: no metric is
recomputed and no predictions file is read. A predictions file is hashed when a view reads it
(:meth:`Entry.read_predictions`); a mismatch marks the entry stale (:func:`assemble`'s ``stale``).

An entry is **rejected**, with the reason, when its result is malformed, filed under a folder that is
not its own (``genshift.eval.results.entry_dir``), or records a model id that is not the canonical id
of its weights (``genshift.identity``); with trusted suites given, also when it was made on other
suite data. Nothing about one entry can take the board down.

**Boards**: results are compared only on the same suite data (manifest hash) under the same protocol;
the suite's board with the most verified entries is its default. **One entry per model and board**
(:func:`assemble`): entries are keyed by the canonical identity, so the same weights under two ids
(``Identity.key``) and two results of one id rank once: a verified entry wins, then Hub weights over a
local copy, then the stamp signed last, then the entry path; result fields play no part. The
others are superseded, and the entry shown says so in its flags.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from genshift.errors import BenchError, IntegrityError
from genshift.fsutil import canonical_json, read_limited, sha256_bytes
from genshift.eval.diagnose_report import REPORT as DIAGNOSE
from genshift.eval.results import MAX_PREDICTIONS_BYTES, MAX_RESULT_BYTES, RESULT_FILE
from genshift.eval.stamps import MAX_STAMP_BYTES, STAMP_FILE as STAMP

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Trust:
    """What the board trusts: maintainers' keys (by key id) and, if given, the suite manifests (sha256)."""

    keys: dict = field(default_factory=dict)
    manifests: frozenset | None = None
    digest: str = ""  # of the files they were read from (a cache key for what they decide)


def trust(trusted_keys=None, suites=None) -> Trust:
    """``trusted_keys``: a trusted-keys file or ``load_trusted_keys``'s dict; ``suites``: trusted suite folders or
    manifest files, or a ``TrustedSuites`` (given: entries on other suite data are rejected)."""
    from genshift.eval.stamps import load_trusted_keys
    from genshift.eval.suite_trust import TrustedSuites

    keys = trusted_keys if isinstance(trusted_keys, dict) else load_trusted_keys(trusted_keys) if trusted_keys else {}
    manifests = None
    if suites is not None:
        ts = suites if isinstance(suites, TrustedSuites) else TrustedSuites.from_paths(suites, registry=False)
        manifests = frozenset(ts.by_sha)
    digest = sha256_bytes(canonical_json([sorted(keys), sorted(manifests) if manifests is not None else None]))
    return Trust(keys, manifests, digest)


@dataclass
class Entry:
    path: Path                  # the result.json
    record: dict | None = None  # the board record (genshift.eval.stamps): signed if verified, else built
    status: str = "rejected"    # "verified" | "accepted" | "rejected" | "superseded"
    reason: str = ""            # rejected or superseded: why
    note: str = ""              # accepted: why it is not verified
    flags: list = field(default_factory=list)
    digest: str = ""            # sha256 of the bytes the record was read from (result.json and stamp)
    hub: tuple | None = None    # (repo, revision) of a Hub store: files not yet downloaded are fetched from it
    _result: dict | None = field(default=None, repr=False)

    @property
    def model_id(self) -> str:
        return self.record["model"]["id"] if self.record else "?"

    @property
    def suite_id(self) -> str:
        return self.record["suite"]["id"] if self.record else "?"

    @property
    def verified(self) -> bool:
        return self.status == "verified"

    @property
    def stamp(self) -> dict | None:
        """The signed record of a verified entry."""
        return self.record if self.verified else None

    @property
    def run_dir(self) -> Path:
        return self.path.parent

    @property
    def identity(self):
        from genshift.identity import Identity

        m = self.record["model"]
        return Identity(m["id"], m["source"], m["id"] if m["source"] == "hf-hub" else None, m.get("revision"),
                        m.get("tensors_sha256"))

    @cached_property
    def board(self) -> str:
        """``<manifest sha256[:12]>-<protocol sha256[:8]>``: results on one board are comparable."""
        r = self.record or {}
        protocol = sha256_bytes(canonical_json(r.get("protocol", {})))
        return f"{r.get('suite', {}).get('manifest_sha256', '?')[:12]}-{protocol[:8]}"

    @property
    def result(self) -> dict | None:
        """The parsed ``result.json``, as the record names it (``IntegrityError`` if it changed since); None for
        a rejected entry."""
        from genshift.eval.results import parse_result

        if self._result is None and self.record is not None:
            self._result = parse_result(self.read_file(RESULT_FILE, MAX_RESULT_BYTES), where=str(self.path))
        return self._result

    def file(self, rel: str) -> Path:
        """The entry's file ``rel``, downloaded first from a Hub store's pinned revision if it is not here yet."""
        f = self.run_dir / rel
        if self.hub is not None and not f.exists():
            from huggingface_hub import hf_hub_download

            suite, folder = self.run_dir.parent.name, self.run_dir.name
            return Path(hf_hub_download(self.hub[0], f"{suite}/{folder}/{rel}", repo_type="dataset",
                                        revision=self.hub[1]))
        return f

    def read_file(self, rel: str, limit: int) -> bytes:
        """The bytes of a file the record vouches for, hashed: ``IntegrityError`` (stale) unless they are the
        bytes the record names."""
        try:
            data = read_limited(self.file(rel), max_bytes=limit, what=rel)
        except (OSError, BenchError) as e:
            raise IntegrityError(f"{self.run_dir.name}: {rel} cannot be read ({e})") from None
        if sha256_bytes(data) != self.record["files"].get(rel):
            raise IntegrityError(f"{self.run_dir.name}: {rel} is not the file its record names (changed after it "
                                 f"was {'verified' if self.verified else 'submitted'}): stale")
        return data

    def check(self) -> None:
        """Hash every file the record vouches for (``IntegrityError`` naming the first that changed)."""
        for rel in self.record["files"]:
            self.read_file(rel, MAX_RESULT_BYTES if rel == RESULT_FILE else MAX_PREDICTIONS_BYTES)

    def read_predictions(self, config: str, columns: list[str] | None = None):
        """One predictions table of this entry, hashed against the record first."""
        from genshift.eval.predictions import read_predictions

        rel = f"predictions/{config}.parquet"
        return read_predictions(self.file(rel), columns=columns, data=self.read_file(rel, MAX_PREDICTIONS_BYTES))


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


def resolve_source(source: str, *, cache_dir: str | None = None, probe_s: float = 4.0) -> tuple[Path, str | None]:
    """A local folder, or ``ORG/NAME[@rev]`` of a Hub dataset repo: its records (``result.json``,
    ``verification.json``, ``diagnose.json``) downloaded at a commit sha; predictions follow when read.
    A cached snapshot at a pinned sha opens without the network; an unreachable Hub is one line
    after at most ``probe_s`` seconds (never huggingface_hub's retries)."""
    from genshift.errors import OfflineError
    from genshift.hubio import REPO_RE, SHA_RE, _endpoint, _offline, resolve_revision, snapshot

    path = Path(source)
    if path.exists():
        if not path.is_dir():
            raise BenchError(f"results store {source!r} is not a folder")
        return path, None
    repo, _, rev = source.partition("@")
    if not REPO_RE.match(repo) or source.startswith((".", "/")):
        raise BenchError(f"results store {source!r} does not exist; give a folder of bench eval runs (--out) or a Hub "
                         "dataset repo ORG/NAME[@sha]")
    patterns = ["*/*/" + RESULT_FILE, f"*/*/{STAMP}", f"*/*/{DIAGNOSE}"]
    if SHA_RE.match(rev):
        try:
            return snapshot(repo, revision=rev, patterns=patterns, cache_dir=cache_dir, local_only=True), rev
        except BenchError:
            pass  # not cached yet
    if _offline() or not _reachable(_endpoint(None), probe_s):
        raise OfflineError(f"the Hugging Face Hub ({_endpoint(None)}) does not answer (or HF_HUB_OFFLINE is set) and no "
                           f"copy of the results repository {source} is cached here, so it cannot be read now")
    sha = resolve_revision(repo, rev or None)
    return snapshot(repo, revision=sha, patterns=patterns, cache_dir=cache_dir), sha


def _reachable(url: str, timeout: float) -> bool:
    """Whether a TCP connection to the endpoint opens within ``timeout`` seconds (name lookup included)."""
    import socket
    import threading
    from urllib.parse import urlsplit

    u = urlsplit(url)
    done = []

    def connect():
        try:
            socket.create_connection((u.hostname, u.port or (443 if u.scheme == "https" else 80)), timeout).close()
            done.append(True)
        except OSError:
            pass
    t = threading.Thread(target=connect, daemon=True)
    t.start()
    t.join(timeout)
    return bool(done)


def misfiled(path: Path, doc: dict) -> str:
    """Why an entry's folder is not the one its result (or record) names (``genshift.eval.results.entry_dir``),
    or ``""``: a folder is owned by one (suite, model), so a result filed under another model's folder is
    refused instead of taking that entry's place."""
    from genshift.eval.results import entry_dir

    want, have = entry_dir(doc), f"{path.parent.parent.name}/{path.parent.name}"
    if have == want:
        return ""
    return (f"filed under {have}/, but its result is {doc['model']['id']} on {doc['suite']['id']}, which "
            f"belongs under {want}/; move the entry there")


def read_files(path: Path) -> tuple[bytes | str, bytes | None]:
    """An entry's ``result.json`` bytes (or why they cannot be read) and its stamp's bytes (None if absent)."""
    try:
        if not path.is_file():  # a fifo or device would block or never end
            return "result.json is not a regular file", None
        if (size := path.stat().st_size) > MAX_RESULT_BYTES:
            return f"result file is {size / 2**20:.1f} MiB, over the {MAX_RESULT_BYTES >> 20} MiB limit", None
        raw = read_limited(path, max_bytes=MAX_RESULT_BYTES, what="result file")
        sp = path.parent / STAMP
        return raw, read_limited(sp, max_bytes=MAX_STAMP_BYTES, what="stamp") if sp.is_file() else None
    except (OSError, BenchError) as e:
        return str(e), None


def read_entry(path: Path, raw: bytes | str, stamp: bytes | None, trust: Trust) -> Entry:
    """One entry from its files' bytes (:func:`read_files`): the signed record if it checks out, else a record
    built from the result; never raises."""
    from genshift.eval.results import parse_result
    from genshift.eval.stamps import build_record, check_stamp

    entry = Entry(path, digest=sha256_bytes(canonical_json([sha256_bytes(raw if isinstance(raw, bytes) else b""),
                                                             sha256_bytes(stamp or b""), trust.digest])))
    if isinstance(raw, str):
        entry.reason = raw
        return entry
    try:
        record, why = (None, "no verification stamp") if stamp is None else \
            check_stamp(stamp, result_sha256=sha256_bytes(raw), trusted=trust.keys)
        if record is None:  # a community entry: its record built from the result (the identity checked first)
            result = parse_result(raw, where=str(path))
            record = build_record(result, result_sha256=sha256_bytes(raw),
                                  predictions_sha256={p["path"]: p["sha256"] for p in result["predictions"]})
            why = "this board trusts no maintainer key" if stamp is not None and not trust.keys else why
            entry._result, entry.note = result, f"not verified: {why}"
        entry.reason = misfiled(path, record)
        if not entry.reason and trust.manifests is not None and record["suite"]["manifest_sha256"] not in trust.manifests:
            entry.reason = (f"made on suite data this leaderboard does not trust (manifest "
                            f"{record['suite']['manifest_sha256'][:12]}…); maintainers add the suite with --suites")
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


def _signed_time(e: Entry) -> float:
    """The stamp's ``verified_at`` (signed by the maintainer) as a POSIX time; -inf if none or unreadable."""
    from datetime import datetime, timezone

    try:
        t = datetime.fromisoformat(str((e.stamp or {})["verified_at"]))
        return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()
    except (KeyError, TypeError, ValueError, OverflowError):
        return float("-inf")


def precedence(e: Entry) -> tuple:
    """Sort key, first wins: verified, then Hub weights over local ones, then the latest signed stamp, then the
    entry path. Nothing in it is a field a submitter writes (``finished_at`` is not used)."""
    return (not e.verified, e.identity.local, -_signed_time(e) if e.verified else 0.0, e.path.as_posix())


def _why_wins(w: Entry, o: Entry) -> str:
    if w.verified != o.verified:
        return "verified"
    if w.identity.local != o.identity.local:
        return "Hub weights win over a local copy"
    return "stamp signed later" if w.verified and _signed_time(w) != _signed_time(o) else "first path"


def assemble(store: Store, entries: list[Entry], stale: dict | None = None) -> Store:
    """Sort read entries into the store's shown / rejected / superseded lists: one shown entry per identity
    (``Identity.key``: the same tensors) and per model id on each board, by :func:`precedence`. ``stale``:
    entry digest -> why a file it vouches for was found changed (the entry is then not verified)."""
    groups: dict[tuple, list[Entry]] = {}
    for e in entries:
        e.flags = []
        if e.status == "rejected":
            store.rejected.append(e)
            continue
        if (stale or {}).get(e.digest):
            e.status, e.note = "accepted", f"not verified: {stale[e.digest]}"
        groups.setdefault((e.suite_id, e.board, e.identity.key), []).append(e)
    for pass_key in (None, lambda e: (e.suite_id, e.board, e.model_id)):
        if pass_key is not None:  # second pass: one entry per model id too (ids whose tensors differ)
            groups = {}
            for e in store.entries:
                groups.setdefault(pass_key(e), []).append(e)
            store.entries = []
        for group in groups.values():
            group.sort(key=precedence)
            win = group[0]
            store.entries.append(win)
            for other in group[1:]:
                same = "the same weights" if other.model_id != win.model_id else "another entry of the same model"
                other.reason = f"{same} as {win.model_id} ({win.run_dir.name}) wins: {_why_wins(win, other)}"
                other.status = "superseded"
                win.flags.append(f"same weights also submitted as {other.model_id}: listed and ranked once, as this entry"
                                 if other.model_id != win.model_id else f"one of {len(group)} entries of this model")
                store.superseded.append(other)
    return store


def load_store(source: str, *, trusted_keys=None, suites=None, cache_dir: str | None = None, stale=None) -> Store:
    """Read every entry of a store (see the module docstring); never raises for a bad entry (it is rejected)."""
    t = trust(trusted_keys, suites)
    root, revision = resolve_source(source, cache_dir=cache_dir)
    store = Store(source=source, root=root, revision=revision)
    entries = []
    for path in sorted(root.glob(f"*/*/{RESULT_FILE}")):
        e = read_entry(path, *read_files(path), t)
        e.hub = (source.partition("@")[0], revision) if revision else None
        entries.append(e)
    return assemble(store, entries, stale)

