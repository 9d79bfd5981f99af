"""``bench review``: verify every pull request on the results repo, sign, comment and merge.

For each open pull request on the results dataset repo (huggingface_hub's discussions API):

1. skip it if this service already reviewed it at its current head commit (a marker in its
   comment names the head), so reruns and crashed runs resume without repeating work;
2. list what the PR changes against the commit of ``main`` it branched from: only ``<suite>/<model>/result.json`` and
   ``<suite>/<model>/predictions/*.parquet`` may be added or changed (no deletions, no other files,
   no stamps of the submitter's own), each within the store's size limits;
3. download each changed entry at the PR head and check it exactly as the leaderboard store
   does (``leaderboard.store.load_store``: schema, hashes, every metric recomputed);
4. re-run a fresh random sample of images through the model at the recorded weights on the
   suite at the recorded manifest, checked against a trusted suite manifest
   (``eval.verify.verify_result`` with ``recheck``; the seed is drawn at review time and recorded
   in the stamp, so a submitter cannot know which images are re-run);
5. if everything passed, sign one verification stamp per entry with the maintainer key
   (``eval.stamps.make_stamp`` + ``sign``) and commit the stamps to the PR (``refs/pr/N``); comment the outcome
   (checks, images re-run, every mismatch) and, with ``merge``, merge the PR.

One PR's failure (a bad submission, a download error, a crash in a check) is recorded for that
PR and never stops the others. Comments quote data-derived text inside code blocks only.
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from benchmark.errors import BenchError, one_line

log = logging.getLogger(__name__)
MARKER = re.compile(r"<!-- genshift-review head=([0-9a-f]{7,64}) outcome=(passed|failed) -->")
ENTRY_FILE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)/([A-Za-z0-9][A-Za-z0-9._-]*)/"
                        r"(result\.json|predictions/[A-Za-z0-9][A-Za-z0-9._-]*\.parquet)$")


@dataclass
class Outcome:
    pr: int
    head: str = ""
    status: str = "error"        # "passed" | "failed" | "skipped" | "error"
    entries: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    merged: bool = False
    stamp_commit: str = ""
    model_prs: dict[str, str] = field(default_factory=dict)  # entry -> model-repo PR (--publish-model-results)


def _marker(head: str, outcome: str) -> str:
    return f"<!-- genshift-review head={head} outcome={outcome} -->"


def _block(lines: list[str]) -> str:
    """Data-derived lines inside a fenced block: the Hub renders comments as Markdown."""
    body = "\n".join(line.replace("```", "'''") for line in lines)
    return f"```text\n{body}\n```"


class Reviewer:
    def __init__(self, repo_id: str, *, key_path: str, recheck: int = 50, merge: bool = False,
                 suite: str | None = None, suites: str | None = None, checkpoint: str | None = None,
                 device: str = "cpu", endpoint: str | None = None, token: str | None = None,
                 work_dir: str | None = None, publish_model_results: bool = False):
        from huggingface_hub import HfApi

        from eval.stamps import load_private_key

        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*", repo_id or ""):
            raise BenchError(f"--repo {repo_id!r} is not a Hub repo id; give ORG/NAME of the results dataset repo")
        if recheck < 1:
            raise BenchError(f"--recheck must be at least 1 image, got {recheck}")
        self.repo_id, self.recheck, self.merge = repo_id, recheck, merge
        self.publish_model_results = publish_model_results  # leaderboard.hub_results, after a merge
        self.suite, self.checkpoint, self.device, self.work_dir = suite, checkpoint, device, work_dir
        self.key = load_private_key(key_path)
        self.api = HfApi(endpoint=endpoint, token=token)
        self.suites = None  # trusted suite manifests (eval.suite_trust); default: the registry's pinned ones
        if suites:
            from eval.suite_trust import TrustedSuites

            self.suites = TrustedSuites.from_paths([suites], registry=True, download=True)

    # -- one pass over the open pull requests ------------------------------------------------
    def run_once(self) -> list[Outcome]:
        from huggingface_hub import errors

        try:
            prs = [d for d in self.api.get_repo_discussions(self.repo_id, repo_type="dataset",
                                                            discussion_type="pull_request", discussion_status="open")]
        except errors.RepositoryNotFoundError:
            raise BenchError(f"results repo datasets/{self.repo_id} not found (or no access: set HF_TOKEN)") from None
        except (errors.HfHubHTTPError, OSError) as e:
            raise BenchError(f"cannot list the pull requests of datasets/{self.repo_id} "
                             f"({type(e).__name__}: {one_line(e, 200)})") from None
        out = []
        for d in sorted(prs, key=lambda d: d.num):
            try:
                out.append(self.review_pr(d.num))
            except Exception as e:  # noqa: BLE001 - one PR never stops the others; the next run retries it
                log.warning("PR #%d: %s: %s", d.num, type(e).__name__, e)
                out.append(Outcome(d.num, status="error", problems=[f"{type(e).__name__}: {e}"]))
        return out

    def review_pr(self, num: int) -> Outcome:
        pr_ref = f"refs/pr/{num}"
        head = self.api.repo_info(self.repo_id, repo_type="dataset", revision=pr_ref).sha
        outcome = Outcome(num, head=head)
        details = self.api.get_discussion_details(self.repo_id, num, repo_type="dataset")
        reviewed = dict(m for ev in details.events if ev.type == "comment"
                        for m in MARKER.findall(getattr(ev, "content", "") or ""))
        if head in reviewed:
            outcome.status = "skipped"
            if reviewed[head] == "passed" and self.merge and details.status == "open":
                self._merge(outcome)  # passed earlier, but the merge did not happen (e.g. run without --merge)
            return outcome
        base = self._merge_base(pr_ref)
        entries, problems = self._changed_entries(base, head)
        outcome.entries = sorted(entries)
        with tempfile.TemporaryDirectory(prefix=f"genshift-review-{num}-", dir=self.work_dir) as tmp:
            stamps: dict[str, dict] = {}
            if not problems:
                results = self._download(head, entries, Path(tmp))
                more, stamps = self._check(results, outcome)
                problems += more
            if problems:
                outcome.status, outcome.problems = "failed", problems
                self._comment(num, head, outcome)
                return outcome
            from huggingface_hub import CommitOperationAdd

            from benchmark.fsutil import canonical_json
            from eval.stamps import STAMP_FILE

            ops = [CommitOperationAdd(f"{entry}/{STAMP_FILE}", canonical_json(stamp)) for entry, stamp in stamps.items()]
            info = self.api.create_commit(self.repo_id, ops, repo_type="dataset", revision=pr_ref, parent_commit=head,
                                          commit_message=f"Verification stamps ({self.recheck} images re-run)")
            outcome.stamp_commit = info.oid
        outcome.status = "passed"
        self._comment(num, outcome.stamp_commit, outcome)
        if self.merge:
            self._merge(outcome)
        return outcome

    def _merge(self, outcome: Outcome) -> None:
        from huggingface_hub import errors

        try:
            self.api.merge_pull_request(self.repo_id, outcome.pr, repo_type="dataset",
                                        comment="Merged by `bench review`: every check passed.")
            outcome.merged = True
        except errors.HfHubHTTPError as e:  # e.g. a conflict: reported, retried on the next run
            outcome.problems.append(f"merge failed: {one_line(e, 200) or type(e).__name__}")
        if outcome.merged and self.publish_model_results:
            from leaderboard.hub_results import publish_reviewed

            publish_reviewed(self, outcome)

    # -- steps --------------------------------------------------------------------------------
    def _merge_base(self, pr_ref: str) -> str:
        """The newest commit of the PR's history that is also on main: the PR's changes are relative to it
        (main may have moved on since, e.g. by merging other submissions)."""
        on_main = {c.commit_id for c in self.api.list_repo_commits(self.repo_id, repo_type="dataset")}
        for c in self.api.list_repo_commits(self.repo_id, repo_type="dataset", revision=pr_ref):
            if c.commit_id in on_main:
                return c.commit_id
        raise BenchError(f"{pr_ref} shares no history with main")

    def _changed_entries(self, base: str, head: str) -> tuple[dict[str, list], list[str]]:
        from huggingface_hub.hf_api import RepoFile

        from leaderboard.store import MAX_PREDICTIONS_BYTES, MAX_RESULT_BYTES

        def tree(rev):
            return {f.path: f for f in self.api.list_repo_tree(self.repo_id, repo_type="dataset", revision=rev,
                                                                recursive=True) if isinstance(f, RepoFile)}
        old, new = tree(base), tree(head)
        entries: dict[str, list] = {}
        problems = [f"deletes {p}: a submission only adds or replaces its own entry" for p in sorted(set(old) - set(new))]
        for path, f in sorted(new.items()):
            if path in old and old[path].blob_id == f.blob_id:
                continue
            m = ENTRY_FILE.match(path)
            if not m:
                problems.append(f"changes {path}: a submission may only add <suite>/<model>/result.json and "
                                "<suite>/<model>/predictions/*.parquet (stamps are written by the reviewer)")
                continue
            limit = MAX_RESULT_BYTES if m.group(3) == "result.json" else MAX_PREDICTIONS_BYTES
            if (f.size or 0) > limit:
                problems.append(f"{path} is {f.size / 2**20:.1f} MiB, over the {limit // 2**20} MiB limit")
            entries.setdefault(f"{m.group(1)}/{m.group(2)}", [])
        for entry in entries:  # the whole entry is downloaded, changed files or not
            entries[entry] = sorted(p for p in new if p.startswith(entry + "/") and ENTRY_FILE.match(p))
            if f"{entry}/result.json" not in new:
                problems.append(f"{entry} has no result.json")
        if not entries and not problems:
            problems.append("the pull request adds no result")
        return entries, problems

    def _download(self, head: str, entries: dict[str, list], root: Path) -> dict[str, Path]:
        for files in entries.values():
            for f in files:
                self.api.hf_hub_download(self.repo_id, f, repo_type="dataset", revision=head, local_dir=root)
        return {entry: root / entry / "result.json" for entry in entries}

    def _check(self, results: dict[str, Path], outcome: Outcome) -> tuple[list[str], dict[str, dict]]:
        """Problems of the downloaded entries, and a signed stamp for each entry that passed."""
        from eval.stamps import make_stamp, sign
        from eval.verify import verify_result
        from leaderboard.store import load_store

        problems, stamps = [], {}
        root = next(iter(results.values())).parent.parent.parent if results else None
        store = load_store(str(root), suites=self.suites) if root else None  # the store's checks, on the PR's entries
        status = {e.path.resolve(): e for e in (store.entries + store.rejected + store.superseded if store else [])}
        for entry, path in sorted(results.items()):
            e = status.get(path.resolve())
            if e is None or e.status in ("rejected", "superseded"):
                problems.append(f"{entry}: rejected by the store: {e.reason if e else 'not loaded'}")
                continue
            # seed=None: verify_result draws a fresh seed and records it (report.recheck, then the stamp)
            report = verify_result(path, recheck=self.recheck, suite=self.suite, suites=self.suites,
                                   checkpoint=self.checkpoint, device=self.device)
            if not report.ok:
                problems += [f"{entry}: {p}" for p in report.problems[:20]]
                continue
            try:
                stamps[entry] = sign(make_stamp(report), self.key)
            except BenchError as e:  # e.g. the suite it was checked against is not a trust root
                problems.append(f"{entry}: {e}")
                continue
            outcome.checked += [f"{entry}: {c}" for c in report.checked]
        return problems, stamps

    def _comment(self, num: int, head: str, outcome: Outcome) -> None:
        if outcome.status == "passed":
            text = (f"**Verification passed.** Every metric was recomputed from the stored predictions and "
                    f"{self.recheck} randomly drawn images per entry were re-run through the model; a signed "
                    "verification stamp was added to each entry.\n\n" + _block(outcome.checked))
        else:
            text = ("**Verification failed**; this pull request will not be merged as it is. What did not match:\n\n"
                    + _block(outcome.problems) + "\n\nFix the submission (re-run `bench eval`, then `bench submit`) "
                    "and push again; the new head commit is reviewed on the next run.")
        self.api.comment_discussion(self.repo_id, num, text + "\n\n" + _marker(head, outcome.status),
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
