"""`bench review` end to end against the local Hub server: PRs, stamps, comments, merges."""

import json
import shutil

import pytest
import pyarrow as pa
import pyarrow.parquet as pq

from tests.fakehub import FakeHub


def _rewrite(run_dir, change=None, tables=None):
    """Edit a result as a forger would and make it self-consistent again: predictions sha256, every metric and
    the config hash recomputed (``tables``: config -> predictions table to write first)."""
    from genshift.fsutil import canonical_json, sha256_file
    from genshift.eval.predictions import read_predictions
    from genshift.eval.results import config_hash
    from genshift.eval.scoring import ScoringOptions, score

    path = run_dir / "result.json"
    r = json.loads(path.read_text())
    if change:
        change(r)
    for p in r["predictions"]:
        f = run_dir / p["path"]
        if tables and p["config"] in tables:
            pq.write_table(tables[p["config"]], f)
        p["sha256"] = sha256_file(f)
    preds = {p["config"]: read_predictions(run_dir / p["path"]) for p in r["predictions"]}
    r["metrics"] = score(r["suite"]["metric_family"], preds, ScoringOptions(**r["protocol"]["scoring"]))
    r["config_hash"] = config_hash(r["model"], r["suite"], r["protocol"], r["data_config"])
    path.write_bytes(canonical_json(r))


def _forge(path):
    """A forger's result: every image made a confident top-1 hit (label moved to the front of the top-k
    at probability 0.9; rows stay self-consistent), sha256 and metrics recomputed: only a re-run of
    the images through the model can tell."""
    r = json.loads(path.read_text())
    tables = {}
    for p in r["predictions"]:
        t = pq.read_table(path.parent / p["path"])
        idx, probs = t["topk_idx"].to_pylist(), t["topk_prob"].to_pylist()
        labels = t["label"].to_pylist()
        idx = [[y] + [i for i in row if i != y][:len(row) - 1] for y, row in zip(labels, idx)]
        probs = [[0.9] + row[:-1] for row in probs]
        for name, values in (("topk_idx", idx), ("topk_prob", probs), ("true_prob", [0.9] * t.num_rows),
                             ("true_rank", [0] * t.num_rows)):
            t = t.set_column(t.schema.get_field_index(name), name, pa.array(values, type=t.schema.field(name).type))
        tables[p["config"]] = t
    _rewrite(path.parent, tables=tables)


def test_review_signs_comments_merges_good_and_refuses_forged(tmp_path, toy_suite, tiny_checkpoint, capsys):
    from huggingface_hub import HfApi

    from genshift.eval import stamps
    from genshift import evaluate
    from genshift.eval.verify import verify_result
    from genshift.leaderboard.review import MARKER, review
    from genshift.leaderboard.submit import submit

    good = evaluate(f"test_resnet.r160_in1k={tiny_checkpoint}", str(toy_suite), out=tmp_path / "runs",
                    batch_size=40, workers=0, compile="off", progress=False).path
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
        from genshift.leaderboard.store import load_store
        snap = api.snapshot_download("org/results", repo_type="dataset", local_dir=tmp_path / "snap")
        store = load_store(snap, trusted_keys=trusted, suites=[str(toy_suite)])
        assert [e.verified for e in store.entries] == [True], [e.note for e in store.entries]
        assert [e.verified for e in load_store(snap).entries] == [False]  # no trusted keys: no badge


def test_review_one_broken_pr_never_stops_the_others(tmp_path, monkeypatch, capsys):
    from huggingface_hub import CommitOperationAdd, HfApi, constants

    from genshift.cli import main
    from genshift.eval import stamps
    from genshift.leaderboard.review import Reviewer, review, watch

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
    from genshift.cli import main
    assert main(["review", "--repo", "org/results", "--key", str(tmp_path / "nope.key")]) != 0
    err = capsys.readouterr().err
    assert err.startswith("error:") and "bench keygen" in err and len(err.strip().splitlines()) == 1
    assert main(["review", "--repo", "../x", "--key", str(tmp_path / "nope.key")]) != 0
    assert "is not a Hub repo id" in capsys.readouterr().err
    # a key file whose read fails (an I/O error, whoever runs the test): one line, no traceback
    assert main(["review", "--repo", "org/results", "--key", "/proc/self/mem"]) != 0
    err = capsys.readouterr().err
    assert err.startswith("error: signing key '/proc/self/mem' cannot be read (Input/output error)") and len(err.strip().splitlines()) == 1


# -- attacks on the review service: markers, ownership, terminal answers --------------------------------------------
USERS = {"tok-maint": "maintainer", "tok-alice": "alice", "tok-mallory": "mallory"}  # token -> Hub account


@pytest.fixture(scope="module")
def made(tmp_path_factory, tiny_checkpoint):
    """A toy suite, one honest run of ``test_resnet.r160_in1k`` on it (local weights) and the maintainer key."""
    from genshift.synthetic import make_synthetic_suite
    from genshift.eval import stamps
    from genshift import evaluate

    root = tmp_path_factory.mktemp("review")
    make_synthetic_suite(root / "toy", configs=("base", "shifted"), classes=range(10), per_class=4, num_shards=2)
    path = evaluate(f"test_resnet.r160_in1k={tiny_checkpoint}", str(root / "toy"), out=root / "runs",
                    batch_size=40, workers=0, compile="off", progress=False).path
    stamps.generate_key(root / "maintainer.key")
    return root / "toy", path.parent, root / "maintainer.key"


