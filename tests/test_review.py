"""`bench review` end to end against the local Hub server: PRs, stamps, comments, merges."""

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tests.fakehub import FakeHub


def _forge(path):
    """A forger's result: every image made a confident top-1 hit (label moved to the front of the top-k
    at probability 0.9; rows stay self-consistent), sha256 and metrics recomputed: only a re-run of
    the images through the model can tell."""
    from benchmark.fsutil import sha256_file
    from eval.predictions import read_predictions
    from eval.scoring import ScoringOptions, score

    r = json.loads(path.read_text())
    for p in r["predictions"]:
        f = path.parent / p["path"]
        t = pq.read_table(f)
        idx, probs = t["topk_idx"].to_pylist(), t["topk_prob"].to_pylist()
        labels = t["label"].to_pylist()
        idx = [[y] + [i for i in row if i != y][:len(row) - 1] for y, row in zip(labels, idx)]
        probs = [[0.9] + row[:-1] for row in probs]
        for name, values in (("topk_idx", idx), ("topk_prob", probs), ("true_prob", [0.9] * t.num_rows),
                             ("true_rank", [0] * t.num_rows)):
            t = t.set_column(t.schema.get_field_index(name), name, pa.array(values, type=t.schema.field(name).type))
        pq.write_table(t, f)
        p["sha256"] = sha256_file(f)
    tables = {p["config"]: read_predictions(path.parent / p["path"]) for p in r["predictions"]}
    r["metrics"] = score(r["suite"]["metric_family"], tables, ScoringOptions(**r["protocol"]["scoring"]))
    path.write_text(json.dumps(r))


def test_review_signs_comments_merges_good_and_refuses_forged(tmp_path, toy_suite, tiny_checkpoint, capsys):
    from huggingface_hub import HfApi

    from eval import stamps
    from eval.inference import InferenceOptions
    from eval.runner import EvalRequest, evaluate
    from eval.verify import verify_result
    from leaderboard.review import MARKER, review
    from leaderboard.submit import submit

    _, good = evaluate(EvalRequest(model="test_resnet.r160_in1k", suite=str(toy_suite), checkpoint=str(tiny_checkpoint),
                                   out=str(tmp_path / "runs"), inference=InferenceOptions(batch_size=40, workers=0,
                                                                                         compile="off")), progress=False)
    forged_dir = tmp_path / "forged" / good.parent.name
    shutil.copytree(good.parent, forged_dir)
    forged = forged_dir / "result.json"
    _forge(forged)
    assert verify_result(forged, suite=str(toy_suite)).ok  # hashes, rows and metrics agree: only a re-run can tell
    stamps.generate_key(tmp_path / "maintainer.key")
    trusted = stamps.load_trusted_keys(tmp_path / "maintainer.key.pub")

    with FakeHub() as hub:
        hub.create("dataset", "org/results")
        api = HfApi(endpoint=hub.endpoint)
        submit(good, "org/results", endpoint=hub.endpoint)
        submit(forged, "org/results", endpoint=hub.endpoint)
        kw = dict(key_path=str(tmp_path / "maintainer.key"), recheck=80, merge=False, checkpoint=str(tiny_checkpoint), suite=str(toy_suite),
                  endpoint=hub.endpoint)
        dry = {o.pr: o for o in review("org/results", **kw)}  # reviewed, stamped, commented, not merged
        assert dry[1].status == "passed" and not dry[1].merged
        kw["merge"] = True
        first = {o.pr: o for o in review("org/results", **kw)}  # a later run with --merge merges it, no re-review
        assert first[1].status == "skipped" and first[2].status == "skipped"
        first[2] = dry[2]
        assert first[1].merged and dry[1].problems == []
        assert first[2].status == "failed" and not first[2].merged
        assert any("true-class probability" in p for p in first[2].problems), first[2].problems

        repo = hub.repos[("dataset", "org/results")]
        main = repo.commits[repo.refs["main"]].files
        entry = dry[1].entries[0]
        stamp = json.loads(main[f"{entry}/verification.json"])
        assert stamps.check_signature(stamp, trusted) is None and stamp["recheck"]["n"] == 80
        assert isinstance(stamp["recheck"]["seed"], int) and stamp["result_sha256"]
        assert main[f"{entry}/result.json"] == good.read_bytes()
        d1 = api.get_discussion_details("org/results", 1, repo_type="dataset")
        d2 = api.get_discussion_details("org/results", 2, repo_type="dataset")
        assert d1.status == "merged" and d2.status == "open"
        c1 = [e.content for e in d1.events if e.type == "comment"]
        c2 = [e.content for e in d2.events if e.type == "comment"]
        assert "Verification passed" in c1[0] and MARKER.search(c1[0])
        assert "Verification failed" in c2[0] and "true-class probability" in c2[0]
        assert "verification.json" not in "".join(repo.commits[repo.refs["refs/pr/2"]].files)

        # a rerun does nothing new: no commit, no comment, no merge
        posts = sum(m == "POST" for m, _ in hub.requests)
        second = review("org/results", **kw)
        assert [o.status for o in second] == ["skipped"]  # PR 1 is merged, PR 2 reviewed at its head
        assert sum(m == "POST" for m, _ in hub.requests) == posts

        # the merged store shows the entry as verified by the trusted key
        from leaderboard.store import load_store
        snap = api.snapshot_download("org/results", repo_type="dataset", local_dir=tmp_path / "snap")
        store = load_store(snap, trusted_keys=trusted, suites=[str(toy_suite)])
        assert [e.verified for e in store.entries] == [True], [e.note for e in store.entries]
        assert [e.verified for e in load_store(snap).entries] == [False]  # no trusted keys: no badge


