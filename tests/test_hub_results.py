"""The Hub's eval-results system, through huggingface_hub against the local Hub stand-in: a published
suite is a benchmark (eval.yaml), a merged result becomes a model-repo PR of ``.eval_results``, the
review service opens it itself, and the board reads the Hub's leaderboard as a separate table."""

import json
import math

import pytest
import yaml

from genshift.errors import BenchError, IntegrityError
from tests.fakehub import FakeHub
from tests.resultkit import fake_result


def _m(v):
    return {"value": v, "ci": None, "n": 4}


# -- eval.yaml: tasks per family, hand-computed values --------------------------------------------
def test_tasks_and_values_per_family_are_the_headline_metrics_in_percent():
    from genshift.hub import tasks
    from genshift.leaderboard.hub_results import task_values

    star = fake_result("timm/a", ["base", "fog", "snow"], {"configs": {
        "base": {"acc1": _m(0.9), "acc5": _m(1.0)}, "fog": {"acc1": _m(0.5), "acc5": _m(1.0)},
        "snow": {"acc1": _m(0.25), "acc5": _m(1.0)}}, "imagenet_star": {}})
    assert [(t.id, t.config) for t in tasks("imagenet_star", ["snow", "base", "fog"], "base")] == [
        ("mean_shift_acc1", "fog"), ("acc1_fog", "fog"), ("acc1_snow", "snow")]
    # mean over the shifts only (the reference is left out): (0.5 + 0.25) / 2 = 0.375 -> 37.5 %
    assert task_values(star) == {"mean_shift_acc1": 37.5, "acc1_fog": 50.0, "acc1_snow": 25.0}

    lance = fake_result("timm/a", ["original", "counterfactual"], {
        "configs": {"original": {"acc1": _m(0.8), "acc5": _m(1.0)},
                    "counterfactual": {"acc1": _m(0.55), "acc5": _m(1.0)}},
        "lance": {"headline_T": "originals_with_counterfactual",
                  "delta_acc1": {"originals_with_counterfactual": _m(-0.2), "all_originals": _m(-0.25)}}},
        metric_family="lance", reference_config="original")
    assert [t.id for t in tasks("lance", ["original", "counterfactual"])] == ["acc1_edited", "delta_acc1"]
    # Δacc@1 on the headline T (originals with a counterfactual), in percentage points
    assert task_values(lance) == {"acc1_edited": 55.0, "delta_acc1": -20.0}

    in_g = fake_result("timm/a", ["generated"], {
        "configs": {"generated": {"acc1": _m(0.7), "acc5": _m(0.9)}},
        "in_g": {"generated": {"top1_error": _m(0.3), "top3_failure_rate": _m(0.125), "parent_failure_rate": _m(0.1)}}},
        metric_family="in_g", reference_config=None)
    assert task_values(in_g) == {"top3_failure_rate": 12.5}
    with pytest.raises(IntegrityError, match="counterfactual"):
        tasks("lance", ["original"])


def test_eval_yaml_round_trips_and_hostile_files_are_one_line(tmp_path):
    from genshift.hub import check_eval_yaml, parse_eval_yaml, render_eval_yaml
    from genshift.suite_format import Manifest
    from genshift.synthetic import make_synthetic_suite

    make_synthetic_suite(tmp_path / "s", suite_id="toy", classes=range(2), per_class=1)
    m = Manifest.load(tmp_path / "s")
    text = render_eval_yaml(m, name="Toy")
    doc = yaml.safe_load(text)
    assert set(doc) == {"name", "description", "evaluation_framework", "tasks"}
    assert doc["evaluation_framework"] == "genshift-bench" and doc["name"] == "Toy"
    assert doc["tasks"] == [{"id": "mean_acc1", "config": "base", "split": "test"},
                            {"id": "acc1_base", "config": "base", "split": "test"},
                            {"id": "acc1_shifted", "config": "shifted", "split": "test"}]
    assert check_eval_yaml(text.encode(), m) == doc
    bad = {
        b"a: &x [1]\nb: *x\n": "aliases",
        b"[" * 50 + b"]" * 50: "deeper",
        b"name: x\n": "'description'",
        b"- 1\n": "not a mapping",
        b"\xff\xfe": "not UTF-8",
        b"x" * (70 << 10): "over the",
        yaml.safe_dump({**doc, "tasks": [dict(t) for t in doc["tasks"] * 2]}).encode(): "appears twice",
    }
    for data, why in bad.items():
        with pytest.raises(IntegrityError, match=why) as info:
            parse_eval_yaml(data)
        assert "\n" not in str(info.value)
    other = yaml.safe_dump({**doc, "tasks": doc["tasks"][:2]}).encode()
    with pytest.raises(IntegrityError, match="not the ones suite toy defines"):
        check_eval_yaml(other, m)


