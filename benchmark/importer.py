"""``bench import-folder``: your own images as a suite in format 1.1 (``docs/hub.md`` section 7). Every file is fully
decoded before anything is written; the suite is written to ``.<out name>.<pid>.incomplete`` and renamed at the end."""

from __future__ import annotations

import csv
import hashlib
import io
import logging
import os
import re
import shutil
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from genshift import imagenet
from genshift.errors import BenchError, IntegrityError
from genshift.fsutil import prepare_fresh_dir, read_limited, read_text_limited
from genshift.pixels import check_size, to_8bit
from genshift.suite_format import CONFIG_RE, MANIFEST, Manifest, SuiteWriter, check_name

log = logging.getLogger(__name__)
MAX_SHARD_SIZE = 100_000
MAX_CSV_BYTES = 256 << 20  # a path,label line per image: ImageNet-train (1.28M images) is ~60 MiB
MAX_IMAGE_BYTES = 1 << 28
DEFAULT_WORKERS = 8
CHUNK = 16  # images per worker task
MAX_WORKERS = 256


def display(path: str | os.PathLike) -> str:
    """A file name as text that prints and encodes as UTF-8: bytes that are not UTF-8 (names on
    Linux file systems are bytes) are shown as ``\\xe9`` escapes instead of lone surrogates."""
    return os.fsencode(os.fspath(path)).decode("utf-8", "backslashreplace")


@dataclass(frozen=True)
class Item:
    path: Path
    rel: str  # display form of the path relative to the import folder
    label: int
    image_id: str
    config: str


@dataclass(frozen=True)
class Layout:
    """What an import folder holds: its items (sorted by image id) and the reference config of a multi-shift one."""

    items: list[Item]
    configs: tuple[str, ...]
    reference: str | None


def _csv_pairs(src: Path, csv_path: Path) -> dict[str | None, list[tuple[Path, int]]]:
    """``path,label`` rows under ``None``, or with a ``path,label,shift`` header grouped by shift."""
    name = display(csv_path.name)
    text = read_text_limited(csv_path, max_bytes=MAX_CSV_BYTES, what="--csv file",
                             fix="a path,label list is far smaller, check that --csv names the right file",
                             encoding_fix=f"save it as UTF-8 (Excel: 'CSV UTF-8'; or: iconv -f latin1 -t utf-8 {name} "
                                          f"> utf8-{name})")
    try:
        rows = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as e:
        raise BenchError(f"{name} is not a readable CSV ({e}); write one 'path,label' pair per line") from None
    by_shift: dict[str | None, list[tuple[Path, int]]] = {}
    with_shift = False
    for i, row in enumerate(rows, 1):
        if not row or not "".join(row).strip():
            continue
        if i == 1 and row[0].strip().lower() == "path":
            with_shift = len(row) >= 3 and row[2].strip().lower() in ("shift", "config")
            continue
        if len(row) < (3 if with_shift else 2):
            raise BenchError(f"{name} line {i}: expected '{'path,label,shift' if with_shift else 'path,label'}', "
                             f"got {row!r}")
        shift = row[2].strip() if with_shift else None
        if shift is not None and not CONFIG_RE.fullmatch(shift):
            raise BenchError(f"{name} line {i}: shift {shift[:70]!r} is not a valid config name; use lower-case "
                             "letters, digits, '_' or '-' (at most 64 characters)")
        try:
            label = imagenet.parse_class(row[1])
        except BenchError as e:
            raise BenchError(f"{name} line {i}: label: {e}") from None
        p = Path(row[0].strip())
        by_shift.setdefault(shift, []).append((p if p.is_absolute() else src / p, label))
    return by_shift


def _listing(d: Path) -> tuple[list[Path], list[str]]:
    """The sub-folders and the names of the files of ``d``, hidden ones left out, sorted."""
    entries = sorted(p for p in d.iterdir() if not p.name.startswith("."))
    return [p for p in entries if p.is_dir()], [display(p.name) for p in entries if p.is_file()]


def _names(paths, n: int = 5) -> str:
    names = [f"'{display(p.name)}'" for p in paths]  # not repr: it would double the \\x escapes
    return ", ".join(names[:n]) + (" ..." if len(names) > n else "")


