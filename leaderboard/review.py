"""``bench review``: verify every pull request on the results repo, sign, comment and merge.

For each open pull request on the results dataset repo (huggingface_hub's discussions API):

1. skip it if this service already answered it at its current head commit: a review marker, an
   ed25519 signature by the maintainer key over (repo, PR number, head sha, outcome), in a comment
   written by the reviewing account (when the Hub names it: ``HfApi.whoami``). A marker anyone
   else wrote, or one copied from another PR or another head, is not believed; a new push is
   reviewed again;
2. list what the PR changes against the commit of ``main`` it branched from: only
   ``<suite>/<model>/result.json`` and the ``<suite>/<model>/predictions/*.parquet`` files it names
   may be added or changed (no deletions, no other files, no stamps of the submitter's own: only
   this service's, from an earlier pass, next to a result the PR changes again), each within the
   store's size limits, at most ``MAX_ENTRIES_PER_PR`` entries;
3. download each changed entry at the PR head and check it exactly as the leaderboard store
   does (``genshift.leaderboard.store.load_store``: the folder is the one its result names
   (``genshift.eval.results.entry_dir``), schema, hashes, every metric recomputed); an entry already on
   ``main`` may only be replaced by a result of the same model id on the same suite;
4. re-run a fresh random sample of images through the model at the recorded weights on the
   suite at the recorded manifest, checked against a trusted suite manifest
   (``genshift.eval.verify.verify_result`` with ``recheck``; the seed is drawn at review time and recorded
   in the stamp, so a submitter cannot know which images are re-run);
5. if everything passed, sign one verification stamp per entry with the maintainer key
   (``genshift.eval.stamps.make_stamp`` + ``sign``) and commit the stamps to the PR (``refs/pr/N``); comment the
   outcome (checks, images re-run, every mismatch) and, with ``merge``, merge the PR. A PR that
   passed on an earlier run without ``merge`` is merged by a later one only after steps 2-3 are
   re-checked against ``main`` as it is then (no image re-run; ``_merge_later``).

Every PR gets a terminal answer at its head: ``passed``, ``failed`` (what did not match) or
``unreviewable`` (what the reviewer is missing to check it: a model that does not load, weights
it does not have); each is a comment with a signed marker, so it is not redone on the next pass.
A PR pushed to while it is reviewed gets no answer (``moved``: its stamps are not committed on top
of the unreviewed push) and is reviewed at its new head on the next run. Only a failure of the
service itself (the Hub unreachable, a crash in a check) leaves a PR without an answer, ``error``:
it is retried on the next run, and the CLI exits non-zero. One PR's outcome never stops the others. Comments quote data-derived text inside code blocks only.
"""

from __future__ import annotations

import logging
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from genshift.errors import BenchError, OfflineError, first_line, one_line

log = logging.getLogger(__name__)
MARKER_KIND = "genshift-review"
OUTCOMES = ("passed", "failed", "unreviewable")  # terminal answers, each signed
# the marker ends the comment; quoted text above it (in code blocks) can never be taken for it
MARKER = re.compile(r"<!-- genshift-review v=2 head=(?P<head>[0-9a-f]{7,64}) outcome=(?P<outcome>"
                    + "|".join(OUTCOMES) + r") key=(?P<key>[0-9a-f]{16}) sig=(?P<sig>[A-Za-z0-9+/]{86}==) -->\s*\Z")
MAX_ENTRIES_PER_PR = 20  # each entry is an image re-run: a bigger PR would hold the service for hours
ENTRY_FILE = re.compile(r"^([A-Za-z0-9._-]+)/([A-Za-z0-9._-]+)/"
                        r"(result\.json|predictions/[A-Za-z0-9][A-Za-z0-9._-]*\.parquet)$")


@dataclass
class Outcome:
    pr: int
    head: str = ""
    status: str = "error"        # "passed" | "failed" | "unreviewable" | "skipped" | "moved" | "error"
    entries: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    merged: bool = False
    stamp_commit: str = ""
    model_prs: dict[str, str] = field(default_factory=dict)  # entry -> model-repo PR (--publish-model-results)
    earlier: str = ""            # skipped: the outcome of the earlier review at this head


