"""The upstream ImageNet* adapter on a small synthetic release in the authors' layout."""

import io
import os
import pickle
import zipfile

import numpy as np
import pytest
from PIL import Image

from benchmark import imagenet
from benchmark.errors import BenchError, IntegrityError
from benchmark.reader import LocalSuite
from benchmark.upstream import convert_release, load_masks

PER_CLASS = 4
CLASSES = [0, 1, 7]


def _jpeg(value: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (value, 255 - value, 40)).save(buf, format="JPEG")
    return buf.getvalue()


def _release(root, *, shift="in_the_snow", missing=(), index_folder_for=(), extra=()):
    """<shift>.zip with <shift>/<wnid or index>/NN.jpg; (class, NN) pairs in ``missing`` are left out."""
    root.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(root / f"{shift}.zip", "w") as zf:
        for c in CLASSES:
            folder = str(c) if c in index_folder_for else imagenet.wnids()[c]
            for n in range(PER_CLASS):
                if (c, n) not in missing:
                    zf.writestr(f"{shift}/{folder}/{n:02d}.jpg", _jpeg(10 * c + n))
        for name in extra:
            zf.writestr(name, b"junk")
    return root


def _mask_npy(path, masks: dict):
    np.save(path, np.array(masks, dtype=object), allow_pickle=True)
    return path


def test_convert_indexes_the_mask_by_class_and_number(tmp_path):
    # class 1 image 00 is missing: a positional index would shift every later entry by one
    root = _release(tmp_path / "rel", missing={(1, 0)}, index_folder_for={7})
    mask = np.zeros(PER_CLASS * 1000, dtype=np.uint8)
    keep = {(0, 1), (1, 1), (1, 3), (7, 0)}
    for c, n in keep:
        mask[PER_CLASS * c + n] = 1
    mpath = _mask_npy(tmp_path / "masks.npy", {"in_the_snow": mask})
    m = convert_release(root, tmp_path / "out", shifts=["in_the_snow"], mask=mpath, per_class=PER_CLASS,
                        classes=CLASSES)
    suite = LocalSuite.open(tmp_path / "out")
    suite.verify()
    t = suite.read_columns("in_the_snow", ["image_id", "label", "keep"])
    kept = {(row["label"], int(row["image_id"][-2:])) for row in t.to_pylist() if row["keep"]}
    assert kept == keep
    assert m.configs["in_the_snow"].rows == len(CLASSES) * PER_CLASS - 1
    assert m.generator["files"]["in_the_snow"]["missing"] == 1
    assert m.generator["files"]["in_the_snow"]["missing_examples"] == [f"{imagenet.wnids()[1]}/00"]
    assert "in_the_snow/n01443537/01" in t["image_id"].to_pylist()  # class 1 = goldfish, by wnid
    assert any(r.startswith(f"in_the_snow/{imagenet.wnids()[7]}/") for r in t["image_id"].to_pylist())  # index folder
    # JPEG bytes are not re-encoded
    ds = suite.dataset("in_the_snow")
    raw = ds.with_format("arrow")[0]["image"][0].as_py()["bytes"]
    assert raw == _jpeg(0)


def test_missing_and_unexpected_files_are_reported_and_strict_refuses(tmp_path):
    root = _release(tmp_path / "rel", missing={(0, 2)}, extra=("in_the_snow/n01440764/notes.txt", "in_the_snow/cats/00.jpg"))
    with pytest.raises(IntegrityError, match=r"in_the_snow: 1 missing file\(s\) .*2 unexpected"):
        convert_release(root, tmp_path / "out", shifts=["in_the_snow"], per_class=PER_CLASS, classes=CLASSES,
                        strict=True)
    assert not (tmp_path / "out" / "manifest.json").exists()
    m = convert_release(root, tmp_path / "out2", shifts=["in_the_snow"], per_class=PER_CLASS, classes=CLASSES)
    assert m.generator["files"]["in_the_snow"]["unexpected"] == 2 and m.generator["mask"] is None


@pytest.mark.parametrize("masks, match", [
    ({"in_the_snow": np.zeros(PER_CLASS * 1000 - 1, np.uint8)}, "has 3,999 entries, expected 4,000"),
    ({"in_the_snow": np.full(PER_CLASS * 1000, 2, np.uint8)}, "values other than 0 and 1"),
    ({"in_the_sand": np.zeros(PER_CLASS * 1000, np.uint8)}, "unknown shift key 'in_the_sand'"),
    ({"in_the_snow": np.zeros(PER_CLASS * 1000, np.float32)}, "not a 1-d integer array"),
])
def test_masks_that_do_not_fit(tmp_path, masks, match):
    path = _mask_npy(tmp_path / "m.npy", masks)
    with pytest.raises(IntegrityError, match=match):
        load_masks(path, per_class=PER_CLASS)


