"""The results store: a folder (or a Hub dataset repo at a pinned revision) of ``bench eval`` runs.

Layout (what ``bench eval --out`` writes, and what ``bench submit`` proposes in a pull request)::

    <suite id>/<model slug>/result.json
    <suite id>/<model slug>/predictions/<config>.parquet
    <suite id>/<model slug>/verification.json     optional: written by `bench verify --recheck N --stamp`

Loading checks every entry the way ``bench verify`` does (schema, predictions hashes, every
metric recomputed from the predictions). Entries that fail are listed as **rejected** with the
reason and never shown as results. An entry is **verified** when it also carries a verification
stamp (a model re-run, ``--recheck``) whose hashes match the files as they are now; a stamp that
does not match is ignored.

Results are compared only on one **board**: the same suite data (manifest hash) scored under
the same protocol (filter, reference, top-k, limits). A suite with results on several revisions
or protocols has several boards, never mixed; the one with the most models is the default. Of
several entries for one model on one board, the verified one wins, then the newest; the others
are listed as superseded.

Verification outcomes are cached by content (result sha256 + predictions sizes and mtimes), so a
store of hundreds of models loads in well under a second once seen.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from benchmark.errors import BenchError
from benchmark.fsutil import atomic_write_json, canonical_json, sha256_bytes, sha256_file

log = logging.getLogger(__name__)
MAX_RESULT_BYTES = 5 * 2**20
MAX_PREDICTIONS_BYTES = 512 * 2**20
STAMP = "verification.json"
CACHE_VERSION = 1


@dataclass
class Entry:
    path: Path                  # the result.json
    result: dict | None = None
    status: str = "rejected"    # "verified" | "accepted" | "rejected" | "superseded"
    reason: str = ""
    stamp: dict | None = None
    result_sha256: str = ""
    cache_dir: Path | None = None
    _ranks: dict | None = field(default=None, repr=False)

    @property
    def model_id(self) -> str:
        return (self.result or {}).get("model", {}).get("id", "?")

    @property
    def suite_id(self) -> str:
        return (self.result or {}).get("suite", {}).get("id", "?")

    @property
    def verified(self) -> bool:
        return self.status == "verified"

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

    def pair_ids(self, config: str) -> list:
        """``pair_id`` of the scored rows of ``config``, in the order of :meth:`true_ranks`."""
        from eval.predictions import read_predictions

        p = next(p for p in self.result["predictions"] if p["config"] == config)
        t = read_predictions(self.run_dir / p["path"], columns=["keep", "pair_id"])
        if self.result["protocol"]["scoring"]["filter"]:
            t = t.filter(t["keep"])
        return t["pair_id"].to_pylist()

    def _load_ranks(self) -> dict:
        import numpy as np

        from benchmark.fsutil import atomic_path
        from eval.predictions import read_predictions

        cache = self.cache_dir / f"{self.result_sha256[:32]}-ranks.npz" if self.cache_dir else None
        if cache is not None and cache.is_file():
            with np.load(cache, allow_pickle=False) as z:
                configs, ids, n, ranks = z["configs"].tolist(), z["ids"].tolist(), z["n"], z["ranks"]
            starts = np.concatenate([[0], np.cumsum(n)])
            return {c: (ids[i], ranks[starts[i]:starts[i + 1]]) for i, c in enumerate(configs)}
        out = {}
        for p in self.result["predictions"]:
            t = read_predictions(self.run_dir / p["path"], columns=["image_id", "keep", "true_rank"])
            if self.result["protocol"]["scoring"]["filter"]:
                t = t.filter(t["keep"])
            out[p["config"]] = (sha256_bytes("\n".join(t["image_id"].to_pylist()).encode()),
                                np.minimum(t["true_rank"].to_numpy(), 255).astype(np.uint8))
        if cache is not None:
            try:
                cache.parent.mkdir(parents=True, exist_ok=True)
                with atomic_path(cache) as tmp, open(tmp, "wb") as f:
                    np.savez(f, configs=np.array(list(out)), ids=np.array([d for d, _ in out.values()]),
                             n=np.array([r.size for _, r in out.values()]),
                             ranks=np.concatenate([r for _, r in out.values()]) if out else np.zeros(0, np.uint8))
            except OSError:
                pass
        return out


@dataclass
class Store:
    source: str
    root: Path
    revision: str | None
    entries: list[Entry] = field(default_factory=list)      # shown: one per (model, suite)
    rejected: list[Entry] = field(default_factory=list)
    superseded: list[Entry] = field(default_factory=list)

    @property
    def fingerprint(self) -> str:
        """Content key for caches: changes whenever any accepted entry or stamp changes."""
        keys = sorted(f"{e.path}|{e.status}|{e.result.get('finished_at')}|{e.result.get('config_hash')}"
                      for e in self.entries)
        return sha256_bytes("\n".join([self.revision or "", *keys]).encode())

    def suites(self) -> list[str]:
        return sorted({e.suite_id for e in self.entries})

    def boards(self, suite_id: str) -> list[str]:
        """The suite's boards, the one with the most models first (ties: the newest result)."""
        groups: dict[str, list[Entry]] = {}
        for e in self.entries:
            if e.suite_id == suite_id:
                groups.setdefault(e.board, []).append(e)
        return sorted(groups, key=lambda b: (len(groups[b]), max(e.result.get("finished_at", "") for e in groups[b])),
                      reverse=True)

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
        from benchmark.hub import resolve_revision, snapshot

        sha = resolve_revision(repo, rev or None)
        root = snapshot(repo, revision=sha, patterns=["**/result.json", "**/predictions/*.parquet", f"**/{STAMP}"],
                        cache_dir=cache_dir)
        return root, sha
    raise BenchError(f"results store {source!r} does not exist; give a folder of bench eval runs (--out) or a Hub "
                     "dataset repo ORG/NAME[@sha]")