def _marker_body(repo_id: str, pr: int, head: str, outcome: str) -> dict:
    """What a review marker's signature covers: the answer is bound to one repo, one PR and one head."""
    return {"kind": MARKER_KIND, "version": 2, "repo": repo_id, "pr": pr, "head": head, "outcome": outcome}


MAX_COMMENT_LINES = 50  # a comment stays readable (and within the Hub's size limits) however big the PR


def _block(lines: list[str]) -> str:
    """Data-derived lines inside a fenced block: the Hub renders comments as Markdown. At most
    ``MAX_COMMENT_LINES`` lines of at most 500 characters; the rest is counted."""
    shown = [one_line(line, 500) for line in lines[:MAX_COMMENT_LINES]]
    if len(lines) > MAX_COMMENT_LINES:
        shown.append(f"… and {len(lines) - MAX_COMMENT_LINES} more")
    body = "\n".join(line.replace("```", "'''") for line in shown)
    return f"```text\n{body}\n```"


def _hub_failure(e: BaseException) -> bool:
    """True when ``e`` is the service's own failure (network, the Hub answering an error), not the submission's."""
    from huggingface_hub import errors

    from genshift.hubio import _unreachable

    return isinstance(e, (OfflineError, errors.HfHubHTTPError, OSError)) or _unreachable(e)