def test_alias_and_plain_array_and_npz(tmp_path):
    ok = load_masks(_mask_npy(tmp_path / "a.npy", {"at_dusk_simple": np.ones(PER_CLASS * 1000, np.uint8)}),
                    per_class=PER_CLASS)
    assert list(ok) == ["at_dusk"] and ok["at_dusk"].dtype == bool
    np.save(tmp_path / "plain.npy", np.zeros(10))
    with pytest.raises(IntegrityError, match="expected a pickled dict"):
        load_masks(tmp_path / "plain.npy")
    np.savez(tmp_path / "m.npz", base=np.ones(PER_CLASS * 1000, np.uint8))
    assert load_masks(tmp_path / "m.npz", per_class=PER_CLASS)["base"].all()


def test_mask_loader_refuses_code_execution(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned > " + str(tmp_path / "pwned"),))

    header = {"descr": "|O", "fortran_order": False, "shape": ()}
    with open(tmp_path / "evil.npy", "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)  # writes the magic too
        pickle.dump({"base": Evil()}, f, protocol=2)
    with pytest.raises(IntegrityError, match="refusing to unpickle"):
        load_masks(tmp_path / "evil.npy")
    assert not (tmp_path / "pwned").exists()


def test_unknown_shift_and_absent_zip(tmp_path):
    root = _release(tmp_path / "rel")
    with pytest.raises(BenchError, match="unknown ImageNet\\* shift 'in_the_snwo'"):
        convert_release(root, tmp_path / "o", shifts=["in_the_snwo"], per_class=PER_CLASS, classes=CLASSES)
    with pytest.raises(BenchError, match="neither at_night.zip nor a at_night/ folder"):
        convert_release(root, tmp_path / "o", shifts=["at_night"], per_class=PER_CLASS, classes=CLASSES)


def test_bench_eval_scores_the_upstream_release_from_the_hub(tmp_path, tiny_checkpoint):
    """`bench eval --suite imagenet-star-upstream --mask masks.npy` against a local Hub holding the zips."""
    import json

    from huggingface_hub import HfApi

    from tests.fakehub import FakeHub
    from tests.hubtools import bench_subprocess

    rel = tmp_path / "rel"
    rel.mkdir()
    with zipfile.ZipFile(rel / "in_the_snow.zip", "w") as zf:  # 3 classes x 50 images, real layout
        for c in CLASSES:
            for n in range(50):
                zf.writestr(f"in_the_snow/{imagenet.wnids()[c]}/{n:02d}.jpg", _jpeg(c * 3 + n))
    mask = np.zeros(50_000, np.uint8)
    mask[[50 * 0 + 1, 50 * 1 + 2, 50 * 7 + 49]] = 1
    mpath = _mask_npy(tmp_path / "masks.npy", {"in_the_snow": mask, "base": np.ones(50_000, np.uint8)})
    with FakeHub() as fh:
        api = HfApi(endpoint=fh.endpoint, token="t")
        api.create_repo("madrylab/imagenet-star", repo_type="dataset")
        api.upload_file(path_or_fileobj=str(rel / "in_the_snow.zip"), path_in_repo="in_the_snow.zip",
                        repo_id="madrylab/imagenet-star", repo_type="dataset")
        r = bench_subprocess(["eval", "--model", "test_resnet.r160_in1k", "--checkpoint", str(tiny_checkpoint),
                              "--suite", "imagenet-star-upstream", "--configs", "in_the_snow", "--mask", str(mpath),
                              "--out", str(tmp_path / "runs"), "--workers", "0", "--no-progress", "--json"],
                             env={"HF_ENDPOINT": fh.endpoint, "HF_HOME": str(tmp_path / "hf")}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout)
    assert result["suite"]["id"] == "imagenet-star-upstream" and result["suite"]["repo_id"] == "madrylab/imagenet-star"
    assert len(result["suite"]["revision"]) == 40 and result["flags"]["unpinned_suite"]
    assert result["counts"]["in_the_snow"] == {**result["counts"]["in_the_snow"], "total": 150, "kept": 3}
    assert result["metrics"]["configs"]["in_the_snow"]["n_scored"] == 3
    assert "49,850 missing" in r.stderr or "49850 missing" in r.stderr
