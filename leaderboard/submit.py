"""``bench submit``: propose a result to the public results repo as a pull request.

The result is checked locally first exactly as the leaderboard will check it (schema,
predictions hashes, every metric recomputed) and against the size limits; then its
``result.json`` and predictions files are committed to ``<suite id>/<model slug>/`` of the results
dataset repo in **one** pull request. Maintainers review the PR, CI runs
``bench verify --recheck N --sign KEY`` on it, and merging publishes it (``docs/leaderboard.md``).
"""

from __future__ import annotations

from pathlib import Path

from benchmark.errors import BenchError, OfflineError
from eval.results import MAX_PREDICTIONS_BYTES, entry_dir
from eval.verify import result_path, verify_result


def submit(result: str | Path, repo_id: str, *, endpoint: str | None = None, token: str | None = None,
           message: str | None = None) -> str:
    """Open the pull request; returns its URL."""
    from huggingface_hub import CommitOperationAdd, HfApi, errors

    path = result_path(result)
    # the schema (types and ranges) first: one clear error for a malformed result; the submitter's own suite
    report = verify_result(path, use_recorded_suite=True)
    res = report.result
    if not report.ok:
        raise BenchError(f"{path} does not verify ({report.problems[0]}); fix it before submitting")
    if res["flags"].get("partial"):
        raise BenchError("partial results (--limit-per-class or a subset of configs) are not accepted; "
                         "evaluate every config without --limit-per-class")
    prefix = entry_dir(res)
    ops = [CommitOperationAdd(f"{prefix}/result.json", str(path))]
    for p in res["predictions"]:
        f = path.parent / p["path"]
        if f.stat().st_size > MAX_PREDICTIONS_BYTES:
            raise BenchError(f"{f.name} is over the {MAX_PREDICTIONS_BYTES // 2**20} MiB limit for predictions")
        ops.append(CommitOperationAdd(f"{prefix}/{p['path']}", str(f)))
    api = HfApi(endpoint=endpoint, token=token)
    title = message or f"Add {res['model']['id']} on {res['suite']['id']} (config {res['config_hash'][:12]})"
    try:
        info = api.create_commit(repo_id, ops, repo_type="dataset", create_pr=True, commit_message=title,
                                 commit_description=f"Submitted with `bench submit`. Suite manifest "
                                                    f"{res['suite']['manifest_sha256']}, weights "
                                                    f"{res['model'].get('weights_sha256')}.")
    except errors.RepositoryNotFoundError:
        raise BenchError(f"results repo datasets/{repo_id} not found (or no access: set HF_TOKEN)") from None
    except errors.HfHubHTTPError as e:
        raise BenchError(f"the Hub refused the pull request: {str(e).splitlines()[0]}") from None
    except OSError as e:
        raise OfflineError(f"cannot reach the Hub to submit ({type(e).__name__}); check the network") from None
    return info.pr_url or info.commit_url
