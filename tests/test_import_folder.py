"""bench import-folder: happy path and every bad input (one line, non-zero exit, nothing left);
real photos (skimage.data) in every image mode, multi-shift folders scored by bench eval."""

import io
import json
import os
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from genshift.cli import main
from genshift.suite_format import LocalSuite


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
                           "--shard-size", "4", "--workers", "2", "--no-progress"], capsys)
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
        code, _, err = run(["import-folder", str(src), "--name", "x", "--out", str(out), "--no-progress", *extra],
                           capsys)
        assert code != 0 and err.startswith("error: ") and err.count("\n") == 1, (src, err)
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


@pytest.mark.slow
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


# -- images: full decode, modes, orientation (real photos from skimage.data) ----------------------




def _photo(name="astronaut", size=None):
    """A real photo from skimage.data as an 8-bit array (optionally resized)."""
    import skimage.data

    a = getattr(skimage.data, name)()
    if size is not None:
        a = np.asarray(Image.fromarray(a).resize(size, Image.BILINEAR))
    return a


def _png16_rgb(a8: np.ndarray) -> bytes:
    """A 16-bit-per-channel RGB PNG (Pillow cannot write one), values v * 257 as image tools scale."""
    h, w, _ = a8.shape
    a16 = a8.astype(">u2") * 257
    raw = b"".join(b"\x00" + a16[y].tobytes() for y in range(h))

    def chunk(t, x):
        return struct.pack(">I", len(x)) + t + x + struct.pack(">I", zlib.crc32(t + x))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def _stored(out, config="default"):
    """image_id -> (row, pixels decoded exactly as bench eval decodes them)."""
    ds = LocalSuite.open(out).dataset(config).with_format("arrow")
    t = ds[:]
    rows = {}
    for i, iid in enumerate(t["image_id"].to_pylist()):
        row = {c: t[c][i].as_py() for c in t.column_names}
        with Image.open(io.BytesIO(row["image"]["bytes"])) as im:  # eval/inference.py's decode
            rows[iid] = (row, np.asarray(im.convert("RGB")).astype(int))
    return rows


def _import(tmp_path, src, capsys, *extra, out="s"):
    code, stdout, err = run(["import-folder", str(src), "--name", "x", "--out", str(tmp_path / out), "--no-progress",
                             *extra], capsys)
    assert code == 0, err
    return tmp_path / out


def test_16_bit_images_are_scaled_not_clipped(tmp_path, capsys):
    """A real photo saved with 16 bits per channel imports to its 8-bit pixels within 1 level
    (it was scored as an all-white image when the raw 16-bit PNG reached eval's convert('RGB'))."""
    import tifffile

    cam, ast = _photo("camera", (128, 128)), _photo("astronaut", (128, 128))
    d = tmp_path / "src" / "n04266014"
    d.mkdir(parents=True)
    Image.fromarray(cam.astype(np.uint16) * 257).save(d / "gray16.png")      # Pillow: I;16
    tifffile.imwrite(d / "gray16be.tif", (cam.astype(np.uint16) * 257).astype(">u2"))  # I;16B
    Image.fromarray(cam.astype(np.int32) * 257, "I").save(d / "gray32.tif")   # I
    (d / "rgb16.png").write_bytes(_png16_rgb(ast))
    assert Image.open(d / "gray16.png").mode == "I;16" and Image.open(d / "gray16be.tif").mode == "I;16B"
    out = _import(tmp_path, tmp_path / "src", capsys)
    rows = _stored(out)
    for stem, want, mode in (("gray16", cam, "I;16"), ("gray16be", cam, "I;16B"), ("gray32", cam, "I"),
                             ("rgb16", ast, "RGB")):
        row, px = rows[f"default/n04266014/{stem}"]
        want = np.repeat(want[..., None], 3, axis=2) if want.ndim == 2 else want
        assert row["source_mode"] == mode and row["reencoded"]
        assert np.abs(px - want).max() <= 1, stem
        assert px.mean() < 200  # not the all-white image of a clipped conversion


