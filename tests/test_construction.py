"""The construction-model flag comes from what the suite recorded at build time (its target); the
registry only for suites that recorded none."""

import json
from types import SimpleNamespace

import pytest

from genshift.cli import main
from genshift.eval.suite_trust import is_construction_model as _is_construction_model
from genshift.eval.suite_trust import open_suite
from genshift.eval.verify import verify_result
from genshift.suites import construction_models, get_suite


@pytest.mark.slow
def test_a_suite_built_with_another_target_flags_that_target(tmp_path, tiny_checkpoint, tiny_folder):
    out = tmp_path / "ing"
    # the registry's in-g-vit target is vit_base_patch16_224.augreg_in1k; the smoke build mines with
    # test_resnet.r160_in1k (random weights) and records it as the suite's target
    assert main(["build", "in-g-vit", "--smoke", "--out", str(out), "--no-progress"]) == 0
    info = open_suite(str(out))
    assert info.construction_models == ("test_resnet.r160_in1k",)
    assert not _is_construction_model("timm/vit_base_patch16_224.augreg_in1k", info.construction_models)
    assert main(["eval", "--model", "test_resnet.r160_in1k", "--checkpoint", str(tiny_checkpoint), "--suite", str(out),
                 "--out", str(tmp_path / "runs"), "--workers", "0", "--no-progress"]) == 0
    path = tmp_path / "runs/in-g-vit" / tiny_folder / "result.json"
    assert json.loads(path.read_text())["flags"]["construction_model"] is True
    rep = verify_result(path, suite=str(out))   # verify recomputes the flag the same way
    assert rep.ok, rep.problems


def test_recorded_local_target_weights_are_matched_by_sha256():
    sha = "ab" * 32
    m = SimpleNamespace(generator={"target": {"id": "resnet50", "source": "checkpoint", "weights_sha256": sha}})
    cm = construction_models(m, get_suite("in-g-rn"))
    assert cm == (f"sha256:{sha}",)
    assert _is_construction_model("resnet50", cm, sha)
    assert not _is_construction_model("resnet50", cm, "cd" * 32)          # another checkpoint of the arch
    assert not _is_construction_model("timm/resnet50.tv_in1k", cm, None)  # the registry's target is not it


def test_released_suites_fall_back_to_the_registry():
    spec = get_suite("in-g-rn")
    assert construction_models(SimpleNamespace(generator={}), spec) == ("resnet50.tv_in1k",)
    assert construction_models(SimpleNamespace(generator={"target": "junk"}), spec) == ("resnet50.tv_in1k",)
    assert _is_construction_model("hf-hub:timm/resnet50.tv_in1k@" + "a" * 40, ("resnet50.tv_in1k",))
    hub_target = SimpleNamespace(generator={"target": {"id": "timm/resnet50.a1_in1k", "source": "hf-hub"}})
    assert construction_models(hub_target, spec) == ("resnet50.a1_in1k",)