def _copy(made, tmp_path, name, change=None):
    run = tmp_path / "copies" / name
    shutil.copytree(made[1], run)
    if change:
        _rewrite(run, change)
    return run


def _entry_ops(run, folder):
    from huggingface_hub import CommitOperationAdd

    return [CommitOperationAdd(f"{folder}/{p.relative_to(run)}", str(p))
            for p in sorted(run.rglob("*")) if p.is_file() and (p.name == "result.json" or p.suffix == ".parquet")]


def _open_pr(hub, token, ops, title="submission") -> int:
    from huggingface_hub import HfApi

    info = HfApi(endpoint=hub.endpoint, token=token).create_commit("org/results", ops, repo_type="dataset",
                                                                   create_pr=True, commit_message=title)
    return int(info.pr_url.rstrip("/").rsplit("/", 1)[1])


def _push(hub, token, num, ops):
    from huggingface_hub import HfApi

    HfApi(endpoint=hub.endpoint, token=token).create_commit("org/results", ops, repo_type="dataset",
                                                            revision=f"refs/pr/{num}", commit_message="update")


def _say(hub, token, num, text):
    from huggingface_hub import HfApi

    HfApi(endpoint=hub.endpoint, token=token).comment_discussion("org/results", num, text, repo_type="dataset")


def _comments(hub, num):
    from huggingface_hub import HfApi

    d = HfApi(endpoint=hub.endpoint).get_discussion_details("org/results", num, repo_type="dataset")
    return [(e.author, e.content) for e in d.events if e.type == "comment"]


def _head(hub, num):
    repo = hub.repos[("dataset", "org/results")]
    return repo.refs[f"refs/pr/{num}"]


def _bench_review(monkeypatch, hub, made, *extra, token="tok-maint", key=None):
    """``bench review`` through the CLI, against the local Hub as the maintainer's account."""
    from huggingface_hub import constants

    from genshift.cli import main

    monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)  # what HF_ENDPOINT sets at import
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setenv("HF_TOKEN", token)
    return main(["review", "--repo", "org/results", "--key", str(key or made[2]), "--suite", str(made[0]),
                 "--recheck", "5", *extra])


@pytest.fixture
def reruns(monkeypatch):
    """Every image re-run ``bench review`` asks for (``verify_result`` with ``recheck``), by result path."""
    import genshift.eval.verify

    calls, real = [], genshift.eval.verify.verify_result

    def counting(path, **kw):
        if kw.get("recheck"):
            calls.append(str(path))
        return real(path, **kw)
    monkeypatch.setattr(genshift.eval.verify, "verify_result", counting)
    return calls


