"""`bench import-folder`: turn a folder of your own images into a suite (format 1)."""

from __future__ import annotations

from benchmark.cli._common import add_verb, positive_int


def add_parser(sub):
    p = add_verb(sub, "import-folder", help="turn a folder of images into a suite in format 1",
                 description="Import images in ImageNet wnid sub-folders (or listed in a CSV of path,label) as a "
                             "suite that `bench eval` scores. Image bytes are embedded unchanged.",
                 examples="  bench import-folder ./my-shift --name my-shift --out ./my-shift-suite\n"
                          "  bench import-folder ./photos --csv labels.csv --name photos --config night --out suite/\n")
    p.add_argument("folder", help="folder of <wnid>/<image> files (or the root of the CSV's paths)")
    p.add_argument("--name", required=True, help="suite id written into the manifest")
    p.add_argument("--config", default="default", help="config name (default: default)")
    p.add_argument("--csv", help="CSV of path,label (label: wnid or class index)")
    p.add_argument("--out", required=True, help="output suite folder (must not exist unless --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing suite at --out")
    p.add_argument("--skip-bad-images", action="store_true", help="skip (and count) files that do not decode")
    p.add_argument("--shard-size", type=positive_int, default=1000, help="images per parquet shard")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    return p


def run(args) -> int:
    from benchmark.importer import import_folder

    m = import_folder(args.folder, name=args.name, out=args.out, config=args.config, csv_path=args.csv,
                      overwrite=args.overwrite, skip_bad_images=args.skip_bad_images, shard_size=args.shard_size,
                      progress=args.progress)
    c = m.configs[args.config]
    print(f"wrote {args.out}: suite {m.suite_id}, config {args.config}, {c.rows} images in {len(c.files)} shard(s); "
          f"manifest sha256 {m.sha256}")
    return 0
