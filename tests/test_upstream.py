"""The upstream ImageNet* adapter on a small synthetic release in the authors' layout."""

import io
import os
import pickle
import zipfile

import numpy as np
import pytest
from PIL import Image

from genshift import imagenet
from genshift.errors import BenchError, IntegrityError
from genshift.fsutil import sha256_file
from genshift.suite_format import LocalSuite
from genshift.suites import imagenet_star_shifts
from genshift.upstream import convert_release, load_masks

PER_CLASS = 4
CLASSES = [0, 1, 7]


def _jpeg(value: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (value, 255 - value, 40)).save(buf, format="JPEG")
    return buf.getvalue()


def _release(root, *, shift="in_the_snow", missing=(), index_folder_for=(), extra=(), per_class=PER_CLASS, step=10):
    """<shift>.zip with <shift>/<wnid or index>/NN.jpg (image ``step * class + NN``); (class, NN) pairs in
    ``missing`` are left out. ``per_class=50`` is the release's real layout."""
    root.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(root / f"{shift}.zip", "w") as zf:
        for c in CLASSES:
            folder = str(c) if c in index_folder_for else imagenet.wnids()[c]
            for n in range(per_class):
                if (c, n) not in missing:
                    zf.writestr(f"{shift}/{folder}/{n:02d}.jpg", _jpeg(step * c + n))
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
    root = _release(tmp_path / "rel", missing={(0, 2)},
                    extra=("in_the_snow/n01440764/notes.txt", "in_the_snow/cats/00.jpg"))
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