def _class_pairs(d: Path) -> list[tuple[Path, int]]:
    """``<wnid>/<image>`` files of one folder (images in nested folders count for their wnid)."""
    dirs, top = _listing(d)
    wnids = set(imagenet.wnids())
    if bad := [x for x in dirs if x.name not in wnids]:
        raise BenchError(f"sub-folders of {display(d)} must be ImageNet-1k wnids (e.g. n01440764), or shift folders "
                         f"holding wnid folders (<shift>/<wnid>/<image>); found {_names(bad)}; rename them or use "
                         "--csv path,label")
    if top and not dirs:
        raise BenchError(f"{display(d)} holds files but no wnid sub-folders; put images in <wnid>/ folders or use "
                         "--csv")
    if top:
        log.warning("ignoring %d file(s) at the top of %s (e.g. %s): only <wnid>/ sub-folders are imported",
                    len(top), display(d), top[0])
    return [(p, imagenet.index_of(x.name)) for x in dirs
            for p in sorted(x.rglob("*")) if p.is_file() and not p.name.startswith(".")]


def discover(src: str | Path, *, config: str | None = None, csv_path: str | Path | None = None,
             base: str | None = None) -> Layout:
    """The images to import and the suite's configs; every naming problem is one clear error. ``<wnid>/``
    sub-folders (or a ``path,label`` CSV) make one config named ``config``; sub-folders holding ``<wnid>/``
    folders (or a ``path,label,shift`` CSV) are shifts, one config each, ``base`` the reference."""
    src = Path(src)
    if not src.is_dir():
        raise BenchError(f"import folder {display(src)!r} does not exist or is not a folder")
    wnids = set(imagenet.wnids())
    if csv_path is not None:
        by_shift = _csv_pairs(src, Path(csv_path))
        multi = bool(by_shift) and None not in by_shift
        where = f"the shift column of {display(Path(csv_path).name)}"
    else:
        dirs, top = _listing(src)
        others = [d for d in dirs if d.name not in wnids]
        multi = any(x.name in wnids for d in others for x in _listing(d)[0])
        if multi and len(others) < len(dirs):
            raise BenchError(f"{display(src)} mixes class folders ({_names([d for d in dirs if d.name in wnids])}) "
                             f"with shift folders ({_names(others)}); use either <wnid>/<image> or "
                             "<shift>/<wnid>/<image>")
        where = f"the shift folders of {display(src)}"
    if not multi:
        if base is not None:
            raise BenchError("--base names the reference shift of a multi-shift import (<shift>/<wnid>/<image> folders "
                             f"or a path,label,shift CSV); {display(src)} is a single-config import, drop --base")
        config = check_name(config or "default")
        per_config = {config: by_shift.get(None, []) if csv_path is not None else _class_pairs(src)}
        reference = None
    else:
        if config is not None:
            raise BenchError(f"{where} name the configs of this multi-shift import; drop --config")
        if csv_path is not None:
            per_config = {s: by_shift[s] for s in sorted(by_shift)}
        else:
            if bad := [d for d in dirs if not CONFIG_RE.fullmatch(display(d.name))]:
                raise BenchError(f"shift folder(s) {_names(bad)} in {display(src)} are not valid config names; rename "
                                 "them with lower-case letters, digits, '_' or '-' (at most 64 characters)")
            if top:
                log.warning("ignoring %d file(s) at the top of %s: only <shift>/<wnid>/ folders are imported",
                            len(top), display(src))
            per_config = {d.name: _class_pairs(d) for d in dirs}
        reference = check_name(base or "base")
        if reference not in per_config:
            raise BenchError(f"{where} have no shift {reference!r} (found {', '.join(map(repr, per_config))}); name "
                             "the in-distribution shift base or pass --base NAME")
        if len(per_config) < 2:
            raise BenchError(f"{where} hold only the reference {reference!r}; add at least one shift beside it, or "
                             "import it as one config")
        if empty := [c for c, p in per_config.items() if not p]:
            raise BenchError(f"shift(s) {', '.join(map(repr, empty))} hold no images; add images or remove them")
    items, seen = [], {}
    for cfg, pairs in per_config.items():
        for path, label in pairs:
            if not path.is_file():
                raise BenchError(f"{display(path)} is listed but does not exist")
            iid = f"{cfg}/{imagenet.wnids()[label]}/{display(path.stem)}"
            if iid in seen:
                raise BenchError(f"duplicate image id {iid!r}: {display(seen[iid])} and {display(path)} share a class "
                                 "and file stem; rename one of them")
            seen[iid] = path
            try:
                rel = display(path.relative_to(src))
            except ValueError:  # a CSV's absolute path outside the folder: relative to the CSV, never the
                # machine's absolute path (source_path is published with the suite)
                here = Path(os.path.relpath(path, Path(csv_path).resolve().parent)) if csv_path else path
                rel = display(here)
            items.append(Item(path, rel, label, iid, cfg))
    if not items:
        raise BenchError(f"no images found in {display(src)}; expected <wnid>/<image> files, "
                         "<shift>/<wnid>/<image> files or a --csv list")
    return Layout(sorted(items, key=lambda it: it.image_id), tuple(per_config), reference)


