"""`bench review` end to end against the local Hub server: PRs, stamps, comments, merges."""

import hashlib
import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fakehub import FakeHub


def _rewrite(run_dir, change=None, tables=None):
    """Edit a result as a forger would and make it self-consistent again: predictions sha256, every metric and
    the config hash recomputed (``tables``: config -> predictions table to write first)."""
    from genshift.eval.predictions import read_predictions
    from genshift.eval.results import config_hash
    from genshift.eval.scoring import ScoringOptions, score
    from genshift.fsutil import canonical_json, sha256_file

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

    from genshift import evaluate
    from genshift.eval import stamps
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
        kw = dict(key_path=str(tmp_path / "maintainer.key"), recheck=80, merge=False, checkpoint=str(tiny_checkpoint),
                  suite=str(toy_suite), endpoint=hub.endpoint)
        dry = {o.pr: o for o in review("org/results", **kw)}  # reviewed and answered, nothing published
        assert dry[1].status == "passed" and not dry[1].merged and dry[1].problems == []
        assert dry[2].status == "failed" and not dry[2].merged
        assert any("true-class probability" in p for p in dry[2].problems), dry[2].problems
        repo = hub.repos[("dataset", "org/results")]
        assert not any(p.endswith("result.json") for p in repo.commits[repo.refs["main"]].files)
        kw.update(merge=True, again=(1,))
        first = {o.pr: o for o in review("org/results", **kw)}  # --again PR --merge: reviewed anew and published
        assert first[1].status == "passed" and first[1].merged and first[2].status == "skipped"
        kw["again"] = ()

        main = repo.commits[repo.refs["main"]].files
        entry = dry[1].entries[0]
        stamp, why = stamps.open_stamp(main[f"{entry}/verification.json"], trusted)
        assert why == "" and stamp["recheck"]["n"] == 80
        assert isinstance(stamp["recheck"]["seed"], int)
        assert stamp["files"]["result.json"] == hashlib.sha256(good.read_bytes()).hexdigest()
        assert main[f"{entry}/result.json"] == good.read_bytes()
        d1 = api.get_discussion_details("org/results", 1, repo_type="dataset")
        d2 = api.get_discussion_details("org/results", 2, repo_type="dataset")
        assert d1.status == "closed" and d2.status == "open"
        c1 = [e.content for e in d1.events if e.type == "comment"]
        c2 = [e.content for e in d2.events if e.type == "comment"]
        assert "Verification passed" in c1[-1] and "Published to `main`" in c1[-1] and MARKER.search(c1[-1])
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
    from genshift.leaderboard.review import review

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
        assert "s/m: result file s/m/result.json is not valid JSON" in out[0].problems[0]
        assert "changes README.md" in out[1].problems[0]
        comment = [e.content for e in api.get_discussion_details("org/results", 2, repo_type="dataset").events
                   if e.type == "comment"][0]
        assert "```text\nchanges README.md" in comment  # data-derived text quoted, never live Markdown

        # the CLI (HF_ENDPOINT, read by huggingface_hub at import): both PRs already reviewed
        monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
        assert main(["review", "--repo", "org/results", "--key", str(tmp_path / "k"), "--recheck", "5"]) == 0
        out = capsys.readouterr().out
        assert out.count("skipped") == 2 and "#1" in out and "#2" in out

        # --watch SECONDS: a pass every SECONDS until stopped (here after two passes, the sleep the test's)
        import genshift.leaderboard.review as reviewing
        slept, real = [], reviewing.watch
        monkeypatch.setattr(reviewing, "watch", lambda r, s, **kw: real(r, s, passes=2, sleep=slept.append, **kw))
        assert main(["review", "--repo", "org/results", "--key", str(tmp_path / "k"), "--watch", "30"]) == 0
        assert slept == [30] and capsys.readouterr().out.count("skipped") == 4