def test_palette_alpha_cmyk_la_and_1_bit_are_converted(tmp_path, capsys):
    cat = _photo("chelsea", (96, 64))
    alpha = np.tile(np.linspace(0, 255, 96).astype(np.uint8), (64, 1))
    d = tmp_path / "src" / "n02123045"
    d.mkdir(parents=True)
    Image.fromarray(np.dstack([cat, alpha]), "RGBA").save(d / "rgba.png")
    gray = np.asarray(Image.fromarray(cat).convert("L"))
    Image.fromarray(np.dstack([gray, alpha]), "LA").save(d / "la.png")
    Image.fromarray(cat).convert("CMYK").save(d / "cmyk.jpg", quality=95)
    Image.fromarray(cat).convert("1").save(d / "bits.png")
    pal = Image.fromarray(cat).convert("P", palette=Image.ADAPTIVE, colors=32)
    pal.save(d / "pal.png")
    pal.save(d / "palt.gif", transparency=0)
    out = _import(tmp_path, tmp_path / "src", capsys)
    rows = _stored(out)
    px = {iid.rsplit("/", 1)[1]: p for iid, (_, p) in rows.items()}
    a = alpha[..., None] / 255.0
    on_white = cat * a + 255 * (1 - a)  # composite on white, by hand
    assert np.abs(px["rgba"] - on_white).max() <= 1
    assert np.abs(px["la"][..., 0] - (gray * a[..., 0] + 255 * (1 - a[..., 0]))).max() <= 1
    assert (px["la"][..., 0] == px["la"][..., 2]).all()
    assert np.abs(px["cmyk"] - cat).mean() < 4  # the JPEG (lossy) one
    bits = np.asarray(Image.open(d / "bits.png").convert("L"))
    assert set(np.unique(px["bits"])) <= {0, 255} and (px["bits"][..., 0] == bits).all()
    assert (px["pal"] == np.asarray(pal.convert("RGB"))).all()
    palt = np.asarray(Image.open(d / "palt.gif").convert("RGBA"))
    assert (px["palt"][palt[..., 3] == 0] == 255).all()  # the transparent index shows as white
    assert (px["palt"][palt[..., 3] == 255] == palt[palt[..., 3] == 255][:, :3]).all()
    modes = {iid.rsplit("/", 1)[1]: (r["source_format"], r["source_mode"]) for iid, (r, _) in rows.items()}
    assert modes["cmyk"] == ("JPEG", "CMYK") and modes["la"] == ("PNG", "LA") and modes["bits"] == ("PNG", "1")


def test_cmyk_tiff_is_converted(tmp_path, capsys):
    cat = _photo("chelsea", (48, 32))
    d = tmp_path / "src" / "n02123045"
    d.mkdir(parents=True)
    Image.fromarray(cat).convert("CMYK").save(d / "cmyk.tif")
    (_, px), = _stored(_import(tmp_path, tmp_path / "src", capsys)).values()
    assert np.abs(px - cat).max() <= 1


def test_exif_orientation_is_applied_and_recorded(tmp_path, capsys):
    cat = _photo("chelsea", (90, 60))
    d = tmp_path / "src" / "n02123045"
    d.mkdir(parents=True)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    Image.fromarray(cat).save(d / "rotated.jpg", exif=exif, quality=95)
    Image.fromarray(cat).save(d / "plain.jpg", quality=95)
    rows = _stored(_import(tmp_path, tmp_path / "src", capsys))
    rot_row, rot = rows["default/n02123045/rotated"]
    plain_row, plain = rows["default/n02123045/plain"]
    assert rot.shape == (90, 60, 3) and plain.shape == (60, 90, 3)
    from PIL import ImageOps
    assert (rot == np.asarray(ImageOps.exif_transpose(Image.open(d / "rotated.jpg")).convert("RGB"))).all()
    assert rot_row["exif_orientation"] == 6 and rot_row["reencoded"]
    # a plain JPEG is stored byte for byte: no second lossy encoding
    assert plain_row["exif_orientation"] == 1 and not plain_row["reencoded"]
    assert plain_row["image"]["bytes"] == (d / "plain.jpg").read_bytes()


def test_truncated_jpeg_is_refused_or_skipped(tmp_path, capsys):
    """A real photo cut short: its header verifies, only a full decode finds it."""
    d = tmp_path / "src" / "n02123045"
    d.mkdir(parents=True)
    Image.fromarray(_photo("chelsea")).save(d / "ok.jpg")
    buf = io.BytesIO()
    Image.fromarray(_photo("astronaut")).save(buf, format="JPEG")
    (d / "cut.jpg").write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    Image.open(d / "cut.jpg").verify()  # passes the header check the importer used to rely on
    code, _, err = run(["import-folder", str(tmp_path / "src"), "--name", "x", "--out", str(tmp_path / "s"),
                        "--no-progress"], capsys)
    assert code != 0 and err.count("\n") == 1 and "cut.jpg is not a readable image" in err and "truncated" in err
    assert not (tmp_path / "s").exists() and not list(tmp_path.glob(".*incomplete"))
    out = _import(tmp_path, tmp_path / "src", capsys, "--skip-bad-images")
    m = LocalSuite.open(out).manifest
    assert m.configs["default"].rows == 1 and m.generator["skipped_bad_images"] == ["n02123045/cut.jpg"]


# -- tables and file names ------------------------------------------------------------------------

def test_csv_with_excel_bom_and_a_latin1_csv(tmp_path, capsys):
    src = tmp_path / "flat"
    _img(src / "café.jpg")
    _img(src / "b.jpg", (200, 0, 0))
    (tmp_path / "excel.csv").write_bytes("\ufeffpath,label\r\ncafé.jpg,n01440764\r\nb.jpg,967\r\n".encode())
    out = _import(tmp_path, src, capsys, "--csv", str(tmp_path / "excel.csv"))
    ds = LocalSuite.open(out).dataset("default")
    assert sorted(zip(ds["image_id"], ds["label"])) == [("default/n01440764/café", 0), ("default/n07920052/b", 967)]
    (tmp_path / "latin.csv").write_bytes("path,label\ncafé.jpg,n01440764\n".encode("latin-1"))
    code, _, err = run(["import-folder", str(src), "--csv", str(tmp_path / "latin.csv"), "--name", "x", "--out",
                        str(tmp_path / "s2"), "--no-progress"], capsys)
    assert code != 0 and err.count("\n") == 1
    assert "latin.csv' is not UTF-8 text (byte 0xe9 on line 2)" in err and "iconv -f latin1 -t utf-8" in err
    assert not (tmp_path / "s2").exists()


