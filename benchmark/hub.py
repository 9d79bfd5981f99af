"""Hub I/O: download suites at pinned commits, open any suite the user names, publish a build.

Consumption follows the offline-safe pattern of ``specs/ecosystem.md`` s2.3-2.4: resolve the
revision to a 40-character commit sha, ``snapshot_download`` only the manifest, the card and the
requested configs' shards, verify the manifest, then read the parquet files from the snapshot.
``HF_ENDPOINT`` / ``HF_HUB_OFFLINE`` / ``HF_TOKEN`` are honoured (huggingface_hub reads them at
import; ``endpoint=`` / ``token=`` arguments override them per call).

Publishing uploads a built suite in **one** commit (``upload_folder`` against the expected
parent commit), then tags it.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from benchmark.errors import BenchError, IntegrityError, NotFoundError, OfflineError
from benchmark.reader import LocalSuite
from benchmark.suite_format import CARD, MANIFEST

log = logging.getLogger(__name__)
SHA_RE = re.compile(r"^[0-9a-f]{40}$")
REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
PUBLISH_PATTERNS = [CARD, MANIFEST, "data/**"]


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _endpoint(endpoint: str | None) -> str:
    from huggingface_hub import constants

    return (endpoint or constants.ENDPOINT).rstrip("/")


def _api(endpoint: str | None, token: str | None):
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint, token=token)


def _check_repo_id(repo_id: str) -> None:
    if not REPO_RE.match(repo_id):
        raise BenchError(f"{repo_id!r} is not a Hub repo id; use ORG/NAME")


def _hub_error(e: Exception, repo_id: str, revision: str | None, endpoint: str | None) -> BenchError:
    """One clear line for the errors huggingface_hub raises."""
    from huggingface_hub import errors

    where = f"datasets/{repo_id} on {_endpoint(endpoint)}"
    if isinstance(e, errors.GatedRepoError):
        return BenchError(f"{where} is gated: request access at {_endpoint(endpoint)}/datasets/{repo_id} and log in "
                          "(`hf auth login` or HF_TOKEN)")
    if isinstance(e, errors.RevisionNotFoundError):
        return NotFoundError(f"revision {revision!r} does not exist in {where}; pass an existing commit sha or tag")
    if isinstance(e, errors.RepositoryNotFoundError):
        return NotFoundError(f"dataset repo {where} not found (a private repo needs a token: HF_TOKEN or `hf auth login`)")
    if isinstance(e, errors.LocalEntryNotFoundError) or (_offline() and isinstance(e, (OSError, ValueError))):
        return OfflineError(f"no cached snapshot of {repo_id}@{revision} and the Hub is not reachable (offline); run "
                            f"`bench download {repo_id} --revision {revision}` once with network")
    if isinstance(e, errors.HfHubHTTPError):
        return BenchError(f"the Hub answered an error for {where}: {str(e).splitlines()[0]}")
    return OfflineError(f"cannot reach {_endpoint(endpoint)} ({type(e).__name__}); check the network or HF_ENDPOINT, "
                        "or use a local suite folder")


def resolve_revision(repo_id: str, revision: str | None, *, endpoint: str | None = None,
                     token: str | None = None) -> str:
    """The 40-character commit sha of a dataset repo at ``revision`` (default ``main``)."""
    rev = revision or "main"
    if _offline():
        if SHA_RE.match(rev):
            return rev
        raise OfflineError(f"offline (HF_HUB_OFFLINE=1): cannot resolve {repo_id}@{rev} to a commit; pass the "
                           "40-character commit sha with --revision")
    try:  # also for a sha: checks that it exists and that we may read the repo
        return _api(endpoint, token).dataset_info(repo_id, revision=rev).sha
    except Exception as e:  # noqa: BLE001 - mapped to one clear line
        raise _hub_error(e, repo_id, rev, endpoint) from None


def _patterns(configs: list[str] | None) -> list[str]:
    pats = [MANIFEST, CARD]
    return pats + (["data/**"] if configs is None else [f"data/{c}/*" for c in configs])


def snapshot(repo_id: str, *, revision: str, patterns: list[str], cache_dir: str | None = None,
             endpoint: str | None = None, token: str | None = None, force_download: bool = False) -> Path:
    """``snapshot_download`` of a dataset repo at a sha; errors become one clear line."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, repo_type="dataset", revision=revision, allow_patterns=patterns,
                                      cache_dir=cache_dir, endpoint=endpoint, token=token,
                                      force_download=force_download))
    except Exception as e:  # noqa: BLE001 - mapped to one clear line
        raise _hub_error(e, repo_id, revision, endpoint) from None