# -- end to end over the local Hub -----------------------------------------------------------------
@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """Once per module: a suite published to a local Hub (eval.yaml written), a timm model repo, a result
    of that model on the suite at its pinned sha (`bench eval`), signed by a maintainer key (`bench verify
    --recheck --sign`). The stand-in's commit ids depend on content only, so every test's fresh Hub
    republishes the same shas."""
    import timm
    import torch
    from timm.models._hub import save_for_hf

    from genshift import evaluate
    from genshift.data_cards import render_card
    from genshift.eval import stamps
    from genshift.eval.verify import verify_result
    from genshift.suite_format import Manifest
    from genshift.synthetic import make_synthetic_suite

    tmp = tmp_path_factory.mktemp("scored")
    suite = tmp / "suite"
    make_synthetic_suite(suite, suite_id="toy", configs=("base", "shifted"), classes=range(4), per_class=2)
    (suite / "README.md").write_text(render_card(Manifest.load(suite)))
    torch.manual_seed(0)
    save_for_hf(timm.create_model("test_resnet.r160_in1k", pretrained=False), str(tmp / "model"),
                safe_serialization=True)
    with FakeHub(users={"t": "tester"}) as hub, pytest.MonkeyPatch.context() as mp:
        sha = _publish(hub, suite, tmp / "model")
        _point_hub_defaults_at(mp, hub, tmp / "hf")
        result = evaluate("hf-hub:org/tiny-resnet", "org/toy", out=tmp / "runs",
                          revision=sha, batch_size=16, workers=0, compile="off", progress=False).path
        assert json.loads(result.read_text())["suite"]["revision"] == sha
        report = verify_result(result, recheck=2, suite=str(suite))
        assert report.ok, report.problems
        stamps.generate_key(tmp / "maintainer.key")
        stamps.write_stamp(report, stamps.load_private_key(tmp / "maintainer.key"))
    return {"suite": suite, "model": tmp / "model", "sha": sha, "run": result.parent, "key": tmp / "maintainer.key",
            "trusted": tmp / "maintainer.key.pub", "hf_home": tmp / "hf"}


def _point_hub_defaults_at(mp, hub, cache) -> None:
    """huggingface_hub's defaults (read from HF_ENDPOINT / HF_HOME at import) pointed at the stand-in, so code
    that takes no endpoint (timm's weight loading, snapshot downloads) talks to it in this process."""
    from huggingface_hub import constants

    mp.setattr(constants, "ENDPOINT", hub.endpoint)
    mp.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    mp.setattr(constants, "HF_HUB_CACHE", str(cache))


def _publish(hub, suite, model_dir) -> str:
    from huggingface_hub import HfApi

    from genshift.hub import publish_suite

    sha = publish_suite(suite, "org/toy", endpoint=hub.endpoint, token="t")
    api = HfApi(endpoint=hub.endpoint, token="t")
    api.create_repo("org/tiny-resnet")
    api.upload_folder(repo_id="org/tiny-resnet", folder_path=str(model_dir), commit_message="weights")
    return sha