def test_watch_retries_a_failed_pass_and_refuses_a_bad_interval(capsys, caplog):
    from genshift.cli import main
    from genshift.errors import BenchError
    from genshift.leaderboard.review import watch

    class Flaky:
        passes = 0

        def run_once(self):
            self.passes += 1
            if self.passes == 2:
                raise BenchError("cannot list the pull requests of datasets/org/results (ConnectError)")
            return [self.passes]
    reports, slept = [], []
    watch(Flaky(), 60, report=reports.append, passes=3, sleep=slept.append)
    assert reports == [[1], [3]] and slept == [60, 60]  # the failed second pass did not stop the loop
    assert "review pass failed" in caplog.text and "ConnectError" in caplog.text
    for bad in ("0", "604801", "soon"):
        with pytest.raises(SystemExit) as stop:
            main(["review", "--repo", "org/results", "--key", "k", "--watch", bad])
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "--watch" in err
        assert bad == "soon" or "1..604800" in err


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
    assert (err.startswith("error: bench review: signing key '/proc/self/mem' cannot be read (Input/output error)")
            and len(err.strip().splitlines()) == 1)


# -- attacks on the review service: markers, ownership, terminal answers --------------------------------------------
USERS = {"tok-maint": "maintainer", "tok-alice": "alice", "tok-mallory": "mallory"}  # token -> Hub account


@pytest.fixture(scope="module")
def made(tmp_path_factory, tiny_checkpoint):
    """A toy suite, one honest run of ``test_resnet.r160_in1k`` on it (local weights) and the maintainer key."""
    from genshift import evaluate
    from genshift.eval import stamps
    from genshift.synthetic import make_synthetic_suite

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


def _as(model_id, source="checkpoint", revision="a" * 40):
    """A change making a result the self-consistent record of another model (only a re-run can tell): Hub
    weights ``model_id``, or local weights whose tensors digest is made from ``model_id``."""
    from genshift.fsutil import sha256_bytes

    def change(r):
        m, digest = r["model"], sha256_bytes(model_id.encode())
        m.update(tensors_sha256=digest, id=f"test_resnet@sha256:{digest[:16]}")
        if source == "hf-hub":
            m.pop("declared_name", None)
            m.update(id=model_id, source=source, weights_revision=revision,
                     pretrained_cfg={**m["pretrained_cfg"], "hf_hub_id": model_id})
    return change


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


def _bench_review(monkeypatch, hub, made, *extra, token="tok-maint", key=None, suite=True):
    """``bench review`` through the CLI, against the local Hub as the maintainer's account."""
    from huggingface_hub import constants

    from genshift.cli import main

    monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)  # what HF_ENDPOINT sets at import
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setenv("HF_TOKEN", token)
    return main(["review", "--repo", "org/results", "--key", str(key or made[2]),
                 *(["--suite", str(made[0])] if suite else []), "--recheck", "5", *extra])


class _Calls(list):
    modes: list  # the recheck asked for, call by call


@pytest.fixture
def reruns(monkeypatch):
    """Every image re-run ``bench review`` asks for (``verify_result`` with ``recheck``), by result path."""
    import genshift.eval.verify

    calls, real = _Calls(), genshift.eval.verify.verify_result
    calls.modes = []

    def counting(path, **kw):
        if kw.get("recheck"):
            calls.append(str(path))
            calls.modes.append(kw["recheck"])
        return real(path, **kw)
    monkeypatch.setattr(genshift.eval.verify, "verify_result", counting)
    return calls