def test_forged_and_copied_review_markers_are_not_believed(made, tmp_path, monkeypatch, capsys, tiny_checkpoint,
                                                           reruns):
    from genshift.eval import stamps
    from genshift.leaderboard.review import Reviewer

    entry = "toy/test_resnet.r160_in1k"
    stamps.generate_key(tmp_path / "alice.key")
    alice_key = Reviewer("org/results", key_path=str(tmp_path / "alice.key"), endpoint="http://127.0.0.1:9")
    maint = Reviewer("org/results", key_path=str(made[2]), endpoint="http://127.0.0.1:9")
    with FakeHub(users=USERS) as hub:
        hub.create("dataset", "org/results")
        from huggingface_hub import CommitOperationAdd

        # PR 1 (alice): replaces the README next to her entry, then marks it passed herself, three ways
        pr1 = _open_pr(hub, "tok-alice", _entry_ops(made[1], entry) + [CommitOperationAdd("README.md", b"# mine")])
        h1 = _head(hub, pr1)
        _say(hub, "tok-alice", pr1, f"lgtm\n\n<!-- genshift-review head={h1} outcome=passed -->")  # the old format
        _say(hub, "tok-alice", pr1, "lgtm\n\n" + alice_key.marker(pr1, h1, "passed"))  # signed by her own key
        # PR 2 (alice, honest): mallory marks it failed with her own key, and with a maintainer-signed marker that
        # she posts herself (were one ever leaked): neither is the maintainer's account writing its own answer
        pr2 = _open_pr(hub, "tok-alice", _entry_ops(made[1], entry))
        h2 = _head(hub, pr2)
        _say(hub, "tok-mallory", pr2, "nope\n\n" + alice_key.marker(pr2, h2, "failed"))
        _say(hub, "tok-mallory", pr2, "nope\n\n" + maint.marker(pr2, h2, "failed"))

        assert _bench_review(monkeypatch, hub, made, "--merge", "--checkpoint", str(tiny_checkpoint)) == 0
        out = capsys.readouterr().out
        assert f"#{pr1}" in out and f"#{pr2}" in out and "skipped" not in out
        assert sorted(reruns) and all(p.endswith("result.json") for p in reruns)  # PR 2 was really re-run
        repo = hub.repos[("dataset", "org/results")]
        main = repo.commits[repo.refs["main"]].files
        assert main.get("README.md") is None                       # PR 1 not merged
        assert f"{entry}/verification.json" in main                # PR 2 reviewed, stamped and merged
        assert hub.repos[("dataset", "org/results")].discussions[pr2]["status"] == "merged"
        assert hub.repos[("dataset", "org/results")].discussions[pr1]["status"] == "open"
        author, text = _comments(hub, pr1)[-1]
        assert author == "maintainer" and "Verification failed" in text and "changes README.md" in text

        # the maintainer's genuine passed marker of PR 2, copied onto PR 1 (even by the maintainer's own account):
        # it is signed for PR 2 and another head, so PR 1 stays unreviewed-as-passed; its own failed answer stands
        passed2 = next(t for a, t in _comments(hub, pr2) if "Verification passed" in t)
        _say(hub, "tok-alice", pr1, passed2)
        _say(hub, "tok-maint", pr1, passed2)
        # ... and a passed marker for PR 1 at an older head cannot carry over to the next push
        n = len(reruns)
        assert _bench_review(monkeypatch, hub, made, "--merge", "--checkpoint", str(tiny_checkpoint)) == 0
        assert "skipped" in capsys.readouterr().out and len(reruns) == n  # its own signed failed answer: no re-run
        assert repo.discussions[pr1]["status"] == "open" and "README.md" not in repo.commits[repo.refs["main"]].files

        # the markers the service believes: its own, signed over this repo, this PR, this head and this outcome
        from huggingface_hub import HfApi
        maint.account = "maintainer"
        events = HfApi(endpoint=hub.endpoint).get_discussion_details("org/results", pr1, repo_type="dataset").events
        assert maint.answers(pr1, events) == {h1: "failed"}  # not alice's passed markers, not PR 2's copied one
        maint.account = None  # even were the Hub to name no authors, the signatures alone decide the same
        assert maint.answers(pr1, events) == {h1: "failed"}
        maint.account = "maintainer"
        tampered = passed2.replace("outcome=passed", "outcome=failed")
        assert "outcome=failed" in tampered
        _say(hub, "tok-maint", pr2, tampered)
        events2 = HfApi(endpoint=hub.endpoint).get_discussion_details("org/results", pr2, repo_type="dataset").events
        assert list(maint.answers(pr2, events2).values()) == ["passed"]  # the edited outcome fails its signature

        # a new maintainer key (rotation): no earlier answer carries it, so PR 1 is answered once more
        stamps.generate_key(tmp_path / "new.key")
        assert _bench_review(monkeypatch, hub, made, key=tmp_path / "new.key") == 0
        assert "failed" in capsys.readouterr().out and len(_comments(hub, pr1)) == 6