def test_non_utf8_file_names(tmp_path, capsys):
    """Linux file names are bytes: a latin-1 name imports (shown with \\x escapes); a folder
    named so is one readable error."""
    src = tmp_path / "src"
    _img(src / "n01440764" / "ok.jpg")
    raw = os.fsencode(src / "n01440764") + b"/caf\xe9.jpg"
    _img(Path(os.fsdecode(raw)))
    code, stdout, err = run(["import-folder", str(src), "--name", "x", "--out", str(tmp_path / "s"), "--no-progress"],
                            capsys)
    assert code == 0, err
    ds = LocalSuite.open(tmp_path / "s").dataset("default")
    assert sorted(ds["image_id"]) == ["default/n01440764/caf\\xe9", "default/n01440764/ok"]
    assert "n01440764/caf\\xe9.jpg" in ds["source_path"]
    bad = tmp_path / "bad"
    _img(Path(os.fsdecode(os.fsencode(bad) + b"/n\xe9/x.jpg")))
    code, _, err = run(["import-folder", str(bad), "--name", "x", "--out", str(tmp_path / "s3"), "--no-progress"],
                       capsys)
    assert code != 0 and err.count("\n") == 1 and "'n\\xe9'" in err




# -- names and bounds at parse time ---------------------------------------------------------------

@pytest.mark.parametrize("extra, match", [
    (["--name", ".."], "suite id (name) '..' is not valid"),
    (["--name", "a/b"], "is not valid: use lower-case letters"),
    (["--name", "x" * 400], "suite id (name) '" + "x" * 60 + "'… is not valid"),
    (["--name", "Mine"], "is not valid: use lower-case letters"),
    (["--name", "ok\n"], "is not valid: use lower-case letters"),
    (["--workers", "-1"], "--workers must be between 0 and 256, got -1"),
    (["--shard-size", "0"], "--shard-size must be between 1 and 100000, got 0"),
    (["--shard-size", "1000000000"], "--shard-size must be between 1 and 100000"),
    (["--config", "../up"], "config name '../up' is not valid"),
    (["--base", "a b"], "config name 'a b' is not valid"),
])
def test_names_and_bounds_are_checked_before_any_work(tmp_path, capsys, extra, match):
    args = {"--name": "ok", "--out": str(tmp_path / "out")}
    it = iter(extra)
    for k in it:
        args[k] = next(it)
    # the folder does not exist: the option is refused before the folder is even looked at
    code, _, err = run(["import-folder", str(tmp_path / "missing"), *[x for kv in args.items() for x in kv],
                        "--no-progress"], capsys)
    assert code != 0 and err.count("\n") == 1 and match in err, err
    assert list(tmp_path.iterdir()) == []


# -- output safety --------------------------------------------------------------------------------

def test_suite_gets_the_users_permissions(tmp_path, folder, capsys):
    old = os.umask(0o022)
    try:
        out = _import(tmp_path, folder, capsys)
    finally:
        os.umask(old)
    assert (out.stat().st_mode & 0o777) == 0o755
    assert all((p.stat().st_mode & 0o777) == (0o755 if p.is_dir() else 0o644) for p in out.rglob("*"))


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.mark.subprocess
def test_leftovers_of_killed_imports_are_cleaned(tmp_path, folder, capsys):
    dead, alive = _dead_pid(), os.getppid()
    for name in (f".s.{dead}.incomplete", f".s.{dead}.old.incomplete", f".s.{alive}.incomplete", ".other.1.incomplete"):
        (tmp_path / name / "data").mkdir(parents=True)
    _import(tmp_path, folder, capsys)
    left = sorted(p.name for p in tmp_path.glob(".*incomplete"))
    assert left == [".other.1.incomplete", f".s.{alive}.incomplete"]  # a live import and another --out stay


