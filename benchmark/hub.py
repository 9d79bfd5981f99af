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


def _offline() -> bool:
    from huggingface_hub import constants

    check = getattr(constants, "is_offline_mode", None)
    return bool(check() if check else constants.HF_HUB_OFFLINE)


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
    incomplete = getattr(errors, "IncompleteSnapshotError", ())
    if incomplete and isinstance(e, incomplete):
        return OfflineError(f"the cached snapshot of {repo_id}@{revision} is incomplete and the Hub is not reachable; "
                            f"run `bench download {repo_id} --revision {revision}` (with the same --configs) once "
                            "with network")
    if isinstance(e, errors.LocalEntryNotFoundError) or (_offline() and isinstance(e, (OSError, ValueError))):
        return OfflineError(f"no cached snapshot of {repo_id}@{revision} and the Hub is not reachable (HF_HUB_OFFLINE=1 "
                            f"or no network); run `bench download {repo_id} --revision {revision}` once with network")
    if isinstance(e, errors.HfHubHTTPError):
        return BenchError(f"the Hub answered an error for {where}: {str(e).splitlines()[0]}")
    return OfflineError(f"cannot reach {_endpoint(endpoint)} ({type(e).__name__}); check the network or HF_ENDPOINT, "
                        "or use a local suite folder")


def _unreachable(e: BaseException) -> bool:
    """True for transport failures (no network, refused, timeout), whatever HTTP client raised them."""
    names = {c.__name__ for c in type(e).__mro__}
    return bool(names & {"TransportError", "ConnectionError", "Timeout", "TimeoutException", "OfflineModeIsEnabled"})


def resolve_revision(repo_id: str, revision: str | None, *, endpoint: str | None = None,
                     token: str | None = None) -> str:
    """The 40-character commit sha of a dataset repo at ``revision`` (default ``main``).

    Online, a branch or tag is resolved with ``dataset_info`` (a sha is checked to exist). Offline
    (``HF_HUB_OFFLINE=1``, or the endpoint unreachable) only a sha can be used: it is returned
    as is, so a cached snapshot at that sha still opens; a branch or tag is an ``OfflineError``.
    """
    return resolve_or_cache(repo_id, revision, endpoint=endpoint, token=token)[0]


def resolve_or_cache(repo_id: str, revision: str | None, *, endpoint: str | None = None,
                     token: str | None = None, pin_hint: str = "with --revision") -> tuple[str, bool]:
    """Like :func:`resolve_revision`, returning ``(sha, reachable)``.

    ``pin_hint`` tells the user how to give a sha on the command at hand (in the offline errors).

    ``reachable`` is False when only the local cache can be used (offline, or the endpoint did
    not answer): pass ``local_only=True`` to :func:`snapshot` then.
    """
    rev = revision or "main"
    if _offline():
        if SHA_RE.match(rev):
            return rev, False
        raise OfflineError(f"offline (HF_HUB_OFFLINE=1): cannot resolve {repo_id}@{rev} to a commit; pass the "
                           f"40-character commit sha {pin_hint}")
    try:  # also for a sha: checks that it exists and that we may read the repo
        return _api(endpoint, token).dataset_info(repo_id, revision=rev).sha, True
    except Exception as e:  # noqa: BLE001 - mapped to one clear line
        if _unreachable(e):
            if SHA_RE.match(rev):  # a cached snapshot at this sha is still usable
                log.warning("cannot reach %s (%s); using the cached snapshot of %s@%s if there is one",
                            _endpoint(endpoint), type(e).__name__, repo_id, rev[:12])
                return rev, False
            raise OfflineError(f"cannot reach {_endpoint(endpoint)} to resolve {repo_id}@{rev} to a commit "
                               f"({type(e).__name__}); check the network or HF_ENDPOINT, or pin the 40-character "
                               f"commit sha {pin_hint} to use a cached snapshot") from None
        raise _hub_error(e, repo_id, rev, endpoint) from None


def _patterns(configs: list[str] | None) -> list[str]:
    pats = [MANIFEST, CARD]
    return pats + (["data/**"] if configs is None else [f"data/{c}/*" for c in configs])


def snapshot(repo_id: str, *, revision: str, patterns: list[str], cache_dir: str | None = None,
             endpoint: str | None = None, token: str | None = None, force_download: bool = False,
             local_only: bool = False) -> Path:
    """``snapshot_download`` of a dataset repo at a sha; errors become one clear line.

    ``local_only`` reads the cache without any request (used once the Hub proved unreachable,
    which spares huggingface_hub's ~25 s of connection retries).
    """
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, repo_type="dataset", revision=revision, allow_patterns=patterns,
                                      cache_dir=cache_dir, endpoint=endpoint, token=token,
                                      force_download=force_download and not local_only,
                                      local_files_only=local_only))
    except Exception as e:  # noqa: BLE001 - mapped to one clear line
        raise _hub_error(e, repo_id, revision, endpoint) from None