@dataclass(frozen=True)
class ImageInfo:
    """How one source file is stored (recorded per row)."""

    source_format: str
    source_mode: str
    exif_orientation: int
    reencoded: bool


def decode_image(data: bytes, *, pixels: bool = True):
    """Fully decode ``data`` -> ``(8-bit RGB/L image, or None without pixels, ImageInfo)``; raise on errors."""
    from PIL import Image, ImageFile, ImageOps

    truncated_ok = ImageFile.LOAD_TRUNCATED_IMAGES
    ImageFile.LOAD_TRUNCATED_IMAGES = False  # a truncated file must fail, whoever set this
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "Corrupt EXIF data": the pixels still decode
            warnings.simplefilter("error", Image.DecompressionBombWarning)  # > 89 Mpx: refused, bounded memory
            with Image.open(io.BytesIO(data)) as im:
                check_size(im.size)  # from the header: a 208-byte PNG may claim 20000x2 pixels
                im.load()
                fmt, mode = im.format or "unknown", im.mode
                orientation = im.getexif().get(0x0112, 1)  # the EXIF Orientation tag
                orientation = orientation if isinstance(orientation, int) and 1 <= orientation <= 8 else 1
                passthrough = fmt == "JPEG" and mode in ("RGB", "L") and orientation == 1
                out = None
                if pixels or not passthrough:  # conversions can fail too (e.g. 32-bit values out of range)
                    out = to_8bit(ImageOps.exif_transpose(im) if orientation != 1 else im)
                    out = (out.copy() if out is im else out) if pixels else None
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = truncated_ok
    return out, ImageInfo(fmt, mode, int(orientation), not passthrough)


def check_image(data: bytes) -> tuple[ImageInfo | None, str | None]:
    """``(info, None)`` if ``data`` decodes completely, else ``(None, reason)``."""
    try:
        return decode_image(data, pixels=False)[1], None
    except Exception as e:  # any decoder failure means "not a usable image"
        return None, f"{type(e).__name__}: {e}"


def stored_bytes(data: bytes, info: ImageInfo | None = None) -> tuple[bytes, ImageInfo]:
    """The bytes to store for a source file: itself (a plain JPEG) or a lossless PNG of the pixels ``bench eval``
    decodes; ``info`` from an earlier ``check_image`` of the same bytes saves decoding a JPEG again."""
    if info is not None and not info.reencoded:
        return data, info
    im, info = decode_image(data)
    if not info.reencoded:
        return data, info
    buf = io.BytesIO()
    # zlib level 1: ~3x faster than Pillow's default 6 for ~10% more bytes (512x512 photo);
    # no metadata is written, so the same pixels always give the same bytes
    im.save(buf, format="PNG", compress_level=1)
    return buf.getvalue(), info


def _check_file(path: Path) -> tuple[ImageInfo | None, str | None, bytes | None]:
    """``(info, reason, sha256)`` of one file (runs in worker processes)."""
    try:
        size = path.stat().st_size
        if size > MAX_IMAGE_BYTES:
            return None, f"{size} bytes, over the {MAX_IMAGE_BYTES >> 20} MiB limit for one image", None
        data = read_limited(path, max_bytes=MAX_IMAGE_BYTES, what="image")  # bounded if it grew since the stat
    except OSError as e:
        return None, f"cannot be read: {e.strerror}", None
    except IntegrityError as e:
        return None, str(e), None
    info, why = check_image(data)
    return info, why, hashlib.sha256(data).digest() if info is not None else None