def test_forged_and_copied_review_markers_are_not_believed(made, tmp_path, monkeypatch, capsys, tiny_checkpoint,
                                                           reruns):
    from genshift.eval import stamps
    from genshift.leaderboard.review import Reviewer

    entry = f"toy/{made[1].name}"
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
        assert hub.repos[("dataset", "org/results")].discussions[pr2]["status"] == "closed"
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

    own = f"toy/{made[1].name}"
    other = _copy(made, tmp_path, "other", _as("other weights"))
    org_m = _copy(made, tmp_path, "org_m", _as("org/m", "hf-hub"))
    collide = _copy(made, tmp_path, "collide", lambda r: r["model"].update(id="org--m"))  # path_slug's same folder
    again = _copy(made, tmp_path, "again", lambda r: r.update(notes="re-run with a newer timm"))
    monkeypatch.setattr("genshift.leaderboard.review.MAX_OPEN_PRS", 100)  # many PRs of one account here
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
            "race": _open_pr(hub, "tok-alice", _entry_ops(_copy(made, tmp_path, "race", _as("org/q", "hf-hub")),
                                                          "toy/org--q")),          # new at its base, but ...
        }
        # ... main moved on after the PR was opened: org/q's entry under another protocol now holds that folder
        other_protocol = _copy(made, tmp_path, "org_q", lambda r: (_as("org/q", "hf-hub")(r),
                                                                   r["protocol"]["scoring"].update(n_boot=200)))
        api.create_commit("org/results", _entry_ops(other_protocol, "toy/org--q"), repo_type="dataset",
                          commit_message="merged meanwhile")
        assert _bench_review(monkeypatch, hub, made, "--checkpoint", str(tiny_checkpoint)) == 0
        capsys.readouterr()
        said = {k: _comments(hub, n)[-1][1] for k, n in prs.items()}
        other_id = json.loads((other / "result.json").read_text())["model"]["id"]
        assert f"filed under {own}/, but its result is {other_id} on toy, which belongs under " \
               f"toy/{other_id.replace(':', '-')}/" in said["overwrite"]
        assert "filed under other-suite/a..b/" in said["misfiled"] and f"belongs under {own}/" in said["misfiled"]
        assert "model id 'org--m' is not a canonical id" in said["collide"]  # no id can share another's folder
        assert "replaces the entry of org/q under another suite version or protocol with a result of org/q" \
            in said["race"]
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
    shutil.copytree(other, store / own)
    shutil.copytree(made[1], store / f"{own}.v2")
    loaded = load_store(str(store), suites=[str(made[0])])
    assert loaded.entries == [] and len(loaded.rejected) == 2
    reasons = {e.path.parent.name: e.reason for e in loaded.rejected}
    assert f"belongs under toy/{other_id.replace(':', '-')}/" in reasons[made[1].name]
    assert f"filed under {own}.v2/" in reasons[f"{made[1].name}.v2"]


def test_every_pr_gets_a_terminal_answer_and_is_not_retried(made, tmp_path, monkeypatch, capsys, tiny_checkpoint,
                                                            reruns):
    import timm
    import torch
    from safetensors.torch import save_file

    entry = f"toy/{made[1].name}"
    torch.manual_seed(1)  # the same architecture, other weights: not what the entry was scored with
    other_weights = tmp_path / "other.safetensors"
    save_file({k: v.contiguous() for k, v in timm.create_model("test_resnet.r160_in1k").state_dict().items()},
              str(other_weights))
    missing = _copy(made, tmp_path, "missing", _as("org/no-such-model", "hf-hub"))
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
        broken_run = _copy(made, tmp_path, "broken", _as("org/broken", "hf-hub", sha))
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
        assert "cannot be checked" in text and "it has 469,688 parameters, the weights hold" in text
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
        assert len(texts) == 3 and "Verification passed" in texts[2] and "Published to `main`" in texts[2]
        assert hub.repos[("dataset", "org/results")].discussions[pr]["status"] == "closed"
        assert len(reruns) == tried + 1


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
        pr = _open_pr(hub, "tok-alice", _entry_ops(made[1], f"toy/{made[1].name}"))
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


