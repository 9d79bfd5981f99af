"""``bench import-folder``: your own images as a suite in format 1.

Input: a folder with one sub-folder per class named by its ImageNet-1k wnid (``n01440764/...``),
or a CSV of ``path,label`` (label = wnid or class index; paths relative to the folder). Image
bytes are embedded as they are (nothing is re-encoded); ``image_id`` = ``<config>/<wnid>/<file
stem>``; ``keep`` = true; the relative source path is kept as provenance. The suite is written to
a temporary folder next to ``out`` and renamed at the end, so a failure leaves nothing behind.
"""

from __future__ import annotations

import csv
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmark import imagenet
from benchmark.errors import BenchError
from benchmark.fsutil import prepare_fresh_dir
from benchmark.suite_format import MANIFEST, check_config_name

log = logging.getLogger(__name__)
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp"}


@dataclass(frozen=True)
class Item:
    path: Path
    rel: str
    label: int
    image_id: str


def _label(text: str, where: str) -> int:
    text = text.strip()
    if text.isdigit():
        if not 0 <= int(text) < imagenet.NUM_CLASSES:
            raise BenchError(f"{where}: label {text} is not an ImageNet-1k class index (0..999)")
        return int(text)
    try:
        return imagenet.index_of(text)
    except KeyError:
        raise BenchError(f"{where}: label {text!r} is not an ImageNet-1k wnid (like n01440764) or index") from None


def list_items(src: Path, *, config: str, csv_path: Path | None = None) -> list[Item]:
    """The images to import, sorted by image id; every naming problem is one clear error."""
    if not src.is_dir():
        raise BenchError(f"import folder {str(src)!r} does not exist or is not a folder")
    pairs: list[tuple[Path, int]] = []
    if csv_path is not None:
        if not csv_path.is_file():
            raise BenchError(f"--csv {str(csv_path)!r} does not exist")
        with open(csv_path, newline="") as f:
            reader = csv.reader(f)
            for i, row in enumerate(reader, 1):
                if i == 1 and row and row[0].strip().lower() == "path":
                    continue
                if len(row) < 2:
                    raise BenchError(f"{csv_path.name} line {i}: expected 'path,label', got {row!r}")
                p = Path(row[0].strip())
                pairs.append((p if p.is_absolute() else src / p, _label(row[1], f"{csv_path.name} line {i}")))
    else:
        top_files = [p.name for p in src.iterdir() if p.is_file() and not p.name.startswith(".")]
        dirs = sorted(p for p in src.iterdir() if p.is_dir() and not p.name.startswith("."))
        bad = [d.name for d in dirs if d.name not in set(imagenet.wnids())]
        if bad:
            raise BenchError(f"sub-folders of {src} must be ImageNet-1k wnids (e.g. n01440764); found "
                             f"{', '.join(repr(b) for b in bad[:5])}{' ...' if len(bad) > 5 else ''}; rename them or "
                             "use --csv path,label")
        if top_files and not dirs:
            raise BenchError(f"{src} holds files but no wnid sub-folders; put images in <wnid>/ folders or use --csv")
        if top_files:
            log.warning("ignoring %d file(s) at the top of %s (e.g. %s): only <wnid>/ sub-folders are imported",
                        len(top_files), src, sorted(top_files)[0])
        for d in dirs:
            label = imagenet.index_of(d.name)
            pairs += [(p, label) for p in sorted(d.rglob("*")) if p.is_file() and not p.name.startswith(".")]
    if not pairs:
        raise BenchError(f"no images found in {src}; expected <wnid>/<image> files or a --csv list")
    items, seen = [], {}
    for path, label in pairs:
        if not path.is_file():
            raise BenchError(f"{path} is listed but does not exist")
        wnid = imagenet.wnids()[label]
        iid = f"{config}/{wnid}/{path.stem}"
        if iid in seen:
            raise BenchError(f"duplicate image id {iid!r}: {seen[iid]} and {path} share a class and file stem; "
                             "rename one of them")
        seen[iid] = path
        try:
            rel = str(path.relative_to(src))
        except ValueError:
            rel = str(path)
        items.append(Item(path, rel, label, iid))
    return sorted(items, key=lambda it: it.image_id)


def _check_image(data: bytes) -> str | None:
    """None if the bytes decode as an image, else the reason."""
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            im.verify()
        return None
    except Exception as e:  # noqa: BLE001 - any decoder failure means "not an image"
        return f"{type(e).__name__}: {e}"


def import_folder(src: str | Path, *, name: str, out: str | Path, config: str = "default",
                  csv_path: str | Path | None = None, overwrite: bool = False, skip_bad_images: bool = False,
                  shard_size: int = 1000, progress: bool = True):
    """Import images into a new suite at ``out``; returns its ``Manifest``."""
    from datasets import Value
    from tqdm.auto import tqdm

    from benchmark.writer import SuiteWriter
    from data_cards import render_card

    check_config_name(config)
    if shard_size < 1:
        raise BenchError(f"--shard-size must be >= 1, got {shard_size}")
    src, out = Path(src), Path(out)
    items = list_items(src, config=config, csv_path=Path(csv_path) if csv_path else None)
    # checks only: an existing output is replaced at the very end, so a failed import keeps it
    prepare_fresh_dir(out, overwrite=overwrite, marker_files=(MANIFEST, "build.json"), what="--out", remove=False)
    good, skipped = [], []
    for it in tqdm(items, desc="check images", unit="img", disable=not progress):
        why = _check_image(it.path.read_bytes())
        if why is None:
            good.append(it)
        elif skip_bad_images:
            skipped.append(it.rel)
        else:
            raise BenchError(f"{it.rel} is not a readable image ({why}); remove it or pass --skip-bad-images")
    if not good:
        raise BenchError(f"none of the {len(items)} files in {src} is a readable image")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".incomplete", dir=out.parent))
    try:
        shards = [good[a:a + shard_size] for a in range(0, len(good), shard_size)]
        bar = tqdm(total=len(good), desc=f"import {name}", unit="img", disable=not progress)

        def rows(block):
            for it in block:
                bar.update(1)
                yield {"image": {"bytes": it.path.read_bytes(), "path": None}, "label": it.label,
                       "image_id": it.image_id, "config": config, "keep": True, "pair_id": None,
                       "source_path": it.rel}

        with SuiteWriter(tmp, suite_id=name, extra_features={"source_path": Value("string")}) as w:
            for i, block in enumerate(shards):
                w.write_shard(config, i, len(shards), rows(block))
            bar.close()
            generator = {"builder": "bench import-folder", "images": len(good), "n_skipped_bad_images": len(skipped),
                         "skipped_bad_images": skipped[:1000]}
            w.finalize(generator=generator, card=lambda m: render_card(
                m, template="generic", pretty_name=name,
                context={"note": f"Imported with `bench import-folder` ({len(good)} images)."}))
        (tmp / "build.json").unlink(missing_ok=True)
        prepare_fresh_dir(out, overwrite=overwrite, marker_files=(MANIFEST, "build.json"), what="--out")
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    from benchmark.suite_format import Manifest

    if skipped:
        log.warning("skipped %d unreadable file(s), e.g. %s", len(skipped), skipped[0])
    return Manifest.load(out)