def test_a_pr_may_only_add_or_replace_its_own_entry(made, tmp_path, monkeypatch, capsys, tiny_checkpoint, reruns):
    from huggingface_hub import CommitOperationAdd, HfApi

    from genshift.leaderboard.store import load_store

    own = "toy/test_resnet.r160_in1k"
    other = _copy(made, tmp_path, "other", lambda r: r["model"].update(id="timm/other_model.in1k"))
    org_m = _copy(made, tmp_path, "org_m", lambda r: r["model"].update(id="org/m"))
    collide = _copy(made, tmp_path, "collide", lambda r: r["model"].update(id="org--m"))  # the same folder name
    again = _copy(made, tmp_path, "again", lambda r: r.update(notes="re-run with a newer timm"))
    with FakeHub(users=USERS) as hub:
        hub.create("dataset", "org/results")
        api = HfApi(endpoint=hub.endpoint, token="tok-maint")
        api.create_commit("org/results", _entry_ops(made[1], own) + _entry_ops(org_m, "toy/org--m")
                          + [CommitOperationAdd(f"{own}/verification.json", b'{"kind": "genshift-verification"}')],
                          repo_type="dataset", commit_message="entries already on main")
        prs = {
            "overwrite": _open_pr(hub, "tok-alice", _entry_ops(other, own)),           # another model in own's folder
            "misfiled": _open_pr(hub, "tok-alice", _entry_ops(made[1], "other-suite/a..b")),
            "collide": _open_pr(hub, "tok-alice", _entry_ops(collide, "toy/org--m")),  # org--m replacing org/m
            "stamp": _open_pr(hub, "tok-alice", [CommitOperationAdd(f"{own}/verification.json", b"{}")]),
            "readme": _open_pr(hub, "tok-alice", _entry_ops(again, own) + [CommitOperationAdd("README.md", b"x")]),
            "unnamed": _open_pr(hub, "tok-alice", _entry_ops(again, own)
                                + [CommitOperationAdd(f"{own}/predictions/junk.parquet", b"PAR1 not named")]),
            "replace": _open_pr(hub, "tok-alice", _entry_ops(again, own)),             # same model id: allowed
            "race": _open_pr(hub, "tok-alice", _entry_ops(_copy(made, tmp_path, "race", lambda r: r["model"].update(
                id="org--q")), "toy/org--q")),                                      # new at its base, but ...
        }
        # ... main moved on after the PR was opened: another model's entry now holds that folder
        api.create_commit("org/results", _entry_ops(_copy(made, tmp_path, "org_q", lambda r: r["model"].update(
            id="org/q")), "toy/org--q"), repo_type="dataset", commit_message="merged meanwhile")
        assert _bench_review(monkeypatch, hub, made, "--checkpoint", str(tiny_checkpoint)) == 0
        capsys.readouterr()
        said = {k: _comments(hub, n)[-1][1] for k, n in prs.items()}
        assert "filed under toy/test_resnet.r160_in1k/, but its result is timm/other_model.in1k on toy, which " \
               "belongs under toy/timm--other_model.in1k/" in said["overwrite"]
        assert "filed under other-suite/a..b/" in said["misfiled"] and "belongs under toy/test_resnet.r160_in1k/" \
            in said["misfiled"]
        assert "replaces the entry of org/m with a result of org--m on toy" in said["collide"]
        assert "replaces the entry of org/q with a result of org--q on toy" in said["race"]
        assert "verification stamps are written only by the reviewer" in said["stamp"]
        assert "changes README.md" in said["readme"]
        assert f"changes {own}/predictions/junk.parquet, which {own}/result.json does not name" in said["unnamed"]
        assert all("Verification failed" in said[k]
                   for k in ("overwrite", "misfiled", "collide", "stamp", "readme", "unnamed"))
        assert "Verification passed" in said["replace"]
        # only the allowed replacement reached the image re-run: every refusal came before it
        assert len(reruns) == 1 and reruns[0].endswith(f"{own}/result.json")

    # the store refuses a misfiled entry the same way (its folder is owned by the result's suite and model ids)
    store = tmp_path / "store"
    shutil.copytree(other, store / "toy" / "test_resnet.r160_in1k")
    shutil.copytree(made[1], store / "toy" / "test_resnet.r160_in1k.v2")
    loaded = load_store(str(store), suites=[str(made[0])])
    assert loaded.entries == [] and len(loaded.rejected) == 2
    reasons = {e.path.parent.name: e.reason for e in loaded.rejected}
    assert "belongs under toy/timm--other_model.in1k/" in reasons["test_resnet.r160_in1k"]
    assert "filed under toy/test_resnet.r160_in1k.v2/" in reasons["test_resnet.r160_in1k.v2"]


