"""Hub I/O end to end over loopback: olah serves local git repos (downloads), the project's fake
Hub takes uploads (publish, PRs). No network."""

import json
import os
from pathlib import Path

import pytest

from genshift import hub
from genshift.data_cards import render_card
from genshift.errors import BenchError, NotFoundError, OfflineError
from genshift.suite_format import LocalSuite, Manifest
from genshift.synthetic import make_synthetic_suite
from tests.fakehub import FakeHub
from tests.hubtools import bench_subprocess, git_commit, olah_available, olah_server

pytestmark = pytest.mark.skipif(not olah_available(), reason="olah (test extra) is not installed")


@pytest.fixture(scope="module")
def hub_repos(tmp_path_factory):
    """A dataset repo with two commits and a model repo of timm's tiny test_resnet, served by olah."""
    import timm
    import torch
    from timm.models._hub import save_for_hf

    root = tmp_path_factory.mktemp("repos")
    ds = root / "datasets" / "genshift-test" / "toy"
    make_synthetic_suite(ds, suite_id="toy", classes=range(6), per_class=3, num_shards=2)
    (ds / "build.json").unlink()
    (ds / "README.md").write_text(render_card(Manifest.load(ds)))
    sha1 = git_commit(ds, "v1")
    make_synthetic_suite(ds / ".." / "tmp2", suite_id="toy", classes=range(6), per_class=3, num_shards=2, seed=7)
    import shutil
    shutil.rmtree(ds / "data")
    shutil.copytree(ds.parent / "tmp2" / "data", ds / "data")
    shutil.copy(ds.parent / "tmp2" / "manifest.json", ds / "manifest.json")
    shutil.rmtree(ds.parent / "tmp2")
    sha2 = git_commit(ds, "v2: other images")
    torch.manual_seed(0)
    model_dir = root / "models" / "timm" / "test_resnet.r160_in1k"
    model_dir.mkdir(parents=True)
    save_for_hf(timm.create_model("test_resnet.r160_in1k", pretrained=False), str(model_dir), safe_serialization=True)
    msha = git_commit(model_dir, "weights")
    work = tmp_path_factory.mktemp("olah")
    with olah_server(root, work) as endpoint:
        yield {"endpoint": endpoint, "sha1": sha1, "sha2": sha2, "model_sha": msha, "work": work}


# The olah server of hub_repos takes ~9 s to start: every test on it is slow.
@pytest.mark.slow
def test_download_at_pinned_shas_verifies_and_loads(hub_repos, tmp_path):
    e = hub_repos["endpoint"]
    s1 = hub.download_suite("genshift-test/toy", revision=hub_repos["sha1"], configs=["base"], endpoint=e,
                            cache_dir=str(tmp_path))
    s2 = hub.download_suite("genshift-test/toy", revision=hub_repos["sha2"], endpoint=e, cache_dir=str(tmp_path))
    assert s1.revision == hub_repos["sha1"] and s2.revision == hub_repos["sha2"]
    assert s1.manifest.sha256 != s2.manifest.sha256  # two pinnable versions
    ds = s1.dataset("base")
    assert len(ds) == 18 and ds.features["label"].names[0] == "n01440764"
    # only the requested config's shards were fetched
    assert not (s1.root / "data" / "shifted").exists() or s1.root == s2.root
    head = hub.resolve_revision("genshift-test/toy", "main", endpoint=e)
    assert head == hub_repos["sha2"]


