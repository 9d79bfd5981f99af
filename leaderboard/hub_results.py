"""Results where the field looks for them (``docs/hub.md``, section 9): :func:`publish_entry` reports an entry of
the results repo on its model repo as ``.eval_results/<suite id>.yaml`` (a pull request; "verified" only with a
trusted stamp over these files and the repo's own weights); :func:`hub_reported` reads the benchmark's Hub
leaderboard as the board's separate, never-ranked rows, each bounded and type-checked.
"""

from __future__ import annotations

import math
import re
import tempfile
from pathlib import Path

import yaml
from huggingface_hub import CommitOperationAdd, EvalResultEntry, HfApi, errors, eval_result_entries_to_yaml

from genshift.errors import BenchError, one_line
from genshift.eval.results import MAX_PREDICTIONS_BYTES, MAX_RESULT_BYTES, parse_result
from genshift.eval.stamps import MAX_STAMP_BYTES, STAMP_FILE, check_stamp
from genshift.families import get_family
from genshift.fsutil import read_limited, sha256_bytes
from genshift.hub import EVAL_YAML, MAX_EVAL_YAML_BYTES, parse_eval_yaml
from genshift.hubio import SHA_RE, is_repo_id

MAX_HUB_ROWS = 500            # leaderboard rows read from the Hub
MAX_HUB_TEXT = 300            # any string field of a Hub row
TITLE = "genshift-bench: {suite} results"  # one open PR per (model repo, suite) carries exactly this title
URL_RE = re.compile(r"^https?://[^\s<>\"'`]{1,280}$")


def task_values(result: dict) -> dict[str, float]:
    """Each task's value in percent, read off the result by its family's declaration (``genshift.families``: the
    board's columns); undefined values are left out."""
    s = result["suite"]
    family = get_family(s["metric_family"])
    cols = family.columns(result)
    out = {}
    for t in family.tasks(list(s["configs"]), result["protocol"]["scoring"].get("reference_config")):
        v = cols.get(t.column)
        if v is not None and math.isfinite(float(v)):
            out[t.id] = round(100.0 * float(v), 4)
    if not out:
        raise BenchError("the result holds no value of its suite's tasks")
    return out


def build_entries(result: dict, *, stamp: dict | None, source_url: str, declared: set[str]):
    """The ``EvalResultEntry`` list for one complete result pinned to a Hub suite (``docs/hub.md``)."""
    s = result["suite"]
    if result["flags"].get("partial"):
        raise BenchError("partial results (--limit-per-class or a subset of configs) are not reported to model pages; "
                         "evaluate every config without --limit-per-class")
    if result["flags"].get("unpinned_suite") or not SHA_RE.match(str(s.get("revision") or "")) \
            or not is_repo_id(str(s.get("repo_id") or "")):
        raise BenchError(f"the result was not scored on a Hub dataset repo pinned to a commit (suite {s['id']!r}); "
                         "evaluate with --suite ORG/NAME --revision <sha> (or a pinned registry suite)")
    values = task_values(result)
    missing = sorted(set(values) - declared)
    if missing:
        raise BenchError(f"datasets/{s['repo_id']}'s eval.yaml does not declare task(s) {', '.join(missing)}; "
                         "republish the suite with `bench publish` (it writes eval.yaml)")
    p, run, mask = result["protocol"], result.get("run") or {}, s.get("mask") or {}
    notes = [f"preprocess {p.get('preprocess', 'timm')}", f"mask {mask.get('source', 'none') if mask else 'n/a'}",
             f"amp {run.get('amp_dtype') or 'on'}" if run.get("amp") else "fp32",
             "kept rows only" if p["scoring"].get("filter", True) else "all rows"]
    if stamp is None:
        notes.append("not verified by genshift-bench")
    else:
        key = str((stamp.get("signature") or {}).get("key_id", "?"))[:16]
        notes.append(f"verified by genshift-bench: stamp key {key}, {stamp['recheck']['n']} images re-run, "
                     f"seed {stamp['recheck']['seed']}")
    return [EvalResultEntry(dataset_id=s["repo_id"], task_id=task, value=value, dataset_revision=s["revision"],
                            date=result["finished_at"], source_url=source_url, source_name="genshift-bench results",
                            notes="; ".join(notes)) for task, value in values.items()]


def declared_tasks(api, dataset_id: str) -> set[str]:
    """The task ids the benchmark's ``eval.yaml`` declares on its ``main`` (what the Hub reads)."""
    try:
        path = api.hf_hub_download(dataset_id, EVAL_YAML, repo_type="dataset", revision="main")
    except errors.EntryNotFoundError:
        raise BenchError(f"datasets/{dataset_id} has no {EVAL_YAML}, so the Hub does not treat it as a benchmark; "
                         "publish the suite with `bench publish` (it writes eval.yaml)") from None
    except (errors.HfHubHTTPError, OSError) as e:
        raise BenchError(f"cannot read datasets/{dataset_id}/{EVAL_YAML} ({type(e).__name__}: "
                         f"{one_line(e, 160)})") from None
    doc = parse_eval_yaml(read_limited(path, max_bytes=MAX_EVAL_YAML_BYTES, what=EVAL_YAML),
                          where=f"datasets/{dataset_id}/{EVAL_YAML}")
    return {t["id"] for t in doc["tasks"]}