def test_every_pr_gets_a_terminal_answer_and_is_not_retried(made, tmp_path, monkeypatch, capsys, tiny_checkpoint,
                                                            reruns):
    import timm
    import torch
    from safetensors.torch import save_file

    entry = "toy/test_resnet.r160_in1k"
    torch.manual_seed(1)  # the same architecture, other weights: not what the entry was scored with
    other_weights = tmp_path / "other.safetensors"
    save_file({k: v.contiguous() for k, v in timm.create_model("test_resnet.r160_in1k").state_dict().items()},
              str(other_weights))
    missing = _copy(made, tmp_path, "missing", lambda r: r["model"].update(
        source="hf-hub", id="org/no-such-model", weights_revision="a" * 40))
    with FakeHub(users=USERS) as hub:
        hub.create("dataset", "org/results")
        # a timm model repo whose weights do not fit its architecture: timm cannot load it
        from huggingface_hub import CommitOperationAdd, HfApi
        hub.create("model", "org/broken")
        cfg = {"architecture": "test_resnet", "num_classes": 1000,
               "pretrained_cfg": timm.create_model("test_resnet.r160_in1k").pretrained_cfg}
        save_file({"junk": torch.zeros(3)}, str(tmp_path / "broken.safetensors"))
        sha = HfApi(endpoint=hub.endpoint).create_commit(
            "org/broken", [CommitOperationAdd("config.json", json.dumps(cfg, default=str).encode()),
                           CommitOperationAdd("model.safetensors", str(tmp_path / "broken.safetensors"))],
            commit_message="weights").oid
        broken_run = _copy(made, tmp_path, "broken", lambda r: r["model"].update(
            source="hf-hub", id="org/broken", weights_revision=sha))
        pr = _open_pr(hub, "tok-alice", _entry_ops(made[1], entry))
        gone = _open_pr(hub, "tok-alice", _entry_ops(missing, "toy/org--no-such-model"))
        broken = _open_pr(hub, "tok-alice", _entry_ops(broken_run, "toy/org--broken"))

        # no --checkpoint: the reviewer lacks the local weights; the Hub has no such model repo
        assert _bench_review(monkeypatch, hub, made) == 0  # bad submissions are answered, not a service failure
        assert "unreviewable" in capsys.readouterr().out
        (author, text), = _comments(hub, pr)
        assert author == "maintainer" and "cannot be checked" in text and "scored with local weights" in text
        assert "is not retried" in text
        (_, text), = _comments(hub, gone)
        assert "cannot be checked" in text and "model org/no-such-model is not available on the Hub" in text
        (_, text), = _comments(hub, broken)
        assert "cannot be checked" in text and "model hf-hub:org/broken@" in text and "cannot be loaded (RuntimeError" in text
        tried = len(reruns)
        assert tried == 2  # both Hub models reached the re-run; the local-weights entry was refused before it

        # the next scheduled pass: both answered at their heads, nothing re-run, nothing posted
        posts = sum(m == "POST" for m, _ in hub.requests)
        assert _bench_review(monkeypatch, hub, made) == 0
        assert capsys.readouterr().out.count("skipped") == 3
        assert len(reruns) == tried and sum(m == "POST" for m, _ in hub.requests) == posts
        assert len(_comments(hub, pr)) == 1
        # ... unless a maintainer asks for one PR again (--again): that one is re-run and answered anew
        assert _bench_review(monkeypatch, hub, made, "--again", str(gone)) == 0
        assert "skipped" in capsys.readouterr().out and len(reruns) == tried + 1 and len(_comments(hub, gone)) == 2
        assert len(_comments(hub, pr)) == 1
        tried += 1

        # a new push is a new head: reviewed again (other weights given: unreviewable, saying whose they are)
        _push(hub, "tok-alice", pr, _entry_ops(_copy(made, tmp_path, "v2", lambda r: r.update(notes="v2")), entry))
        assert _bench_review(monkeypatch, hub, made, "--checkpoint", str(other_weights)) == 0
        capsys.readouterr()
        assert len(_comments(hub, pr)) == 2 and "not the reviewer's --checkpoint" in _comments(hub, pr)[-1][1]
        # ... and once more with the weights it was scored with: passed, stamped, merged
        _push(hub, "tok-alice", pr, _entry_ops(_copy(made, tmp_path, "v3", lambda r: r.update(notes="v3")), entry))
        assert _bench_review(monkeypatch, hub, made, "--checkpoint", str(tiny_checkpoint), "--merge") == 0
        capsys.readouterr()
        texts = [t for _, t in _comments(hub, pr)]
        assert len(texts) == 4 and "Verification passed" in texts[2] and texts[3].startswith("Merged by `bench review`")
        assert hub.repos[("dataset", "org/results")].discussions[pr]["status"] == "merged"
        assert len(reruns) == tried + 1

        # --merge merges only the commit that was reviewed: a push between the review and the merge stops it
        from genshift.leaderboard.review import Outcome, Reviewer
        late = _open_pr(hub, "tok-alice", _entry_ops(_copy(made, tmp_path, "v4", lambda r: r.update(notes="v4")), entry))
        reviewed = _head(hub, late)
        _push(hub, "tok-alice", late, _entry_ops(_copy(made, tmp_path, "v5", lambda r: r.update(notes="v5")), entry))
        outcome = Outcome(late, head=reviewed, status="passed")
        Reviewer("org/results", key_path=str(made[2]), endpoint=hub.endpoint, merge=True)._merge(outcome)
        assert not outcome.merged and "head moved" in outcome.problems[0]
        assert hub.repos[("dataset", "org/results")].discussions[late]["status"] == "open"


def test_review_exits_non_zero_only_when_the_service_fails(made, monkeypatch, capsys):
    from huggingface_hub import constants

    from genshift.cli import main

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("HF_TOKEN", "tok-maint")
    assert main(["review", "--repo", "org/results", "--key", str(made[2])]) != 0
    err = capsys.readouterr().err
    assert err.startswith("error:") and len(err.strip().splitlines()) == 1 and "org/results" in err
    with FakeHub(users=USERS) as hub:
        hub.create("dataset", "org/results")
        assert _bench_review(monkeypatch, hub, made, token="tok-stolen") != 0  # a token the Hub does not know
        err = capsys.readouterr().err
        assert err.startswith("error:") and "refused the token" in err and len(err.strip().splitlines()) == 1
        monkeypatch.setenv("HF_TOKEN", "tok-maint")
        assert main(["review", "--repo", "org/missing", "--key", str(made[2])]) != 0
        assert "results repo datasets/org/missing not found" in capsys.readouterr().err


def test_a_crash_in_a_check_is_no_answer_and_is_retried(made, monkeypatch, capsys, tiny_checkpoint):
    import genshift.eval.verify

    real = genshift.eval.verify.verify_result

    def crash(path, **kw):
        if kw.get("recheck"):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(path, **kw)
    with FakeHub(users=USERS) as hub:
        hub.create("dataset", "org/results")
        pr = _open_pr(hub, "tok-alice", _entry_ops(made[1], "toy/test_resnet.r160_in1k"))
        monkeypatch.setattr(genshift.eval.verify, "verify_result", crash)
        assert _bench_review(monkeypatch, hub, made, "--checkpoint", str(tiny_checkpoint)) == 1  # the service failed
        assert "RuntimeError: CUDA error" in capsys.readouterr().out and _comments(hub, pr) == []  # no answer
        monkeypatch.setattr(genshift.eval.verify, "verify_result", real)
        assert _bench_review(monkeypatch, hub, made, "--checkpoint", str(tiny_checkpoint)) == 0  # retried
        assert "passed" in capsys.readouterr().out and "Verification passed" in _comments(hub, pr)[-1][1]


