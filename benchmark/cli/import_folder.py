"""`bench import-folder`: turn a folder of your own images into a suite (format 1)."""

from __future__ import annotations

from genshift.cli._common import add_verb


def add_parser(sub):
    p = add_verb(sub, "import-folder", help="turn a folder of images (one shift or several) into a suite in format 1",
                 description="Import images in wnid sub-folders (or a CSV of path,label) as a one-config suite, or "
                             "shift folders (<shift>/<wnid>/<image>, one of them 'base') as an ImageNet*-style suite. "
                             "JPEGs are stored as they are, other images as 8-bit PNG (docs/hub.md section 7).",
                 examples="  bench import-folder ./my-shift --name my-shift --out ./my-shift-suite\n"
                          "  bench import-folder ./photos --csv labels.csv --name photos --config night --out suite/\n"
                          "  bench import-folder ./my-shifts --name my-shifts --out ./my-shifts-suite"
                          "   # base/<wnid>/..., fog/<wnid>/...\n")
    p.add_argument("folder", help="folder of <wnid>/<image> or <shift>/<wnid>/<image> files, or the CSV's root")
    p.add_argument("--name", required=True,
                   help="suite id written into the manifest (lower-case letters, digits, '_', '-'; at most 64)")
    p.add_argument("--config", default=None,
                   help="config name of a one-config import (default: default); shift folders name their own")
    p.add_argument("--base", default=None, help="the in-distribution shift of a multi-shift import (default: base)")
    p.add_argument("--csv", help="CSV of path,label (label: wnid or class index), UTF-8 with or without BOM; "
                                 "a header path,label,shift makes one config per shift")
    p.add_argument("--out", required=True, help="output suite folder (must not exist unless --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing suite at --out")
    p.add_argument("--skip-bad-images", action="store_true",
                   help="skip (and count in the manifest) files that do not fully decode, instead of stopping")
    p.add_argument("--shard-size", type=int, default=1000, help="images per parquet shard (1..100000; default 1000)")
    p.add_argument("--workers", type=int, default=None, help="processes that decode and convert images (0..256; "
                   "default: one per CPU, at most 8; 0 = in the main process); the suite is the same for any number")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    return p


def run(args) -> int:
    from genshift.data_cards import import_card
    from genshift.importer import display, import_folder

    m = import_folder(args.folder, name=args.name, out=args.out, config=args.config, csv_path=args.csv,
                      base=args.base, overwrite=args.overwrite, skip_bad_images=args.skip_bad_images,
                      shard_size=args.shard_size, workers=args.workers, progress=args.progress, card=import_card)
    for name, c in sorted(m.configs.items()):
        print(f"wrote {display(args.out)}: suite {m.suite_id}, config {name}, {c.rows} images in "
              f"{len(c.files)} shard(s)")
    if m.generator.get("reference_config"):
        print(f"scored as ImageNet* (reference config {m.generator['reference_config']})")
    print(f"manifest sha256 {m.sha256}")
    return 0
