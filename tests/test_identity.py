"""genshift.identity: one canonical id per model, weights identified by their tensors."""

import pytest
import torch

from genshift.errors import BenchError
from genshift.identity import canonical_of, check_id, folder_name, identity_of, tensors_sha256

LOOK_ALIKES = ["x", " x", "timm/x ", "TIMM/x", "t\u0456mm/x", "hf-hub:timm/x", "timm/x@v2", "timm/x@" + "0" * 40,
               "timm//x", "timm/x/y", "timm/..x", "timm/a--b", "a" * 97]


@pytest.mark.parametrize("text", LOOK_ALIKES)
def test_look_alike_ids_are_not_canonical(text):
    record = {"id": text, "source": "hf-hub", "architecture": "x", "pretrained_cfg": {"hf_hub_id": "timm/x"}}
    with pytest.raises(BenchError, match="canonical|characters"):
        identity_of(record)


def test_the_canonical_form_is_named_in_the_error():
    record = {"id": "TIMM/x", "source": "hf-hub", "architecture": "x", "pretrained_cfg": {"hf_hub_id": "timm/x"}}
    with pytest.raises(BenchError, match="their canonical id is 'timm/x'"):
        identity_of(record)


def test_local_weights_can_never_carry_a_hub_id():
    sd = {"w": torch.randn(3, 3)}
    record = {"id": "timm/x", "source": "checkpoint", "architecture": "x", "tensors_sha256": tensors_sha256(sd)}
    assert canonical_of(record) == "x@sha256:" + tensors_sha256(sd)[:16]
    with pytest.raises(BenchError, match="x@sha256:"):
        identity_of(record)


def test_resaved_tensors_are_the_same_weights(tmp_path):
    from safetensors.torch import load_file, save_file

    sd = {"a.weight": torch.randn(4, 3), "a.bias": torch.randn(4), "bn.num_batches_tracked": torch.tensor(7)}
    torch.save(sd, tmp_path / "w.pth")
    save_file(sd, tmp_path / "w.safetensors")
    from_pth = torch.load(tmp_path / "w.pth", weights_only=True)
    from_st = load_file(tmp_path / "w.safetensors")
    assert (tmp_path / "w.pth").read_bytes() != (tmp_path / "w.safetensors").read_bytes()
    assert tensors_sha256(from_pth) == tensors_sha256(from_st) == tensors_sha256(sd)
    changed = {**sd, "a.bias": sd["a.bias"].clone()}
    changed["a.bias"][0] += 1e-6
    assert tensors_sha256(changed) != tensors_sha256(sd)
    # dtype and shape are part of the content, not only the bytes
    assert tensors_sha256({"w": torch.zeros(2, 2)}) != tensors_sha256({"w": torch.zeros(4)})
    same_bytes = torch.zeros(2, dtype=torch.float32), torch.zeros(1, dtype=torch.float64)
    assert tensors_sha256({"w": same_bytes[0]}) != tensors_sha256({"w": same_bytes[1]})


def test_folder_names_are_one_to_one_and_bounded():
    ids = ["timm/resnet50.a1_in1k", "timm-resnet50.a1_in1k@sha256:0123456789abcdef", "a/b",
           "a-b@sha256:0123456789abcdef", "timm/" + "r" * 91]
    folders = [folder_name(i) for i in ids]
    assert len(set(folders)) == len(ids)
    assert all(len(f) <= 97 and "/" not in f and ":" not in f for f in folders)
    with pytest.raises(BenchError):
        folder_name("../etc")


def test_check_id_accepts_canonical_forms():
    assert check_id("timm/resnet50.a1_in1k") == "timm/resnet50.a1_in1k"
    assert check_id("resnet50@sha256:0123456789abcdef") == "resnet50@sha256:0123456789abcdef"