def test_a_push_during_the_review_is_no_answer_and_no_service_failure(made, tmp_path, monkeypatch, capsys,
                                                                       tiny_checkpoint):
    """The submitter pushes while the images are re-run: the stamps are not committed on top of the unreviewed
    push (the Hub refuses the stale parent), nothing is commented, the run exits 0; the next run reviews the
    new head."""
    import genshift.eval.verify

    entry = f"toy/{made[1].name}"
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
        assert repo.discussions[pr]["status"] == "closed"
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
    """Passed without --merge; the submitter pushes a new run of the same model: the new head is reviewed (images
    re-run) and published with --merge. A verification.json a submitter pushes fails the PR: stamps are written
    only by the reviewer, on main."""
    from huggingface_hub import CommitOperationAdd

    entry = f"toy/{made[1].name}"
    with FakeHub(users=USERS) as hub:
        hub.create("dataset", "org/results")
        pr = _open_pr(hub, "tok-alice", _entry_ops(made[1], entry))
        assert _bench_review(monkeypatch, hub, made, "--checkpoint", str(tiny_checkpoint)) == 0
        capsys.readouterr()
        repo = hub.repos[("dataset", "org/results")]
        _push(hub, "tok-alice", pr, _entry_ops(_copy(made, tmp_path, "v2", lambda r: r.update(notes="v2")), entry))
        assert _bench_review(monkeypatch, hub, made, "--checkpoint", str(tiny_checkpoint), "--merge") == 0
        out = capsys.readouterr().out
        assert len(reruns) == 2 and repo.discussions[pr]["status"] == "closed", out
        main = repo.commits[repo.refs["main"]].files
        assert b'"v2"' in main[f"{entry}/result.json"] and f"{entry}/verification.json" in main

        pr2 = _open_pr(hub, "tok-alice", _entry_ops(_copy(made, tmp_path, "v3", lambda r: r.update(notes="v3")), entry)
                       + [CommitOperationAdd(f"{entry}/verification.json", b'{"kind": "x"}')])
        assert _bench_review(monkeypatch, hub, made, "--checkpoint", str(tiny_checkpoint)) == 0
        capsys.readouterr()
        assert "verification stamps are written only by the reviewer" in _comments(hub, pr2)[-1][1]


def test_repo_files_odd_names_deletions_and_size_limits_fail_before_any_download(made, monkeypatch, capsys, reruns):
    """`.gitattributes` changed or deleted, a predictions file whose name has a space or non-ASCII letters, a
    result over the size limit: each fails with the offending path, and nothing reaches the image re-run."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    import genshift.eval.results

    entry = f"toy/{made[1].name}"
    monkeypatch.setattr(genshift.eval.results, "MAX_RESULT_BYTES", 1000)  # the real 5 MiB, scaled down for the test
    monkeypatch.setattr("genshift.leaderboard.review.MAX_OPEN_PRS", 100)  # many PRs of one account here
    with FakeHub(users=USERS) as hub:
        hub.create("dataset", "org/results")
        prs = {
            "attrs": _open_pr(hub, "tok-mallory", _entry_ops(made[1], entry) + [
                CommitOperationAdd(".gitattributes", b"*.json filter=lfs diff=lfs merge=lfs -text\n")]),
            "unattrs": _open_pr(hub, "tok-mallory", _entry_ops(made[1], entry)
                                + [CommitOperationDelete(".gitattributes")]),
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
        def downloads():  # of the PR's files (the service reads its own ledger on main too)
            return sum("/resolve/" in p and "review-ledger.json" not in p for _, p in hub.requests)
        before = downloads()
        assert _bench_review(monkeypatch, hub, made) == 0
        capsys.readouterr()
        text = _comments(hub, pr)[-1][1]
        assert "Verification failed" in text and f"adds or changes {MAX_ENTRIES_PER_PR + 1} entries" in text
        assert f"at most {MAX_ENTRIES_PER_PR} per pull request" in text
        assert reruns == [] and downloads() == before


def test_a_marker_is_bound_to_its_repo(made):
    """The same key reviewing two results repos (e.g. a staging copy): a genuine answer of one, posted on the
    same PR number and head of the other by the same account, is not believed there."""
    from types import SimpleNamespace

    from genshift.leaderboard.review import Reviewer

    head = "ab" * 20
    staging = Reviewer("org/staging", key_path=str(made[2]), endpoint="http://127.0.0.1:9")
    results = Reviewer("org/results", key_path=str(made[2]), endpoint="http://127.0.0.1:9")
    results.account = staging.account = "maintainer"
    events = [SimpleNamespace(type="comment", author="maintainer",
                              content="ok\n\n" + staging.marker(3, head, "passed"))]
    assert staging.answers(3, events) == {head: "passed"}
    assert results.answers(3, events) == {} and staging.answers(4, events) == {}


def test_a_failed_comment_after_publishing_is_recovered_on_the_next_run(made, monkeypatch, capsys,
                                                                        tiny_checkpoint, reruns):
    """The Hub fails the answer's comment right after the entry was published: that run fails (exit 1, no answer);
    the next one reviews the head again, publishes the same files and answers once."""
    import requests
    from huggingface_hub import HfApi, errors

    entry = f"toy/{made[1].name}"
    real = HfApi.comment_discussion

    def down(self, *a, **kw):
        r = requests.Response()
        r.status_code, r.url = 503, "http://hub/comment"
        raise errors.HfHubHTTPError("503 Service Unavailable", response=r)
    with FakeHub(users=USERS) as hub:
        hub.create("dataset", "org/results")
        pr = _open_pr(hub, "tok-alice", _entry_ops(made[1], entry))
        monkeypatch.setattr(HfApi, "comment_discussion", down)
        assert _bench_review(monkeypatch, hub, made, "--checkpoint", str(tiny_checkpoint), "--merge") == 1
        capsys.readouterr()
        repo = hub.repos[("dataset", "org/results")]
        assert f"{entry}/verification.json" in _main_files(hub) and _comments(hub, pr) == []
        monkeypatch.setattr(HfApi, "comment_discussion", real)
        assert _bench_review(monkeypatch, hub, made, "--checkpoint", str(tiny_checkpoint), "--merge") == 0
        capsys.readouterr()
        assert len(reruns) == 2 and repo.discussions[pr]["status"] == "closed"
        assert [t for _, t in _comments(hub, pr) if "Verification" in t][0].startswith("**Verification passed")
        assert len([t for _, t in _comments(hub, pr) if "Verification" in t]) == 1


# -- issue 30: one identity, a re-check that cannot be retried away, a review that cannot be raced ---------------
def _main_files(hub):
    repo = hub.repos[("dataset", "org/results")]
    return repo.commits[repo.refs["main"]].files


def _confident(run):
    """Edit a run's predictions as a forger would (every row a confident top-1 hit), keeping them consistent."""
    _forge(run / "result.json")
    return run


