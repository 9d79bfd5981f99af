"""Suites on the Hub (``docs/hub.md``): open any suite the user names, download one at a pinned commit (through
``genshift.hubio``), publish a build (one commit, or resumably in several; tagged; gated when its card asks) with the
``eval.yaml`` that makes its dataset repo a benchmark on the Hub (section 9: one task per headline metric of the suite's
family, ``Family.tasks``)."""

from __future__ import annotations

import logging
from pathlib import Path

import yaml
from pydantic import Field

from genshift import hubio, upstream
from genshift.errors import BenchError, IntegrityError, OfflineError, first_line, unknown
from genshift.families import Task, get_family
from genshift.fsutil import atomic_write_bytes, load_yaml, read_limited
from genshift.hubio import is_repo_id, resolve_revision, snapshot  # noqa: F401 - re-exported
from genshift.schema import Schema, Text, validate
from genshift.suite_format import CARD, EVAL_YAML, MANIFEST, SPLIT, LocalSuite
from genshift.suites import SUITES, declared_scoring

log = logging.getLogger(__name__)


def download_suite(repo_id: str, *, revision: str | None, configs: list[str] | None = None,
                   cache_dir: str | None = None, endpoint: str | None = None, token: str | None = None,
                   force_download: bool = False) -> LocalSuite:
    """Download (or reuse) the manifest, card and selected configs at a pinned sha, then verify them."""
    hubio._check_repo_id(repo_id)
    sha, reachable = hubio.resolve(repo_id, revision, endpoint=endpoint, token=token, cache_dir=cache_dir)
    kw = {"revision": sha, "cache_dir": cache_dir, "endpoint": endpoint, "token": token,
          "force_download": force_download, "local_only": not reachable}
    root = snapshot(repo_id, patterns=[MANIFEST, CARD], **kw)
    if not (root / MANIFEST).is_file():
        raise OfflineError(f"the snapshot of {repo_id}@{sha[:12]} has no {MANIFEST}; it is not a genshift suite "
                           "(format 1 or 1.1), or the cache holds only part of it and the Hub is not reachable")
    hint = f"re-download with `bench download {repo_id} --revision {sha} --force-download`"
    suite = LocalSuite.open(root, repo_id=repo_id, revision=sha, redownload_hint=hint)
    selected = suite.select(configs)
    try:  # eval.yaml too: `bench verify` checks it on the downloaded folder
        root = snapshot(repo_id, patterns=[MANIFEST, CARD, EVAL_YAML, *(f"data/{c}/*" for c in selected)], **kw)
    except OfflineError:  # the manifest is cached, some shards are not
        raise OfflineError(f"the cached snapshot of {repo_id}@{sha} is incomplete (it lacks files of "
                           f"{', '.join(selected)}) and the Hub is not reachable; run `bench download {repo_id} "
                           f"--revision {sha} --configs {','.join(selected)}` once with network") from None
    suite = LocalSuite.open(root, repo_id=repo_id, revision=sha, redownload_hint=hint)
    suite.verify(selected)
    return suite