@pytest.fixture
def hub_world(scored, tmp_path, monkeypatch):
    import shutil

    from huggingface_hub import CommitOperationAdd, HfApi

    run = tmp_path / "run"
    shutil.copytree(scored["run"], run)
    with FakeHub(users={"t": "tester"}) as hub:
        monkeypatch.setenv("HF_TOKEN", "t")
        assert _publish(hub, scored["suite"], scored["model"]) == scored["sha"]
        yield dict(scored, hub=hub, api=HfApi(endpoint=hub.endpoint, token="t"), result=run / "result.json",
                   tmp=tmp_path, CommitOperationAdd=CommitOperationAdd)


def _merge_into_results(w, with_stamp=True):
    from genshift.eval.results import entry_dir

    api, result = w["api"], w["result"]
    res = json.loads(result.read_bytes())
    prefix = entry_dir(res)
    names = ["result.json", *(p["path"] for p in res["predictions"])] + (["verification.json"] if with_stamp else [])
    api.create_repo("org/results", repo_type="dataset", exist_ok=True)
    api.create_commit("org/results", [w["CommitOperationAdd"](f"{prefix}/{n}", str(result.parent / n)) for n in names],
                      repo_type="dataset", commit_message="merged entry")
    return res, prefix


def test_published_suite_is_a_benchmark_and_a_verified_result_reaches_the_model_page(hub_world, capsys):
    from huggingface_hub import parse_eval_result_entries

    from genshift.cli import main
    from genshift.leaderboard.hub_results import hub_reported, task_values

    w = hub_world
    hub, api = w["hub"], w["api"]
    # the published repo carries eval.yaml, and bench verify checks the suite folder's copy
    files = hub.repos[("dataset", "org/toy")].commits[w["sha"]].files
    spec = yaml.safe_load(files["eval.yaml"])
    assert spec["evaluation_framework"] == "genshift-bench"
    assert main(["verify", str(w["suite"])]) == 0
    assert "eval.yaml declares its 3 tasks" in capsys.readouterr().out

    res, prefix = _merge_into_results(w)
    # not in the results repo under this name -> refused, nothing opened
    assert main(["submit", str(w["result"]), "--repo", "org/results", "--model-repo", "org/tiny-resnet",
                 "--endpoint", hub.endpoint, "--trusted-keys", str(w["trusted"])]) == 0
    url = capsys.readouterr().out.strip()
    assert url.endswith("/org/tiny-resnet/discussions/1 (opened)"), url
    model = hub.repos[("model", "org/tiny-resnet")]
    raw = model.commits[model.refs["refs/pr/1"]].files[".eval_results/toy.yaml"]
    entries = parse_eval_result_entries(yaml.safe_load(raw))
    # task ids are exactly the benchmark's; values read back are the result's, in percent
    assert [e.task_id for e in entries] == [t["id"] for t in spec["tasks"]]
    assert {e.task_id: e.value for e in entries} == task_values(res)
    e0 = entries[0]
    assert e0.dataset_id == "org/toy" and e0.dataset_revision == w["sha"] and e0.date == res["finished_at"]
    assert e0.source_url.startswith(f"{hub.endpoint}/datasets/org/results/tree/") and e0.source_url.endswith(prefix)
    stamp = json.loads((w["result"].parent / "verification.json").read_text())
    assert "verified by genshift-bench: stamp key " + stamp["signature"]["key_id"][:16] in e0.notes
    assert f"seed {stamp['record']['recheck']['seed']}" in e0.notes and "preprocess timm" in e0.notes
    assert e0.verify_token is None  # the Hub's own verifyToken scheme is not ours to fill

    # idempotent: a rerun changes nothing; without trusted keys the file says "not verified" and the
    # same open PR is updated, never a second one
    assert main(["submit", str(w["result"]), "--repo", "org/results", "--model-repo", "org/tiny-resnet",
                 "--endpoint", hub.endpoint, "--trusted-keys", str(w["trusted"])]) == 0
    assert capsys.readouterr().out.strip().endswith("(unchanged)")
    assert main(["submit", str(w["result"]), "--repo", "org/results", "--model-repo", "org/tiny-resnet",
                 "--endpoint", hub.endpoint]) == 0
    assert capsys.readouterr().out.strip().endswith("/discussions/1 (updated)")
    assert model.prs == 1
    raw = model.commits[model.refs["refs/pr/1"]].files[".eval_results/toy.yaml"]
    assert all("not verified by genshift-bench" in e.notes for e in parse_eval_result_entries(yaml.safe_load(raw)))

    # the Hub's leaderboard shows it as community (open PR); the board reads it as its own table
    rows, problems = hub_reported("org/toy", endpoint=hub.endpoint)
    assert problems == [] and [r["model"] for r in rows] == ["org/tiny-resnet"]
    assert rows[0]["status"] == "community (open PR #1)" and rows[0]["source"] == e0.source_url
    assert math.isclose(rows[0]["value"], task_values(res)[spec["tasks"][0]["id"]])
    # once merged, model_info(expand=["evalResults"]) reads the entries back through huggingface_hub
    api.merge_pull_request("org/tiny-resnet", 1)
    info = api.model_info("org/tiny-resnet", expand=["evalResults"])
    assert {e.task_id: e.value for e in info.eval_results} == {e.task_id: e.value for e in entries}