@pytest.mark.slow
def test_bad_revision_and_repo_are_one_line_errors(hub_repos, tmp_path):
    e = hub_repos["endpoint"]
    with pytest.raises(BenchError) as info:  # olah answers 500 for an unknown sha; still one clear line
        hub.download_suite("genshift-test/toy", revision="0" * 40, endpoint=e, cache_dir=str(tmp_path))
    assert "\n" not in str(info.value) and "genshift-test/toy" in str(info.value)
    with pytest.raises(BenchError):  # olah offline drops the connection for unknown repos
        hub.download_suite("genshift-test/nothing", revision="main", endpoint=e, cache_dir=str(tmp_path))
    with pytest.raises(BenchError, match="not a Hub repo id"):
        hub.download_suite("no slash", revision="main", endpoint=e)
    folder = _built_suite(tmp_path)
    with FakeHub() as fh:  # the Hub's own answer for an unknown revision
        hub.publish_suite(folder, "org/toy", endpoint=fh.endpoint, token="t")
        with pytest.raises(NotFoundError, match="revision '0{40}' does not exist in datasets/org/toy"):
            hub.download_suite("org/toy", revision="0" * 40, endpoint=fh.endpoint, cache_dir=str(tmp_path / "c"))
        with pytest.raises(NotFoundError, match="dataset repo datasets/org/nothing .* not found"):
            hub.download_suite("org/nothing", revision="main", endpoint=fh.endpoint, cache_dir=str(tmp_path / "c"))


