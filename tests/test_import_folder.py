"""bench import-folder: happy path and every bad input (one line, non-zero exit, nothing left)."""

import io

import pytest
from PIL import Image

from benchmark.cli import main
from benchmark.reader import LocalSuite


def _img(path, color=(10, 20, 30), fmt="JPEG"):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (24, 24), color).save(path, format=fmt)


@pytest.fixture
def folder(tmp_path):
    src = tmp_path / "src"
    for i in range(3):
        _img(src / "n01440764" / f"tench_{i}.jpg", (i, 2, 3))
        _img(src / "n02123045" / f"cat_{i}.png", (3, i, 2), fmt="PNG")
    return src


def run(argv, capsys):
    code = main(argv)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_import_happy_path(tmp_path, folder, capsys):
    out = tmp_path / "suite"
    code, stdout, _ = run(["import-folder", str(folder), "--name", "mine", "--config", "night", "--out", str(out),
                           "--shard-size", "4", "--no-progress"], capsys)
    assert code == 0 and "6 images in 2 shard(s)" in stdout
    suite = LocalSuite.open(out)
    suite.verify()
    assert suite.suite_id == "mine" and suite.configs == ["night"]
    ds = suite.dataset("night")
    assert sorted(ds["image_id"]) == sorted([f"night/n01440764/tench_{i}" for i in range(3)] +
                                            [f"night/n02123045/cat_{i}" for i in range(3)])
    assert set(ds["label"]) == {0, 281} and all(ds["keep"])
    row = ds.with_format("arrow")[0]
    assert row["image"][0].as_py()["bytes"] == (folder / row["source_path"][0].as_py()).read_bytes()
    assert not (out / "build.json").exists() and (out / "README.md").is_file()
    assert not list(tmp_path.glob(".*incomplete"))


def test_import_from_csv(tmp_path, capsys):
    src = tmp_path / "flat"
    _img(src / "a.jpg")
    _img(src / "b.jpg", (200, 0, 0))
    (tmp_path / "labels.csv").write_text("path,label\na.jpg,n01440764\nb.jpg,967\n")
    code, _, err = run(["import-folder", str(src), "--csv", str(tmp_path / "labels.csv"), "--name", "x", "--out",
                        str(tmp_path / "s"), "--no-progress"], capsys)
    assert code == 0, err
    assert sorted(LocalSuite.open(tmp_path / "s").dataset("default")["label"]) == [0, 967]


def _bad_cases(tmp_path, folder):
    cats = tmp_path / "cats"
    _img(cats / "cats" / "x.jpg")
    _img(cats / "dogs" / "y.jpg")
    broken = tmp_path / "broken"
    _img(broken / "n01440764" / "ok.jpg")
    (broken / "n01440764" / "notes.txt").write_text("not an image")
    dup = tmp_path / "dup"
    _img(dup / "n01440764" / "a.jpg")
    _img(dup / "n01440764" / "a.png", fmt="PNG")
    empty = tmp_path / "empty"
    empty.mkdir()
    return [
        (cats, [], "sub-folders of .* must be ImageNet-1k wnids .* found 'cats', 'dogs'"),
        (broken, [], "notes.txt is not a readable image .* --skip-bad-images"),
        (dup, [], "duplicate image id 'default/n01440764/a'"),
        (empty, [], "no images found"),
        (tmp_path / "nope", [], "does not exist or is not a folder"),
    ]


def test_bad_inputs(tmp_path, folder, capsys):
    for src, extra, match in _bad_cases(tmp_path, folder):
        out = tmp_path / f"out-{src.name}"
        code, _, err = run(["import-folder", str(src), "--name", "x", "--out", str(out), "--no-progress", *extra], capsys)
        assert code != 0 and err.startswith("error: ") and err.count("\n") == 1, (src, err)
        import re
        assert re.search(match, err), (match, err)
        assert not out.exists()
        assert not list(tmp_path.glob(".*incomplete"))


def test_skip_bad_images_counts_them(tmp_path, capsys):
    broken = tmp_path / "broken"
    _img(broken / "n01440764" / "ok.jpg")
    (broken / "n01440764" / "bad.jpg").write_bytes(b"\xff\xd8 nope")
    code, _, err = run(["import-folder", str(broken), "--name", "x", "--out", str(tmp_path / "s"),
                        "--skip-bad-images", "--no-progress"], capsys)
    assert code == 0, err
    m = LocalSuite.open(tmp_path / "s").manifest
    assert m.configs["default"].rows == 1 and m.generator["n_skipped_bad_images"] == 1


def test_existing_or_unwritable_output(tmp_path, folder, capsys):
    out = tmp_path / "suite"
    assert run(["import-folder", str(folder), "--name", "x", "--out", str(out), "--no-progress"], capsys)[0] == 0
    code, _, err = run(["import-folder", str(folder), "--name", "x", "--out", str(out), "--no-progress"], capsys)
    assert code != 0 and "already exists; pass --overwrite" in err
    assert run(["import-folder", str(folder), "--name", "y", "--out", str(out), "--overwrite", "--no-progress"],
               capsys)[0] == 0
    assert LocalSuite.open(out).suite_id == "y"
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep.txt").write_text("mine")
    code, _, err = run(["import-folder", str(folder), "--name", "x", "--out", str(precious), "--overwrite",
                        "--no-progress"], capsys)
    assert code != 0 and "was not written by bench" in err and (precious / "keep.txt").exists()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = run(["import-folder", str(folder), "--name", "x", "--out", str(blocker / "sub"), "--no-progress"],
                       capsys)
    assert code != 0 and "not writable" in err


def test_many_images_stream_with_bounded_memory(tmp_path, capsys):
    """10,000 small images: a real folder of that size goes through without holding it in memory."""
    import resource
    src = tmp_path / "big"
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(buf, format="JPEG")
    data = buf.getvalue()
    for c in ("n01440764", "n01443537"):
        (src / c).mkdir(parents=True)
        for i in range(5000):
            (src / c / f"{i:05d}.jpg").write_bytes(data)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code, stdout, err = run(["import-folder", str(src), "--name", "big", "--out", str(tmp_path / "s"), "--no-progress"],
                            capsys)
    assert code == 0, err
    assert "10000 images in 10 shard(s)" in stdout
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 300


def test_failed_overwrite_keeps_the_previous_suite(tmp_path, folder, capsys):
    out = tmp_path / "suite"
    assert run(["import-folder", str(folder), "--name", "old", "--out", str(out), "--no-progress"], capsys)[0] == 0
    before = (out / "manifest.json").read_bytes()
    (folder / "n01440764" / "broken.jpg").write_bytes(b"\xff\xd8 truncated")
    code, _, err = run(["import-folder", str(folder), "--name", "new", "--out", str(out), "--overwrite",
                        "--no-progress"], capsys)
    assert code != 0 and "broken.jpg is not a readable image" in err
    assert (out / "manifest.json").read_bytes() == before and LocalSuite.open(out).suite_id == "old"
    assert not list(tmp_path.glob(".*incomplete"))


def test_top_level_files_next_to_class_folders_are_named(tmp_path, folder, capsys, caplog):
    (folder / "README.txt").write_text("notes")
    code, _, err = run(["import-folder", str(folder), "--name", "x", "--out", str(tmp_path / "s"), "--no-progress"],
                       capsys)
    assert code == 0, err
    assert "ignoring 1 file(s) at the top" in caplog.text and "README.txt" in caplog.text
    assert LocalSuite.open(tmp_path / "s").manifest.configs["default"].rows == 6