def _children(pid: int) -> list[int]:
    kids = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and int((p / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(p.name))
        except (OSError, IndexError, ValueError):
            pass
    return kids


def _wait_for_output(stream, needle: bytes, *, timeout: float) -> bool:
    """Read a child's pipe until ``needle`` appears (True) or it closes or ``timeout`` passes (False)."""
    import selectors

    seen, sel = b"", selectors.DefaultSelector()
    sel.register(stream, selectors.EVENT_READ)
    while needle not in seen:
        if not sel.select(timeout):
            return False
        chunk = os.read(stream.fileno(), 1 << 16)
        if not chunk:
            return False
        seen = seen[-len(needle):] + chunk
    return True


def _all_exit(pidfds: list[int], *, timeout: float) -> bool:
    """Whether every process behind ``pidfds`` exits within ``timeout`` (a pidfd turns readable at exit)."""
    import select

    try:
        pending = list(pidfds)
        while pending:
            ready, _, _ = select.select(pending, [], [], timeout)
            if not ready:
                return False
            pending = [fd for fd in pending if fd not in ready]
        return True
    finally:
        for fd in pidfds:
            os.close(fd)


def test_workers_give_the_same_suite(tmp_path, capsys):
    """Decoding in worker processes (chunks, out of order) writes the same bytes as in-process."""
    src = tmp_path / "src"
    cat = _photo("chelsea", (40, 30))
    for i in range(40):  # JPEGs stored as is and PNGs converted, interleaved in image_id order
        _img_arr = np.roll(cat, i, axis=1)
        (src / "n02123045").mkdir(parents=True, exist_ok=True)
        if i % 2:
            Image.fromarray(_img_arr).save(src / "n02123045" / f"{i:02d}.jpg")
        else:
            Image.fromarray(np.dstack([_img_arr, np.full(cat.shape[:2], 128, np.uint8)]), "RGBA").save(
                src / "n02123045" / f"{i:02d}.png")
    a = _import(tmp_path, src, capsys, "--workers", "0", "--shard-size", "7", out="a")
    b = _import(tmp_path, src, capsys, "--workers", "3", "--shard-size", "7", out="b")
    assert (a / "manifest.json").read_bytes() == (b / "manifest.json").read_bytes()


@pytest.mark.slow
@pytest.mark.subprocess
def test_kill_9_mid_import_then_rerun(tmp_path):
    """kill -9 while shards are being written leaves a .incomplete folder; the rerun removes it
    and writes the right suite."""
    src = tmp_path / "src"
    photo = _photo("astronaut", (192, 192))
    rgba = Image.fromarray(np.dstack([photo, np.full(photo.shape[:2], 200, np.uint8)]), "RGBA")
    for c in ("n01440764", "n04266014"):
        (src / c).mkdir(parents=True)
        for i in range(40):
            rgba.save(src / c / f"{i:03d}.png", compress_level=0)
    out = tmp_path / "suite"
    cmd = [sys.executable, "-m", "genshift", "-v", "import-folder", str(src), "--name", "k", "--out", str(out),
           "--shard-size", "4", "--workers", "2", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE)
    try:
        assert _wait_for_output(proc.stderr, b"wrote data/default/", timeout=120), "no shard was written"
        assert proc.poll() is None, "the import finished before it could be killed"
        workers = [os.pidfd_open(w) for w in _children(proc.pid)]  # readable once the process has exited
        assert len(workers) == 2
    finally:
        proc.kill()
        proc.wait()
    assert list(tmp_path.glob(".suite.*.incomplete")) and not out.exists()
    assert _all_exit(workers, timeout=10), "decode workers outlived the killed import"
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.glob(".*incomplete"))
    suite = LocalSuite.open(out)
    suite.verify()
    assert suite.manifest.configs["default"].rows == 80


# -- multi-shift import scored as ImageNet* -------------------------------------------------------

def _shift_folder(root, shifts=("base", "fog", "gray")):
    """Real photos (skimage.data, resized) in <shift>/<wnid>/ folders; each shift a real change."""
    from PIL import ImageFilter

    photos = {"n02123045": ["chelsea"], "n07920052": ["coffee"], "n04266014": ["rocket"], "n09472597": ["astronaut"]}
    for shift in shifts:
        for wnid, names in photos.items():
            for name in names:
                im = Image.fromarray(_photo(name, (96, 96)))
                if shift == "fog":
                    im = Image.blend(im.filter(ImageFilter.GaussianBlur(3)), Image.new("RGB", im.size, "white"), 0.5)
                elif shift == "gray":
                    im = im.convert("L")
                (root / shift / wnid).mkdir(parents=True, exist_ok=True)
                im.save(root / shift / wnid / f"{name}.jpg", quality=90)
    return root


def test_multi_shift_folder_is_scored_as_imagenet_star(tmp_path, tiny_checkpoint, capsys):
    import datasets
    import pyarrow.parquet as pq

    src = _shift_folder(tmp_path / "shifts")
    code, stdout, err = run(["import-folder", str(src), "--name", "mine", "--out", str(tmp_path / "suite"),
                             "--no-progress"], capsys)
    assert code == 0, err
    assert "scored as ImageNet* (reference config base)" in stdout
    m = LocalSuite.open(tmp_path / "suite").manifest
    assert sorted(m.configs) == ["base", "fog", "gray"] and m.generator["metric_family"] == "imagenet_star"
    for c in m.configs:  # every config loads on its own through the real datasets client and the card
        ds = datasets.load_dataset(str(tmp_path / "suite"), c, split="test")
        assert ds.num_rows == 4 and set(ds["config"]) == {c}
    runs = tmp_path / "runs"
    code, _, err = run(["eval", "--model", "test_resnet.r160_in1k", "--checkpoint", str(tiny_checkpoint), "--suite",
                        str(tmp_path / "suite"), "--out", str(runs), "--no-progress", "--workers", "0",
                        "--compile", "off"], capsys)
    assert code == 0, err
    (result_path,) = runs.rglob("result.json")
    result = json.loads(result_path.read_text())
    assert result["suite"]["metric_family"] == "imagenet_star"
    assert result["protocol"]["scoring"]["reference_config"] == "base"
    acc = {}
    for c in ("base", "fog", "gray"):
        t = pq.read_table(result_path.parent / "predictions" / f"{c}.parquet")
        acc[c] = float(np.mean(t["true_rank"].to_numpy() == 0))
        assert result["metrics"]["configs"][c]["acc1"]["value"] == pytest.approx(acc[c])
    impact = result["metrics"]["imagenet_star"]["absolute_impact"]
    assert sorted(impact) == ["fog", "gray"]
    for s in ("fog", "gray"):
        assert impact[s]["value"] == pytest.approx(acc["base"] - acc[s])
    assert result["metrics"]["imagenet_star"]["model_mean_impact"]["value"] == pytest.approx(
        np.mean([acc["base"] - acc["fog"], acc["base"] - acc["gray"]]))
    # the suite and the result both verify (the declared family is recomputed from the result)
    assert run(["verify", str(tmp_path / "suite")], capsys)[0] == 0
    code, out, err = run(["verify", str(result_path.parent)], capsys)
    assert code == 0, out + err