@pytest.mark.slow
@pytest.mark.subprocess
def test_bench_eval_scores_the_upstream_release_from_the_hub(tmp_path, tiny_checkpoint, tiny_folder):
    """`bench eval --suite imagenet-star-upstream --mask masks.npy` against a local Hub holding the zips."""
    import json

    from huggingface_hub import HfApi

    from tests.fakehub import FakeHub
    from tests.hubtools import bench_subprocess

    rel = _release(tmp_path / "rel", per_class=50, step=3)  # 3 classes x 50 images, the real layout
    mask = np.zeros(50_000, np.uint8)
    mask[[50 * 0 + 1, 50 * 1 + 2, 50 * 7 + 49]] = 1
    mpath = _mask_npy(tmp_path / "masks.npy", {"in_the_snow": mask, "base": np.ones(50_000, np.uint8)})
    with FakeHub() as fh:
        api = HfApi(endpoint=fh.endpoint, token="t")
        api.create_repo("madrylab/imagenet-star", repo_type="dataset")
        sha = api.upload_file(path_or_fileobj=str(rel / "in_the_snow.zip"), path_in_repo="in_the_snow.zip",
                              repo_id="madrylab/imagenet-star", repo_type="dataset").oid
        env = {"HF_ENDPOINT": fh.endpoint, "HF_HOME": str(tmp_path / "hf")}
        # main is not the paper-era commit c9af165: only an explicit --revision scores it
        r = bench_subprocess(["eval", "--model", "test_resnet.r160_in1k", "--checkpoint", str(tiny_checkpoint),
                              "--suite", "imagenet-star-upstream", "--configs", "in_the_snow", "--mask", str(mpath),
                              "--revision", sha,
                              "--out", str(tmp_path / "runs"), "--workers", "0", "--no-progress", "--json"],
                             env=env, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        # the result records the mask, so --recheck reopens the same filtered suite without being told
        run_dir = tmp_path / "runs/imagenet-star-upstream" / tiny_folder
        recheck = ["verify", str(run_dir), "--recheck", "3", "--checkpoint", str(tiny_checkpoint)]
        v = bench_subprocess(recheck, env=env, cwd=tmp_path)
        assert v.returncode == 0 and "OK:" in v.stdout, v.stdout + v.stderr[-2000:]
        moved = mpath.rename(tmp_path / "elsewhere.npy")
        v = bench_subprocess(recheck, env=env, cwd=tmp_path)
        assert v.returncode != 0 and "pass the same file with --mask" in v.stderr, v.stderr[-2000:]
        v = bench_subprocess([*recheck, "--mask", str(moved)], env=env, cwd=tmp_path)
        assert v.returncode == 0, v.stdout + v.stderr[-2000:]
    result = json.loads(r.stdout)
    assert result["suite"]["mask"] == {"path": str(mpath), "sha256": sha256_file(moved), "source": "file"}
    assert result["suite"]["id"] == "imagenet-star-upstream" and result["suite"]["repo_id"] == "madrylab/imagenet-star"
    assert result["suite"]["revision"] == sha and not result["flags"]["unpinned_suite"]  # --revision pins it
    assert result["counts"]["in_the_snow"] == {**result["counts"]["in_the_snow"], "total": 150, "kept": 3}
    assert result["metrics"]["configs"]["in_the_snow"]["n_scored"] == 3
    assert "49,850 missing" in r.stderr or "49850 missing" in r.stderr


def _extracted(root, *, shift="in_the_snow", missing=()):
    """The same release, unzipped: <root>/<shift>/<wnid>/NN.jpg."""
    for c in CLASSES:
        for n in range(PER_CLASS):
            if (c, n) not in missing:
                p = root / shift / imagenet.wnids()[c] / f"{n:02d}.jpg"
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(_jpeg(10 * c + n))
    return root


def test_extracted_folders_convert_like_the_zip(tmp_path):
    zipped = convert_release(_release(tmp_path / "z"), tmp_path / "oz", shifts=["in_the_snow"], per_class=PER_CLASS,
                             classes=CLASSES)
    unzipped = convert_release(_extracted(tmp_path / "x"), tmp_path / "ox", shifts=["in_the_snow"],
                               per_class=PER_CLASS, classes=CLASSES)
    # same rows, same bytes: only the provenance column (zip member vs file name) differs
    a = LocalSuite.open(tmp_path / "oz")
    b = LocalSuite.open(tmp_path / "ox")
    a.verify()
    b.verify()
    cols = ["image_id", "label", "keep"]
    assert a.read_columns("in_the_snow", cols).to_pylist() == b.read_columns("in_the_snow", cols).to_pylist()
    assert zipped.configs["in_the_snow"].rows == unzipped.configs["in_the_snow"].rows == len(CLASSES) * PER_CLASS
    assert unzipped.generator["zips_sha256"] == {} and len(zipped.generator["zips_sha256"]["in_the_snow"]) == 64


def test_open_release_converts_once_per_content_and_mask(tmp_path, monkeypatch):
    from genshift import hub, upstream

    root = _release(tmp_path / "rel", missing={(7, 3)})
    assert upstream.is_release_folder(root) and not upstream.is_release_folder(tmp_path)
    calls = []
    real = upstream.convert_release
    monkeypatch.setattr(upstream, "convert_release", lambda *a, **k: calls.append(1) or real(*a, **k))
    kw = {"cache_dir": str(tmp_path / "cache"), "per_class": PER_CLASS, "classes": CLASSES}
    first = upstream.open_release(root, mask=upstream.NO_MASK, **kw)
    again = upstream.open_release(root, mask=upstream.NO_MASK, **kw)
    assert len(calls) == 1 and first.root == again.root and first.configs == ["in_the_snow"]
    assert first.manifest.generator["mask"] is None and first.manifest.configs["in_the_snow"].kept == 11
    mask = np.zeros(PER_CLASS * 1000, np.uint8)
    mask[PER_CLASS * 7 + 2] = 1
    masked = upstream.open_release(root, mask=_mask_npy(tmp_path / "m.npy", {"in_the_snow": mask}), **kw)
    assert len(calls) == 2 and masked.root != first.root and masked.manifest.configs["in_the_snow"].kept == 1
    # a cached conversion of a short release still refuses --strict
    with pytest.raises(IntegrityError, match=r"in_the_snow: 1 missing file\(s\), 0 unexpected \(--strict\)"):
        upstream.open_release(root, strict=True, mask=upstream.NO_MASK, **kw)
    # the zip changed -> its sha256 changed -> a new conversion
    _release(root)
    assert upstream.open_release(root, mask=upstream.NO_MASK, **kw).manifest.configs["in_the_snow"].rows == \
        len(CLASSES) * PER_CLASS
    assert len(calls) == 3
    # the single entry point recognises a release folder (and routes it to the adapter)
    with pytest.raises(BenchError, match="neither at_night.zip nor a at_night/ folder"):
        hub.open_suite(str(root), configs=["at_night"], cache_dir=str(tmp_path / "cache"), mask=upstream.NO_MASK)


def test_real_shaped_mask_file(tmp_path):
    shifts = [s.key for s in imagenet_star_shifts()]
    good = {("at_dusk_simple" if k == "at_dusk" else k): np.ones(50_000, np.uint8) for k in shifts}
    masks = load_masks(_mask_npy(tmp_path / "masks.npy", good))
    assert sorted(masks) == sorted(shifts) and all(m.shape == (50_000,) for m in masks.values())
    short = dict(good, in_the_snow=np.ones(49_999, np.uint8))
    with pytest.raises(IntegrityError) as info:
        load_masks(_mask_npy(tmp_path / "masks.npy", short))
    assert str(info.value) == ("masks.npy: key 'in_the_snow' has 49,999 entries, expected 50,000 (50 per class x "
                               "1000 classes)")
    both = dict(good, at_dusk=np.ones(50_000, np.uint8))
    with pytest.raises(IntegrityError, match="shift 'at_dusk' appears twice"):
        load_masks(_mask_npy(tmp_path / "masks.npy", both))
    not_a_dict = np.empty((), dtype=object)
    not_a_dict[()] = [1, 2]
    np.save(tmp_path / "masks.npy", not_a_dict, allow_pickle=True)
    with pytest.raises(IntegrityError, match="expected a dict of shift -> 0/1 array, got list"):
        load_masks(tmp_path / "masks.npy")


def test_open_suite_downloads_and_converts_the_upstream_release(tmp_path):
    """The registry id `imagenet-star-upstream` against a local Hub holding one shift's zip."""
    from huggingface_hub import HfApi

    from genshift import hub
    from tests.fakehub import FakeHub

    rel = _release(tmp_path / "rel", per_class=50, step=3, index_folder_for={7})  # class 7 named by its index
    mask = np.zeros(50_000, np.uint8)
    mask[[50 * 0 + 1, 50 * 1 + 2, 50 * 7 + 49]] = 1
    mpath = _mask_npy(tmp_path / "masks.npy", {"in_the_snow": mask})
    with FakeHub() as fh:
        api = HfApi(endpoint=fh.endpoint, token="t")
        api.create_repo("madrylab/imagenet-star", repo_type="dataset")
        sha = api.upload_file(path_or_fileobj=str(rel / "in_the_snow.zip"), path_in_repo="in_the_snow.zip",
                              repo_id="madrylab/imagenet-star", repo_type="dataset").oid
        suite = hub.open_suite("imagenet-star-upstream", configs=["in_the_snow"], mask=str(mpath), revision=sha,
                               endpoint=fh.endpoint, cache_dir=str(tmp_path / "cache"))
    assert suite.revision == sha and suite.repo_id == "madrylab/imagenet-star" and suite.pinned
    t = suite.read_columns("in_the_snow", ["image_id", "keep"])
    assert sorted(i for i, k in zip(t["image_id"].to_pylist(), t["keep"].to_pylist()) if k) == [
        "in_the_snow/n01440764/01", "in_the_snow/n01443537/02", f"in_the_snow/{imagenet.wnids()[7]}/49"]
    files = suite.manifest.generator["files"]["in_the_snow"]
    assert files["found"] == 150 and files["missing"] == 49_850 and files["unexpected"] == 0
    assert suite.manifest.generator["source"] == {"repo_id": "madrylab/imagenet-star", "revision": sha}



def test_open_suite_on_a_local_copy_of_the_release(tmp_path):
    """What `bench eval --suite <folder of zips> --mask masks.npy` opens: no Hub involved."""
    from genshift import hub

    rel = _release(tmp_path / "imagenet-star-zips", shift="base", per_class=50, step=3)
    mask = np.zeros(50_000, np.uint8)
    mask[[50 * 0 + 3, 50 * 7 + 0]] = 1
    suite = hub.open_suite(str(rel), mask=str(_mask_npy(tmp_path / "masks.npy", {"base": mask})),
                           cache_dir=str(tmp_path / "cache"))
    assert suite.suite_id == "imagenet-star-upstream" and suite.configs == ["base"]
    assert suite.repo_id is None and suite.pinned and suite.root.is_relative_to(tmp_path / "cache" / "upstream")
    assert suite.manifest.configs["base"].rows == 150 and suite.manifest.configs["base"].kept == 2
    assert suite.manifest.generator["source"] == {"folder": "imagenet-star-zips"}


# -- the released mask and the pinned data repo -----------------------------------------------------


def _plant_released_mask(monkeypatch, path, masks: dict):
    """A mask file standing in for the authors' masks.npy: the pins are pointed at its size and sha256."""
    from genshift import upstream

    _mask_npy(path, masks)
    monkeypatch.setattr(upstream, "MASK_SHA256", sha256_file(path))
    monkeypatch.setattr(upstream, "MASK_SIZE", path.stat().st_size)
    return path


def test_released_mask_is_downloaded_checked_cached_and_refused_when_wrong(tmp_path, monkeypatch):
    import http.server
    import threading
    from functools import partial

    from genshift import hubio, upstream
    from genshift.errors import OfflineError

    served = tmp_path / "www"
    served.mkdir()
    _plant_released_mask(monkeypatch, served / "masks.npy", {"base": np.ones(50_000, np.uint8)})
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/masks.npy"
    monkeypatch.setattr(upstream, "MASK_URL", url)
    cache = str(tmp_path / "cache")
    dest = upstream.released_mask_path(cache)
    assert dest == tmp_path / "cache" / "masks" / upstream.MASK_COMMIT / "masks.npy"
    try:
        # offline: one error naming the URL, the sha256 and exactly where to put the file; nothing fetched
        monkeypatch.setattr(hubio, "_offline", lambda: True)
        with pytest.raises(OfflineError) as info:
            upstream.released_mask(cache_dir=cache)
        assert f"put it at {dest}" in str(info.value) and url in str(info.value) and "--no-mask" in str(info.value)
        assert not dest.exists()
        monkeypatch.setattr(hubio, "_offline", lambda: False)
        # online: downloaded once, checked, cached
        assert upstream.released_mask(cache_dir=cache) == dest
        assert sha256_file(dest) == upstream.MASK_SHA256
        assert [p.name for p in dest.parent.iterdir()] == ["masks.npy"]  # no temporary left behind
        (served / "masks.npy").write_bytes(b"a different file")  # the server no longer has it: the cache is used
        assert upstream.released_mask(cache_dir=cache) == dest
        # a swapped cache file is refused, never applied
        dest.write_bytes(b"x" * upstream.MASK_SIZE)
        with pytest.raises(IntegrityError, match=r"the cached .*masks.npy is not the released file"):
            upstream.released_mask(cache_dir=cache)
        # a download with other bytes is refused and leaves nothing at the cache path
        dest.unlink()
        with pytest.raises(IntegrityError, match="is not the released file \\(16 bytes; expected"):
            upstream.released_mask(cache_dir=cache)
        assert not dest.exists() and not list(dest.parent.iterdir())
    finally:
        server.shutdown()
        server.server_close()
    # unreachable: the same instructions
    with pytest.raises(OfflineError, match=f"could not download the authors' masks.npy .*put it at {dest}"):
        upstream.released_mask(cache_dir=cache)


def test_upstream_is_scored_as_the_paper_did_by_default(tmp_path, monkeypatch):
    """The registry id applies the released mask by default, pins the data repo, and records the mask."""
    from huggingface_hub import HfApi

    from genshift import hub, upstream
    from tests.fakehub import FakeHub

    rel = _release(tmp_path / "rel", per_class=50, step=3)
    mask = np.zeros(50_000, np.uint8)
    mask[[50 * 0 + 5, 50 * 7 + 6]] = 1
    cache = str(tmp_path / "cache")
    released = upstream.released_mask_path(cache)
    released.parent.mkdir(parents=True)
    _plant_released_mask(monkeypatch, released, {"in_the_snow": mask, "base": np.ones(50_000, np.uint8)})
    kw = {"configs": ["in_the_snow"], "endpoint": None, "cache_dir": cache}
    with FakeHub() as fh:
        kw["endpoint"] = fh.endpoint
        api = HfApi(endpoint=fh.endpoint, token="t")
        api.create_repo("madrylab/imagenet-star", repo_type="dataset")
        sha = api.upload_file(path_or_fileobj=str(rel / "in_the_snow.zip"), path_in_repo="in_the_snow.zip",
                              repo_id="madrylab/imagenet-star", repo_type="dataset").oid
        with pytest.raises(IntegrityError) as info:  # main moved away from the paper's commit
            hub.open_suite("imagenet-star-upstream", **kw)
        assert str(info.value) == (f"madrylab/imagenet-star main is now {sha[:12]}…, not the commit c9af165… the "
                                   f"paper's release was scored at; pass --revision {sha} to score this revision "
                                   "anyway (recorded in the result)")
        monkeypatch.setattr(upstream, "DATA_REVISION_PREFIX", sha[:7])  # as if main were still that commit
        suite = hub.open_suite("imagenet-star-upstream", **kw)
        assert suite.pinned and suite.revision == sha  # main, checked to be the release commit
        unfiltered = hub.open_suite("imagenet-star-upstream", mask=upstream.NO_MASK, revision=sha, **kw)
    t = suite.read_columns("in_the_snow", ["image_id", "keep"])
    assert sorted(i for i, k in zip(t["image_id"].to_pylist(), t["keep"].to_pylist()) if k) == [
        "in_the_snow/n01440764/05", f"in_the_snow/{imagenet.wnids()[7]}/06"]
    assert suite.manifest.generator["mask"]["sha256"] == upstream.MASK_SHA256
    assert upstream.mask_record(None, suite.manifest.generator, cache_dir=cache) == {
        "path": str(released), "sha256": upstream.MASK_SHA256, "source": "released"}
    assert unfiltered.manifest.configs["in_the_snow"].kept == 150 and unfiltered.root != suite.root
    assert upstream.mask_record(upstream.NO_MASK, unfiltered.manifest.generator) == {
        "path": None, "sha256": None, "source": "none"}
    assert upstream.mask_record(None, {"builder": "genshift.builders.imagenet_star"}) is None  # not a converted release
