"""``bench review``: verify every open pull request on the results repo, sign, comment and publish to ``main``
(``docs/leaderboard.md``, "Automatic verification"). Only the service's own failure leaves a PR unanswered
(``error``, retried on the next run)."""

from __future__ import annotations

import errno
import itertools
import json
import logging
import re
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, errors
from huggingface_hub.hf_api import RepoFile

from genshift.errors import BenchError, OfflineError, first_line, one_line
from genshift.eval import verify
from genshift.eval.results import parse_result, read_result_bytes
from genshift.eval.stamps import (
    STAMP_FILE,
    PublicKey,
    check_signature,
    key_id,
    load_private_key,
    make_stamp,
    sign,
    signature,
)
from genshift.eval.suite_trust import TrustedSuites
from genshift.fsutil import canonical_json, read_json
from genshift.hubio import _unreachable, is_repo_id
from genshift.leaderboard.store import misfiled

log = logging.getLogger(__name__)
MARKER_KIND = "genshift-review"
OUTCOMES = ("passed", "failed", "unreviewable", "deferred")  # each signed; all but "deferred" are final at a head
# the marker ends the comment; quoted text above it (in code blocks) can never be taken for it
MARKER = re.compile(r"<!-- genshift-review v=2 head=(?P<head>[0-9a-f]{7,64}) outcome=(?P<outcome>"
                    + "|".join(OUTCOMES) + r") key=(?P<key>[0-9a-f]{16}) sig=(?P<sig>[A-Za-z0-9+/]{86}==) -->\s*\Z")
# per-submitter bounds: what one account can make the service do
MAX_ENTRIES_PER_PR = 20        # each entry is a re-run of images
MAX_OPEN_PRS = 3               # open PRs of one submitter reviewed at a time, oldest first
MAX_IMAGES_PER_DAY = 50_000    # images re-run for one submitter per UTC day (the reviewer's time)
MAX_PATH_CHARS = 200           # a PR path; a component at most 100 (entry folders are at most 97)
ENTRY_FILE = re.compile(r"^([A-Za-z0-9._-]{1,100})/([A-Za-z0-9._@-]{1,100})/"
                        r"(result\.json|predictions/[A-Za-z0-9][A-Za-z0-9._-]{0,99}\.parquet)$")
LEDGER_FILE, LEDGER_KIND, MAX_LEDGER_BYTES = "review-ledger.json", "genshift-review-ledger", 4 << 20
MAX_COMMENT_LINES = 50  # a comment stays readable (and within the Hub's size limits) however big the PR


@dataclass
class Outcome:
    pr: int
    head: str = ""
    status: str = "error"  # "passed" | "failed" | "unreviewable" | "deferred" | "skipped" | "moved" | "error"
    entries: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    merged: bool = False         # published to main (the reviewed files and their stamps)
    merge_commit: str = ""
    earlier: str = ""            # skipped: the outcome of the earlier review at this head
    author: str = ""
    model_prs: list[str] = field(default_factory=list)  # "<entry>: <url> (opened|updated|unchanged)"


class Deferred(BenchError):
    """A submitter's bound is reached: the PR is answered in one line and reviewed on a later run."""


def _marker_body(repo_id: str, pr: int, head: str, outcome: str) -> dict:
    """What a review marker's signature covers: one repo, one PR, one head, one outcome."""
    return {"kind": MARKER_KIND, "version": 2, "repo": repo_id, "pr": pr, "head": head, "outcome": outcome}


def _block(lines: list[str]) -> str:
    """Data-derived lines in a fenced block (comments are Markdown), at most ``MAX_COMMENT_LINES`` of 500 characters."""
    shown = [one_line(line, 500) for line in lines[:MAX_COMMENT_LINES]]
    if len(lines) > MAX_COMMENT_LINES:
        shown.append(f"… and {len(lines) - MAX_COMMENT_LINES} more")
    body = "\n".join(line.replace("```", "'''") for line in shown)
    return f"```text\n{body}\n```"


def _hub_failure(e: BaseException) -> bool:
    """True when ``e`` is the service's own failure (network, the Hub answering an error), not the submission's:
    a file-system error a submitted path causes (a name too long) is the submission's."""
    if isinstance(e, OSError) and e.errno in (errno.ENAMETOOLONG, errno.ENOTDIR, errno.EISDIR, errno.EINVAL):
        return False
    return isinstance(e, (OfflineError, errors.HfHubHTTPError, OSError)) or _unreachable(e)