def open_suite(suite: str, *, revision: str | None = None, configs: list[str] | None = None,
               cache_dir: str | None = None, endpoint: str | None = None, token: str | None = None,
               mask: str | None = None, strict: bool = False, force_download: bool = False) -> LocalSuite:
    """Any suite the user can name -> a verified ``LocalSuite`` (``docs/hub.md`` section 1): a suite folder, a
    local copy of the upstream ImageNet* release (``mask``, ``strict``), a registry id or ``ORG/NAME``. ``revision``:
    the resolved sha (``None`` for a folder); ``pinned`` False when no pin chose it (results flag such runs)."""
    path = Path(suite)
    if path.exists():
        if upstream.is_release_folder(path):
            return upstream.open_release(path, configs=configs, mask=mask, strict=strict, cache_dir=cache_dir)
        _no_mask(mask, suite)
        local = LocalSuite.open(path)
        local.verify(local.select(configs))
        gen = local.manifest.generator or {}
        if gen.get("builder") == "genshift.synthetic" or gen.get("images") == "noise":  # genshift.synthetic
            log.warning("note: %s is a synthetic demo suite of random-noise images: any model scores ~0%% on it; it "
                        "checks the plumbing, not the model (score real images: bench import-folder)", suite)
        return local
    spec = SUITES.get(suite) if suite in SUITES else None
    if spec is None and not is_repo_id(suite):
        raise unknown("suite", suite, SUITES, hint="Give a registry id (`bench suites`), an ORG/NAME Hub dataset "
                      "repo, or the path of a suite folder.")
    repo_id, rev = (spec.repo_id, revision or spec.revision) if spec else (suite, revision)
    from_release = spec is not None and spec.source == "upstream-imagenet-star"
    if from_release:
        local = upstream.open_upstream(repo_id, revision=rev, configs=configs, mask=mask, strict=strict,
                                       cache_dir=cache_dir, endpoint=endpoint, token=token)
    else:
        _no_mask(mask, suite)
        local = download_suite(repo_id, revision=rev, configs=configs, cache_dir=cache_dir, endpoint=endpoint,
                               token=token, force_download=force_download)
    # an unpinned upstream: open_upstream accepted main only as the release commit (DATA_REVISION_PREFIX)
    local.pinned = bool(hubio.SHA_RE.match(rev or "")) or (from_release and rev is None)
    if spec is not None and not local.pinned:
        log.warning("suite %s is not pinned to a commit sha; using %s@%s (recorded in the result as unpinned)",
                    suite, repo_id, local.revision)
    return local


def _no_mask(mask: str | None, suite: str) -> None:
    if mask:
        raise BenchError(f"--mask applies to the upstream ImageNet* release only (imagenet-star-upstream or a folder "
                         f"of its zips), not to {suite!r}; format-1 suites carry their filter in the `keep` column")


FRAMEWORK = "genshift-bench"
MAX_EVAL_YAML_BYTES = 64 << 10
MAX_EVAL_YAML_DEPTH = 8
EVAL_YAML_FIX = "delete it and rerun `bench publish`, which writes it from the manifest"
UNITS = "Values: accuracies and failure rates in percent (0-100)."
PP_UNITS = " Differences of two accuracies ({}) in percentage points."


def tasks(family: str, configs: list[str], reference: str | None = None) -> list[Task]:
    """The tasks of a suite of ``family`` with these configs (``genshift.families``)."""
    try:
        return get_family(family).tasks(configs, reference)
    except ValueError as e:
        raise IntegrityError(str(e)) from None


def suite_scoring(manifest) -> tuple[str, str | None]:
    return declared_scoring(manifest, SUITES.get(manifest.suite_id) if manifest.suite_id in SUITES else None)


def suite_tasks(manifest) -> list[Task]:
    family, reference = suite_scoring(manifest)
    return tasks(family, list(manifest.configs), reference)


def render_eval_yaml(manifest, *, name: str | None = None, description: str | None = None) -> str:
    """The ``eval.yaml`` of a suite (name and description from its card)."""
    family = get_family(suite_scoring(manifest)[0])
    suite_task_list = suite_tasks(manifest)
    pp = sorted({m.label for m in (family.metric(t.column.split("/")[0]) for t in suite_task_list) if m.unit == "pp"})
    lines = [description or f"{manifest.suite_id}: how ImageNet classifiers fail under a generated distribution "
             f"shift (genshift-bench suite, metric family {family.name}).",
             UNITS + (PP_UNITS.format(", ".join(pp)) if pp else ""),
             "Tasks: " + "; ".join(f"{t.id} = {t.label}" for t in suite_task_list) + "."]
    doc = {"name": name or manifest.suite_id, "description": "\n".join(lines), "evaluation_framework": FRAMEWORK,
           "tasks": [{"id": t.id, "config": t.config, "split": SPLIT} for t in suite_task_list]}
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=100)


class _TaskEntry(Schema):
    id: Text
    config: Text
    split: Text


class _EvalYaml(Schema):
    """The Hub's ``eval.yaml`` (hub-docs, "Evaluation results")."""

    name: Text
    description: Text
    evaluation_framework: Text
    tasks: list[_TaskEntry] = Field(min_length=1)