def test_entry_folders_are_derived_from_the_ids():
    from genshift.eval.results import entry_dir, path_slug

    assert path_slug("timm/resnet50.a1_in1k") == "timm--resnet50.a1_in1k" == path_slug("timm--resnet50.a1_in1k")
    assert path_slug("ré/x y") == "r----x--y"  # ASCII only: the folder names the results repo accepts
    assert path_slug("..") == "_.." and path_slug("") == "_" and len(path_slug("m" * 300)) == 96
    assert entry_dir({"suite": {"id": "imagenet-star"}, "model": {"id": "org/m"}}) == "imagenet-star/org--m"


def test_a_pr_merged_on_a_later_run_is_checked_against_main_as_it_is_then(made, tmp_path, monkeypatch, capsys,
                                                                          tiny_checkpoint, reruns):
    """Passed without --merge, then main moved on: another model's entry now holds the PR's folder. The later
    --merge run re-checks ownership against main (no image re-run) and answers 'failed' instead of merging,
    once, rather than overwriting that entry."""
    from huggingface_hub import HfApi

    entry = "toy/test_resnet.r160_in1k"
    with FakeHub(users=USERS) as hub:
        hub.create("dataset", "org/results")
        api = HfApi(endpoint=hub.endpoint, token="tok-maint")
        pr = _open_pr(hub, "tok-alice", _entry_ops(made[1], entry))
        assert _bench_review(monkeypatch, hub, made, "--checkpoint", str(tiny_checkpoint)) == 0  # no --merge
        assert "passed" in capsys.readouterr().out and len(reruns) == 1
        # meanwhile main got org/q's entry in that folder (a maintainer's direct commit)
        api.create_commit("org/results", _entry_ops(_copy(made, tmp_path, "org_q", lambda r: r["model"].update(
            id="org/q")), entry), repo_type="dataset", commit_message="merged meanwhile")
        repo = hub.repos[("dataset", "org/results")]
        before = repo.commits[repo.refs["main"]].files[f"{entry}/result.json"]

        assert _bench_review(monkeypatch, hub, made, "--checkpoint", str(tiny_checkpoint), "--merge") == 0
        out = capsys.readouterr().out
        assert len(reruns) == 1  # the ownership re-check needs no image re-run
        assert repo.discussions[pr]["status"] == "open", out
        assert repo.commits[repo.refs["main"]].files[f"{entry}/result.json"] == before  # org/q's entry stands
        author, text = _comments(hub, pr)[-1]
        assert author == "maintainer" and "Verification failed" in text
        assert "replaces the entry of org/q with a result of test_resnet.r160_in1k on toy" in text

        # its new (failed) answer at the same head is the one believed from now on: nothing more is done
        posts = sum(m == "POST" for m, _ in hub.requests)
        assert _bench_review(monkeypatch, hub, made, "--checkpoint", str(tiny_checkpoint), "--merge") == 0
        assert "skipped (failed earlier)" in capsys.readouterr().out
        assert sum(m == "POST" for m, _ in hub.requests) == posts and repo.discussions[pr]["status"] == "open"


def test_a_push_during_the_review_is_no_answer_and_no_service_failure(made, tmp_path, monkeypatch, capsys,
                                                                       tiny_checkpoint):
    """The submitter pushes while the images are re-run: the stamps are not committed on top of the unreviewed
    push (the Hub refuses the stale parent), nothing is commented, the run exits 0; the next run reviews the
    new head."""
    import genshift.eval.verify

    entry = "toy/test_resnet.r160_in1k"
    real = genshift.eval.verify.verify_result
    with FakeHub(users=USERS) as hub:
        hub.create("dataset", "org/results")
        pr = _open_pr(hub, "tok-alice", _entry_ops(made[1], entry))
        v2 = _copy(made, tmp_path, "v2", lambda r: r.update(notes="pushed during the review"))

        def push_meanwhile(path, **kw):
            if kw.get("recheck"):
                _push(hub, "tok-alice", pr, _entry_ops(v2, entry))
            return real(path, **kw)
        monkeypatch.setattr(genshift.eval.verify, "verify_result", push_meanwhile)
        assert _bench_review(monkeypatch, hub, made, "--checkpoint", str(tiny_checkpoint), "--merge") == 0
        assert "moved" in capsys.readouterr().out
        repo = hub.repos[("dataset", "org/results")]
        assert _comments(hub, pr) == [] and repo.discussions[pr]["status"] == "open"
        assert not any(p.endswith("verification.json") for p in repo.commits[_head(hub, pr)].files)

        monkeypatch.setattr(genshift.eval.verify, "verify_result", real)
        assert _bench_review(monkeypatch, hub, made, "--checkpoint", str(tiny_checkpoint), "--merge") == 0
        capsys.readouterr()
        assert repo.discussions[pr]["status"] == "merged"
        assert b"pushed during the review" in repo.commits[repo.refs["main"]].files[f"{entry}/result.json"]