def test_only_complete_pinned_results_that_are_in_the_results_repo(hub_world, capsys):
    from genshift.cli import main

    w = hub_world
    hub = w["hub"]
    # not merged into the results repo yet: one line, no PR
    w["api"].create_repo("org/results", repo_type="dataset")
    assert main(["submit", str(w["result"]), "--repo", "org/results", "--model-repo", "org/tiny-resnet",
                 "--endpoint", hub.endpoint]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no entry toy/" in err and "bench submit RESULT --repo org/results" in err
    # a different local run than the merged one: refused
    _merge_into_results(w, with_stamp=False)
    res = json.loads(w["result"].read_text())
    res["notes"] = "another run"
    w["result"].write_text(json.dumps(res))
    assert main(["submit", str(w["result"]), "--repo", "org/results", "--model-repo", "org/tiny-resnet",
                 "--endpoint", hub.endpoint]) == 2
    assert "is not this result" in capsys.readouterr().err
    assert w["hub"].repos[("model", "org/tiny-resnet")].prs == 0


def test_partial_and_unpinned_results_never_become_entries():
    from genshift.leaderboard.hub_results import build_entries

    r = fake_result("timm/a", ["base", "fog"], {"configs": {"base": {"acc1": _m(0.9), "acc5": _m(1.0)},
                                                            "fog": {"acc1": _m(0.5), "acc5": _m(1.0)}}})
    r["suite"].update(repo_id="org/star", revision="a" * 40)
    assert len(build_entries(r, stamp=None, source_url="http://x/y", declared={"mean_shift_acc1", "acc1_fog"})) == 2
    with pytest.raises(BenchError, match="does not declare task"):
        build_entries(r, stamp=None, source_url="http://x/y", declared={"mean_shift_acc1"})
    r["flags"]["partial"] = True
    with pytest.raises(BenchError, match="partial"):
        build_entries(r, stamp=None, source_url="http://x/y", declared=set())
    r["flags"]["partial"] = False
    r["suite"]["revision"] = "main"
    with pytest.raises(BenchError, match="pinned to a commit"):
        build_entries(r, stamp=None, source_url="http://x/y", declared=set())


def test_hostile_hub_leaderboards_are_one_line_and_never_reach_the_ranking():
    from genshift.leaderboard.hub_results import hub_reported

    good = {"rank": 1, "modelId": "org/ok", "value": 71.5, "filename": ".eval_results/toy.yaml", "verified": False,
            "author": {"type": "user", "name": "u"}, "source": {"url": "https://example.org/x"}}
    with FakeHub(users={"t": "tester"}) as hub:
        hub.create("dataset", "org/toy")
        hub.leaderboards["org/toy"] = [
            good,
            {**good, "modelId": "org/nan", "value": "NaN"},
            {**good, "modelId": "org/inf", "value": float("inf")},
            {**good, "modelId": "org/big", "value": 1e300},
            {**good, "modelId": "org/huge-notes", "notes": "x" * 100_000},
            {**good, "modelId": "org/js", "source": {"url": "javascript:alert(1)"}},
            {**good, "modelId": "../../etc"},
            {**good, "modelId": "org/pr", "pullRequest": "7"},
        ]
        rows, problems = hub_reported("org/toy", endpoint=hub.endpoint)
        assert [r["model"] for r in rows] == ["org/ok"]
        assert len(problems) == 7 and all("\n" not in p and p.startswith("Hub row") for p in problems)
        hub.leaderboards["org/toy"] = [{**good, "rank": i} for i in range(501)]  # bounded
        rows, problems = hub_reported("org/toy", endpoint=hub.endpoint)
        assert len(rows) == 500 and problems == ["the Hub leaderboard of org/toy has 501 rows; the first 500 are shown"]
        hub.leaderboards["org/toy"] = [{"rank": 1}]  # huggingface_hub's own parse fails: one line, no rows
        rows, problems = hub_reported("org/toy", endpoint=hub.endpoint)
        assert rows == [] and len(problems) == 1 and "cannot be read" in problems[0]
        hub.leaderboards["org/toy"] = {"not": "a list"}
        rows, problems = hub_reported("org/toy", endpoint=hub.endpoint)
        assert rows == [] and len(problems) == 1
        rows, problems = hub_reported("org/missing", endpoint=hub.endpoint)
        assert rows == [] and "RepositoryNotFound" in problems[0]


def test_malformed_and_huge_eval_results_files_on_model_repos_are_skipped(hub_world):
    """Other model repos' broken .eval_results files: the Hub's leaderboard leaves them out (invalid) and
    a valid file with a huge field is dropped here by the row bounds."""
    from genshift.leaderboard.hub_results import hub_reported

    w = hub_world
    api, op = w["api"], w["CommitOperationAdd"]
    for name, data in (("org/bad-yaml", b"- dataset: [unclosed"), ("org/not-list", b"dataset: {id: org/toy}"),
                       ("org/junk-value", yaml.safe_dump([{"dataset": {"id": "org/toy", "task_id": "mean_acc1"},
                                                           "value": "high"}]).encode()),
                       ("org/huge", yaml.safe_dump([{"dataset": {"id": "org/toy", "task_id": "mean_acc1"},
                                                     "value": 50.0, "notes": "n" * 300_000}]).encode()),
                       ("org/fine", yaml.safe_dump([{"dataset": {"id": "org/toy", "task_id": "mean_acc1"},
                                                     "value": 12.5}]).encode())):
        api.create_repo(name)
        api.create_commit(name, [op(".eval_results/toy.yaml", data)], commit_message="results")
    rows, problems = hub_reported("org/toy", endpoint=w["hub"].endpoint)
    assert [r["model"] for r in rows] == ["org/fine"] and rows[0]["status"] == "on the model page"
    assert len(problems) == 1 and "org/huge" not in problems[0] and "notes is not a short" in problems[0]


def test_review_reports_what_it_published_on_the_model_repo(hub_world, monkeypatch, capsys):
    """`bench review --merge --publish-model-results`: the entry committed to main is reported on its Hub model repo
    (verified by the reviewer's key) and linked in the answer; the same entry again changes nothing, a new run of
    the model updates the same model PR, and a failure there is a problem of the outcome, never an undone publish."""
    from huggingface_hub import parse_eval_result_entries

    from genshift.cli import main
    from genshift.eval import stamps
    from genshift.leaderboard import review as reviewing
    from genshift.leaderboard.hub_results import publish_entry
    from genshift.leaderboard.submit import submit

    w = hub_world
    hub, api = w["hub"], w["api"]
    _point_hub_defaults_at(monkeypatch, hub, w["tmp"] / "hub-cache")  # the re-run loads the recorded Hub weights
    (w["result"].parent / "verification.json").unlink()  # the submitter's own stamp is never sent
    api.create_repo("org/results", repo_type="dataset")
    submit(w["result"], "org/results", endpoint=hub.endpoint, token="t")
    cli = ["review", "--repo", "org/results", "--key", str(w["key"]), "--suite", str(w["suite"]), "--recheck", "2",
           "--merge", "--publish-model-results"]
    assert main(cli) == 0 and "passed + merged" in capsys.readouterr().out
    model = hub.repos[("model", "org/tiny-resnet")]
    assert model.prs == 1
    entries = parse_eval_result_entries(yaml.safe_load(model.commits[model.refs["refs/pr/1"]].files[
        ".eval_results/toy.yaml"]))
    [key] = stamps.load_trusted_keys(w["trusted"])
    assert entries and all(f"verified by genshift-bench: stamp key {key}" in e.notes for e in entries)
    answer = [e.content for e in api.get_discussion_details("org/results", 1, repo_type="dataset").events
              if e.type == "comment"][-1]
    assert "Verification passed" in answer and "/org/tiny-resnet/discussions/1 (opened)" in answer
    # idempotent: the same entry once more is "unchanged", no commit on the model repo
    commits, merged = len(model.commits), entries[0].source_url.split("/tree/")[1].split("/")[0]
    assert publish_entry("org/results", "toy/org--tiny-resnet", trusted=stamps.load_trusted_keys(w["trusted"]),
                         revision=merged, api=api)[1] == "unchanged"
    assert len(model.commits) == commits and model.prs == 1
    # a new run of the model: published to main, the same model PR updated; then the model repo refuses: the
    # publish stands and the answer says what failed
    for note, refuse in (("rerun", False), ("rerun again", True)):
        res = json.loads(w["result"].read_text())
        res["notes"] = note
        w["result"].write_text(json.dumps(res))
        submit(w["result"], "org/results", endpoint=hub.endpoint, token="t")
        if refuse:
            def refused(*a, **kw):
                raise reviewing.BenchError("the Hub refused the model-repo pull request: 403 Forbidden")
            monkeypatch.setattr("genshift.leaderboard.hub_results.open_or_update_pr", refused)
        assert main(cli) == 0
        assert "passed + merged" in capsys.readouterr().out and model.prs == 1
    [pr2, pr3] = [[e.content for e in api.get_discussion_details("org/results", n, repo_type="dataset").events
                   if e.type == "comment"][-1] for n in (2, 3)]
    assert "/org/tiny-resnet/discussions/1 (updated)" in pr2
    assert "not reported on its model page: the Hub refused" in pr3 and "Verification passed" in pr3
    main_files = hub.repos[("dataset", "org/results")].commits[hub.repos[("dataset", "org/results")].refs["main"]].files
    assert json.loads(main_files["toy/org--tiny-resnet/result.json"])["notes"] == "rerun again"


def test_board_shows_hub_reported_entries_in_their_own_never_ranked_table(hub_world, monkeypatch, capsys):
    """`bench leaderboard --hub-results`: the app (under Streamlit's AppTest) shows the Hub's leaderboard of the
    suite's dataset below the ranking; a Hub-reported model with a higher score never enters the ranking."""
    import shutil

    from genshift.cli import main

    w = hub_world
    hub, api = w["hub"], w["api"]
    _merge_into_results(w)
    assert main(["submit", str(w["result"]), "--repo", "org/results", "--model-repo", "org/tiny-resnet",
                 "--endpoint", hub.endpoint]) == 0
    api.create_repo("org/other")
    api.create_commit("org/other", [w["CommitOperationAdd"](".eval_results/toy.yaml", yaml.safe_dump(
        [{"dataset": {"id": "org/toy", "task_id": "mean_acc1"}, "value": 99.0,
          "source": {"url": "https://example.org/other"}}]).encode())], commit_message="results")
    store = w["tmp"] / "store" / "toy" / "org--tiny-resnet"
    shutil.copytree(w["result"].parent, store)
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    from tests.boardkit import app

    at = app(store.parent.parent)
    assert not at.exception and "Reported on the Hub" not in [s.value for s in at.subheader]  # opt-in
    at = app(store.parent.parent, hub_results=True)
    assert not at.exception
    ranking = at.dataframe[0].value
    assert list(ranking["model"]) == ["org/tiny-resnet"]  # org/other (99 %) is not ranked
    hub_df = next(d for d in at.dataframe if d.proto.id.endswith("hub_reported_org/toy") or
                  "hub rank" in d.value.columns).value
    assert list(hub_df["model"]) == ["org/other", "org/tiny-resnet"]
    assert list(hub_df["status"]) == ["on the model page", "community (open PR #1)"]
    assert hub_df["source"].iloc[0] == "https://example.org/other"
    assert hub_df["source"].iloc[1].startswith(f"{hub.endpoint}/datasets/org/results/tree/")
    cols = json.loads(next(d for d in at.dataframe if "hub rank" in d.value.columns).proto.columns)
    assert cols["source"]["type_config"]["type"] == "link"
    assert "Reported on the Hub" in [s.value for s in at.subheader]


def test_a_verified_result_is_reported_only_on_its_own_model_repo(hub_world, capsys):
    """Mallory takes a verified entry of org/tiny-resnet and asks for it on her own model repo: refused, one line,
    nothing opened there, so no model page says "verified by genshift-bench" about numbers of another model."""
    from genshift.cli import main

    w = hub_world
    hub = w["hub"]
    _merge_into_results(w)
    w["api"].create_repo("org/mallory")
    assert main(["submit", str(w["result"]), "--repo", "org/results", "--model-repo", "org/mallory",
                 "--trusted-keys", str(w["trusted"]), "--endpoint", hub.endpoint]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "org/tiny-resnet" in err and "--model-repo org/tiny-resnet" in err
    assert hub.repos[("model", "org/mallory")].prs == 0


def test_a_stamp_over_local_weights_is_not_written_as_verified_on_a_model_page(hub_world, capsys):
    """A result scored from a local weights file, signed by the maintainer: its stamp vouches for a sha256, not for
    whatever the named model repo holds, so the model-repo PR says "not verified by genshift-bench"."""
    from huggingface_hub import parse_eval_result_entries

    from genshift.cli import main
    from genshift.eval.results import config_hash
    from genshift.eval.stamps import load_private_key, sign
    from genshift.fsutil import canonical_json, sha256_file
    from genshift.identity import canonical_of

    w = hub_world
    run = w["result"].parent
    res = json.loads(w["result"].read_text())
    res["model"].update(source="checkpoint", weights_revision=None)
    res["model"]["pretrained_cfg"].pop("hf_hub_id")
    res["model"]["id"] = canonical_of(res["model"])  # local weights: never a Hub repo's id
    res["config_hash"] = config_hash(res["model"], res["suite"], res["protocol"], res["data_config"])
    w["result"].write_bytes(canonical_json(res))
    stamp = json.loads((run / "verification.json").read_text())["record"]
    stamp["files"]["result.json"] = sha256_file(w["result"])  # a maintainer signed these exact files
    (run / "verification.json").write_bytes(sign(stamp, load_private_key(str(w["key"]))))
    _merge_into_results(w)
    assert main(["submit", str(w["result"]), "--repo", "org/results", "--model-repo", "org/tiny-resnet",
                 "--trusted-keys", str(w["trusted"]), "--endpoint", w["hub"].endpoint]) == 0, capsys.readouterr().err
    model = w["hub"].repos[("model", "org/tiny-resnet")]
    raw = model.commits[model.refs["refs/pr/1"]].files[".eval_results/toy.yaml"]
    entries = parse_eval_result_entries(yaml.safe_load(raw))
    assert entries and all("not verified by genshift-bench" in e.notes for e in entries)