def _publish_model(hub, tmp_path, repo="timm/test_resnet.r160_in1k"):
    """The genuine Hub weights of ``repo`` (the tiny model at seed 0: ``tiny_checkpoint``'s tensors); its sha."""
    import timm
    import torch
    from huggingface_hub import HfApi
    from timm.models._hub import save_for_hf

    torch.manual_seed(0)
    save_for_hf(timm.create_model("test_resnet.r160_in1k", pretrained=False), str(tmp_path / "hub-model"),
                safe_serialization=True)
    hub.create("model", repo)
    return HfApi(endpoint=hub.endpoint).upload_folder(repo_id=repo, folder_path=str(tmp_path / "hub-model"),
                                                      commit_message="weights").oid


def test_own_weights_under_a_hub_models_id_never_pass_review(made, tmp_path, monkeypatch, capsys, tiny_checkpoint):
    """Mallory raises a classifier bias in her own weights of the architecture, scores them, edits model.id to the
    Hub model's and the maintainer reviews with her --checkpoint: refused, the id is not the canonical id of the
    weights the record describes. Claiming the Hub's weights instead (source, revision): re-run from the Hub, never
    from her file, so the weights that load are not hers: failed. Nothing reaches main."""
    from safetensors.torch import load_file, save_file

    from genshift import evaluate

    sd = load_file(str(tiny_checkpoint))
    sd["fc.bias"][:10] += 3.0  # the suite's ten classes: a better score on it
    save_file(sd, str(tmp_path / "mallory.safetensors"))
    path = evaluate(f"test_resnet.r160_in1k={tmp_path / 'mallory.safetensors'}", str(made[0]), out=tmp_path / "runs",
                    batch_size=40, workers=0, compile="off", progress=False).path
    hers = json.loads(path.read_text())["model"]["id"]
    target = "timm/test_resnet.r160_in1k"
    with FakeHub(users=USERS) as hub:
        hub.create("dataset", "org/results")
        sha = _publish_model(hub, tmp_path)
        renamed = tmp_path / "renamed"
        shutil.copytree(path.parent, renamed)
        _rewrite(renamed, lambda r: r["model"].update(id=target))
        claimed = tmp_path / "claimed"
        shutil.copytree(path.parent, claimed)
        _rewrite(claimed, _as(target, "hf-hub", sha))
        claimed_result = json.loads((claimed / "result.json").read_text())
        claimed_result["model"]["tensors_sha256"] = json.loads(path.read_text())["model"]["tensors_sha256"]  # hers
        (claimed / "result.json").write_text(json.dumps(claimed_result))
        _rewrite(claimed)
        prs = [_open_pr(hub, "tok-mallory", _entry_ops(run, "toy/timm--test_resnet.r160_in1k"))
               for run in (renamed, claimed)]
        assert _bench_review(monkeypatch, hub, made, "--merge",
                             "--checkpoint", str(tmp_path / "mallory.safetensors")) == 0
        said = [_comments(hub, n)[-1][1] for n in prs]
        assert "Verification failed" in said[0] and f"their canonical id is '{hers}'" in said[0]
        assert ("Verification failed" in said[1] and "the model loads with other" in said[1]
                and "tensors_sha256" in said[1])
        assert not any(p.startswith("toy/timm--") for p in _main_files(hub))