def _cache_path(root: Path) -> Path:
    if os.access(root, os.W_OK):
        return root / ".genshift-leaderboard-cache.json"
    from huggingface_hub import constants

    return Path(constants.HF_HOME) / "genshift" / f"leaderboard-cache-{sha256_bytes(str(root).encode())[:16]}.json"


def _check_entry(path: Path, cache: dict) -> Entry:
    """Validate one result.json like `bench verify` (cached by content)."""
    from eval.results import parse_result
    from eval.verify import verify_result

    entry = Entry(path)
    try:
        size = path.stat().st_size
        if size > MAX_RESULT_BYTES:
            entry.reason = f"result file is {size / 2**20:.1f} MiB, over the {MAX_RESULT_BYTES // 2**20} MiB limit"
            return entry
        raw = path.read_bytes()
        entry.result_sha256 = sha256_bytes(raw)
        entry.result = parse_result(raw, where=str(path))
        stats = []
        for p in entry.result["predictions"]:
            try:
                st = os.stat(os.path.join(path.parent, p["path"]))
            except OSError:
                stats.append(None)
                continue
            if st.st_size > MAX_PREDICTIONS_BYTES:
                entry.reason = f"{p['path']} is over the {MAX_PREDICTIONS_BYTES // 2**20} MiB limit"
                return entry
            stats.append([st.st_size, st.st_mtime_ns])
        key = json.dumps([entry.result_sha256, stats])
        if key in cache:
            ok, reason = cache[key]
        else:
            report = verify_result(path)
            ok, reason = report.ok, "; ".join(report.problems[:3])
            cache[key] = (ok, reason)
        if not ok:
            entry.reason = f"does not verify: {reason}"
            return entry
        entry.status = "accepted"
        entry.stamp = _valid_stamp(path, raw, entry.result)
        if entry.stamp:
            entry.status = "verified"
    except BenchError as e:
        entry.reason = str(e)
    except (OSError, ValueError, KeyError, TypeError) as e:
        entry.reason = f"unreadable ({type(e).__name__}: {e})"
    return entry


def _valid_stamp(path: Path, raw: bytes, result: dict) -> dict | None:
    """The verification stamp if it matches the result and predictions exactly as they are now."""
    sp = path.parent / STAMP
    if not sp.is_file() or sp.stat().st_size > 1 * 2**20:
        return None
    try:
        stamp = json.loads(sp.read_bytes())
    except ValueError:
        return None
    if not isinstance(stamp, dict) or stamp.get("ok") is not True or stamp.get("result_sha256") != sha256_bytes(raw):
        return None
    if not isinstance(stamp.get("recheck"), int) or stamp["recheck"] < 1:
        return None
    return stamp


def write_stamp(result_path: Path, *, recheck: int, checked: list[str]) -> Path:
    """Record a successful `bench verify --recheck N` next to the result (maintainers' CI)."""
    from datetime import datetime, timezone

    from benchmark import __version__

    raw = result_path.read_bytes()
    stamp = {"ok": True, "result_sha256": sha256_bytes(raw), "recheck": int(recheck), "checked": checked,
             "verified_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
             "genshift_bench": __version__,
             "predictions_sha256": {p["path"]: sha256_file(result_path.parent / p["path"])
                                    for p in json.loads(raw)["predictions"]}}
    out = result_path.parent / STAMP
    atomic_write_json(out, stamp)
    return out


def assemble(store: Store, checked: list[Entry]) -> Store:
    """Sort checked entries into the store's shown / rejected / superseded lists: of several entries of
    one model on one board, the verified one wins, then the newest."""
    candidates: dict[tuple[str, str, str], list[Entry]] = {}
    for e in checked:
        if e.status == "rejected":
            store.rejected.append(e)
        else:
            candidates.setdefault((e.suite_id, e.board, e.model_id), []).append(e)
    for group in candidates.values():
        group.sort(key=lambda e: (e.verified, e.result.get("finished_at", "")), reverse=True)
        store.entries.append(group[0])
        for other in group[1:]:
            other.status, other.reason = "superseded", f"another entry of {other.model_id} wins ({group[0].path.parent.name})"
            store.superseded.append(other)
    return store


def load_store(source: str, *, cache_dir: str | None = None, progress=None) -> Store:
    """Load and check every entry of a store; never raises for a bad entry (it is rejected).
    ``progress(done, total, entry)`` is called after each entry is checked (the leaderboard's
    background check paints the first rows from it)."""
    root, revision = resolve_source(source, cache_dir=cache_dir)
    cache_file = _cache_path(root)
    cache: dict = {}
    if cache_file.is_file():
        try:
            data = json.loads(cache_file.read_text())
            if data.get("version") == CACHE_VERSION:
                cache = {k: tuple(v) for k, v in data["entries"].items()}
        except (ValueError, KeyError, AttributeError):
            cache = {}
    before = dict(cache)
    store = Store(source=source, root=root, revision=revision)
    hits_dir = cache_file.parent / (cache_file.stem + "-hits")
    checked = []
    paths = sorted(root.glob("*/*/result.json"))
    for i, path in enumerate(paths):
        e = _check_entry(path, cache)
        e.cache_dir = hits_dir
        checked.append(e)
        if progress is not None:
            progress(i + 1, len(paths), e)
    assemble(store, checked)
    if cache != before:
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(cache_file, {"version": CACHE_VERSION, "entries": {k: list(v) for k, v in cache.items()}})
        except OSError as ex:
            log.warning("could not write the leaderboard cache %s (%s)", cache_file, ex)
    return store