def _same_weights(result: dict, entries: dict[str, dict | None], entry: str) -> str | None:
    """Another entry of ``entries`` holding the same weights (tensors) on the same suite, if any."""
    key = (result["model"]["tensors_sha256"], result["suite"]["id"])
    return next((f for f, r in sorted(entries.items()) if r and f != entry
                 and (r["model"]["tensors_sha256"], r["suite"]["id"]) == key), None)


def _board(result: dict) -> tuple:
    """What an entry may be replaced only by the same of: model id, suite id, suite data and protocol."""
    return (result["model"]["id"], result["suite"]["id"], result["suite"]["manifest_sha256"],
            json.dumps(result["protocol"], sort_keys=True))


class Reviewer:
    def __init__(self, repo_id: str, *, key_path: str, recheck: int | str = "auto", merge: bool = False,
                 suite: str | None = None, suites: str | None = None, checkpoint: str | None = None,
                 device: str = "cpu", endpoint: str | None = None, token: str | None = None,
                 work_dir: str | None = None, again: tuple[int, ...] = (), batch_size: int = 32,
                 publish_model_results: bool = False):
        from genshift.eval.models import check_checkpoint_file, weights_sha256

        if not is_repo_id(repo_id):
            raise BenchError(f"--repo {repo_id!r} is not a Hub repo id; give ORG/NAME of the results dataset repo")
        verify.recheck_count(recheck, 1)  # "auto", "all" or a positive number: one line otherwise
        self.repo_id, self.recheck, self.merge, self.batch_size = repo_id, recheck, merge, batch_size
        self.suite, self.checkpoint, self.device, self.work_dir = suite, checkpoint, device, work_dir
        self.publish_model_results = publish_model_results
        self.again = set(again)  # PRs a maintainer asked to review again at their current head (e.g. with --checkpoint)
        self.key = load_private_key(key_path)
        # one line for a missing, empty or unreadable file before any PR is looked at
        self.checkpoint_sha256 = weights_sha256(check_checkpoint_file(checkpoint)) if checkpoint else None
        raw = self.key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.public = {key_id(raw): PublicKey(key_id(raw), raw, "reviewer")}  # the only key a marker may carry
        self.api = HfApi(endpoint=endpoint, token=token)
        self.ledger: dict = {}
        self._ledger_read = ""  # the ledger's canonical JSON as read: written back only when changed
        self._main_index: tuple[str, dict] = ("", {})
        # trusted suite manifests; default (None): the registry's pinned ones
        self.suites = TrustedSuites.from_paths([suites], registry=True, download=True) if suites else None

    # -- one pass over the open pull requests ------------------------------------------------
    def run_once(self) -> list[Outcome]:
        """Review every open PR; ``BenchError`` only when the service cannot work at all (the Hub unreachable, the
        repo missing, a refused token, a damaged ledger). One PR's failure is that PR's ``error`` outcome."""
        try:
            self.account  # noqa: B018 - asked once, before any PR
            prs = list(self.api.get_repo_discussions(self.repo_id, repo_type="dataset", discussion_type="pull_request",
                                                     discussion_status="open"))
            self._read_ledger()
        except errors.RepositoryNotFoundError:
            raise BenchError(f"results repo datasets/{self.repo_id} not found (or no access: set HF_TOKEN)") from None
        except Exception as e:
            if isinstance(e, BenchError) or not _hub_failure(e):
                raise
            raise BenchError(f"cannot list the pull requests of datasets/{self.repo_id} "
                             f"({type(e).__name__}: {one_line(e, 200)})") from None
        out, queue, prs = [], {}, sorted(prs, key=lambda d: d.num)
        for d in prs:
            queue.setdefault(d.author, []).append(d.num)
        for d in prs:
            try:
                out.append(self.review_pr(d.num, author=d.author or "", queue=queue[d.author]))
            except Exception as e:  # noqa: BLE001 - one PR never stops the others; the next run retries it
                log.warning("PR #%d: %s: %s", d.num, type(e).__name__, e)
                out.append(Outcome(d.num, status="error", problems=[f"{type(e).__name__}: {one_line(e, 300)}"]))
        today = datetime.now(UTC).date().isoformat()  # the ledger written back (only when changed): today's usage
        self.ledger["usage"] = {a: u for a, u in self.ledger["usage"].items() if u.get("day") == today}
        if (data := canonical_json(self.ledger)) != self._ledger_read:
            self.api.create_commit(self.repo_id, [CommitOperationAdd(LEDGER_FILE, data)], repo_type="dataset",
                                   commit_message="bench review: the ledger (failed model ids, images re-run today)")
            self._ledger_read = data
        return out

    @cached_property
    def account(self) -> str | None:
        """The reviewing account: only its comments can carry markers (the signatures alone decide without a token)."""
        try:
            return self.api.whoami()["name"]
        except errors.LocalTokenNotFoundError:
            return None
        except errors.HfHubHTTPError as e:
            if getattr(e.response, "status_code", None) == 401:
                raise BenchError("the Hub refused the token (401): set HF_TOKEN to a valid token with write access "
                                 f"to datasets/{self.repo_id}") from None
            raise

    def review_pr(self, num: int, *, author: str = "", queue: list[int] = ()) -> Outcome:
        """Review PR ``num``; ``queue``: the submitter's open PRs, oldest first."""
        head = self.api.repo_info(self.repo_id, repo_type="dataset", revision=f"refs/pr/{num}").sha
        outcome = Outcome(num, head=head, author=author)
        earlier = self.answers(num, self.api.get_discussion_details(self.repo_id, num, repo_type="dataset").events)
        if earlier.get(head, "deferred") != "deferred" and num not in self.again:
            outcome.status, outcome.earlier = "skipped", earlier[head]
            return outcome
        with tempfile.TemporaryDirectory(prefix=f"genshift-review-{num}-", dir=self.work_dir) as tmp:
            try:
                if num in queue[MAX_OPEN_PRS:]:
                    raise Deferred(f"{author or 'this submitter'} has {len(queue)} open pull requests and only the "
                                   f"oldest {MAX_OPEN_PRS} are reviewed: close one of them and this one is reviewed")
                changed, at_head, problems = self._changed_entries(f"refs/pr/{num}", head)
                outcome.entries = sorted(changed)
                if not problems:
                    results, problems = self._fetch(head, changed, at_head, Path(tmp) / "head")
                if not problems:
                    problems, stamps = self._check(results, outcome, Path(tmp) / "main")
                if not problems and self.merge:
                    problems = self._publish(outcome, Path(tmp) / "head", stamps)
            except Exception as e:
                if isinstance(e, OSError) and not _hub_failure(e):  # caused by what the PR holds (a path)
                    problems = [f"a file of the pull request cannot be stored ({e.strerror})"]
                elif _hub_failure(e) or not isinstance(e, BenchError):
                    raise  # the service failed (network, a crash in a check): no answer, retried next run
                else:
                    outcome.status, outcome.problems = "deferred" if isinstance(e, Deferred) else "unreviewable", \
                        [one_line(e, 500)]
                    if not (outcome.status == "deferred" == earlier.get(head)):  # a deferral is said once per head
                        self._comment(num, head, outcome)
                    return outcome
        if outcome.status == "moved":
            return outcome
        outcome.status, outcome.problems = ("failed", problems) if problems else ("passed", [])
        if outcome.merged and self.publish_model_results:  # docs/hub.md, "Results reach model pages"
            from genshift.leaderboard.hub_results import publish_entry

            for entry in outcome.entries:
                if "@" in entry:  # local weights (NAME@sha256-…): no model repo of their own
                    continue
                try:
                    url, what = publish_entry(self.repo_id, entry, trusted=self.public, revision=outcome.merge_commit,
                                              api=self.api)
                    outcome.model_prs.append(f"{entry}: {url} ({what})")
                except Exception as e:  # noqa: BLE001 - the publish to main stands; the failure is reported
                    outcome.problems.append(f"{entry}: not reported on its model page: {one_line(e, 200)}")
        self._comment(num, head, outcome)
        if outcome.merged:
            self.api.change_discussion_status(self.repo_id, num, "closed", repo_type="dataset")
        return outcome

    def _publish(self, outcome: Outcome, files: Path, stamps: dict[str, bytes]) -> list[str]:
        """Commit the reviewed files (``files``) and their stamps to ``main`` (``docs/leaderboard.md``, step 5 of
        "Automatic verification"); returns why they may not be published, if so."""
        now = self.api.repo_info(self.repo_id, repo_type="dataset", revision=f"refs/pr/{outcome.pr}").sha
        if now != outcome.head:
            outcome.status, outcome.problems = "moved", [f"the head moved to {now[:12]} during the review"]
            return []
        main = self.api.repo_info(self.repo_id, repo_type="dataset").sha
        problems, ops = [], []
        on_main = self._tree(main)
        for entry, stamp in stamps.items():
            result = json.loads((files / entry / "result.json").read_bytes())
            if why := self._owner_problem(entry, result, main, files.parent / "main"):
                problems.append(why)
            names = ["result.json", *(p["path"] for p in result["predictions"])]
            ops += [CommitOperationAdd(f"{entry}/{n}", str(files / entry / n)) for n in names]
            ops.append(CommitOperationAdd(f"{entry}/{STAMP_FILE}", stamp))
            ops += [CommitOperationDelete(p) for p in on_main if p.startswith(entry + "/")
                    and p[len(entry) + 1:] not in (*names, STAMP_FILE)]
        if problems:
            return problems
        try:
            info = self.api.create_commit(self.repo_id, ops, repo_type="dataset", parent_commit=main,
                                          commit_message=f"Add the entries reviewed in PR #{outcome.pr} "
                                                         f"(at {outcome.head[:12]})")
        except errors.HfHubHTTPError as e:
            if getattr(e.response, "status_code", None) not in (409, 412):
                raise
            outcome.status, outcome.problems = "moved", ["main moved while publishing; the next run reviews it again"]
            return []
        outcome.merged, outcome.merge_commit = True, info.oid
        return []

    # -- review markers -----------------------------------------------------------------------
    def marker(self, num: int, head: str, outcome: str) -> str:
        """The hidden line that ends a review comment: the outcome at ``head``, signed by the maintainer key."""
        sig = signature(canonical_json(_marker_body(self.repo_id, num, head, outcome)), self.key)
        return f"<!-- genshift-review v=2 head={head} outcome={outcome} key={sig['key_id']} sig={sig['value']} -->"

    def answers(self, num: int, events) -> dict[str, str]:
        """head sha -> outcome of this service's earlier answers on PR ``num`` (only its own signed markers)."""
        out = {}
        for ev in events:
            if ev.type != "comment" or (self.account is not None and ev.author != self.account):
                continue
            m = MARKER.search(getattr(ev, "content", "") or "")
            if m is None:
                continue
            body = canonical_json(_marker_body(self.repo_id, num, m["head"], m["outcome"]))
            sig = {"algorithm": "ed25519", "key_id": m["key"], "value": m["sig"]}
            if check_signature(body, sig, self.public) is None:
                out[m["head"]] = m["outcome"]
        return out

    # -- the ledger: failed model ids and each submitter's re-run images, on main ------------
    def _read_ledger(self) -> None:
        """``review-ledger.json`` on ``main``; the Hub unreachable is the service's failure, never an empty ledger."""
        self.ledger = {"kind": LEDGER_KIND, "failed": {}, "usage": {}}
        with tempfile.TemporaryDirectory(prefix="genshift-review-ledger-", dir=self.work_dir) as tmp:
            try:
                path = self._download("main", LEDGER_FILE, Path(tmp))
                doc = read_json(path, where=LEDGER_FILE, what="review ledger", max_bytes=MAX_LEDGER_BYTES)
            except errors.LocalEntryNotFoundError:
                raise  # not found in a cache because the Hub did not answer: forgetting failed ids would weaken reviews
            except errors.EntryNotFoundError:
                doc = self.ledger
        if not (isinstance(doc, dict) and isinstance(doc.get("failed"), dict) and isinstance(doc.get("usage"), dict)
                and all(isinstance(u, dict) and isinstance(u.get("images"), int) for u in doc["usage"].values())):
            raise BenchError(f"{LEDGER_FILE} on main is not a review ledger; restore it from the repo's history")
        self.ledger.update(failed=doc["failed"], usage=doc["usage"])
        self._ledger_read = canonical_json(self.ledger)

    def _charge(self, author: str, images: int, *, planned: bool = False) -> None:
        """Count ``images`` re-run for ``author`` today; ``planned``: only check that they fit (else ``Deferred``)."""
        today = datetime.now(UTC).date().isoformat()
        usage = self.ledger["usage"].get(author)
        used = usage["images"] if usage and usage.get("day") == today else 0
        if planned:
            if used and used + images > MAX_IMAGES_PER_DAY:
                raise Deferred(f"{author or 'this submitter'} has had {used:,} images re-run today; this pull request "
                               f"needs {images:,} more, over the {MAX_IMAGES_PER_DAY:,} a day: it is reviewed tomorrow")
            return
        self.ledger["usage"][author] = {"day": today, "images": used + images}

    # -- steps --------------------------------------------------------------------------------
    def _tree(self, rev: str) -> dict:
        return {f.path: f for f in self.api.list_repo_tree(self.repo_id, repo_type="dataset", revision=rev,
                                                            recursive=True) if isinstance(f, RepoFile)}

    def _changed_entries(self, pr_ref: str, head: str) -> tuple[dict[str, set], set[str], list[str]]:
        """The entries the PR changes since its merge base with main (entry -> its changed files), every file at
        the head, what it may not do."""
        from genshift.eval.results import MAX_PREDICTIONS_BYTES, MAX_RESULT_BYTES

        on_main = {c.commit_id for c in self.api.list_repo_commits(self.repo_id, repo_type="dataset")}
        base = next((c.commit_id for c in self.api.list_repo_commits(self.repo_id, repo_type="dataset",
                                                                      revision=pr_ref) if c.commit_id in on_main), None)
        if base is None:
            raise BenchError(f"{pr_ref} shares no history with main; open the pull request again from main")
        old, new = self._tree(base), self._tree(head)
        changed: dict[str, set] = {}
        problems = [f"deletes {p}: a submission only adds or replaces its own entry" for p in sorted(old.keys() - new)]
        for path, f in sorted(new.items()):
            if path in old and old[path].blob_id == f.blob_id:
                continue
            m = ENTRY_FILE.match(path) if len(path) <= MAX_PATH_CHARS else None
            if not m or {m.group(1), m.group(2)} & {".", ".."}:
                shown, stamp = path[:MAX_PATH_CHARS] + ("…" if len(path) > MAX_PATH_CHARS else ""), \
                    path.endswith("/verification.json")
                problems.append(f"changes {shown}: a submission may only add or replace <suite>/<model>/result.json "
                                f"and <suite>/<model>/predictions/*.parquet (paths of at most {MAX_PATH_CHARS} "
                                "characters), nothing else" + (" (verification stamps are written only by the "
                                                               "reviewer)" if stamp else ""))
                continue
            limit = MAX_RESULT_BYTES if m.group(3) == "result.json" else MAX_PREDICTIONS_BYTES
            if (f.size or 0) > limit:
                problems.append(f"{path} is {f.size / 2**20:.1f} MiB, over the {limit // 2**20} MiB limit")
            changed.setdefault(f"{m.group(1)}/{m.group(2)}", set()).add(path)
        problems += [f"{entry} has no result.json" for entry in sorted(changed) if f"{entry}/result.json" not in new]
        if len(changed) > MAX_ENTRIES_PER_PR:
            problems.insert(0, f"adds or changes {len(changed)} entries; at most {MAX_ENTRIES_PER_PR} per pull request "
                               "(each is re-run through its model): split it into several pull requests")
        if not changed and not problems:
            problems.append("the pull request adds no result")
        return changed, set(new), problems

    def _fetch(self, head: str, changed: dict[str, set], at_head: set[str],
               root: Path) -> tuple[dict[str, tuple[Path, dict]], list[str]]:
        """Each changed entry's result.json and the predictions it names, downloaded at the head: entry -> (path,
        result), and problems (a changed file it does not name is one)."""
        results, problems = {}, []
        for entry in sorted(changed):
            path = self._download(head, f"{entry}/result.json", root)
            try:
                result = parse_result(read_result_bytes(path), where=f"{entry}/result.json")
            except BenchError as e:
                problems.append(f"{entry}: {e}")
                continue
            results[entry] = (path, result)
            named = {f"{entry}/{p['path']}" for p in result["predictions"]}
            unnamed = changed[entry] - named - {f"{entry}/result.json"}
            problems += [f"changes {f}, which {entry}/result.json does not name: a submission adds only its result "
                         "and the predictions files it names" for f in sorted(unnamed)]
            for f in sorted(named & at_head):
                self._download(head, f, root)
        return results, problems

    def _download(self, rev: str, path: str, root: Path) -> Path:
        return Path(self.api.hf_hub_download(self.repo_id, path, repo_type="dataset", revision=rev, local_dir=root))

    def _owner_problem(self, entry: str, result: dict, main: str, root: Path) -> str:
        """Why ``result`` may not be filed as ``entry`` on ``main`` as it is now (another owner, its weights already
        there), or "". Main's entries (folder -> result, None if unreadable) are read once per commit of main."""
        if self._main_index[0] != main:
            index = {}
            for p in self._tree(main):
                m = ENTRY_FILE.match(p)
                if m and m.group(3) == "result.json":
                    folder = p.rsplit("/", 1)[0]
                    try:
                        index[folder] = parse_result(read_result_bytes(self._download(main, p, root)), where=p)
                    except BenchError:
                        index[folder] = None
            self._main_index = (main, index)
        index = self._main_index[1]
        if entry in index and (index[entry] is None or _board(index[entry]) != _board(result)):
            owner = index[entry]
            what = "an unreadable result" if owner is None else (
                f"{owner['model']['id']}" + (" under another suite version or protocol" if
                                             owner["model"]["id"] == result["model"]["id"] else ""))
            return (f"{entry}: replaces the entry of {what} with a result of {result['model']['id']} on "
                    f"{result['suite']['id']}; an entry is replaced only by the same model on the same suite data "
                    "under the same protocol")
        if same := _same_weights(result, index, entry):
            return (f"{entry}: the same weights (tensors sha256 {result['model']['tensors_sha256'][:12]}…) are already "
                    f"on the board as {index[same]['model']['id']}; one set of weights is one entry")
        return ""

    def _check(self, results: dict[str, tuple[Path, dict]], outcome: Outcome,
               main_root: Path) -> tuple[list[str], dict[str, dict]]:
        """Problems of the downloaded entries, and a signed stamp for each entry that passed."""
        problems, stamps, checked = [], {}, {}
        main = self.api.repo_info(self.repo_id, repo_type="dataset").sha
        for entry, (_, result) in sorted(results.items()):
            if why := misfiled(Path(entry, "result.json"), result):
                problems.append(f"{entry}: {why}")
            elif why := self._owner_problem(entry, result, main, main_root):
                problems.append(why)
            elif other := _same_weights(result, checked, entry):
                problems.append(f"{entry}: the same weights as {other} in this pull request; one set of weights is one "
                                "entry")
            else:
                checked[entry] = result
        if problems:
            return problems, {}
        plans = {}  # rows each re-run draws (docs/leaderboard.md, "What verified guarantees")
        for entry, result in checked.items():
            m = result["model"]  # weights the reviewer lacks make the PR unreviewable
            if m["source"] in ("module", "random"):
                raise BenchError(f"{m['id']} was scored with {m['source']} weights, which nobody else can load: "
                                 "publish them as a Hub model repo, or as a file a maintainer reviews with "
                                 "--checkpoint")
            if m["source"] == "checkpoint" and m["weights_sha256"] != self.checkpoint_sha256:
                mine, theirs = self.checkpoint_sha256, str(m["weights_sha256"])[:12]
                raise BenchError(f"{m['id']} was scored with local weights (sha256 {theirs}…) " + (
                    "that the reviewer does not have: publish the weights as a Hub model repo and score with them, or "
                    "ask a maintainer to review with those weights (--checkpoint)" if mine is None else
                    f"that are not the reviewer's --checkpoint ({mine[:12]}…): score with the published weights, or "
                    "ask a maintainer to review with yours"))
            # (Hub weights are fetched at the recorded revision: a missing repo raises from genshift.eval.models)
            full = (m["id"] in self.ledger["failed"] and outcome.pr not in self.again) or (
                self.recheck == "auto" and m["source"] == "hf-hub" and self.device.startswith("cuda"))
            plans[entry] = "all" if full else self.recheck
        planned = sum(verify.recheck_count(plans[e], sum(r["counts"][c]["total"] for c in r["suite"]["configs"]))
                      for e, r in checked.items())
        self._charge(outcome.author, planned, planned=True)
        for entry, result in sorted(checked.items()):
            # rows drawn now (recorded in the stamp); a model the Hub does not have (repo, revision or weights
            # missing, gated) makes the PR unreviewable
            m = result["model"]
            try:
                report = verify.verify_result(results[entry][0], recheck=plans[entry], suite=self.suite,
                                              suites=self.suites, device=self.device, batch_size=self.batch_size,
                                              checkpoint=self.checkpoint if m["source"] == "checkpoint" else None)
            except OfflineError:
                raise  # the reviewer's network: retried
            except BenchError as ex:
                raise BenchError(f"{entry}: {one_line(ex, 400)}") from None
            except (errors.RepositoryNotFoundError, errors.RevisionNotFoundError, errors.EntryNotFoundError) as ex:
                raise BenchError(f"{entry}: model {m['id']} is not available on the Hub at its recorded weights "
                                 f"({type(ex).__name__}: {first_line(ex, 160)}); "
                                 "publish the model repo (public) at that revision, or score a model that is") from None
            self._charge(outcome.author, (report.recheck or {}).get("n", 0))
            # the ledger's failed model ids: added by a re-run that disagreed, cleared by a full (or --again) one
            rows = (report.recheck or {}).get("disagreeing")
            if rows:
                self.ledger["failed"][m["id"]] = {"pr": outcome.pr, "disagreeing": rows, "n": report.recheck["n"]}
            elif rows == 0 and report.ok and (plans[entry] == "all" or outcome.pr in self.again):
                self.ledger["failed"].pop(m["id"], None)
            if not report.ok:
                problems += [f"{entry}: {p}" for p in report.problems[:20]]
                continue
            try:
                stamps[entry] = sign(make_stamp(report), self.key)
            except BenchError as ex:  # e.g. the suite it was checked against is not a trust root
                problems.append(f"{entry}: {ex}")
                continue
            outcome.checked += [f"{entry}: {c}" for c in report.checked]
        return problems, stamps

    def _comment(self, num: int, head: str, outcome: Outcome) -> None:
        if outcome.status == "passed":
            text = ("**Verification passed.** Every metric was recomputed from the stored predictions and rows drawn "
                    "from the suite were re-run through the model. " + (
                        f"Published to `main` as commit {outcome.merge_commit}, with a signed verification stamp per "
                        f"entry: exactly the files reviewed at {head}. This pull request is closed."
                        if outcome.merged else "Not published (a review without --merge).") + "\n\n"
                    + _block(outcome.checked))
            if outcome.model_prs or outcome.problems:
                text += "\n\n**Reported on the Hub model pages** (community results until the model owners merge " \
                        "them):\n\n" + _block(outcome.model_prs + outcome.problems)
        elif outcome.status == "deferred":
            text = f"**Not reviewed yet**: {outcome.problems[0]}"
        elif outcome.status == "unreviewable":
            text = ("**This pull request cannot be checked**, so it will not be merged as it is. What is missing:\n\n"
                    + _block(outcome.problems) + "\n\nThis head commit is not retried. Push a new commit once what is "
                    "missing is available; the new head is reviewed on the next run.")
        else:
            text = ("**Verification failed**; this pull request will not be merged as it is. What did not match:\n\n"
                    + _block(outcome.problems) + "\n\nFix the submission (re-run `bench eval`, then `bench submit`) "
                    "and push again; the new head commit is reviewed on the next run.")
        self.api.comment_discussion(self.repo_id, num, text + "\n\n" + self.marker(num, head, outcome.status),
                                    repo_type="dataset")


def review(repo_id: str, **kw) -> list[Outcome]:
    """One pass over the open pull requests (see the module docstring)."""
    return Reviewer(repo_id, **kw).run_once()


def watch(reviewer: Reviewer, interval: float, *, report, passes: int | None = None, sleep=time.sleep) -> None:
    """``report(reviewer.run_once())`` every ``interval`` seconds (``passes``: stop after that many); a failed pass
    (``BenchError``, e.g. the Hub unreachable) is logged and retried at the next."""
    for n in itertools.count(1):
        try:
            report(reviewer.run_once())
        except BenchError as e:
            log.warning("review pass failed (retried in %gs): %s", interval, e)
        if n == passes:
            return
        sleep(interval)