def test_a_rerun_that_disagrees_says_how_many_never_which_and_forces_a_full_rerun(made, tmp_path, monkeypatch, capsys,
                                                                                 tiny_checkpoint, reruns):
    """A forged result fails with the count of disagreeing rows, no image named. Its model id is then re-run on every
    row the next time (a fresh sample per push would let a forger retry), until a full re-run passes or the
    maintainer asks for the usual sample with --again; the state lives in review-ledger.json on main."""
    import pyarrow.parquet as pq

    from genshift.leaderboard.review import LEDGER_FILE

    entry = f"toy/{made[1].name}"
    model_id = json.loads((made[1] / "result.json").read_text())["model"]["id"]
    ids = [i for p in sorted((made[0] / "data").rglob("*.parquet")) for i in pq.read_table(p, columns=["image_id"])
           ["image_id"].to_pylist()]
    with FakeHub(users=USERS) as hub:
        hub.create("dataset", "org/results")
        pr = _open_pr(hub, "tok-mallory", _entry_ops(_confident(_copy(made, tmp_path, "forged")), entry))
        assert _bench_review(monkeypatch, hub, made, "--checkpoint", str(tiny_checkpoint)) == 0
        text = _comments(hub, pr)[-1][1]
        assert "Verification failed" in text and "of the 5 re-run rows disagree with the stored predictions" in text
        assert not any(i in text for i in ids) and "seed" not in text  # which rows: never said
        assert json.loads(_main_files(hub)[LEDGER_FILE])["failed"][model_id]["pr"] == pr
        # the honest run pushed next: re-run in full, passes, clears the model id
        _push(hub, "tok-mallory", pr, _entry_ops(made[1], entry))
        assert _bench_review(monkeypatch, hub, made, "--checkpoint", str(tiny_checkpoint)) == 0
        assert reruns.modes == [5, "all"] and "Verification passed" in _comments(hub, pr)[-1][1]
        assert model_id not in json.loads(_main_files(hub)[LEDGER_FILE])["failed"]
        # failed again; the maintainer's --again takes the usual sample instead of every row
        pr2 = _open_pr(hub, "tok-mallory", _entry_ops(_confident(_copy(made, tmp_path, "forged2")), entry))
        assert _bench_review(monkeypatch, hub, made, "--checkpoint", str(tiny_checkpoint)) == 0
        _push(hub, "tok-mallory", pr2, _entry_ops(_copy(made, tmp_path, "v2", lambda r: r.update(notes="v2")), entry))
        assert _bench_review(monkeypatch, hub, made, "--checkpoint", str(tiny_checkpoint), "--again", str(pr2)) == 0
        assert reruns.modes[2:] == [5, 5] and "Verification passed" in _comments(hub, pr2)[-1][1]