def test_the_same_tensors_saved_twice_under_two_names_are_one_model(tmp_path, tiny_checkpoint, tiny_id):
    """The same weights as .safetensors and as .pth, declared under two names: one canonical id (from the
    tensors), never the declared names, which stay claims."""
    from safetensors.torch import load_file

    from genshift.eval.models import load_classifier

    torch.save(load_file(str(tiny_checkpoint)), tmp_path / "copy.pth")
    a = load_classifier("test_resnet.r160_in1k", checkpoint=tiny_checkpoint)
    b = load_classifier("timm/test_resnet.r160_in1k", checkpoint=tmp_path / "copy.pth")
    assert a.weights_sha256 != b.weights_sha256  # two files ...
    assert a.model_id == b.model_id == tiny_id and a.tensors_sha256 == b.tensors_sha256  # ... one model
    assert a.describe()["declared_name"] == "test_resnet.r160_in1k" and a.tag is None
    assert "hf_hub_id" not in a.describe()["pretrained_cfg"]  # local weights link to no Hub repo


def test_weights_are_rerun_only_from_where_the_result_says_they_came_from(tiny_checkpoint, monkeypatch):
    """Mallory's shortcut: local weights are never fetched from a Hub repo, and Hub weights are never taken from a
    --checkpoint the reviewer was handed."""
    import huggingface_hub

    from genshift.eval.verify import _load_recorded_model

    hub = {"id": "timm/test_resnet.r160_in1k", "source": "hf-hub", "weights_revision": "a" * 40}
    with pytest.raises(BenchError, match="never from a --checkpoint"):
        _load_recorded_model(hub, checkpoint=str(tiny_checkpoint), device="cpu", preprocess="timm")
    local = {"id": "test_resnet@sha256:0123456789abcdef", "source": "checkpoint",
             "declared_name": "test_resnet.r160_in1k"}
    with pytest.raises(BenchError, match="pass them with --checkpoint"):
        _load_recorded_model(local, checkpoint=None, device="cpu", preprocess="timm")
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **k: pytest.fail("fetched from the Hub"))
    clf = _load_recorded_model(local, checkpoint=str(tiny_checkpoint), device="cpu", preprocess="timm")
    assert clf.source == "checkpoint" and clf.model_id.startswith("test_resnet@sha256:")


def test_a_repo_config_asking_for_a_giant_model_is_refused_before_anything_is_built(tmp_path, monkeypatch):
    """A model repo whose config.json asks for a ~12 GB ViT next to a 1 KiB weights file: sized on the meta device
    and refused before any real allocation (the parameter bound), as is one that fits the bound but not its
    weights file (one byte per parameter at least)."""
    import json

    import timm
    from huggingface_hub import CommitOperationAdd, HfApi, constants

    from genshift.eval.models import load_classifier
    from tests.fakehub import FakeHub

    real, built = timm.create_model, []

    def only_on_meta(*a, **k):
        built.append(torch.empty(0).device.type)
        if built[-1] != "meta":
            pytest.fail(f"{a[0]} built for real before it was sized")
        return real(*a, **k)
    monkeypatch.setattr(timm, "create_model", only_on_meta)
    with FakeHub() as hub:
        monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
        api = HfApi(endpoint=hub.endpoint)
        for name, width, depth in (("giant", 4096, 64), ("hollow", 1024, 24)):  # ~13e9 and ~0.3e9 parameters
            hub.create("model", f"org/{name}")
            cfg = {"architecture": "vit_base_patch16_224", "num_classes": 1000, "pretrained_cfg": {},
                   "model_args": {"embed_dim": width, "depth": depth, "num_heads": 16}}
            sha = api.create_commit(f"org/{name}", [CommitOperationAdd("config.json", json.dumps(cfg).encode()),
                                                    CommitOperationAdd("model.safetensors", b"\0" * 1024)],
                                    commit_message="weights").oid
            with pytest.raises(BenchError, match="parameters"):
                load_classifier(f"hf-hub:org/{name}@{sha}")
    assert built == ["meta", "meta"]