def _read_entry(api, results_repo: str, prefix: str, revision: str, root: Path, trusted: dict):
    """``(result, stamp or None, result sha256)`` of ``<prefix>/`` of the results repo at ``revision``; the stamp
    only if signed by a ``trusted`` key for exactly these files."""
    files = {f for f in api.list_repo_files(results_repo, repo_type="dataset", revision=revision)
             if f.startswith(prefix + "/")}
    if f"{prefix}/result.json" not in files:
        raise BenchError(f"datasets/{results_repo}@{revision[:12]} has no entry {prefix}/ (result.json); submit it "
                         f"with `bench submit RESULT --repo {results_repo}` and have it merged first")

    def get(name: str, limit: int) -> bytes:
        p = api.hf_hub_download(results_repo, f"{prefix}/{name}", repo_type="dataset", revision=revision,
                                local_dir=root)
        return read_limited(p, max_bytes=limit, what=name)

    raw = get("result.json", MAX_RESULT_BYTES)
    result_sha256 = sha256_bytes(raw)
    result = parse_result(raw, where=f"{results_repo}/{prefix}/result.json")
    stamp = None
    if f"{prefix}/{STAMP_FILE}" in files and trusted:
        # hashed from the bytes already read (bounded), not read from disk a second time
        preds = {p["path"]: sha256_bytes(get(p["path"], MAX_PREDICTIONS_BYTES)) for p in result["predictions"]}
        stamp, _why = check_stamp(get(STAMP_FILE, MAX_STAMP_BYTES), result_sha256=result_sha256,
                                  predictions_sha256=preds, trusted=trusted)
    return result, stamp, result_sha256


def open_or_update_pr(api, model_repo: str, path_in_repo: str, data: bytes, *, title: str,
                      description: str) -> tuple[str, str]:
    """``(pr url, "opened" | "updated" | "unchanged")``: the token's user's open PR with ``title`` gets a new commit
    when the file differs, else a new PR is opened."""
    try:
        me = api.whoami().get("name")
    except (OSError, errors.HfHubHTTPError, ValueError) as e:  # no token, or a refused one
        raise BenchError(f"opening a pull request on {model_repo} needs a token with write access (`hf auth login` or "
                         f"HF_TOKEN): {one_line(e, 120)}") from None
    mine = [d for d in api.get_repo_discussions(model_repo, discussion_type="pull_request", discussion_status="open")
            if d.title == title and d.author == me]
    op = CommitOperationAdd(path_in_repo, data)
    if mine:
        pr = min(mine, key=lambda d: d.num)
        url = f"{api.endpoint}/{model_repo}/discussions/{pr.num}"
        try:
            current = Path(api.hf_hub_download(model_repo, path_in_repo, revision=pr.git_reference)).read_bytes()
        except (errors.EntryNotFoundError, errors.HfHubHTTPError, OSError):  # absent (or unreadable): write it
            current = None
        if current == data:
            return url, "unchanged"
        api.create_commit(model_repo, [op], revision=pr.git_reference, commit_message=f"Update {path_in_repo}")
        return url, "updated"
    info = api.create_commit(model_repo, [op], create_pr=True, commit_message=title, commit_description=description)
    return info.pr_url, "opened"