def download_suite(repo_id: str, *, revision: str | None, configs: list[str] | None = None,
                   cache_dir: str | None = None, endpoint: str | None = None, token: str | None = None,
                   force_download: bool = False) -> LocalSuite:
    """Download (or reuse the cached) suite at a pinned sha and verify the requested configs."""
    _check_repo_id(repo_id)
    sha = resolve_revision(repo_id, revision, endpoint=endpoint, token=token)
    root = snapshot(repo_id, revision=sha, patterns=[MANIFEST, CARD], cache_dir=cache_dir, endpoint=endpoint,
                    token=token, force_download=force_download)
    if not (root / MANIFEST).is_file():
        raise OfflineError(f"the snapshot of {repo_id}@{sha[:12]} has no {MANIFEST}" + (
            "; the cache holds only part of it and the Hub is offline" if _offline() else
            "; it is not a genshift suite (format 1)"))
    hint = f"re-download with `bench download {repo_id} --revision {sha} --force-download`"
    suite = LocalSuite.open(root, repo_id=repo_id, revision=sha, redownload_hint=hint)
    selected = suite.select(configs)
    root = snapshot(repo_id, revision=sha, patterns=_patterns(selected), cache_dir=cache_dir, endpoint=endpoint,
                    token=token, force_download=force_download)
    suite = LocalSuite.open(root, repo_id=repo_id, revision=sha, redownload_hint=hint)
    try:
        suite.verify(selected)
    except IntegrityError as e:
        if _offline() and "missing" in str(e):
            raise OfflineError(f"the cached snapshot of {repo_id}@{sha[:12]} lacks files of {', '.join(selected)} and "
                               f"the Hub is offline; run `bench download {repo_id} --revision {sha}` with network") from None
        raise
    return suite


def open_suite(suite: str, *, revision: str | None = None, configs: list[str] | None = None,
               cache_dir: str | None = None, endpoint: str | None = None, token: str | None = None,
               mask: str | None = None, force_download: bool = False) -> LocalSuite:
    """Any suite the user can name -> a verified ``LocalSuite``.

    - a local folder: opened and verified in place (pinned by its manifest hash);
    - a registry id (``bench suites``): its Hub repo at the registry's pinned sha (``revision``
      overrides; an unpinned entry resolves ``main`` and the suite is marked ``pinned=False``);
      the upstream ImageNet* entry goes through ``benchmark.upstream``;
    - ``ORG/NAME``: a Hub dataset repo in format 1 at ``revision``.
    """
    from benchmark.suites import SUITES

    path = Path(suite)
    if path.exists():
        local = LocalSuite.open(path)
        local.verify(local.select(configs))
        return local
    if suite in SUITES:
        spec = SUITES.get(suite)
        rev = revision or spec.revision
        if spec.source == "upstream-imagenet-star":
            from benchmark import upstream

            local = upstream.open_upstream(spec.repo_id, revision=rev, configs=configs, mask=mask,
                                           cache_dir=cache_dir, endpoint=endpoint, token=token)
        else:
            local = download_suite(spec.repo_id, revision=rev, configs=configs, cache_dir=cache_dir,
                                   endpoint=endpoint, token=token, force_download=force_download)
        local.pinned = rev is not None
        if not local.pinned:
            log.warning("suite %s is not pinned in the registry yet; using %s@%s (recorded in the result)",
                        suite, spec.repo_id, local.revision)
        return local
    if REPO_RE.match(suite) and "/" in suite:
        local = download_suite(suite, revision=revision, configs=configs, cache_dir=cache_dir, endpoint=endpoint,
                               token=token, force_download=force_download)
        local.pinned = revision is not None and bool(SHA_RE.match(revision))
        return local
    from benchmark.errors import unknown

    raise unknown("suite", suite, SUITES, hint="Give a registry id (`bench suites`), an ORG/NAME Hub dataset repo, "
                  "or the path of a suite folder.")


def publish_suite(folder: str | Path, repo_id: str, *, tag: str | None = None, endpoint: str | None = None,
                  token: str | None = None, private: bool = False, commit_message: str | None = None) -> str:
    """Upload a built suite in one commit, tag it, and return the commit sha."""
    from huggingface_hub import errors

    _check_repo_id(repo_id)
    if _offline():
        raise OfflineError("publishing needs the network; unset HF_HUB_OFFLINE")
    suite = LocalSuite.open(folder)
    suite.verify()
    if not (Path(folder) / CARD).is_file():
        raise BenchError(f"{folder} has no {CARD} (dataset card); rebuild the suite or render one with data_cards")
    tag = tag or f"v{suite.manifest.suite_version}"
    api = _api(endpoint, token)
    try:
        api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
        parent = api.dataset_info(repo_id, revision="main").sha
        existing = {t.name for t in api.list_repo_refs(repo_id, repo_type="dataset").tags}
        if tag in existing:
            raise BenchError(f"tag {tag!r} already exists in datasets/{repo_id}; bump the suite version or pass --tag")
        info = api.upload_folder(
            repo_id=repo_id, repo_type="dataset", folder_path=str(folder), allow_patterns=PUBLISH_PATTERNS,
            parent_commit=parent,
            commit_message=commit_message or f"{suite.suite_id} {tag} (manifest {suite.manifest.sha256[:12]})",
        )
        sha = info.oid
        api.create_tag(repo_id, repo_type="dataset", tag=tag, revision=sha,
                       tag_message=f"manifest sha256 {suite.manifest.sha256}")
    except BenchError:
        raise
    except errors.HfHubHTTPError as e:
        raise BenchError(f"publishing to datasets/{repo_id} failed: {str(e).splitlines()[0]}") from None
    except OSError as e:
        raise OfflineError(f"cannot reach {_endpoint(endpoint)} to publish ({type(e).__name__})") from None
    return sha