def test_multi_shift_reference_and_layout_errors(tmp_path, capsys):
    src = _shift_folder(tmp_path / "shifts", shifts=("clean", "fog"))
    code, _, err = run(["import-folder", str(src), "--name", "x", "--out", str(tmp_path / "s"), "--no-progress"],
                       capsys)
    assert code != 0 and err.count("\n") == 1 and "have no shift 'base'" in err and "--base NAME" in err
    out = _import(tmp_path, src, capsys, "--base", "clean", out="s2")
    assert LocalSuite.open(out).manifest.generator["reference_config"] == "clean"
    code, _, err = run(["import-folder", str(src), "--name", "x", "--config", "night", "--base", "clean", "--out",
                        str(tmp_path / "s3"), "--no-progress"], capsys)
    assert code != 0 and "drop --config" in err
    _img(src / "n01440764" / "stray.jpg")  # a class folder beside the shift folders
    code, _, err = run(["import-folder", str(src), "--name", "x", "--base", "clean", "--out", str(tmp_path / "s4"),
                        "--no-progress"], capsys)
    assert code != 0 and err.count("\n") == 1 and "mixes class folders ('n01440764')" in err
    (src / "n01440764" / "stray.jpg").unlink()
    (src / "n01440764").rmdir()
    (src / "Bad Shift" / "n01440764").mkdir(parents=True)
    code, _, err = run(["import-folder", str(src), "--name", "x", "--base", "clean", "--out", str(tmp_path / "s5"),
                        "--no-progress"], capsys)
    assert code != 0 and "'Bad Shift'" in err and "not valid config names" in err


def test_decompression_bomb_is_a_bad_image(tmp_path, capsys):
    """A PNG header claiming 400 megapixels is refused at open, before anything is decoded."""
    d = tmp_path / "src" / "n02123045"
    d.mkdir(parents=True)
    Image.fromarray(_photo("chelsea", (32, 32))).save(d / "ok.png")

    def chunk(t, x):
        return struct.pack(">I", len(x)) + t + x + struct.pack(">I", zlib.crc32(t + x))
    header = chunk(b"IHDR", struct.pack(">IIBBBBB", 20000, 20000, 8, 2, 0, 0, 0))
    (d / "bomb.png").write_bytes(b"\x89PNG\r\n\x1a\n" + header + chunk(b"IDAT", zlib.compress(b"\x00" * 64))
                                 + chunk(b"IEND", b""))
    code, _, err = run(["import-folder", str(tmp_path / "src"), "--name", "x", "--out", str(tmp_path / "s"),
                        "--no-progress"], capsys)
    assert code != 0 and err.count("\n") == 1 and "bomb.png is not a readable image (DecompressionBomb" in err
    out = _import(tmp_path, tmp_path / "src", capsys, "--skip-bad-images")
    assert LocalSuite.open(out).manifest.generator["n_skipped_bad_images"] == 1


def test_eval_refuses_a_suite_declaring_a_bad_metric_family(tmp_path, tiny_checkpoint, capsys):
    """The declaration bench eval reads from an imported suite's manifest is checked like any input."""
    src = _shift_folder(tmp_path / "shifts", shifts=("base", "fog"))
    out = _import(tmp_path, src, capsys)
    for gen, match in (({"metric_family": "bogus"}, "declares metric family 'bogus'"),
                       ({"reference_config": "../x"}, "reference config '../x'"),
                       ({"reference_config": ["base"]}, "reference config \"['base']\"")):
        m = json.loads((out / "manifest.json").read_text())
        m["generator"].update(gen)
        (out / "manifest.json").write_text(json.dumps(m))
        code, _, err = run(["eval", "--model", "test_resnet.r160_in1k", "--checkpoint", str(tiny_checkpoint),
                            "--suite", str(out), "--out", str(tmp_path / "runs"), "--no-progress", "--workers", "0"],
                           capsys)
        assert code != 0 and err.count("\n") == 1 and match in err, err
        m["generator"].update(metric_family="imagenet_star", reference_config="base")
        (out / "manifest.json").write_text(json.dumps(m))
    assert not list((tmp_path / "runs").rglob("result.json"))