def publish_entry(results_repo: str, prefix: str, *, model_repo: str | None = None, trusted: dict | None = None,
                  revision: str = "main", expect_sha256: str | None = None, endpoint: str | None = None,
                  token: str | None = None, api=None) -> tuple[str, str]:
    """Open (or update) the model-repo PR for the results-repo entry ``prefix``; ``(url, what happened)``.
    ``model_repo``: default the result's Hub model id; ``expect_sha256``: the entry's result.json must be this."""
    api = api or HfApi(endpoint=endpoint, token=token)
    try:
        sha = api.dataset_info(results_repo, revision=revision).sha
        with tempfile.TemporaryDirectory(prefix="genshift-hub-results-") as tmp:
            result, stamp, result_sha = _read_entry(api, results_repo, prefix, sha, Path(tmp), trusted or {})
        if expect_sha256 and result_sha != expect_sha256:
            raise BenchError(f"{prefix}/result.json in datasets/{results_repo} is not this result (another run of the "
                             "same model); submit this one first, or pass the merged one")
        m, s, hub = result["model"], result["suite"], result["model"]["source"] == "hf-hub"
        model_repo = model_repo or (m["id"] if hub else None)
        if not model_repo or not is_repo_id(model_repo):
            raise BenchError(f"model {str(m['id'])[:80]!r} is not a Hub model repo; pass --model-repo ORG/NAME")
        if hub and model_repo != m["id"]:  # another model's numbers on this page: never
            raise BenchError(f"the entry is a result of the Hub model {m['id']}, not {model_repo}; it is reported only "
                             f"on its own model repo (--model-repo {m['id']})")
        stamp = stamp if hub else None  # it vouches for local weights by hash; nothing ties them to this repo's files
        source_url = f"{api.endpoint}/datasets/{results_repo}/tree/{sha}/{prefix}"
        entries = build_entries(result, stamp=stamp, source_url=source_url, declared=declared_tasks(api, s["repo_id"]))
        desc = (f"Adds `.eval_results/{s['id']}.yaml`: {m['id']} on the genshift-bench suite "
                f"[{s['repo_id']}]({api.endpoint}/datasets/{s['repo_id']}) at `{s['revision']}`. Per-image "
                f"predictions: {source_url}. " + ("Verified: a genshift-bench maintainer re-ran images through the "
                                                  "model and signed the entry." if stamp else
                                                  "Not verified by genshift-bench."))
        data = yaml.safe_dump(eval_result_entries_to_yaml(entries), sort_keys=False, allow_unicode=True).encode()
        return open_or_update_pr(api, model_repo, f".eval_results/{s['id']}.yaml", data,
                                 title=TITLE.format(suite=s["id"]), description=desc)
    except errors.RepositoryNotFoundError as e:
        raise BenchError(f"a repository was not found or is not accessible ({one_line(e, 160)}); check the ids and "
                         "HF_TOKEN") from None
    except errors.HfHubHTTPError as e:
        raise BenchError(f"the Hub refused the model-repo pull request: {one_line(e, 200)}") from None
    except OSError as e:
        raise BenchError(f"cannot reach the Hub ({type(e).__name__}); check the network") from None


# -- the Hub's side, on the board --------------------------------------------------------------
HUB_COLUMNS = ("hub rank", "model", "value", "status", "notes", "source")


def _text(v, what: str) -> str:
    if not isinstance(v, str) or len(v) > MAX_HUB_TEXT or any(ord(c) < 32 for c in v):
        raise ValueError(f"{what} is not a short single-line string")
    return v


def hub_row(e) -> dict:
    """One ``DatasetLeaderboardEntry`` -> a board row; ``ValueError`` naming what is wrong."""
    model = _text(e.model_id, "modelId")
    if not is_repo_id(model):
        raise ValueError(f"modelId {model[:60]!r} is not a repo id")
    if isinstance(e.value, bool) or not isinstance(e.value, (int, float)) or not math.isfinite(e.value) \
            or abs(e.value) > 1e6:
        raise ValueError(f"value {str(e.value)[:40]!r} of {model} is not a finite number")
    url = e.source.get("url") if isinstance(e.source, dict) else None
    if url is not None and not (isinstance(url, str) and URL_RE.match(url)):
        raise ValueError(f"source url of {model} is not an http(s) URL")
    pr = e.pull_request
    if pr is not None and (isinstance(pr, bool) or not isinstance(pr, int) or pr < 0):
        raise ValueError(f"pullRequest of {model} is not a number")
    notes = "" if e.notes is None else _text(e.notes, "notes")
    return {"hub rank": int(e.rank) if isinstance(e.rank, int) and not isinstance(e.rank, bool) else None,
            "model": model, "value": float(e.value),
            "status": f"community (open PR #{pr})" if pr is not None else "on the model page",
            "notes": notes, "source": url or ""}


def hub_reported(dataset_id: str, *, endpoint: str | None = None, token: str | None = None, api=None):
    """``(rows, problems)``: the benchmark's Hub leaderboard as board rows (community, never ranked) and one line
    per dropped row or failed request."""
    api = api or HfApi(endpoint=endpoint, token=token)
    try:
        raw = api.get_dataset_leaderboard(dataset_id, base_model_only=False, timeout=30)
    except Exception as e:  # noqa: BLE001 - the board never fails on the Hub's side (a malformed payload included)
        return [], [f"the Hub leaderboard of {dataset_id} cannot be read ({type(e).__name__}: {one_line(e, 160)}); "
                    "no Hub-reported rows shown"]
    rows, problems = [], []
    for i, item in enumerate(raw[:MAX_HUB_ROWS]):
        try:
            rows.append(hub_row(item))
        except Exception as e:  # noqa: BLE001 - one hostile row is one line
            problems.append(f"Hub row {i + 1} of {dataset_id} dropped: {one_line(e, 160)}")
    if len(raw) > MAX_HUB_ROWS:
        problems.append(f"the Hub leaderboard of {dataset_id} has {len(raw)} rows; the first {MAX_HUB_ROWS} are shown")
    return rows, problems