def test_review_one_broken_pr_never_stops_the_others(tmp_path, monkeypatch, capsys):
    from huggingface_hub import CommitOperationAdd, HfApi, constants

    from benchmark.cli import main
    from eval import stamps
    from leaderboard.review import Reviewer, review, watch

    stamps.generate_key(tmp_path / "k")
    with FakeHub() as hub:
        hub.create("dataset", "org/results")
        api = HfApi(endpoint=hub.endpoint)
        api.create_commit("org/results", [CommitOperationAdd("s/m/result.json", b"{not json")], repo_type="dataset",
                          create_pr=True, commit_message="broken")
        api.create_commit("org/results", [CommitOperationAdd("README.md", b"[x](javascript:1)")], repo_type="dataset",
                          create_pr=True, commit_message="stray file")
        out = review("org/results", key_path=str(tmp_path / "k"), recheck=5, endpoint=hub.endpoint)
        assert [o.status for o in out] == ["failed", "failed"]
        assert "rejected by the store" in out[0].problems[0]
        assert "changes README.md" in out[1].problems[0]
        comment = [e.content for e in api.get_discussion_details("org/results", 2, repo_type="dataset").events
                   if e.type == "comment"][0]
        assert "```text\nchanges README.md" in comment  # data-derived text quoted, never live Markdown

        # the CLI (HF_ENDPOINT, read by huggingface_hub) and the --watch loop: both PRs already reviewed
        monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)
        assert main(["review", "--repo", "org/results", "--key", str(tmp_path / "k"), "--recheck", "5"]) == 0
        out = capsys.readouterr().out
        assert out.count("skipped") == 2 and "#1" in out and "#2" in out
        passes = []
        watch(Reviewer("org/results", key_path=str(tmp_path / "k"), endpoint=hub.endpoint), 0.01,
              report=passes.append, passes=2)
        assert [[o.status for o in p] for p in passes] == [["skipped", "skipped"]] * 2


def test_review_cli_bad_key_is_one_line(tmp_path, capsys):
    from benchmark.cli import main
    assert main(["review", "--repo", "org/results", "--key", str(tmp_path / "nope.key")]) != 0
    err = capsys.readouterr().err
    assert err.startswith("error:") and "bench keygen" in err and len(err.strip().splitlines()) == 1
    assert main(["review", "--repo", "../x", "--key", str(tmp_path / "nope.key")]) != 0
    assert "is not a Hub repo id" in capsys.readouterr().err