@pytest.mark.slow
@pytest.mark.subprocess
def test_offline_without_cache_says_how_to_get_a_snapshot(hub_repos, tmp_path):
    r = bench_subprocess(["download", "genshift-test/toy", "--revision", hub_repos["sha1"], "--cache-dir",
                          str(tmp_path / "empty")], env={"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": hub_repos["endpoint"]},
                         cwd=tmp_path)
    assert r.returncode != 0
    assert "error:" in r.stderr and "bench download" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    r = bench_subprocess(["download", "genshift-test/toy", "--revision", "main", "--cache-dir",
                          str(tmp_path / "empty")], env={"HF_HUB_OFFLINE": "1"}, cwd=tmp_path)
    assert r.returncode != 0 and "40-character commit sha" in r.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_offline_a_branch_resolves_from_the_refs_a_download_recorded(hub_repos, tmp_path):
    """huggingface_hub's own offline rule: a branch or tag resolves from the cache's refs/ once a download
    with network recorded it; never recorded, it is the error that says to pin a sha."""
    cache = str(tmp_path / "c")
    online = hub.download_suite("genshift-test/toy", revision="main", configs=["base"], endpoint=hub_repos["endpoint"],
                                cache_dir=cache)
    r = bench_subprocess(["download", "genshift-test/toy", "--revision", "main", "--configs", "base", "--cache-dir",
                          cache], env={"HF_HUB_OFFLINE": "1"}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == online.revision == hub_repos["sha2"]


@pytest.mark.slow
@pytest.mark.subprocess
def test_eval_a_tiny_hub_model_on_a_hub_suite_over_loopback(hub_repos, tmp_path):
    """`bench eval` with the model and the suite both fetched from the local Hub, then offline again."""
    env = {"HF_ENDPOINT": hub_repos["endpoint"], "HF_HOME": str(tmp_path / "hf")}
    args = ["eval", "--model", "timm/test_resnet.r160_in1k", "--suite", "genshift-test/toy", "--revision",
            hub_repos["sha1"], "--out", str(tmp_path / "runs"), "--workers", "0", "--no-progress", "--json"]
    r = bench_subprocess(args, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout)
    assert result["model"]["weights_revision"] == hub_repos["model_sha"]
    assert len(result["model"]["weights_sha256"]) == 64 and result["model"]["source"] == "hf-hub"
    assert result["suite"]["revision"] == hub_repos["sha1"] and result["suite"]["repo_id"] == "genshift-test/toy"
    assert result["data_config"]["input_size"] == [3, 160, 160]
    # offline now: the cached model (pinned by sha) and suite are enough
    r2 = bench_subprocess(["eval", "--model", f"hf-hub:timm/test_resnet.r160_in1k@{hub_repos['model_sha']}",
                           "--suite", "genshift-test/toy", "--revision", hub_repos["sha1"], "--out",
                           str(tmp_path / "runs2"), "--workers", "0", "--no-progress", "--json"],
                          env={**env, "HF_HUB_OFFLINE": "1"}, cwd=tmp_path)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert json.loads(r2.stdout)["metrics"] == result["metrics"]


def _built_suite(tmp_path) -> Path:
    root = tmp_path / "suite"
    make_synthetic_suite(root, suite_id="toy", classes=range(4), per_class=2)
    (root / "README.md").write_text(render_card(Manifest.load(root)))
    return root


def test_publish_is_one_commit_with_a_tag_and_round_trips(tmp_path):
    folder = _built_suite(tmp_path)
    with FakeHub() as fh:
        sha = hub.publish_suite(folder, "org/toy", endpoint=fh.endpoint, token="t")
        commits = [p for m, p in fh.requests if m == "POST" and "/commit/" in p]
        assert len(commits) == 1
        from huggingface_hub import HfApi
        api = HfApi(endpoint=fh.endpoint, token="t")
        files = set(api.list_repo_files("org/toy", repo_type="dataset", revision=sha))
        assert {"README.md", "manifest.json", "data/base/test-00000-of-00001.parquet"} <= files
        assert "build.json" not in files
        assert [t.target_commit for t in api.list_repo_refs("org/toy", repo_type="dataset").tags] == [sha]
        got = hub.download_suite("org/toy", revision=sha, endpoint=fh.endpoint, cache_dir=str(tmp_path / "c"))
        assert got.manifest.sha256 == Manifest.load(folder).sha256
        with pytest.raises(BenchError, match="tag 'v1.0.0' already exists"):
            hub.publish_suite(folder, "org/toy", endpoint=fh.endpoint, token="t")


def test_publish_refuses_a_stale_parent_commit(tmp_path, monkeypatch):
    folder = _built_suite(tmp_path)
    with FakeHub() as fh:
        hub.publish_suite(folder, "org/toy", endpoint=fh.endpoint, token="t")
        from huggingface_hub import HfApi
        real = HfApi.dataset_info

        def stale(self, repo_id, revision=None, **kw):  # someone commits between our read and our upload
            info = real(self, repo_id, revision=revision, **kw)
            HfApi(endpoint=fh.endpoint, token="t").upload_file(path_or_fileobj=b"x", path_in_repo="other.txt",
                                                               repo_id=repo_id, repo_type="dataset")
            return info
        monkeypatch.setattr(HfApi, "dataset_info", stale)
        with pytest.raises(BenchError, match="publishing to datasets/org/toy failed"):
            hub.publish_suite(folder, "org/toy", endpoint=fh.endpoint, token="t", tag="v2")


def test_publish_refuses_an_unverified_suite(tmp_path):
    folder = _built_suite(tmp_path)
    p = next((folder / "data" / "base").glob("*.parquet"))
    p.write_bytes(p.read_bytes() + b"x")
    from genshift.errors import IntegrityError
    with FakeHub() as fh, pytest.raises(IntegrityError, match="bytes, the manifest says"):
        hub.publish_suite(folder, "org/toy", endpoint=fh.endpoint, token="t")


def test_unknown_suite_name_suggests(tmp_path):
    with pytest.raises(NotFoundError, match="Did you mean 'imagenet-star'"):
        hub.open_suite("imagenet-sta")


def test_gated_repo_says_how_to_get_access(tmp_path):
    folder = _built_suite(tmp_path)
    with FakeHub() as fh:
        hub.publish_suite(folder, "org/gated", endpoint=fh.endpoint, token="t")
        fh.gate("dataset", "org/gated", {"granted"})
        with pytest.raises(BenchError) as info:
            hub.download_suite("org/gated", revision="main", endpoint=fh.endpoint, token="not-granted",
                               cache_dir=str(tmp_path / "c"))
        msg = str(info.value)
        assert "\n" not in msg and "datasets/org/gated" in msg and "is gated" in msg
        assert f"request access at {fh.endpoint}/datasets/org/gated" in msg
        assert "hf auth login" in msg and "HF_TOKEN" in msg
        ok = hub.download_suite("org/gated", revision="main", endpoint=fh.endpoint, token="granted",
                                cache_dir=str(tmp_path / "c"))
        assert ok.manifest.sha256 == Manifest.load(folder).sha256


def test_unreachable_hub_falls_back_to_the_cache_for_a_sha_or_a_recorded_branch(tmp_path):
    from genshift.errors import OfflineError

    folder = _built_suite(tmp_path)
    cache = str(tmp_path / "cache")
    with FakeHub() as fh:
        sha = hub.publish_suite(folder, "org/toy", endpoint=fh.endpoint, token="t")
        hub.download_suite("org/toy", revision=sha, configs=["base"], endpoint=fh.endpoint, cache_dir=cache)
        dead = fh.endpoint
    # the server is gone (connection refused), HF_HUB_OFFLINE is not set
    again = hub.download_suite("org/toy", revision=sha, configs=["base"], endpoint=dead, cache_dir=cache)
    assert again.revision == sha and len(again.dataset("base")) == 8
    with pytest.raises(OfflineError, match=r"cannot reach .* to resolve dataset repo org/toy@main .* pin the 40-char"):
        hub.download_suite("org/toy", revision="main", endpoint=dead, cache_dir=cache)
    with pytest.raises(OfflineError, match=r"cached snapshot of org/toy@[0-9a-f]{40} is incomplete .*bench download"):
        hub.download_suite("org/toy", revision=sha, endpoint=dead, cache_dir=cache)  # 'shifted' was never fetched
    with pytest.raises(OfflineError, match=r"no cached snapshot of org/toy@[0-9a-f]{40} .*`bench download org/toy"):
        hub.download_suite("org/toy", revision=sha, endpoint=dead, cache_dir=str(tmp_path / "empty"))


def test_publish_uploads_only_the_card_manifest_and_listed_shards(tmp_path):
    folder = _built_suite(tmp_path)
    assert (folder / "build.json").is_file()
    (folder / "data" / "base" / "notes.txt").write_text("scratch")
    (folder / "data" / "base" / "test-00000-of-00001.parquet.x1.incomplete").write_bytes(b"half")
    (folder / "data" / "extra").mkdir()
    (folder / "data" / "extra" / "test-00000-of-00001.parquet").write_bytes(b"not in the manifest")
    with FakeHub() as fh:
        sha = hub.publish_suite(folder, "org/toy", endpoint=fh.endpoint, token="t")
        from huggingface_hub import HfApi
        files = set(HfApi(endpoint=fh.endpoint).list_repo_files("org/toy", repo_type="dataset", revision=sha))
    assert files == {".gitattributes", "README.md", "eval.yaml", "manifest.json", *Manifest.load(folder).files}


def test_publish_writes_eval_yaml_and_refuses_a_wrong_one(tmp_path, capsys):
    """The repo becomes a Hub benchmark: eval.yaml is written (temp name + rename) from the manifest, uploaded
    in the release commit, and a hand-edited one whose tasks are not the suite's is refused before any upload."""
    import yaml
    from huggingface_hub import hf_hub_download

    from genshift.cli import main
    from genshift.hub import parse_eval_yaml, suite_tasks

    folder = _built_suite(tmp_path)
    with FakeHub() as fh:
        sha = hub.publish_suite(folder, "org/toy", endpoint=fh.endpoint, token="t")
        got = Path(hf_hub_download("org/toy", "eval.yaml", repo_type="dataset", revision=sha, endpoint=fh.endpoint,
                                   cache_dir=str(tmp_path / "c"))).read_bytes()
        assert got == (folder / "eval.yaml").read_bytes()
        doc = parse_eval_yaml(got)
        assert [t["id"] for t in doc["tasks"]] == [t.id for t in suite_tasks(Manifest.load(folder))]
        assert not list(folder.glob("eval.yaml.*"))  # no temp file left
        down = hub.download_suite("org/toy", revision=sha, endpoint=fh.endpoint, cache_dir=str(tmp_path / "d"))
        assert (down.root / "eval.yaml").read_bytes() == got  # fetched with the manifest: bench verify checks it
        spec = yaml.safe_load(got)
        spec["tasks"] = spec["tasks"][:1]
        (folder / "eval.yaml").write_text(yaml.safe_dump(spec))
        posts = len(fh.requests)
        assert main(["publish", str(folder), "--repo", "org/toy", "--tag", "v2", "--endpoint", fh.endpoint]) == 3
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "are not the ones suite toy defines" in err and "bench publish" in err
        assert len(fh.requests) == posts  # refused before any request
        assert main(["verify", str(folder)]) == 3


def test_open_suite_pins_and_mask_rules(tmp_path):
    folder = _built_suite(tmp_path)
    local = hub.open_suite(str(folder))
    assert local.revision is None and local.pinned and local.repo_id is None
    with pytest.raises(BenchError, match="--mask applies to the upstream ImageNet\\* release only"):
        hub.open_suite(str(folder), mask=str(tmp_path / "masks.npy"))
    with FakeHub() as fh:
        sha = hub.publish_suite(folder, "org/toy", endpoint=fh.endpoint, token="t")
        kw = {"endpoint": fh.endpoint, "cache_dir": str(tmp_path / "c")}
        by_sha = hub.open_suite("org/toy", revision=sha, **kw)
        by_tag = hub.open_suite("org/toy", revision="v1.0.0", **kw)
        by_default = hub.open_suite("org/toy", configs=["base"], **kw)
    assert by_sha.pinned and by_sha.revision == sha and by_sha.repo_id == "org/toy"
    assert not by_tag.pinned and by_tag.revision == sha  # resolved and recorded, but not chosen by a pin
    assert not by_default.pinned and by_default.revision == sha


def test_publish_and_download_verbs(tmp_path, capsys):
    from genshift.cli import main

    folder = _built_suite(tmp_path)
    with FakeHub() as fh:
        assert main(["publish", str(folder), "--repo", "org/toy", "--endpoint", fh.endpoint]) == 0
        sha = capsys.readouterr().out.strip()
        assert len(sha) == 40 and fh.repos[("dataset", "org/toy")].tags == {"v1.0.0": sha}
        assert main(["publish", str(folder), "--repo", "org/toy", "--endpoint", fh.endpoint]) == 2
        err = capsys.readouterr().err
        assert err == ("error: bench publish: tag 'v1.0.0' already exists in datasets/org/toy; bump the suite version "
                       "or pass --tag\n")
        code = main(["download", "org/toy", "--revision", "v1.0.0", "--configs", "base", "--endpoint", fh.endpoint,
                     "--cache-dir", str(tmp_path / "c")])
        out, err = capsys.readouterr()
        assert code == 0
        path, resolved = out.splitlines()
        assert resolved == sha and Path(path, "manifest.json").is_file() and Path(path).name == sha
        assert "unpinned" in err and "1 config(s), 8 rows" in err
        code = main(["download", "org/toy", "--revision", "f" * 40, "--endpoint", fh.endpoint,
                     "--cache-dir", str(tmp_path / "c")])
        err = capsys.readouterr().err
        assert code != 0 and err.count("\n") == 1
        assert f"revision '{'f' * 40}' does not exist in datasets/org/toy" in err


def test_offline_mode_with_a_partial_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from genshift.errors import OfflineError

    folder = _built_suite(tmp_path)
    cache = str(tmp_path / "cache")
    with FakeHub() as fh:
        sha = hub.publish_suite(folder, "org/toy", endpoint=fh.endpoint, token="t")
        hub.download_suite("org/toy", revision=sha, configs=["base"], endpoint=fh.endpoint, cache_dir=cache)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # what HF_HUB_OFFLINE=1 sets at import
        n = len(fh.requests)
        assert hub.download_suite("org/toy", revision=sha, configs=["base"], endpoint=fh.endpoint,
                                  cache_dir=cache).revision == sha
        with pytest.raises(OfflineError, match="pass the 40-character commit sha"):
            hub.download_suite("org/toy", revision="main", endpoint=fh.endpoint, cache_dir=cache)
        with pytest.raises(OfflineError, match=r"snapshot of org/toy@[0-9a-f]{40} is incomplete .*bench download"):
            hub.download_suite("org/toy", revision=sha, endpoint=fh.endpoint, cache_dir=cache)  # 'shifted' not fetched
        assert len(fh.requests) == n  # nothing went to the server


def _gated_suite(tmp_path) -> Path:
    """A suite whose card asks for gated access, as LANCE's does."""
    folder = _built_suite(tmp_path)
    (folder / "README.md").write_text(render_card(Manifest.load(folder), gated=True))
    return folder


def test_large_suite_uploads_resumably_checks_the_head_and_tags_it(tmp_path, monkeypatch):
    """Above the threshold: the resumable path (huggingface_hub's upload_large_folder, or upload_folder on 2.x)."""
    from huggingface_hub import HfApi

    folder = _built_suite(tmp_path)
    used = []
    for name in ("upload_large_folder", "upload_folder", "create_commit"):
        if hasattr(HfApi, name):
            real = getattr(HfApi, name)
            monkeypatch.setattr(HfApi, name,
                                lambda self, *a, _n=name, _r=real, **kw: used.append(_n) or _r(self, *a, **kw))
    shards = sorted(Manifest.load(folder).files)
    with FakeHub() as fh:
        api = HfApi(endpoint=fh.endpoint, token="t")
        api.create_repo("org/big", repo_type="dataset")
        # an earlier run that died after committing one shard: the rerun completes the release
        api.upload_file(path_or_fileobj=str(folder / shards[0]), path_in_repo=shards[0], repo_id="org/big",
                        repo_type="dataset")
        used.clear()
        sha = hub.publish_suite(folder, "org/big", endpoint=fh.endpoint, token="t", large_threshold=0)
        assert used[0] in ("upload_large_folder", "upload_folder")
        head = api.dataset_info("org/big", revision="main").sha
        assert sha == head and fh.repos[("dataset", "org/big")].tags == {"v1.0.0": sha}
        files = set(api.list_repo_files("org/big", repo_type="dataset", revision=sha))
        assert files == {".gitattributes", "README.md", "eval.yaml", "manifest.json", *shards}
        assert fh.repos[("dataset", "org/big")].gated_mode is False  # the card does not ask for gating
        got = hub.download_suite("org/big", revision=sha, endpoint=fh.endpoint, cache_dir=str(tmp_path / "c"))
        assert got.manifest.sha256 == Manifest.load(folder).sha256


def test_large_upload_that_left_a_file_out_is_not_tagged(tmp_path, monkeypatch):
    from huggingface_hub import HfApi

    folder = _built_suite(tmp_path)
    real = HfApi.upload_folder
    monkeypatch.delattr(HfApi, "upload_large_folder", raising=False)
    monkeypatch.setattr(HfApi, "upload_folder", lambda self, **kw: real(
        self, **{**kw, "allow_patterns": [p for p in kw["allow_patterns"] if p != "manifest.json"]}))
    with FakeHub() as fh:
        with pytest.raises(BenchError, match="manifest.json at datasets/org/big@.* is missing; rerun `bench publish`"):
            hub.publish_suite(folder, "org/big", endpoint=fh.endpoint, token="t", large_threshold=0)
        assert fh.repos[("dataset", "org/big")].tags == {}


def test_small_suite_is_one_commit_and_a_gated_card_gates_the_repo(tmp_path, capsys):
    from genshift.cli import main

    folder = _gated_suite(tmp_path)
    assert hub.card_gating(LocalSuite.open(folder))
    assert not hub.card_gating(LocalSuite.open(_built_suite(tmp_path / "plain")))
    with FakeHub() as fh:
        assert main(["publish", str(folder), "--repo", "org/lance", "--endpoint", fh.endpoint,
                     "--gating", "manual"]) == 0
        sha = capsys.readouterr().out.strip()
        repo = fh.repos[("dataset", "org/lance")]
        assert len([p for m, p in fh.requests if m == "POST" and "/commit/" in p]) == 1
        assert repo.tags == {"v1.0.0": sha} and repo.gated_mode == "manual"
        from huggingface_hub import HfApi
        assert HfApi(endpoint=fh.endpoint).dataset_info("org/lance").gated == "manual"
        with pytest.raises(SystemExit):  # argparse's usage error
            main(["publish", str(folder), "--repo", "org/x", "--endpoint", fh.endpoint, "--large-threshold", "-1"])
        assert "expected a number >= 0" in capsys.readouterr().err


def test_main_readme_command_offline_points_to_the_offline_route(monkeypatch, capsys):
    from huggingface_hub import constants

    from genshift.cli import main

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # what HF_HUB_OFFLINE=1 sets at import
    monkeypatch.setattr(constants, "is_offline_mode", lambda: True, raising=False)
    code = main(["eval", "--model", "timm/resnet50.a1_in1k", "--suite", "imagenet-star-upstream", "--configs",
                 "base,in_the_snow"])
    err = capsys.readouterr().err
    assert code != 0 and err.count("\n") == 1 and err.startswith("error: bench eval: offline")
    assert 'README.md, "Offline route"' in err
    from genshift.eval.models import resolve_model_revision

    with pytest.raises(OfflineError, match="Offline route"):
        resolve_model_revision("timm/not-cached-anywhere", "main")


@pytest.mark.slow
@pytest.mark.subprocess
def test_hub_model_with_no_network_is_one_line_pointing_to_the_offline_route(tmp_path, toy_suite):
    """No network and no HF_HUB_OFFLINE (a careless user on a plane): the Hub model cannot be resolved.
    The endpoint is a closed loopback port, so the HTTP client raises its own transport error."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"), HF_HUB_ETAG_TIMEOUT="2",
               HF_HUB_DOWNLOAD_TIMEOUT="2")
    p = subprocess.run([sys.executable, "-m", "genshift", "eval", "--model", "timm/resnet50.a1_in1k", "--suite",
                        str(toy_suite), "--out", str(tmp_path / "runs"), "--no-progress"],
                       env=env, capture_output=True, text=True, timeout=300)
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert len(errors) == 1 and "cannot reach the Hub" in errors[0] and 'README.md, "Offline route"' in errors[0]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("result.json"))


def test_the_noise_demo_suite_says_that_0_percent_is_expected(tmp_path, caplog):
    folder = _built_suite(tmp_path)
    assert Manifest.load(folder).generator["images"] == "noise"
    with caplog.at_level("WARNING", logger="genshift.hub"):
        hub.open_suite(str(folder))
    assert "random-noise images: any model scores ~0%" in caplog.text


def test_publish_that_cannot_write_eval_yaml_is_one_line(tmp_path):
    folder = _built_suite(tmp_path)
    (folder / "eval.yaml").mkdir()  # unwritable as a file, whoever runs the test (root included)
    with FakeHub() as fh, pytest.raises(BenchError, match="cannot write .*eval.yaml .*writable copy") as info:
        hub.publish_suite(folder, "org/toy", endpoint=fh.endpoint, token="t")
    assert "\n" not in str(info.value)
    assert ("dataset", "org/toy") not in fh.repos  # refused before the repo was created
    assert not list(folder.glob("eval.yaml.*"))  # no temp file left


@pytest.mark.parametrize("text, ok", [("org/name", True), ("timm/resnet50.a1_in1k", True), ("Org-1/x_y.z", True),
                                      ("name", False), ("a/b/c", False), ("org/na--me", False), ("org/x.git", False),
                                      ("org/-x", False), ("ørg/x", False), ("org/" + "x" * 97, False), (None, False)])
def test_repo_ids_are_the_hubs_own_rule(text, ok):
    assert hub.is_repo_id(text) is ok