def test_a_pr_of_thousands_of_files_gets_one_bounded_answer(made, monkeypatch, capsys):
    """A flood of stray files: answered once ('failed'), with the first offending paths and a count of the rest,
    never a comment that grows with the PR."""
    from huggingface_hub import CommitOperationAdd

    with FakeHub(users=USERS) as hub:
        hub.create("dataset", "org/results")
        pr = _open_pr(hub, "tok-mallory", [CommitOperationAdd(f"junk/{i:05d}-{'x' * 80}.txt", b"x")
                                           for i in range(2000)])
        assert _bench_review(monkeypatch, hub, made) == 0
        assert "failed" in capsys.readouterr().out
        [(author, text)] = _comments(hub, pr)
        assert author == "maintainer" and "Verification failed" in text and "changes junk/00000-" in text
        assert "… and 1950 more" in text and len(text) < 20_000, len(text)


def test_a_push_after_a_passed_review_is_reviewed_on_its_merits(made, tmp_path, monkeypatch, capsys, tiny_checkpoint,
                                                                reruns):
    """The PR holds the reviewer's own stamps from its earlier pass; the submitter pushes a new run of the same
    model: the new head is reviewed (images re-run), re-stamped and merged, not failed for the old stamps. A
    stamp the reviewer did not sign is still refused."""
    from huggingface_hub import CommitOperationAdd

    entry = "toy/test_resnet.r160_in1k"
    with FakeHub(users=USERS) as hub:
        hub.create("dataset", "org/results")
        pr = _open_pr(hub, "tok-alice", _entry_ops(made[1], entry))
        assert _bench_review(monkeypatch, hub, made, "--checkpoint", str(tiny_checkpoint)) == 0
        capsys.readouterr()
        repo = hub.repos[("dataset", "org/results")]
        old_stamp = repo.commits[_head(hub, pr)].files[f"{entry}/verification.json"]
        _push(hub, "tok-alice", pr, _entry_ops(_copy(made, tmp_path, "v2", lambda r: r.update(notes="v2")), entry))
        assert _bench_review(monkeypatch, hub, made, "--checkpoint", str(tiny_checkpoint), "--merge") == 0
        out = capsys.readouterr().out
        assert len(reruns) == 2 and repo.discussions[pr]["status"] == "merged", out
        main = repo.commits[repo.refs["main"]].files
        assert b'"v2"' in main[f"{entry}/result.json"] and main[f"{entry}/verification.json"] != old_stamp

        # a stamp signed by anyone else (here: an unsigned one) in a later push still fails the PR
        pr2 = _open_pr(hub, "tok-alice", _entry_ops(_copy(made, tmp_path, "v3", lambda r: r.update(notes="v3")), entry))
        assert _bench_review(monkeypatch, hub, made, "--checkpoint", str(tiny_checkpoint)) == 0
        _push(hub, "tok-alice", pr2, [CommitOperationAdd(f"{entry}/verification.json", b'{"kind": "x"}')])
        assert _bench_review(monkeypatch, hub, made, "--checkpoint", str(tiny_checkpoint)) == 0
        capsys.readouterr()
        assert "verification stamps are written only by the reviewer" in _comments(hub, pr2)[-1][1]


def test_repo_files_odd_names_deletions_and_size_limits_fail_before_any_download(made, monkeypatch, capsys, reruns):
    """`.gitattributes` changed or deleted, a predictions file whose name has a space or non-ASCII letters, a
    result over the size limit: each fails with the offending path, and nothing reaches the image re-run."""
    import genshift.leaderboard.store
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    entry = "toy/test_resnet.r160_in1k"
    monkeypatch.setattr(genshift.leaderboard.store, "MAX_RESULT_BYTES", 1000)  # the real 5 MiB, scaled down for the test
    with FakeHub(users=USERS) as hub:
        hub.create("dataset", "org/results")
        prs = {
            "attrs": _open_pr(hub, "tok-mallory", _entry_ops(made[1], entry) + [
                CommitOperationAdd(".gitattributes", b"*.json filter=lfs diff=lfs merge=lfs -text\n")]),
            "unattrs": _open_pr(hub, "tok-mallory", _entry_ops(made[1], entry) + [CommitOperationDelete(".gitattributes")]),
            "space": _open_pr(hub, "tok-mallory", [CommitOperationAdd(f"{entry}/predictions/a b.parquet", b"PAR1")]),
            "unicode": _open_pr(hub, "tok-mallory", [CommitOperationAdd(f"{entry}/predictions/bäse.parquet", b"PAR1")]),
            "big": _open_pr(hub, "tok-mallory", _entry_ops(made[1], entry)),
        }
        assert _bench_review(monkeypatch, hub, made) == 0
        capsys.readouterr()
        said = {k: _comments(hub, n)[-1][1] for k, n in prs.items()}
        assert all("Verification failed" in t for t in said.values()), said
        assert "changes .gitattributes" in said["attrs"] and "deletes .gitattributes" in said["unattrs"]
        assert f"changes {entry}/predictions/a b.parquet" in said["space"]
        assert f"changes {entry}/predictions/bäse.parquet" in said["unicode"]
        assert f"{entry}/result.json is" in said["big"] and "over the 0 MiB limit" in said["big"]
        assert reruns == []


