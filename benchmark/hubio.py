"""Hub transport, the bottom layer under ``genshift.upstream`` and ``genshift.hub`` (it imports neither): revisions
resolved to a sha by huggingface_hub's rules, snapshots at that sha, its errors as one line (``docs/hub.md`` 2-4)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

from huggingface_hub import constants  # light; HfApi and the errors are imported where they are used

from genshift.errors import BenchError, NotFoundError, OfflineError, first_line

log = logging.getLogger(__name__)
# Appended to the errors of a Hub that cannot be reached: the way to work with no network at all.
OFFLINE_ROUTE = "; with no network at all, use a local suite and local weights (README.md, \"Offline route\")"
SHA_RE = re.compile(r"^[0-9a-f]{40}$")


def is_repo_id(text: object) -> bool:
    """``ORG/NAME`` as the Hub accepts it (huggingface_hub's ``validate_repo_id``), ASCII, the namespace required."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not isinstance(text, str) or text.count("/") != 1 or not text.isascii():
        return False
    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


def _offline() -> bool:
    return constants.is_offline_mode()


def _endpoint(endpoint: str | None) -> str:
    return (endpoint or constants.ENDPOINT).rstrip("/")


def _check_repo_id(repo_id: str) -> None:
    if not is_repo_id(repo_id):
        raise BenchError(f"{repo_id!r} is not a Hub repo id; use ORG/NAME")


def _hub_error(e: Exception, repo_id: str, revision: str | None, endpoint: str | None,
               repo_type: str = "dataset") -> BenchError:
    """One clear line for the errors huggingface_hub raises."""
    from huggingface_hub import errors

    where = f"{repo_type}s/{repo_id} on {_endpoint(endpoint)}"
    if isinstance(e, errors.GatedRepoError):
        return BenchError(f"{where} is gated: request access at {_endpoint(endpoint)}/{repo_type}s/{repo_id} and log "
                          "in (`hf auth login` or HF_TOKEN)")
    if isinstance(e, errors.RevisionNotFoundError):
        return NotFoundError(f"revision {revision!r} does not exist in {where}; pass an existing commit sha or tag")
    if isinstance(e, errors.RepositoryNotFoundError):
        return NotFoundError(f"{repo_type} repo {where} not found (a private repo needs a token: HF_TOKEN or "
                             "`hf auth login`)")
    if isinstance(e, errors.IncompleteSnapshotError):
        return OfflineError(f"the cached snapshot of {repo_id}@{revision} is incomplete and the Hub is not reachable; "
                            f"run `bench download {repo_id} --revision {revision}` (with the same --configs) once "
                            "with network")
    if isinstance(e, errors.LocalEntryNotFoundError) or (_offline() and isinstance(e, (OSError, ValueError))):
        return OfflineError(f"no cached snapshot of {repo_id}@{revision} and the Hub is not reachable "
                            f"(HF_HUB_OFFLINE=1 or no network); run `bench download {repo_id} --revision {revision}` "
                            f"once with network{OFFLINE_ROUTE}")
    if isinstance(e, errors.HfHubHTTPError):
        return BenchError(f"the Hub answered an error for {where}: {first_line(e)}")
    return OfflineError(f"cannot reach {_endpoint(endpoint)} ({type(e).__name__}); check the network or HF_ENDPOINT, "
                        f"or use a local suite folder{OFFLINE_ROUTE}")


def _unreachable(e: BaseException) -> bool:
    """True for transport failures (no network, refused, timeout), whatever HTTP client raised them."""
    names = {c.__name__ for c in type(e).__mro__}
    return bool(names & {"TransportError", "ConnectError", "ConnectionError", "Timeout", "TimeoutException",
                         "OfflineModeIsEnabled"})


def resolve_revision(repo_id: str, revision: str | None, **kw) -> str:
    """The commit sha of a repo at ``revision`` (default ``main``); a sha is itself, with no request."""
    return revision if revision and SHA_RE.match(revision) else resolve(repo_id, revision, **kw)[0]


def resolve(repo_id: str, revision: str | None, *, repo_type: str = "dataset", endpoint: str | None = None,
            token: str | None = None, cache_dir: str | None = None,
            pin_hint: str = "with --revision") -> tuple[str, bool]:
    """``(sha, reachable)`` of a repo at ``revision`` (default ``main``) by ``HfApi.resolve_revision``'s rules
    (``docs/hub.md`` section 4: offline, a branch or tag needs the cache's ``refs/`` record, else an
    ``OfflineError`` asks to pin a sha ``pin_hint``). ``reachable`` False: call :func:`snapshot` ``local_only``."""
    from huggingface_hub import HfApi, errors

    rev = revision or "main"
    api = HfApi(endpoint=endpoint, token=token)
    try:
        if SHA_RE.match(rev):
            if not _offline():
                api.repo_info(repo_id, repo_type=repo_type, revision=rev)
            return rev, not _offline()
        return api.resolve_revision(repo_id, repo_type=repo_type, revision=rev, cache_dir=cache_dir,
                                    local_files_only=_offline()).resolved, not _offline()
    except errors.RevisionResolutionError as e:
        what = f"resolve {repo_type} repo {repo_id}@{rev} to a commit, and no earlier download recorded it"
        if _offline():
            raise OfflineError(f"offline (HF_HUB_OFFLINE=1): cannot {what}; pass the 40-character commit sha "
                               f"{pin_hint}{OFFLINE_ROUTE}") from None
        raise OfflineError(f"cannot reach the Hub ({_endpoint(endpoint)}, {type(e.__cause__).__name__}) to {what}; "
                           f"check the network or HF_ENDPOINT, or pin the 40-character commit sha {pin_hint}"
                           f"{OFFLINE_ROUTE}") from None
    except Exception as e:  # mapped to one clear line
        if not (SHA_RE.match(rev) and _unreachable(e)):
            raise _hub_error(e, repo_id, rev, endpoint, repo_type) from None
    log.warning("cannot reach %s; using the cached snapshot of %s@%s if there is one", _endpoint(endpoint), repo_id,
                rev[:12])
    return rev, False


def snapshot(repo_id: str, *, revision: str, patterns: list[str], cache_dir: str | None = None,
             endpoint: str | None = None, token: str | None = None, force_download: bool = False,
             local_only: bool = False) -> Path:
    """``snapshot_download`` of a dataset repo at a sha (``local_only``: the cache, no request), errors one line."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, repo_type="dataset", revision=revision, allow_patterns=patterns,
                                      cache_dir=cache_dir, endpoint=endpoint, token=token,
                                      force_download=force_download and not local_only,
                                      local_files_only=local_only or _offline()))
    except Exception as e:  # mapped to one clear line
        raise _hub_error(e, repo_id, revision, endpoint) from None
