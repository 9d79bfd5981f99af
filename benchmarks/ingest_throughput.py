"""Ingest throughput: the upstream ImageNet* converter and `bench import-folder` vs a bare copy.

    python benchmarks/ingest_throughput.py --images 2000

On the same 512x512 JPEGs (the size the ImageNet* release ships), in one process:
1. baseline: read every image's bytes (from a zip, and from a folder) and write them, with
   image_id and label, into one plain pyarrow parquet file: the least any ingest must do;
2. ``genshift.upstream.convert_release`` on a ``<shift>.zip`` in the release layout (zip hash,
   scan, format-1 shards written with ``datasets``, manifest, card) with a mask;
3. ``genshift.importer.import_folder`` on ``<wnid>/<file>.jpg`` folders (full decode of every
   file, shards, manifest, card, atomic rename).
Reports images/s and the ratio to the baseline of the same source, best of ``--repeat``, as JSON.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np


def make_jpegs(n: int, *, unique: int = 200, size: int = 512, seed: int = 0) -> list[bytes]:
    """Photo-like JPEGs (gradient + noise), ``unique`` distinct ones repeated up to ``n``."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    yy, xx = np.mgrid[0:size, 0:size]
    for _ in range(min(unique, n)):
        base = rng.integers(0, 255, 3)
        arr = (base[None, None, :] + 0.2 * xx[..., None] + 0.1 * yy[..., None]
               + rng.normal(0, 12, (size, size, 3))).clip(0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return [out[i % len(out)] for i in range(n)]


def layout(jpegs: list[bytes], root: Path, *, shift: str = "in_the_snow") -> tuple[Path, Path, int]:
    """The same images as ``<shift>.zip`` (release layout) and as ``<wnid>/`` folders."""
    from genshift import imagenet

    per_class = 50
    classes = (len(jpegs) + per_class - 1) // per_class
    rel, folder = root / "release", root / "folder"
    rel.mkdir(parents=True)
    with zipfile.ZipFile(rel / f"{shift}.zip", "w", compression=zipfile.ZIP_STORED) as zf:
        for k, data in enumerate(jpegs):
            zf.writestr(f"{shift}/{imagenet.wnids()[k // per_class]}/{k % per_class:02d}.jpg", data)
    for k, data in enumerate(jpegs):
        p = folder / imagenet.wnids()[k // per_class] / f"{k % per_class:02d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return rel, folder, classes


def baseline(items, out: Path) -> None:
    """Bytes + id + label streamed into one plain parquet file in 100-row groups (no checks, no
    features, no manifest): the least a bounded-memory ingest must do."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("image_id", pa.string()), ("label", pa.int64()), ("image", pa.binary())])
    with pq.ParquetWriter(out, schema) as w:
        batch: list[tuple] = []
        for image_id, label, read in items:
            batch.append((image_id, label, read()))
            if len(batch) == 100:
                w.write_table(pa.table(list(zip(*batch)), schema=schema))
                batch = []
        if batch:
            w.write_table(pa.table(list(zip(*batch)), schema=schema))


def timed(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)

    from genshift import imagenet
    from genshift.importer import import_folder
    from genshift.upstream import convert_release

    work = Path(tempfile.mkdtemp(prefix="ingest-bench-"))
    try:
        jpegs = make_jpegs(args.images)
        rel, folder, classes = layout(jpegs, work)
        mask = np.ones(50_000, np.uint8)
        np.save(work / "masks.npy", np.array({"in_the_snow": mask}, dtype=object), allow_pickle=True)
        zpath = rel / "in_the_snow.zip"

        def zip_items():
            zf = zipfile.ZipFile(zpath)
            for info in zf.infolist():
                wnid = info.filename.split("/")[1]
                yield info.filename, imagenet.index_of(wnid), lambda info=info: zf.read(info)

        def dir_items():
            for p in sorted(folder.rglob("*.jpg")):
                yield str(p.relative_to(folder)), imagenet.index_of(p.parent.name), p.read_bytes

        def fresh(name):
            shutil.rmtree(work / name, ignore_errors=True)
            return work / name

        t_base_zip = timed(lambda: baseline(zip_items(), work / "b1.parquet"), args.repeat)
        t_base_dir = timed(lambda: baseline(dir_items(), work / "b2.parquet"), args.repeat)
        t_convert = timed(lambda: convert_release(rel, fresh("converted"), shifts=["in_the_snow"],
                                                  mask=work / "masks.npy", classes=range(classes)), args.repeat)
        t_import = timed(lambda: import_folder(folder, name="bench", out=fresh("imported"), progress=False),
                         args.repeat)
        n = args.images
        report = {
            "images": n, "mean_jpeg_bytes": int(np.mean([len(j) for j in jpegs])), "repeat": args.repeat,
            "baseline_from_zip_images_per_s": round(n / t_base_zip, 1),
            "convert_release_images_per_s": round(n / t_convert, 1),
            "convert_release_vs_baseline": round(t_base_zip / t_convert, 3),
            "baseline_from_folder_images_per_s": round(n / t_base_dir, 1),
            "import_folder_images_per_s": round(n / t_import, 1),
            "import_folder_vs_baseline": round(t_base_dir / t_import, 3),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(report, indent=1)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
