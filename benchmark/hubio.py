"""Hub transport: resolve a dataset repo revision to a commit sha and download a snapshot of it.

The offline-safe pattern every Hub read in the project follows (``docs/hub.md``): resolve the
revision to a 40-character commit sha, ``snapshot_download`` only the files needed at that sha,
and turn whatever huggingface_hub raises into one clear line. ``HF_ENDPOINT`` /
``HF_HUB_OFFLINE`` / ``HF_TOKEN`` are honoured (huggingface_hub reads them at import;
``endpoint=`` / ``token=`` arguments override them per call).

This is the bottom layer: ``genshift.upstream`` (the ImageNet* release adapter) and
``genshift.hub`` (suites: open, download, publish) both build on it, and it imports neither.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from genshift.errors import BenchError, NotFoundError, OfflineError, first_line

log = logging.getLogger(__name__)
# Appended to the errors of a Hub that cannot be reached: the way to work with no network at all.
OFFLINE_ROUTE = "; with no network at all, use a local suite and local weights (README.md, \"Offline route\")"
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
                            f"or no network); run `bench download {repo_id} --revision {revision}` once with network"
                            f"{OFFLINE_ROUTE}")
    if isinstance(e, errors.HfHubHTTPError):
        return BenchError(f"the Hub answered an error for {where}: {first_line(e)}")
    return OfflineError(f"cannot reach {_endpoint(endpoint)} ({type(e).__name__}); check the network or HF_ENDPOINT, "
                        f"or use a local suite folder{OFFLINE_ROUTE}")


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
                           f"40-character commit sha {pin_hint}{OFFLINE_ROUTE}")
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
                               f"commit sha {pin_hint} to use a cached snapshot{OFFLINE_ROUTE}") from None
        raise _hub_error(e, repo_id, rev, endpoint) from None


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