def download_suite(repo_id: str, *, revision: str | None, configs: list[str] | None = None,
                   cache_dir: str | None = None, endpoint: str | None = None, token: str | None = None,
                   force_download: bool = False) -> LocalSuite:
    """Download (or reuse the cached) suite at a pinned sha and verify the requested configs.

    Only ``manifest.json``, ``README.md`` and the selected configs' shards are fetched. The
    returned suite has ``revision`` = the resolved sha; a file that fails verification is named
    with the command that re-downloads it.
    """
    _check_repo_id(repo_id)
    sha, reachable = resolve_or_cache(repo_id, revision, endpoint=endpoint, token=token)
    kw = {"revision": sha, "cache_dir": cache_dir, "endpoint": endpoint, "token": token,
          "force_download": force_download, "local_only": not reachable}
    root = snapshot(repo_id, patterns=[MANIFEST, CARD], **kw)
    if not (root / MANIFEST).is_file():
        raise OfflineError(f"the snapshot of {repo_id}@{sha[:12]} has no {MANIFEST}" + (
            "; the cache holds only part of it and the Hub is not reachable" if not reachable else
            "; it is not a genshift suite (format 1)"))
    hint = f"re-download with `bench download {repo_id} --revision {sha} --force-download`"
    suite = LocalSuite.open(root, repo_id=repo_id, revision=sha, redownload_hint=hint)
    selected = suite.select(configs)
    try:
        root = snapshot(repo_id, patterns=_patterns(selected), **kw)
    except OfflineError:  # the manifest is cached, some shards are not
        raise OfflineError(f"the cached snapshot of {repo_id}@{sha} is incomplete (it lacks files of "
                           f"{', '.join(selected)}) and the Hub is not reachable; run `bench download {repo_id} "
                           f"--revision {sha} --configs {','.join(selected)}` once with network") from None
    suite = LocalSuite.open(root, repo_id=repo_id, revision=sha, redownload_hint=hint)
    try:
        suite.verify(selected)
    except IntegrityError as e:
        if not reachable and "missing" in str(e):
            raise OfflineError(f"the cached snapshot of {repo_id}@{sha} lacks files of {', '.join(selected)} and the "
                               f"Hub is not reachable; run `bench download {repo_id} --revision {sha} --configs "
                               f"{','.join(selected)}` once with network") from None
        raise
    return suite


def open_suite(suite: str, *, revision: str | None = None, configs: list[str] | None = None,
               cache_dir: str | None = None, endpoint: str | None = None, token: str | None = None,
               mask: str | None = None, strict: bool = False, force_download: bool = False) -> LocalSuite:
    """Any suite the user can name -> a verified ``LocalSuite`` (the eval harness's one entry point).

    - a local suite folder (has ``manifest.json``): opened and verified in place (pinned by its
      manifest hash);
    - a local copy of the upstream ImageNet* release (``<shift>.zip`` files or extracted
      ``<shift>/`` folders): converted once by ``benchmark.upstream`` (``mask``, ``strict``);
    - a registry id (``bench suites``): its Hub repo at the registry's pinned sha (``revision``
      overrides; an unpinned entry resolves ``main``); ``imagenet-star-upstream`` downloads the
      requested shifts' zips and converts them;
    - ``ORG/NAME``: a Hub dataset repo in format 1 at ``revision`` (default ``main``).

    ``LocalSuite.revision`` is the resolved commit sha (``None`` for local folders) and
    ``LocalSuite.pinned`` is False when the sha was not chosen by a pin (an unpinned registry
    entry, or a branch/tag given as ``revision``); results flag such runs.
    """
    from benchmark import upstream
    from benchmark.suites import SUITES

    path = Path(suite)
    if path.exists():
        if upstream.is_release_folder(path):
            return upstream.open_release(path, configs=configs, mask=mask, strict=strict, cache_dir=cache_dir)
        _no_mask(mask, suite)
        local = LocalSuite.open(path)
        local.verify(local.select(configs))
        return local
    if suite in SUITES:
        spec = SUITES.get(suite)
        rev = revision or spec.revision
        if spec.source == "upstream-imagenet-star":
            local = upstream.open_upstream(spec.repo_id, revision=rev, configs=configs, mask=mask, strict=strict,
                                           cache_dir=cache_dir, endpoint=endpoint, token=token)
        else:
            _no_mask(mask, suite)
            local = download_suite(spec.repo_id, revision=rev, configs=configs, cache_dir=cache_dir,
                                   endpoint=endpoint, token=token, force_download=force_download)
        local.pinned = rev is not None and bool(SHA_RE.match(rev))
        if spec.source == "upstream-imagenet-star" and rev is None:
            local.pinned = True  # open_upstream accepted main only as the release commit (upstream.DATA_REVISION_PREFIX)
        if not local.pinned:
            log.warning("suite %s is not pinned to a commit sha; using %s@%s (recorded in the result as unpinned)",
                        suite, spec.repo_id, local.revision)
        return local
    if REPO_RE.match(suite):
        _no_mask(mask, suite)
        local = download_suite(suite, revision=revision, configs=configs, cache_dir=cache_dir, endpoint=endpoint,
                               token=token, force_download=force_download)
        local.pinned = revision is not None and bool(SHA_RE.match(revision))
        return local
    from benchmark.errors import unknown

    raise unknown("suite", suite, SUITES, hint="Give a registry id (`bench suites`), an ORG/NAME Hub dataset repo, "
                  "or the path of a suite folder.")