def test_per_submitter_bounds_are_answered_in_one_line(made, tmp_path, monkeypatch, capsys, tiny_checkpoint):
    """At most 3 open PRs of one account are reviewed (the 4th waits, told so once in one line); the images re-run
    for one account per day are bounded (a PR over the day's budget waits for the next day)."""
    from huggingface_hub import CommitOperationAdd

    import genshift.leaderboard.review as review

    entry = f"toy/{made[1].name}"
    with FakeHub(users=USERS) as hub:
        hub.create("dataset", "org/results")
        junk = [_open_pr(hub, "tok-mallory", [CommitOperationAdd(f"junk{i}.txt", b"x")]) for i in range(4)]
        assert _bench_review(monkeypatch, hub, made) == 0
        assert "deferred" in capsys.readouterr().out
        said = [_comments(hub, n) for n in junk]
        assert all("Verification failed" in c[-1][1] for c in said[:3])
        (_, waiting), = said[3]
        assert waiting.startswith("**Not reviewed yet**: mallory has 4 open pull requests and only the oldest 3 are "
                                  "reviewed") and waiting.count("\n") == 2  # one line, then the signed marker
        assert _bench_review(monkeypatch, hub, made) == 0 and len(_comments(hub, junk[3])) == 1  # said once per head

        monkeypatch.setattr(review, "MAX_IMAGES_PER_DAY", 100)
        first = _open_pr(hub, "tok-alice", _entry_ops(made[1], entry))
        second = _open_pr(hub, "tok-alice", _entry_ops(_copy(made, tmp_path, "v2", lambda r: r.update(notes="v2")),
                                                       entry))
        assert _bench_review(monkeypatch, hub, made, "--checkpoint", str(tiny_checkpoint), "--recheck", "all") == 0
        assert "Verification passed" in _comments(hub, first)[-1][1]
        text = _comments(hub, second)[-1][1]
        assert text.startswith("**Not reviewed yet**: alice has had 80 images re-run today") and "tomorrow" in text


