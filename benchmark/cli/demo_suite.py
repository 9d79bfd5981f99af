"""`bench demo-suite`: a small suite of random-noise images, to try every verb with no network."""

from __future__ import annotations

from genshift.cli._common import add_verb, bounded_int, csv_list, positive_int


def add_parser(sub):
    p = add_verb(sub, "demo-suite", help="write a small synthetic suite (noise images) to try bench offline",
                 description="Write a suite in format 1.1 of coloured noise images (the same options give the same "
                             "bytes), with its card: any model scores about 0% on it; it checks the plumbing.",
                 examples="  bench demo-suite --out demo-suite --configs base,in_the_snow\n"
                          "  bench demo-suite --out big-demo --classes 100 --per-class 10 --shards 2\n")
    p.add_argument("--out", required=True, help="the new suite folder (must not exist or be empty)")
    p.add_argument("--suite-id", default="demo", help="the suite id written to the manifest (default: demo)")
    p.add_argument("--configs", type=csv_list, default=["base", "shifted"],
                   help="comma-separated config names (default: base,shifted)")
    p.add_argument("--classes", type=bounded_int(1, 1000), default=10, help="use classes 0..N-1 (1..1000, default 10)")
    p.add_argument("--per-class", type=positive_int, default=4, help="images per class and config (default 4)")
    p.add_argument("--shards", type=positive_int, default=1, help="parquet shards per config (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the noise images (default 0)")
    return p


def run(args) -> int:
    from genshift.data_cards import demo_card
    from genshift.synthetic import make_synthetic_suite

    m = make_synthetic_suite(args.out, suite_id=args.suite_id, configs=args.configs, classes=range(args.classes),
                             per_class=args.per_class, num_shards=args.shards, seed=args.seed, card=demo_card)
    print(f"wrote {args.out}: {sum(c.rows for c in m.configs.values())} rows, manifest sha256 {m.sha256}")
    return 0