def _no_mask(mask: str | None, suite: str) -> None:
    if mask:
        raise BenchError(f"--mask applies to the upstream ImageNet* release only (imagenet-star-upstream or a folder "
                         f"of its zips), not to {suite!r}; format-1 suites carry their filter in the `keep` column")


def publish_files(suite: LocalSuite) -> list[str]:
    """What a release holds: the card, the manifest and exactly the data files the manifest lists.

    Anything else in the folder (``build.json``, leftovers, notes) is never uploaded.
    """
    return [CARD, MANIFEST, *sorted(suite.manifest.files)]


def publish_suite(folder: str | Path, repo_id: str, *, tag: str | None = None, endpoint: str | None = None,
                  token: str | None = None, private: bool = False, commit_message: str | None = None) -> str:
    """Upload a built suite in one commit, tag it, and return the commit sha.

    The suite is verified first. The commit is made against the repo's current head
    (``parent_commit``), so a concurrent commit makes it fail instead of mixing releases; the tag
    (default ``v<suite_version>``) must not exist yet and is checked before anything is uploaded.
    """
    from huggingface_hub import errors

    _check_repo_id(repo_id)
    if _offline():
        raise OfflineError("publishing needs the network; unset HF_HUB_OFFLINE")
    suite = LocalSuite.open(folder)
    suite.verify()
    if not (Path(folder) / CARD).is_file():
        raise BenchError(f"{folder} has no {CARD} (dataset card); rebuild the suite or render one with data_cards")
    tag = tag or f"v{suite.manifest.suite_version}"
    files = publish_files(suite)
    if len(files) > 100:
        log.warning("one commit of %d files: above the Hub's recommended 100 files per commit; it still works over "
                    "HTTP but is slow to process (use larger shards to have fewer files)", len(files))
    api = _api(endpoint, token)
    sha = None
    try:
        api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
        parent = api.dataset_info(repo_id, revision="main").sha
        existing = {t.name for t in api.list_repo_refs(repo_id, repo_type="dataset").tags}
        if tag in existing:
            raise BenchError(f"tag {tag!r} already exists in datasets/{repo_id}; bump the suite version or pass --tag")
        info = api.upload_folder(
            repo_id=repo_id, repo_type="dataset", folder_path=str(folder), allow_patterns=files,
            parent_commit=parent,
            commit_message=commit_message or f"{suite.suite_id} {tag} (manifest {suite.manifest.sha256[:12]})",
        )
        sha = info.oid
        api.create_tag(repo_id, repo_type="dataset", tag=tag, revision=sha,
                       tag_message=f"manifest sha256 {suite.manifest.sha256}")
    except BenchError:
        raise
    except errors.HfHubHTTPError as e:
        done = (f" (commit {sha} was made but not tagged; tag it: `hf repos tag create {repo_id} {tag} "
                f"--repo-type dataset --revision {sha}`)" if sha else "")
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status in (401, 403):
            raise BenchError(f"publishing to datasets/{repo_id} was refused ({status}){done}: log in with a token "
                             "that can write to it (`hf auth login` or HF_TOKEN)") from None
        raise BenchError(f"publishing to datasets/{repo_id} failed{done}: {str(e).splitlines()[0]}") from None
    except Exception as e:  # noqa: BLE001 - transport errors of whichever HTTP client
        if not _unreachable(e) and not isinstance(e, OSError):
            raise
        raise OfflineError(f"cannot reach {_endpoint(endpoint)} to publish ({type(e).__name__}); check the network "
                           "or HF_ENDPOINT") from None
    return sha