class Reviewer:
    def __init__(self, repo_id: str, *, key_path: str, recheck: int = 50, merge: bool = False,
                 suite: str | None = None, suites: str | None = None, checkpoint: str | None = None,
                 device: str = "cpu", endpoint: str | None = None, token: str | None = None,
                 work_dir: str | None = None, again: tuple[int, ...] = (), publish_model_results: bool = False):
        from cryptography.hazmat.primitives import serialization
        from huggingface_hub import HfApi

        from genshift.eval.stamps import PublicKey, key_id, load_private_key

        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*", repo_id or ""):
            raise BenchError(f"--repo {repo_id!r} is not a Hub repo id; give ORG/NAME of the results dataset repo")
        if recheck < 1:
            raise BenchError(f"--recheck must be at least 1 image, got {recheck}")
        self.repo_id, self.recheck, self.merge = repo_id, recheck, merge
        self.publish_model_results = publish_model_results  # genshift.leaderboard.hub_results, after a merge
        self.suite, self.checkpoint, self.device, self.work_dir = suite, checkpoint, device, work_dir
        self.again = set(again)  # PRs a maintainer asked to review again at their current head (e.g. with --checkpoint)
        try:
            self.key = load_private_key(key_path)
            self.checkpoint_sha256 = None
            if checkpoint:
                from genshift.fsutil import sha256_file

                if not Path(checkpoint).is_file():
                    raise BenchError(f"--checkpoint {checkpoint!r} does not exist; give the weights file results were "
                                     "scored with")
                self.checkpoint_sha256 = sha256_file(checkpoint)
        except OSError as e:  # e.g. no permission: the service cannot start, one line
            raise BenchError(f"cannot read {e.filename or key_path!r} ({e.strerror or type(e).__name__}); check the "
                             "file and its permissions") from None
        raw = self.key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.public = {key_id(raw): PublicKey(key_id(raw), raw, "reviewer")}  # the only key a marker may carry
        self.api = HfApi(endpoint=endpoint, token=token)
        self.account: str | None = None
        self._account_known = False
        self.suites = None  # trusted suite manifests (genshift.eval.suite_trust); default: the registry's pinned ones
        if suites:
            from genshift.eval.suite_trust import TrustedSuites

            self.suites = TrustedSuites.from_paths([suites], registry=True, download=True)

    # -- one pass over the open pull requests ------------------------------------------------
    def run_once(self) -> list[Outcome]:
        """Review every open PR. Raises ``BenchError`` only when the service cannot work at all (the Hub
        unreachable, the repo missing, an invalid token); one PR's failure is that PR's ``error`` outcome."""
        from huggingface_hub import errors

        try:
            self._whoami()
            prs = [d for d in self.api.get_repo_discussions(self.repo_id, repo_type="dataset",
                                                            discussion_type="pull_request", discussion_status="open")]
        except errors.RepositoryNotFoundError:
            raise BenchError(f"results repo datasets/{self.repo_id} not found (or no access: set HF_TOKEN)") from None
        except BenchError:
            raise
        except Exception as e:
            if not _hub_failure(e):
                raise
            raise BenchError(f"cannot list the pull requests of datasets/{self.repo_id} "
                             f"({type(e).__name__}: {one_line(e, 200)})") from None
        out = []
        for d in sorted(prs, key=lambda d: d.num):
            try:
                out.append(self.review_pr(d.num))
            except Exception as e:  # noqa: BLE001 - one PR never stops the others; the next run retries it
                log.warning("PR #%d: %s: %s", d.num, type(e).__name__, e)
                out.append(Outcome(d.num, status="error", problems=[f"{type(e).__name__}: {one_line(e, 300)}"]))
        return out

    def _whoami(self) -> None:
        """The reviewing account, once: only its comments can carry review markers (defence in depth
        behind the signatures). Without a token there is no account to compare with; signatures decide."""
        from huggingface_hub import errors

        if self._account_known:
            return
        try:
            self.account = self.api.whoami()["name"]
        except errors.LocalTokenNotFoundError:
            self.account = None
        except errors.HfHubHTTPError as e:
            if getattr(e.response, "status_code", None) == 401:
                raise BenchError("the Hub refused the token (401): set HF_TOKEN to a valid token with write access "
                                 f"to datasets/{self.repo_id}") from None
            raise
        self._account_known = True

    def review_pr(self, num: int) -> Outcome:
        head = self.api.repo_info(self.repo_id, repo_type="dataset", revision=f"refs/pr/{num}").sha
        outcome = Outcome(num, head=head)
        details = self.api.get_discussion_details(self.repo_id, num, repo_type="dataset")
        earlier = self.answers(num, details.events)
        if head in earlier and num not in self.again:
            outcome.status, outcome.earlier = "skipped", earlier[head]
            if earlier[head] == "passed" and self.merge and details.status == "open":
                self._merge_later(num, head, outcome)  # passed earlier, not merged then (e.g. run without --merge)
            return outcome
        with tempfile.TemporaryDirectory(prefix=f"genshift-review-{num}-", dir=self.work_dir) as tmp:
            try:
                problems, stamps = self._examine(num, head, outcome, Path(tmp))
            except Exception as e:
                if _hub_failure(e) or not isinstance(e, BenchError):
                    raise  # the service failed (network, a crash in a check): no answer, retried next run
                outcome.status, outcome.problems = "unreviewable", [one_line(e, 500)]
                self._comment(num, head, outcome)
                return outcome
            if problems:
                outcome.status, outcome.problems = "failed", problems
                self._comment(num, head, outcome)
                return outcome
            from huggingface_hub import CommitOperationAdd, errors

            from genshift.fsutil import canonical_json
            from genshift.eval.stamps import STAMP_FILE

            ops = [CommitOperationAdd(f"{entry}/{STAMP_FILE}", canonical_json(stamp)) for entry, stamp in stamps.items()]
            try:  # on top of the reviewed head only: the Hub refuses a stale parent (412)
                info = self.api.create_commit(self.repo_id, ops, repo_type="dataset", revision=f"refs/pr/{num}",
                                              parent_commit=head,
                                              commit_message=f"Verification stamps ({self.recheck} images re-run)")
            except errors.HfHubHTTPError as e:
                if getattr(e.response, "status_code", None) not in (409, 412):
                    raise
                # pushed to during the review: a submission's doing, not the service's failure; no answer
                outcome.status = "moved"
                outcome.problems = ["the head moved during the review; the new head is reviewed on the next run"]
                return outcome
            outcome.stamp_commit = info.oid
        outcome.status = "passed"
        self._comment(num, outcome.stamp_commit, outcome)
        if self.merge:
            self._merge(outcome)
        return outcome

    # -- review markers -----------------------------------------------------------------------
    def marker(self, num: int, head: str, outcome: str) -> str:
        """The hidden line that ends a review comment: the outcome at ``head``, signed by the maintainer key."""
        from genshift.eval.stamps import sign

        sig = sign(_marker_body(self.repo_id, num, head, outcome), self.key)["signature"]
        return f"<!-- genshift-review v=2 head={head} outcome={outcome} key={sig['key_id']} sig={sig['value']} -->"

    def answers(self, num: int, events) -> dict[str, str]:
        """head sha -> outcome of this service's own earlier answers on PR ``num``: markers in comments by the
        reviewing account whose signature by the maintainer key covers this repo, this PR, that head and that
        outcome. Anything else (unsigned, another key, copied from another PR, edited) is ignored."""
        from genshift.eval.stamps import check_signature

        out = {}
        for ev in events:
            if ev.type != "comment" or (self.account is not None and ev.author != self.account):
                continue
            m = MARKER.search(getattr(ev, "content", "") or "")
            if m is None:
                continue
            signed = {**_marker_body(self.repo_id, num, m["head"], m["outcome"]),
                      "signature": {"algorithm": "ed25519", "key_id": m["key"], "value": m["sig"]}}
            if check_signature(signed, self.public) is None:
                out[m["head"]] = m["outcome"]
        return out

    def _merge_later(self, num: int, head: str, outcome: Outcome) -> None:
        """Merge a PR that passed on an earlier run. ``main`` may have moved on since, so what the PR changes is
        listed again and its ownership re-checked against ``main`` as it is now (no image re-run: ``head`` is the
        stamped commit that was reviewed). A PR that would now replace another model's entry gets a new
        ``failed`` answer at this head instead of the merge; one that still owns its folders is merged, and its
        entries are known to the publishing step."""
        with tempfile.TemporaryDirectory(prefix=f"genshift-review-{num}-", dir=self.work_dir) as tmp:
            changed, existing, _, problems = self._changed_entries(self._merge_base(f"refs/pr/{num}"), head,
                                                                   stamped=True)
            outcome.entries = sorted(changed)
            for entry in [] if problems else outcome.entries:
                ids = self._owner(entry, head, Path(tmp) / "head")
                if ids is None:
                    problems.append(f"{entry}/result.json at the reviewed head cannot be read")
                elif why := self._replaces_other(entry, ids, existing.get(entry, ()), Path(tmp) / "main"):
                    problems.append(why)
        if problems:
            outcome.status, outcome.earlier, outcome.problems = "failed", "", problems
            self._comment(num, head, outcome)
            return
        self._merge(outcome)

    def _merge(self, outcome: Outcome) -> None:
        from huggingface_hub import errors

        reviewed = outcome.stamp_commit or outcome.head
        now = self.api.repo_info(self.repo_id, repo_type="dataset", revision=f"refs/pr/{outcome.pr}").sha
        if now != reviewed:  # pushed to after the review: the next run reviews the new head
            outcome.problems.append(f"not merged: the head moved to {now[:12]} after the review")
            return
        try:
            self.api.merge_pull_request(self.repo_id, outcome.pr, repo_type="dataset",
                                        comment="Merged by `bench review`: every check passed.")
            outcome.merged = True
        except errors.HfHubHTTPError as e:  # e.g. a conflict: reported, retried on the next run
            outcome.problems.append(f"merge failed: {one_line(e, 200) or type(e).__name__}")
        if outcome.merged and self.publish_model_results:
            from genshift.leaderboard.hub_results import publish_reviewed

            publish_reviewed(self, outcome)

    # -- steps --------------------------------------------------------------------------------
    def _examine(self, num: int, head: str, outcome: Outcome, root: Path) -> tuple[list[str], dict[str, dict]]:
        """What is wrong with PR ``num`` at ``head`` (empty: nothing) and a signed stamp per entry. Raises
        ``BenchError`` when it cannot be checked (what the reviewer is missing)."""
        base = self._merge_base(f"refs/pr/{num}")
        changed, existing, at_head, problems = self._changed_entries(base, head)
        outcome.entries = sorted(changed)
        if problems:
            return problems, {}
        results, problems = self._fetch(head, changed, at_head, root / "head")
        if problems:
            return problems, {}
        return self._check(results, outcome, existing, root / "main")

    def _merge_base(self, pr_ref: str) -> str:
        """The newest commit of the PR's history that is also on main: the PR's changes are relative to it
        (main may have moved on since, e.g. by merging other submissions)."""
        on_main = {c.commit_id for c in self.api.list_repo_commits(self.repo_id, repo_type="dataset")}
        for c in self.api.list_repo_commits(self.repo_id, repo_type="dataset", revision=pr_ref):
            if c.commit_id in on_main:
                return c.commit_id
        raise BenchError(f"{pr_ref} shares no history with main; open the pull request again from main")

    def _changed_entries(self, base: str, head: str, *, stamped: bool = False
                         ) -> tuple[dict[str, set], dict[str, list], set[str], list[str]]:
        """The entries the PR adds or changes (entry -> its changed files), those of them already on main (entry ->
        the commits holding it: the PR's base and main now, which may have moved on), every file at the head, and
        what the PR may not do. ``stamped``: ``head`` is this service's own stamp commit (its signed answer says
        so), whose stamps are the reviewer's."""
        from huggingface_hub.hf_api import RepoFile

        from genshift.eval.stamps import STAMP_FILE
        from genshift.leaderboard.store import MAX_PREDICTIONS_BYTES, MAX_RESULT_BYTES

        def tree(rev):
            return {f.path: f for f in self.api.list_repo_tree(self.repo_id, repo_type="dataset", revision=rev,
                                                                recursive=True) if isinstance(f, RepoFile)}
        old, new = tree(base), tree(head)
        changed: dict[str, set] = {}
        stamp_files: list[str] = []
        problems = [f"deletes {p}: a submission only adds or replaces its own entry" for p in sorted(set(old) - set(new))]
        for path, f in sorted(new.items()):
            if path in old and old[path].blob_id == f.blob_id:
                continue
            m = ENTRY_FILE.match(path)
            if path.endswith("/" + STAMP_FILE):
                if not stamped:
                    stamp_files.append(path)  # checked below, once the changed results are known
                continue
            if not m or {m.group(1), m.group(2)} & {".", ".."}:
                problems.append(f"changes {path}: a submission may only add or replace <suite>/<model>/result.json "
                                "and <suite>/<model>/predictions/*.parquet, nothing else")
                continue
            limit = MAX_RESULT_BYTES if m.group(3) == "result.json" else MAX_PREDICTIONS_BYTES
            if (f.size or 0) > limit:
                problems.append(f"{path} is {f.size / 2**20:.1f} MiB, over the {limit // 2**20} MiB limit")
            changed.setdefault(f"{m.group(1)}/{m.group(2)}", set()).add(path)
        # the reviewer's own stamps from an earlier pass of this PR may stay next to a result the PR changes
        # again: that entry is re-stamped if it passes (or not merged); any other stamp is the submitter's
        too_many = len(changed) > MAX_ENTRIES_PER_PR  # then no stamp is downloaded: the PR fails anyway
        problems += [f"changes {p}: verification stamps are written only by the reviewer" for p in stamp_files
                     if f"{p.rsplit('/', 1)[0]}/result.json" not in changed.get(p.rsplit("/", 1)[0], ())
                     or not (too_many or self._signed_by_reviewer(head, new[p]))]
        problems += [f"{entry} has no result.json" for entry in sorted(changed) if f"{entry}/result.json" not in new]
        if too_many:
            problems.insert(0, f"adds or changes {len(changed)} entries; at most {MAX_ENTRIES_PER_PR} per pull request "
                               "(each is re-run through its model): split it into several pull requests")
        if not changed and not problems:
            problems.append("the pull request adds no result")
        main = self.api.repo_info(self.repo_id, repo_type="dataset").sha
        trees = {base: old, **({main: tree(main)} if main != base else {})}
        existing = {e: revs for e in changed if (revs := [r for r, t in trees.items() if f"{e}/result.json" in t])}
        return changed, existing, set(new), problems

    def _signed_by_reviewer(self, head: str, f) -> bool:
        """True when the file ``f`` at ``head`` is a stamp signed by this service's key."""
        from genshift.fsutil import parse_json
        from genshift.eval.stamps import MAX_STAMP_BYTES, STAMP_KIND, check_signature

        if (f.size or 0) > MAX_STAMP_BYTES:
            return False
        with tempfile.TemporaryDirectory(prefix="genshift-review-stamp-", dir=self.work_dir) as tmp:
            raw = self._download(head, f.path, Path(tmp)).read_bytes()
        try:
            stamp = parse_json(raw, where=f.path, max_bytes=MAX_STAMP_BYTES)
        except BenchError:
            return False
        return isinstance(stamp, dict) and stamp.get("kind") == STAMP_KIND and check_signature(stamp, self.public) is None

    def _fetch(self, head: str, changed: dict[str, set], at_head: set[str],
               root: Path) -> tuple[dict[str, Path], list[str]]:
        """Download each changed entry at the head: its result.json, then the predictions files it names
        (nothing else). A changed file that the entry's result does not name is a problem."""
        from genshift.eval.results import parse_result

        results, problems = {}, []
        for entry in sorted(changed):
            results[entry] = path = self._download(head, f"{entry}/result.json", root)
            try:
                named = [f"{entry}/{p['path']}" for p in parse_result(path.read_bytes(), where=str(path))["predictions"]]
            except BenchError:
                continue  # the store check below rejects it, with the reason
            problems += [f"changes {f}, which {entry}/result.json does not name: a submission adds only its result "
                         "and the predictions files it names" for f in sorted(changed[entry] - {f"{entry}/result.json", *named})]
            for f in named:
                if f in at_head and ENTRY_FILE.match(f):
                    self._download(head, f, root)
        return results, problems

    def _download(self, rev: str, path: str, root: Path) -> Path:
        return Path(self.api.hf_hub_download(self.repo_id, path, repo_type="dataset", revision=rev, local_dir=root))

    def _owner(self, entry: str, rev: str, root: Path) -> tuple[str, str] | None:
        """(model id, suite id) of the entry as it is on main at ``rev``, or None if that result cannot be read."""
        from genshift.eval.results import MAX_RESULT_BYTES
        from genshift.fsutil import parse_json

        path = self._download(rev, f"{entry}/result.json", root)
        try:
            r = parse_json(path.read_bytes(), where=f"{entry}/result.json on main", max_bytes=MAX_RESULT_BYTES)
            return str(r["model"]["id"]), str(r["suite"]["id"])
        except (BenchError, KeyError, TypeError):
            return None

    def _replaces_other(self, entry: str, ids: tuple[str, str], revs, root: Path) -> str | None:
        """Why the entry with ``ids`` (model id, suite id) may not replace ``entry`` as it is at the commits
        ``revs`` of main, or None: an entry on main is replaced only by a result of the same model on the same suite."""
        others = {self._owner(entry, rev, root / rev) for rev in revs} - {ids}
        if not others:
            return None
        owner = next(iter(others))
        return (f"{entry}: replaces the entry of {owner[0] if owner else 'an unreadable result'} with a result of "
                f"{ids[0]} on {ids[1]}; a submission may replace only an entry of its own model id and suite")

    def _check(self, results: dict[str, Path], outcome: Outcome, existing: dict[str, list],
               base_root: Path) -> tuple[list[str], dict[str, dict]]:
        """Problems of the downloaded entries, and a signed stamp for each entry that passed."""
        from genshift.eval.stamps import make_stamp, sign
        from genshift.leaderboard.store import load_store

        problems, stamps = [], {}
        root = next(iter(results.values())).parent.parent.parent
        store = load_store(str(root), suites=self.suites)  # the store's checks (folder = result ids), on the PR's entries
        status = {e.path.resolve(): e for e in store.entries + store.rejected + store.superseded}
        for entry, path in sorted(results.items()):
            e = status.get(path.resolve())
            if e is None or e.status in ("rejected", "superseded"):
                problems.append(f"{entry}: rejected by the store: {e.reason if e else 'not loaded'}")
                continue
            if why := self._replaces_other(entry, (e.model_id, e.suite_id), existing.get(entry, ()), base_root):
                problems.append(why)
                continue
            self._can_rerun(entry, e.result)
            report = self._rerun(entry, path, e.model_id)
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

    def _rerun(self, entry: str, path: Path, model_id: str):
        """``verify_result`` with a fresh re-run of images (seed=None: drawn now, recorded in the stamp). A model
        the Hub does not have (repo, revision or weights file missing, gated) makes the PR unreviewable."""
        from huggingface_hub import errors

        from genshift.eval.verify import verify_result

        try:
            return verify_result(path, recheck=self.recheck, suite=self.suite, suites=self.suites,
                                 checkpoint=self.checkpoint, device=self.device)
        except OfflineError:
            raise  # the reviewer's network: retried
        except BenchError as ex:
            raise BenchError(f"{entry}: {one_line(ex, 400)}") from None
        except (errors.RepositoryNotFoundError, errors.RevisionNotFoundError, errors.EntryNotFoundError) as ex:
            raise BenchError(f"{entry}: model {model_id} is not available on the Hub at its recorded weights "
                             f"({type(ex).__name__}: {first_line(ex, 160)}); "
                             "publish the model repo (public) at that revision, or score a model that is") from None

    def _can_rerun(self, entry: str, result: dict) -> None:
        """Raise ``BenchError`` (the PR is unreviewable) when the reviewer lacks the weights the entry was scored with."""
        m = result["model"]
        if m["source"] != "checkpoint":
            return  # Hub weights: fetched at the recorded revision (a missing repo raises from genshift.eval.models)
        if self.checkpoint_sha256 is None:
            raise BenchError(f"{entry} was scored with local weights (sha256 {str(m['weights_sha256'])[:12]}…) that "
                             "the reviewer does not have: publish the weights as a Hub model repo and score with "
                             "them, or ask a maintainer to review with those weights (--checkpoint)")
        if m["weights_sha256"] != self.checkpoint_sha256:
            raise BenchError(f"{entry} was scored with local weights of sha256 {str(m['weights_sha256'])[:12]}…, not "
                             f"the reviewer's --checkpoint ({self.checkpoint_sha256[:12]}…): score with the published "
                             "weights, or ask a maintainer to review with yours")

    def _comment(self, num: int, head: str, outcome: Outcome) -> None:
        if outcome.status == "passed":
            text = (f"**Verification passed.** Every metric was recomputed from the stored predictions and "
                    f"{self.recheck} randomly drawn images per entry were re-run through the model; a signed "
                    "verification stamp was added to each entry.\n\n" + _block(outcome.checked))
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


def watch(reviewer: Reviewer, interval: float, *, report, passes: int | None = None) -> None:
    """Review every ``interval`` seconds; a failed pass (e.g. the Hub unreachable) is reported and retried."""
    n = 0
    while passes is None or n < passes:
        try:
            report(reviewer.run_once())
        except BenchError as e:
            log.warning("review pass failed: %s", e)
            report([])
        n += 1
        if passes is None or n < passes:
            time.sleep(interval)
