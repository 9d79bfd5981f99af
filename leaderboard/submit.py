"""``bench submit``: propose a result to the results repo as one pull request (``docs/leaderboard.md``,
"Submitting a result"), checked locally first as ``bench review`` will check it; with ``--model-repo``, report
the merged entry on the model's Hub page (``genshift.leaderboard.hub_results``).
"""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import CommitOperationAdd, HfApi, errors

from genshift.errors import BenchError, OfflineError, first_line
from genshift.eval.results import entry_dir, parse_result, read_result_bytes
from genshift.eval.stamps import load_trusted_keys
from genshift.eval.verify import result_path, verify_result
from genshift.fsutil import sha256_bytes
from genshift.leaderboard.hub_results import publish_entry


def submit_to_model_repo(result: str | Path, repo_id: str, model_repo: str, *, trusted_keys: str | None = None,
                         endpoint: str | None = None, token: str | None = None) -> tuple[str, str]:
    """Open (or update) a PR on ``model_repo`` adding ``.eval_results/<suite id>.yaml`` for this result, whose entry
    must be merged in the results repo ``repo_id`` already; verified only with a stamp signed by one of
    ``trusted_keys``. Returns ``(url, what happened)``."""
    path = result_path(result)
    raw = read_result_bytes(path)
    res = parse_result(raw, where=str(path))
    trusted = load_trusted_keys(trusted_keys) if trusted_keys else {}
    return publish_entry(repo_id, entry_dir(res), model_repo=model_repo, trusted=trusted,
                         expect_sha256=sha256_bytes(raw), endpoint=endpoint, token=token)


def submit(result: str | Path, repo_id: str, *, endpoint: str | None = None, token: str | None = None,
           message: str | None = None) -> str:
    """Open the pull request; returns its URL."""
    path = result_path(result)
    # the schema (types and ranges) first: one clear error for a malformed result; the submitter's own suite
    report = verify_result(path, use_recorded_suite=True)
    res = report.result
    if not report.ok:
        raise BenchError(f"{path} does not verify ({report.problems[0]}); fix it before submitting")
    if res["flags"].get("partial"):
        raise BenchError("partial results (--limit-per-class or a subset of configs) are not accepted; "
                         "evaluate every config without --limit-per-class")
    prefix = entry_dir(res)  # every predictions file was read within MAX_PREDICTIONS_BYTES by the verification
    ops = [CommitOperationAdd(f"{prefix}/result.json", str(path))]
    ops += [CommitOperationAdd(f"{prefix}/{p['path']}", str(path.parent / p["path"])) for p in res["predictions"]]
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
        raise BenchError(f"the Hub refused the pull request: {first_line(e)}") from None
    except OSError as e:
        raise OfflineError(f"cannot reach the Hub to submit ({type(e).__name__}); check the network") from None
    return info.pr_url or info.commit_url