def test_16_bit_photos_score_like_their_8_bit_originals_end_to_end(tmp_path, lite0_weights, capsys):
    """Real ImageNet weights: a real photo saved with 16 bits per channel gets the predictions of
    its 8-bit original through import and bench eval (the raw 16-bit PNG was scored as white)."""

    import pyarrow.parquet as pq

    for name, wnid in (("coffee", "n07920052"), ("chelsea", "n02123045")):
        gray = np.asarray(Image.fromarray(_photo(name)).convert("L"))
        for shift, im in (("base", Image.fromarray(gray)), ("deep16", Image.fromarray(gray.astype(np.uint16) * 257))):
            (tmp_path / "src" / shift / wnid).mkdir(parents=True, exist_ok=True)
            im.save(tmp_path / "src" / shift / wnid / f"{name}.png")  # L and I;16 PNGs
    out = _import(tmp_path, tmp_path / "src", capsys)
    code, _, err = run(["eval", "--model", "tf_efficientnet_lite0", "--checkpoint", lite0_weights, "--remap-by-order",
                        "--suite", str(out), "--out", str(tmp_path / "runs"), "--workers", "0", "--no-progress",
                        "--compile", "off"], capsys)
    assert code == 0, err
    (path,) = (tmp_path / "runs").rglob("result.json")
    base = pq.read_table(path.parent / "predictions" / "base.parquet")
    deep = pq.read_table(path.parent / "predictions" / "deep16.parquet")
    assert base["topk_idx"].to_pylist() == deep["topk_idx"].to_pylist()
    assert np.allclose(base["true_prob"].to_numpy(), deep["true_prob"].to_numpy(), atol=1e-3)
    assert base["true_rank"].to_pylist()[1] == 0  # espresso (rows in image_id order: chelsea, coffee)
    result = json.loads(path.read_text())
    assert result["metrics"]["imagenet_star"]["absolute_impact"]["deep16"]["value"] == 0.0


def test_overwriting_a_linked_out_replaces_the_link_not_its_target(tmp_path, folder, capsys):
    real = _import(tmp_path, folder, capsys, out="real")
    before = (real / "manifest.json").read_bytes()
    (tmp_path / "link").symlink_to(real)
    code, _, err = run(["import-folder", str(folder), "--name", "y", "--out", str(tmp_path / "link"), "--overwrite",
                        "--no-progress"], capsys)
    assert code == 0, err
    assert not (tmp_path / "link").is_symlink() and LocalSuite.open(tmp_path / "link").suite_id == "y"
    assert (real / "manifest.json").read_bytes() == before
    assert not list(tmp_path.glob(".*incomplete"))


@pytest.mark.parametrize("make, match", [
    (lambda cam: Image.fromarray(cam.astype(np.float32) / 255, "F"), "floating-point image"),
    (lambda cam: Image.fromarray(cam.astype(np.int32) * 70000, "I"), "values outside 0..65535"),
])
def test_images_without_a_known_8_bit_scale_are_refused(tmp_path, capsys, make, match):
    d = tmp_path / "src" / "n04266014"
    d.mkdir(parents=True)
    make(_photo("camera", (32, 32))).save(d / "odd.tif")
    code, _, err = run(["import-folder", str(tmp_path / "src"), "--name", "x", "--out", str(tmp_path / "s"),
                        "--no-progress"], capsys)
    assert code != 0 and err.count("\n") == 1 and "odd.tif is not a readable image" in err and match in err, err


def test_damaged_images_never_crash_and_what_passes_decodes_as_eval_decodes():
    """Fuzzing: real JPEG/PNG/GIF/TIFF bytes truncated, overwritten or extended. The check never
    raises; whatever it accepts is stored as bytes that eval's decode reads, as the check saw them."""
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    from genshift.importer import check_image, decode_image, stored_bytes

    cat = _photo("chelsea", (40, 30))
    seeds = []
    for fmt, im in (("JPEG", Image.fromarray(cat)), ("PNG", Image.fromarray(np.dstack([cat, cat[..., 0]]), "RGBA")),
                    ("GIF", Image.fromarray(cat).convert("P")), ("TIFF", Image.fromarray(cat).convert("CMYK"))):
        buf = io.BytesIO()
        im.save(buf, format=fmt)
        seeds.append(buf.getvalue())
    seeds.append(_png16_rgb(cat))

    @hypothesis.settings(max_examples=150, deadline=None, derandomize=True)
    @hypothesis.given(st.sampled_from(range(len(seeds))), st.sampled_from(["cut", "flip", "append"]),
                      st.integers(0, 10_000), st.binary(min_size=1, max_size=16))
    def check(seed, how, pos, junk):
        data = seeds[seed]
        pos %= len(data)
        if how == "cut":
            data = data[:pos]
        elif how == "flip":
            data = data[:pos] + junk + data[pos + len(junk):]
        else:
            data = data + junk
        info, why = check_image(data)
        assert (info is None) != (why is None)
        if info is not None:
            stored, _ = stored_bytes(data, info)
            with Image.open(io.BytesIO(stored)) as im:  # eval/inference.py's decode
                px = np.asarray(im.convert("RGB"))
            assert (px == np.asarray(decode_image(data)[0].convert("RGB"))).all()

    check()