def _store_file(path: Path, digest: bytes, info: ImageInfo) -> bytes | None:
    """The bytes to store for a checked file, or ``None`` if it changed or went since (worker processes)."""
    try:
        data = read_limited(path, max_bytes=MAX_IMAGE_BYTES, what="image")
    except IntegrityError:
        return None
    return stored_bytes(data, info)[0] if hashlib.sha256(data).digest() == digest else None  # bytes as checked


def _worker_init(parent: int) -> None:
    """Worker processes end when the import dies, even by ``kill -9`` (they would wait forever)."""
    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)
    threading.Thread(target=watch, daemon=True).start()


def _in_order(fn, jobs: list[tuple], pool, *, window: int | None = None):
    """``fn(*job)`` of each job, in order: here, or in the pool in tasks of ``CHUNK`` jobs (one task per
    image costs more than a small image), ``window`` jobs at a time (bounded memory; default all)."""
    window = window or max(len(jobs), 1)
    for a in range(0, len(jobs), window):
        part = jobs[a:a + window]
        if pool is None:
            yield from (fn(*job) for job in part)
        else:
            yield from pool.map(fn, *zip(*part), chunksize=CHUNK)


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # this process starts an import only after its previous one ended
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_leftovers(out: Path) -> list[Path]:
    """Remove the ``.<out name>.<pid>[.old].incomplete`` folders of killed imports to ``out``; returns them."""
    pattern = re.compile(rf"^\.{re.escape(out.name)}\.(\d+)(\.old)?\.incomplete$")
    removed = []
    for p in out.parent.iterdir() if out.parent.is_dir() else ():
        m = pattern.fullmatch(p.name)
        if m and not _pid_alive(int(m.group(1))):
            log.warning("removing %s left by an interrupted import", display(p))
            _remove(p)
            removed.append(p)
    return removed


def import_folder(src: str | Path, *, name: str, out: str | Path, config: str | None = None,
                  csv_path: str | Path | None = None, base: str | None = None, overwrite: bool = False,
                  skip_bad_images: bool = False, shard_size: int = 1000, workers: int | None = None,
                  progress: bool = True, card: Callable[[Manifest], str] | None = None) -> Manifest:
    """Import images into a new suite at ``out``; returns its ``Manifest``. ``card``: e.g.
    ``genshift.data_cards.import_card``. ``workers`` processes decode and convert images (default: one per CPU, at
    most ``DEFAULT_WORKERS``; 0 = in this process): rows and shards are the same for any number."""
    # every option is checked before any file is read
    check_name(name, "suite id (name)")  # a path component (runs/<suite id>/...) and the card's title
    for value in (config, base):
        if value is not None:
            check_name(value)
    if not isinstance(shard_size, int) or not 1 <= shard_size <= MAX_SHARD_SIZE:
        raise BenchError(f"--shard-size must be between 1 and {MAX_SHARD_SIZE}, got {shard_size}")
    if workers is None:
        workers = min(DEFAULT_WORKERS, os.cpu_count() or 1)
    if not isinstance(workers, int) or not 0 <= workers <= MAX_WORKERS:
        raise BenchError(f"--workers must be between 0 and {MAX_WORKERS}, got {workers}")
    src, out = Path(src), Path(out)
    if out.name in ("", ".", ".."):
        raise BenchError(f"--out {display(out)!r} must name a folder to create (like ./my-suite)")
    clean_leftovers(out)
    layout = discover(src, config=config, csv_path=csv_path, base=base)
    # checks only: an existing output is replaced at the very end, so a failed import keeps it
    prepare_fresh_dir(out, overwrite=overwrite, marker_files=(MANIFEST, "build.json"), what="--out", remove=False)
    pool = (ProcessPoolExecutor(workers, initializer=_worker_init, initargs=(os.getpid(),))
            if workers > 0 and len(layout.items) > CHUNK else None)
    try:
        return _import(layout, src, out, name=name, overwrite=overwrite, skip_bad_images=skip_bad_images, card=card,
                       shard_size=shard_size, pool=pool, window=4 * CHUNK * max(workers, 1), progress=progress)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)