def test_a_pr_with_too_many_entries_is_refused_before_any_download(made, monkeypatch, capsys, reruns):
    """Every entry costs an image re-run: a PR adding more than MAX_ENTRIES_PER_PR entries would hold the service
    for hours; it is answered at once, saying to split it."""
    from huggingface_hub import CommitOperationAdd

    from genshift.leaderboard.review import MAX_ENTRIES_PER_PR

    with FakeHub(users=USERS) as hub:
        hub.create("dataset", "org/results")
        pr = _open_pr(hub, "tok-mallory", [CommitOperationAdd(f"toy/m{i}/result.json", b"{}")
                                           for i in range(MAX_ENTRIES_PER_PR + 1)])
        downloads = sum("/resolve/" in p for _, p in hub.requests)
        assert _bench_review(monkeypatch, hub, made) == 0
        capsys.readouterr()
        text = _comments(hub, pr)[-1][1]
        assert "Verification failed" in text and f"adds or changes {MAX_ENTRIES_PER_PR + 1} entries" in text
        assert f"at most {MAX_ENTRIES_PER_PR} per pull request" in text
        assert reruns == [] and sum("/resolve/" in p for _, p in hub.requests) == downloads


def test_publishing_a_model_that_is_not_on_the_hub_is_a_line_and_the_merge_stands(made, monkeypatch, capsys,
                                                                                   tiny_checkpoint):
    """--publish-model-results on an entry scored with local weights: merged, and the results PR says in one line
    why it was not reported on a model page; the run exits 0 and a rerun posts nothing."""
    entry = "toy/test_resnet.r160_in1k"
    with FakeHub(users=USERS) as hub:
        hub.create("dataset", "org/results")
        pr = _open_pr(hub, "tok-alice", _entry_ops(made[1], entry))
        args = ("--checkpoint", str(tiny_checkpoint), "--merge", "--publish-model-results")
        assert _bench_review(monkeypatch, hub, made, *args) == 0
        capsys.readouterr()
        assert hub.repos[("dataset", "org/results")].discussions[pr]["status"] == "merged"
        author, text = _comments(hub, pr)[-1]
        assert author == "maintainer" and f"`{entry}`: not reported on the model page" in text
        assert "is not a Hub model repo" in text and text.count("\n- ") == 1
        posts = sum(m == "POST" for m, _ in hub.requests)
        assert _bench_review(monkeypatch, hub, made, *args) == 0
        assert sum(m == "POST" for m, _ in hub.requests) == posts


def test_a_marker_is_bound_to_its_repo(made):
    """The same key reviewing two results repos (e.g. a staging copy): a genuine answer of one, posted on the
    same PR number and head of the other by the same account, is not believed there."""
    from types import SimpleNamespace

    from genshift.leaderboard.review import Reviewer

    head = "ab" * 20
    staging = Reviewer("org/staging", key_path=str(made[2]), endpoint="http://127.0.0.1:9")
    results = Reviewer("org/results", key_path=str(made[2]), endpoint="http://127.0.0.1:9")
    results.account = staging.account = "maintainer"
    events = [SimpleNamespace(type="comment", author="maintainer", content="ok\n\n" + staging.marker(3, head, "passed"))]
    assert staging.answers(3, events) == {head: "passed"}
    assert results.answers(3, events) == {} and staging.answers(4, events) == {}


def test_a_failed_comment_after_the_stamp_commit_is_recovered_on_the_next_run(made, monkeypatch, capsys,
                                                                              tiny_checkpoint, reruns):
    """The Hub fails the answer's comment right after the stamps were committed: that run fails (exit 1, no
    answer); the next one reviews the stamped head again, its own stamps are no reason to fail, and answers once."""
    import requests
    from huggingface_hub import HfApi, errors

    entry = "toy/test_resnet.r160_in1k"
    real = HfApi.comment_discussion

    def down(self, *a, **kw):
        r = requests.Response()
        r.status_code, r.url = 503, "http://hub/comment"
        raise errors.HfHubHTTPError("503 Service Unavailable", response=r)
    with FakeHub(users=USERS) as hub:
        hub.create("dataset", "org/results")
        pr = _open_pr(hub, "tok-alice", _entry_ops(made[1], entry))
        monkeypatch.setattr(HfApi, "comment_discussion", down)
        assert _bench_review(monkeypatch, hub, made, "--checkpoint", str(tiny_checkpoint)) == 1
        capsys.readouterr()
        repo = hub.repos[("dataset", "org/results")]
        assert f"{entry}/verification.json" in repo.commits[_head(hub, pr)].files and _comments(hub, pr) == []
        monkeypatch.setattr(HfApi, "comment_discussion", real)
        assert _bench_review(monkeypatch, hub, made, "--checkpoint", str(tiny_checkpoint), "--merge") == 0
        capsys.readouterr()
        assert len(reruns) == 2 and repo.discussions[pr]["status"] == "merged"
        assert [t for _, t in _comments(hub, pr) if "Verification" in t][0].startswith("**Verification passed")
        assert len([t for _, t in _comments(hub, pr) if "Verification" in t]) == 1