def test_csv_with_a_shift_column_is_a_multi_shift_import(tmp_path, capsys):
    src = tmp_path / "flat"
    for i in range(3):
        _img(src / f"p{i}.jpg", (i * 60, 10, 10))
    (tmp_path / "s.csv").write_text("path,label,shift\np0.jpg,n02123045,base\np1.jpg,n02123045,fog\n"
                                    "p2.jpg,967,fog\n")
    out = _import(tmp_path, src, capsys, "--csv", str(tmp_path / "s.csv"))
    m = LocalSuite.open(out).manifest
    assert sorted(m.configs) == ["base", "fog"] and m.configs["fog"].rows == 2
    assert m.generator["metric_family"] == "imagenet_star" and m.generator["reference_config"] == "base"
    assert sorted(LocalSuite.open(out).dataset("fog")["image_id"]) == ["fog/n02123045/p1", "fog/n07920052/p2"]
    (tmp_path / "bad.csv").write_text("path,label,shift\np0.jpg,0,base\np1.jpg,0,Night Shift\n")
    code, _, err = run(["import-folder", str(src), "--csv", str(tmp_path / "bad.csv"), "--name", "x", "--out",
                        str(tmp_path / "s2"), "--no-progress"], capsys)
    assert code != 0 and err.count("\n") == 1 and "bad.csv line 3: shift 'Night Shift' is not a valid config" in err
    code, _, err = run(["import-folder", str(src), "--csv", str(tmp_path / "s.csv"), "--config", "x", "--name", "x",
                        "--out", str(tmp_path / "s3"), "--no-progress"], capsys)
    assert code != 0 and "the shift column of s.csv name the configs" in err and "drop --config" in err


def test_full_disk_during_import_is_one_line_and_keeps_the_previous_suite(tmp_path, folder, capsys, monkeypatch):
    """ENOSPC while a shard is written (pyarrow reports only the errno): one line naming the shard, the
    old suite untouched, no temporary folder left; the rerun with space imports."""
    import errno

    import pyarrow.parquet as pq

    out = tmp_path / "suite"
    assert run(["import-folder", str(folder), "--name", "old", "--out", str(out), "--no-progress"], capsys)[0] == 0
    before = (out / "manifest.json").read_bytes()
    real, refused = pq.ParquetWriter.write_table, []

    def full_disk(self, *a, **k):
        refused.append(self.where)
        raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full_disk)
    argv = ["import-folder", str(folder), "--name", "new", "--out", str(out), "--overwrite", "--workers", "0",
            "--no-progress"]
    code, _, err = run(argv, capsys)
    assert refused and code == 74 and err.count("\n") == 1, err
    assert err.startswith("error: bench import-folder: No space left on device (ENOSPC) on ")
    assert "test-00000-of-00001.parquet" in err
    assert "free disk space or write elsewhere" in err
    assert (out / "manifest.json").read_bytes() == before and not list(tmp_path.glob(".*incomplete"))
    monkeypatch.setattr(pq.ParquetWriter, "write_table", real)
    assert run(argv, capsys)[0] == 0 and LocalSuite.open(out).suite_id == "new"


# -- image sides are bounded from the header, at import and at eval, before anything is decoded or resized ----

def _zeros_png(w: int, h: int) -> bytes:
    """A valid 8-bit grayscale PNG of w x h black pixels: tiny bytes, any sides (compressed row by row)."""
    def chunk(t, x):
        return struct.pack(">I", len(x)) + t + x + struct.pack(">I", zlib.crc32(t + x))
    z, row = zlib.compressobj(9), b"\x00" * (w + 1)
    idat = b"".join(z.compress(row) for _ in range(h)) + z.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


OVERSIZED = {  # file name: (sides, the one line's reason)
    "wide.png": ((20000, 2), "20000x2 pixels: sides in a ratio of 10000:1, over the 50:1 limit; crop the image"),
    "tall.png": ((2, 20000), "2x20000 pixels: sides in a ratio of 10000:1, over the 50:1 limit"),
    "long.png": ((60000, 2), "60000x2 pixels: a side over the 32768-pixel limit; resize the image"),
    "side.png": ((32769, 1000), "32769x1000 pixels: a side over the 32768-pixel limit"),
}


def test_image_sides_are_bounded_at_import(tmp_path, capsys):
    """Crafted PNGs of a few hundred bytes claiming huge sides are refused (one line naming the file, the
    sides and the limit) or skipped and counted; a 50:1 panorama and a 1x1 image are real images."""
    d = tmp_path / "src" / "n02123045"
    d.mkdir(parents=True)
    Image.fromarray(_photo("chelsea", (32, 32))).save(d / "a-ok.png")
    (d / "panorama.png").write_bytes(_zeros_png(20000, 400))
    (d / "pixel.png").write_bytes(_zeros_png(1, 1))
    for name, ((w, h), reason) in OVERSIZED.items():  # one at a time, beside the good images
        (d / name).write_bytes(_zeros_png(w, h))
        code, _, err = run(["import-folder", str(tmp_path / "src"), "--name", "x", "--out", str(tmp_path / "s"),
                            "--workers", "0", "--no-progress"], capsys)
        assert code != 0 and err.count("\n") == 1, err
        assert f"n02123045/{name} is not a readable image (ImageSizeError: {reason}" in err, err
        (d / name).rename(tmp_path / name)
    assert len((tmp_path / "wide.png").read_bytes()) < 300  # the 208-byte file: tiny bytes, 40000 pixels
    for name in OVERSIZED:
        (tmp_path / name).rename(d / name)
    out = _import(tmp_path, tmp_path / "src", capsys, "--skip-bad-images")
    m = LocalSuite.open(out).manifest
    assert m.generator["n_skipped_bad_images"] == len(OVERSIZED)
    assert sorted(m.generator["skipped_bad_images"]) == sorted(f"n02123045/{n}" for n in OVERSIZED)
    assert set(_stored(out)) == {f"default/n02123045/{n}" for n in ("a-ok", "panorama", "pixel")}