def _import(layout: Layout, src: Path, out: Path, *, name: str, overwrite: bool, skip_bad_images: bool,
            shard_size: int, pool, window: int, progress: bool, card) -> Manifest:
    from datasets import Value
    from tqdm.auto import tqdm

    skipped, checked = [], {}  # checked: image id -> (sha256, ImageInfo) of the readable images
    results = _in_order(_check_file, [(it.path,) for it in layout.items], pool)
    for it, (info, why, digest) in tqdm(zip(layout.items, results), total=len(layout.items), desc="decode images",
                                        unit="img", disable=not progress):
        if info is not None:
            checked[it.image_id] = (digest, info)
        elif skip_bad_images:
            skipped.append(it.rel)
        else:
            raise BenchError(f"{it.rel} is not a readable image ({why}); remove it or pass --skip-bad-images")
    if not checked:
        raise BenchError(f"none of the {len(layout.items)} files in {display(src)} is a readable image")
    by_config = {c: [it for it in layout.items if it.config == c and it.image_id in checked] for c in layout.configs}
    if empty := [c for c, its in by_config.items() if not its]:
        raise BenchError(f"config(s) {', '.join(map(repr, empty))} have no readable image left; fix or add images")

    tmp = out.parent / f".{out.name}.{os.getpid()}.incomplete"
    tmp.mkdir()  # mode 0777 & ~umask: the suite gets the user's normal permissions
    try:
        bar = tqdm(total=len(checked), desc=f"import {name}", unit="img", disable=not progress)

        def rows(block):
            stored = _in_order(_store_file, [(it.path, *checked[it.image_id]) for it in block], pool, window=window)
            for it, data in zip(block, stored):
                if data is None:
                    raise BenchError(f"{it.rel} changed during the import; rerun when the folder is not being written")
                bar.update(1)
                yield {"image": {"bytes": data, "path": None}, "label": it.label, "image_id": it.image_id,
                       "config": it.config, "keep": True, "pair_id": None, "source_path": it.rel,
                       **asdict(checked[it.image_id][1])}  # source_format, source_mode, exif_orientation, reencoded

        extra = {"source_path": Value("string"), "source_format": Value("string"), "source_mode": Value("string"),
                 "exif_orientation": Value("int8"), "reencoded": Value("bool")}
        with SuiteWriter(tmp, suite_id=name, extra_features=extra) as w:
            for cfg, its in by_config.items():
                shards = [its[a:a + shard_size] for a in range(0, len(its), shard_size)]
                for i, block in enumerate(shards):
                    w.write_shard(cfg, i, len(shards), rows(block))
            bar.close()
            generator = {"builder": "bench import-folder", "images": len(checked),
                         "n_skipped_bad_images": len(skipped), "skipped_bad_images": skipped[:1000],
                         "image_storage": "JPEG (RGB/L, no EXIF rotation) as is; all else 8-bit PNG"}
            if layout.reference is not None:
                # read by bench eval for suites outside the registry: score as ImageNet*
                generator.update(metric_family="imagenet_star", reference_config=layout.reference)
            w.finalize(generator=generator, card=card)
        (tmp / "build.json").unlink(missing_ok=True)
        # into place: a replaced suite is moved aside first and removed last, so a kill at any point leaves
        # either suite plus leftovers the next run cleans
        prepare_fresh_dir(out, overwrite=overwrite, marker_files=(MANIFEST, "build.json"), what="--out", remove=False)
        old = out.parent / f".{out.name}.{os.getpid()}.old.incomplete"
        if out.exists():
            os.rename(out, old)
        os.rename(tmp, out)
        _remove(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if skipped:
        log.warning("skipped %d unreadable file(s), e.g. %s", len(skipped), skipped[0])
    return Manifest.load(out)


def _remove(path: Path) -> None:
    if path.is_symlink():  # an --out that was a link: the link goes, never what it points to
        path.unlink()
    elif path.exists():
        shutil.rmtree(path, ignore_errors=True)
