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
    assert tensors_sha256({"w": torch.zeros(2, dtype=torch.float32)}) != tensors_sha256({"w": torch.zeros(1, dtype=torch.float64)})


def test_folder_names_are_one_to_one_and_bounded():
    ids = ["timm/resnet50.a1_in1k", "timm-resnet50.a1_in1k@sha256:0123456789abcdef", "a/b", "a-b@sha256:0123456789abcdef",
           "timm/" + "r" * 91]
    folders = [folder_name(i) for i in ids]
    assert len(set(folders)) == len(ids)
    assert all(len(f) <= 97 and "/" not in f and ":" not in f for f in folders)
    with pytest.raises(BenchError):
        folder_name("../etc")


def test_check_id_accepts_canonical_forms():
    assert check_id("timm/resnet50.a1_in1k") == "timm/resnet50.a1_in1k"
    assert check_id("resnet50@sha256:0123456789abcdef") == "resnet50@sha256:0123456789abcdef"