def test_image_sides_are_bounded_at_eval_before_any_resize(tmp_path, tiny_checkpoint, capsys):
    """A suite from elsewhere holding the 20000x2 PNG (2 GB once resized) and a 90-megapixel one (over
    Pillow's warning threshold, under its error): one line naming the image, or skipped and counted."""
    from genshift.data_cards import render_card
    from genshift.suite_format import SuiteWriter

    photo = io.BytesIO()
    Image.fromarray(_photo("chelsea", (32, 32))).save(photo, format="JPEG")
    images = {"a": photo.getvalue(), "b": _zeros_png(20000, 2), "c": _zeros_png(10000, 9000)}
    root = tmp_path / "suite"
    with SuiteWriter(root, suite_id="sides") as w:
        w.write_shard("base", 0, 1, ({"image": {"bytes": b, "path": None}, "label": 281, "image_id": f"base/{k}",
                                      "config": "base", "keep": True, "pair_id": None} for k, b in images.items()))
        w.finalize(generator={}, card=lambda m: render_card(m, license="other"))
    argv = ["eval", "--model", "test_resnet.r160_in1k", "--checkpoint", str(tiny_checkpoint), "--suite", str(root),
            "--out", str(tmp_path / "runs"), "--workers", "0", "--compile", "off", "--bootstrap", "10", "--no-progress"]
    code, _, err = run(argv, capsys)
    assert code != 0 and err.count("\n") == 1, err
    assert "base/b" in err and "20000x2 pixels: sides in a ratio of 10000:1, over the 50:1 limit" in err, err
    assert not list((tmp_path / "runs").rglob("result.json"))
    code, _, err = run([*argv, "--skip-bad-images", "--force", "--json"], capsys)
    assert code == 0, err
    (result,) = (tmp_path / "runs").rglob("result.json")
    counts = json.loads(result.read_text())["counts"]["base"]
    assert counts["predicted"] == 1 and counts["skipped_bad_ids"] == ["base/b", "base/c"]


def test_device_decode_checks_jpeg_sides_before_decoding():
    """--decode device reads a JPEG's sides from its header before the device decodes it."""
    import torch

    from genshift.eval.inference import DeviceDecoder

    datas = []
    for size in ((32, 32), (20000, 2)):
        buf = io.BytesIO()
        Image.new("RGB", size, (200, 10, 10)).save(buf, format="JPEG")
        datas.append(torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8))
    x, bad = DeviceDecoder({"input_size": (3, 64, 64), "crop_pct": 0.875, "interpolation": "bicubic"}, "cpu")(datas)
    assert x.shape == (1, 3, 64, 64)
    assert bad == [(1, "ImageSizeError: 20000x2 pixels: sides in a ratio of 10000:1, over the 50:1 limit; "
                       "crop the image")]


@pytest.mark.parametrize("size, ok", [((9504, 6336), True), ((20000, 400), True), ((1, 1), True), ((32768, 2000), True),
                                      ((20001, 400), False), ((32769, 1000), False), ((10000, 9000), False),
                                      ((0, 5), False)])
def test_size_bounds_admit_real_photos(size, ok):
    """The documented bounds: a 61-megapixel photo and a 50:1 panorama pass; one pixel over any bound fails."""
    from genshift.pixels import ImageSizeError, check_size

    if ok:
        check_size(size)
    else:
        with pytest.raises(ImageSizeError, match=rf"{size[0]}x{size[1]} pixels: "):
            check_size(size)


def test_csv_absolute_paths_are_stored_relative_to_the_csv(tmp_path, capsys):
    """source_path is published with the suite: an absolute CSV path outside the folder is stored relative to
    the CSV, never as this machine's absolute path."""
    import pyarrow.parquet as pq
    from PIL import Image

    src, elsewhere, lists = tmp_path / "src", tmp_path / "photos", tmp_path / "lists"
    for d in (src, elsewhere, lists):
        d.mkdir()
    Image.new("RGB", (32, 32), (200, 10, 10)).save(src / "a.jpg")
    Image.new("RGB", (32, 32), (10, 200, 10)).save(elsewhere / "b.jpg")
    (lists / "labels.csv").write_text(f"path,label\na.jpg,n01440764\n{elsewhere / 'b.jpg'},967\n")
    code, _, err = run(["import-folder", str(src), "--csv", str(lists / "labels.csv"), "--name", "x", "--out",
                        str(tmp_path / "out")], capsys)
    assert code == 0, err
    paths = sorted(p for f in (tmp_path / "out").rglob("*.parquet")
                   for p in pq.read_table(f, columns=["source_path"])["source_path"].to_pylist())
    assert paths == ["../photos/b.jpg", "a.jpg"]
    assert not any(str(tmp_path) in p for p in paths)