def parse_eval_yaml(data: bytes, *, where: str = EVAL_YAML) -> dict:
    """Check an ``eval.yaml`` against the Hub's format: the four keys, non-blank strings, unique task ids."""
    if len(data) > MAX_EVAL_YAML_BYTES:
        raise IntegrityError(f"{where} is {len(data)} bytes, over the {MAX_EVAL_YAML_BYTES} limit; {EVAL_YAML_FIX}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise IntegrityError(f"{where} is not UTF-8; {EVAL_YAML_FIX}") from None
    doc = load_yaml(text, what="the YAML", where=where, max_depth=MAX_EVAL_YAML_DEPTH)
    if not isinstance(doc, dict):
        raise IntegrityError(f"{where}: not a mapping; {EVAL_YAML_FIX}")
    ids = [t.id for t in validate(_EvalYaml, doc, where=where, fix=EVAL_YAML_FIX).tasks]
    if (twice := next((i for i in ids if ids.count(i) > 1), None)) is not None:
        raise IntegrityError(f"{where}: task id {twice[:64]!r} appears twice; {EVAL_YAML_FIX}")
    return doc


def check_eval_yaml(data: bytes, manifest, *, where: str = EVAL_YAML) -> dict:
    """``parse_eval_yaml`` + the tasks are exactly the ones this suite defines (ids, configs, split)."""
    doc = parse_eval_yaml(data, where=where)
    want = [{"id": t.id, "config": t.config, "split": SPLIT} for t in suite_tasks(manifest)]
    have = [{k: t[k] for k in ("id", "config", "split")} for t in doc["tasks"]]
    if doc["evaluation_framework"] != FRAMEWORK or have != want:
        raise IntegrityError(f"{where}: its tasks ({', '.join(t['id'][:40] for t in have)[:300]}) are not the ones "
                             f"suite {manifest.suite_id} defines ({', '.join(t['id'] for t in want)[:300]}); "
                             f"{EVAL_YAML_FIX}")
    return doc


def ensure_eval_yaml(folder: str | Path, suite: LocalSuite) -> Path:
    """The suite's ``eval.yaml``: written from the manifest and card when absent, checked when present."""
    path = Path(folder) / EVAL_YAML
    if path.is_file():
        check_eval_yaml(read_limited(path, max_bytes=MAX_EVAL_YAML_BYTES, what=EVAL_YAML), suite.manifest,
                        where=str(path))
        return path
    name = (suite.card or {}).get("pretty_name")
    name = name if isinstance(name, str) else None
    try:
        atomic_write_bytes(path, render_eval_yaml(suite.manifest, name=name).encode())
    except OSError as e:
        raise BenchError(f"cannot write {path} ({e.strerror}); publish from a writable copy of the suite "
                         "folder") from None
    return path


LARGE_UPLOAD_BYTES = 5 * 1024**3  # above this a suite is uploaded resumably, in several commits
GATING = ("auto", "manual")


def card_gating(suite: LocalSuite) -> bool:
    """Whether the suite's (required) card asks for gated access (``extra_gated_prompt``, e.g. LANCE)."""
    card = suite.require_card()
    return bool(card.get("extra_gated_prompt") or card.get("extra_gated_fields"))


def _check_remote(api, repo_id: str, sha: str, folder: Path, suite: LocalSuite, files: list[str]) -> None:
    """Every published file is at ``sha`` with the local size (and sha256, for LFS files)."""
    from huggingface_hub.hf_api import RepoFile

    remote = {e.path: e for e in api.list_repo_tree(repo_id, repo_type="dataset", revision=sha, recursive=True)
              if isinstance(e, RepoFile)}
    for f in files:
        e = remote.get(f)
        want = suite.manifest.files[f].sha256 if f in suite.manifest.files else None
        lfs_sha = e.lfs.sha256 if e is not None and e.lfs else None
        if e is None or e.size != (folder / f).stat().st_size or (want and lfs_sha and lfs_sha != want):
            raise BenchError(f"after the upload, {f} at datasets/{repo_id}@{sha[:12]} is "
                             f"{'missing' if e is None else 'different'}; rerun `bench publish` to resume (nothing "
                             "was tagged)")


def publish_suite(folder: str | Path, repo_id: str, *, tag: str | None = None, endpoint: str | None = None,
                  token: str | None = None, private: bool = False, commit_message: str | None = None,
                  large_threshold: int = LARGE_UPLOAD_BYTES, gating: str = "auto") -> str:
    """Upload a verified suite, tag it (default ``v<suite_version>``, which must not exist), gate it when its
    card asks (``gating``: ``auto`` | ``manual``); returns the tagged sha. ``docs/hub.md`` section 6."""
    from huggingface_hub import CommitOperationAdd, HfApi, errors

    hubio._check_repo_id(repo_id)
    if gating not in GATING:
        raise BenchError(f"gating must be one of {', '.join(GATING)}, got {gating!r}")
    if large_threshold < 0:
        raise BenchError(f"the large-upload threshold must be >= 0 bytes, got {large_threshold}")
    if hubio._offline():
        raise OfflineError("publishing needs the network; unset HF_HUB_OFFLINE")
    folder = Path(folder)
    suite = LocalSuite.open(folder)
    suite.verify()
    gated = card_gating(suite)
    ensure_eval_yaml(folder, suite)
    tag = tag or f"v{suite.manifest.suite_version}"
    files = [CARD, EVAL_YAML, MANIFEST, *sorted(suite.manifest.files)]  # never build.json, leftovers, notes
    total = sum((folder / f).stat().st_size for f in files)
    large = total > large_threshold
    if len(files) > 100 and not large:
        log.warning("one commit of %d files: above the Hub's recommended 100 files per commit; it still works over "
                    "HTTP but is slow to process (use larger shards to have fewer files)", len(files))
    message = commit_message or f"{suite.suite_id} {tag} (manifest {suite.manifest.sha256[:12]})"
    api = HfApi(endpoint=endpoint, token=token)
    sha = None
    try:
        api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
        parent = api.dataset_info(repo_id, revision="main").sha
        if tag in {t.name for t in api.list_repo_refs(repo_id, repo_type="dataset").tags}:
            raise BenchError(f"tag {tag!r} already exists in datasets/{repo_id}; bump the suite version or pass --tag")
        if large:
            log.info("%.1f GB in %d files: resumable upload in several commits (rerun to resume)", total / 1e9,
                     len(files))
            # in as many commits as the Hub needs: upload_large_folder in huggingface_hub 1.x, upload_folder in 2
            where = {"repo_id": repo_id, "repo_type": "dataset", "folder_path": str(folder), "allow_patterns": files}
            if hasattr(api, "upload_large_folder"):
                api.upload_large_folder(**where)
            else:
                api.upload_folder(**where, commit_message=message)
            sha = api.dataset_info(repo_id, revision="main").sha
            _check_remote(api, repo_id, sha, folder, suite, files)
        else:  # ONE commit against the head read above: a concurrent commit fails it instead of mixing releases
            ops = [CommitOperationAdd(path_in_repo=f, path_or_fileobj=str(folder / f)) for f in files]
            sha = api.create_commit(repo_id=repo_id, repo_type="dataset", operations=ops, parent_commit=parent,
                                    commit_message=message).oid
        api.create_tag(repo_id, repo_type="dataset", tag=tag, revision=sha,
                       tag_message=f"manifest sha256 {suite.manifest.sha256}")
        if gated:
            api.update_repo_settings(repo_id, repo_type="dataset", gated=gating)
    except BenchError:
        raise
    except errors.HfHubHTTPError as e:
        done = (f" (commit {sha} was made; check that it is tagged {tag}: `hf repos tag create {repo_id} {tag} "
                f"--repo-type dataset --revision {sha}`" + (", and gated" if gated else "") + ")" if sha else "")
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status in (401, 403):
            raise BenchError(f"publishing to datasets/{repo_id} was refused ({status}){done}: log in with a token "
                             "that can write to it (`hf auth login` or HF_TOKEN)") from None
        raise BenchError(f"publishing to datasets/{repo_id} failed{done}: {first_line(e)}") from None
    except Exception as e:  # transport errors of whichever HTTP client
        if not hubio._unreachable(e) and not isinstance(e, OSError):
            raise
        raise OfflineError(f"cannot reach {hubio._endpoint(endpoint)} to publish ({type(e).__name__}); check the "
                           "network or HF_ENDPOINT") from None
    return sha