def test_a_push_between_the_head_check_and_the_merge_never_lands_on_main(made, tmp_path, monkeypatch, capsys,
                                                                        tiny_checkpoint):
    """Between the reviewer's last look at the PR head and what lands on main, the submitter pushes a commit that
    deletes a verified entry and rewrites README.md and .gitattributes: main gets exactly the reviewed files."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi

    entry = f"toy/{made[1].name}"
    verified = "toy/org--m"
    with FakeHub(users=USERS) as hub:
        hub.create("dataset", "org/results")
        HfApi(endpoint=hub.endpoint, token="tok-maint").create_commit(
            "org/results", _entry_ops(_copy(made, tmp_path, "org_m", _as("org/m", "hf-hub")), verified)
            + [CommitOperationAdd("README.md", b"# results\n")], repo_type="dataset", commit_message="main")
        before = dict(_main_files(hub))
        pr = _open_pr(hub, "tok-alice", _entry_ops(made[1], entry))
        injected = []

        def push_first(real):
            def call(self, *a, **kw):
                if not injected and (real.__name__ == "merge_pull_request" or kw.get("revision") in (None, "main")):
                    injected.append(_push(hub, "tok-alice", pr, [
                        CommitOperationDelete(f"{verified}/result.json"), CommitOperationAdd("README.md", b"# pwned\n"),
                        CommitOperationAdd(".gitattributes", b"* -text\n")]))
                return real(self, *a, **kw)
            return call
        monkeypatch.setattr(HfApi, "merge_pull_request", push_first(HfApi.merge_pull_request))
        monkeypatch.setattr(HfApi, "create_commit", push_first(HfApi.create_commit))
        assert _bench_review(monkeypatch, hub, made, "--merge", "--checkpoint", str(tiny_checkpoint)) == 0
        assert injected
        main = _main_files(hub)
        assert main[f"{entry}/result.json"] == (made[1] / "result.json").read_bytes()
        assert f"{entry}/verification.json" in main
        assert {p: b for p, b in main.items() if not p.startswith(entry + "/") and p != "review-ledger.json"} == before


def test_another_protocol_or_the_same_weights_never_replace_an_entry(made, tmp_path, monkeypatch, capsys,
                                                                    tiny_checkpoint, reruns):
    """A genuine result of the same model scored with --bootstrap 200 is another entry, never a replacement of the
    one on main; the same weights under another id are one entry, already there. Both refused before any re-run."""
    from huggingface_hub import HfApi

    entry = f"toy/{made[1].name}"
    with FakeHub(users=USERS) as hub:
        hub.create("dataset", "org/results")
        HfApi(endpoint=hub.endpoint, token="tok-maint").create_commit(
            "org/results", _entry_ops(made[1], entry), repo_type="dataset", commit_message="the verified entry")
        before = dict(_main_files(hub))
        boot = _open_pr(hub, "tok-alice", _entry_ops(_copy(made, tmp_path, "boot", lambda r: r["protocol"]["scoring"]
                                                           .update(n_boot=200)), entry))
        twin = _copy(made, tmp_path, "twin", _as("org/twin", "hf-hub"))
        twin_result = json.loads((twin / "result.json").read_text())
        made_result = json.loads((made[1] / "result.json").read_text())
        twin_result["model"]["tensors_sha256"] = made_result["model"]["tensors_sha256"]
        (twin / "result.json").write_text(json.dumps(twin_result))
        _rewrite(twin)
        same = _open_pr(hub, "tok-alice", _entry_ops(twin, "toy/org--twin"))
        assert _bench_review(monkeypatch, hub, made, "--merge", "--checkpoint", str(tiny_checkpoint)) == 0
        assert "under another suite version or protocol" in _comments(hub, boot)[-1][1]
        assert "the same weights (tensors sha256" in _comments(hub, same)[-1][1]
        assert reruns == [] and {p: b for p, b in _main_files(hub).items() if p != "review-ledger.json"} == before


def test_a_300_character_folder_in_a_pr_path_is_that_prs_failure(made, monkeypatch, capsys):
    """A path the reviewer's file system cannot hold is the submission's fault: that PR fails, the service stays
    green (it used to count the OSError as its own failure, on every run)."""
    from huggingface_hub import CommitOperationAdd

    with FakeHub(users=USERS) as hub:
        hub.create("dataset", "org/results")
        pr = _open_pr(hub, "tok-mallory", [CommitOperationAdd(f"toy/{'a' * 300}/result.json",
                                                              (made[1] / "result.json").read_bytes())])
        assert _bench_review(monkeypatch, hub, made) == 0
        assert "failed" in capsys.readouterr().out
        text = _comments(hub, pr)[-1][1]
        assert "Verification failed" in text and "paths of at most 200 characters" in text


def test_the_reviewer_never_opens_a_path_a_result_records(made, tmp_path, monkeypatch, capsys, tiny_checkpoint):
    """A result's suite.source and suite.mask.path name files on the reviewer's machine: never opened. The public
    answer is the same whether /etc/passwd exists or not (the images come from the trusted suite alone)."""
    import genshift.eval.suite_trust

    trusted = tmp_path / "trusted"
    trusted.mkdir()
    shutil.copy(made[0] / "manifest.json", trusted / "toy.json")  # a trusted manifest, without images
    probes = {}
    for name, path in (("exists", "/etc/passwd"), ("absent", "/nonexistent/passwd")):
        probes[name] = _copy(made, tmp_path, name, lambda r, path=path: r["suite"].update(
            source=path, mask={"path": path, "sha256": "0" * 64, "source": "file"}))
    opened = []
    monkeypatch.setattr(genshift.eval.suite_trust, "reopen_suite",
                        lambda *a, **k: opened.append(a) or pytest.fail("opened"))
    with FakeHub(users=USERS) as hub:
        hub.create("dataset", "org/results")
        prs = {k: _open_pr(hub, "tok-alice", _entry_ops(run, f"toy/{made[1].name}")) for k, run in probes.items()}
        assert _bench_review(monkeypatch, hub, made, "--checkpoint", str(tiny_checkpoint), "--suites", str(trusted),
                             suite=False) == 0
        said = {k: _comments(hub, n)[-1][1].rsplit("<!--", 1)[0] for k, n in prs.items()}
        assert said["exists"] == said["absent"] and "manifest only" in said["exists"], said
        assert "passwd" not in said["exists"] and opened == []
