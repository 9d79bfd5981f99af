"""`bench download`: fetch a suite (or some configs) at a pinned commit and verify it."""

from __future__ import annotations

from benchmark.cli._common import add_verb, csv_list


def add_parser(sub):
    p = add_verb(sub, "download", help="download a suite at a pinned commit and verify it",
                 description="Download a registered suite (or any ORG/NAME dataset repo in format 1) at a commit sha, "
                             "only the configs you name, and verify every file against the manifest. Prints the local "
                             "path and the resolved sha.",
                 examples="  bench download imagenet-star --configs base,in_the_snow\n"
                          "  bench download my-org/my-suite --revision 3f2a...c9\n"
                          "  bench download imagenet-star-upstream --configs base --mask masks.npy\n")
    p.add_argument("suite", help="registry id or ORG/NAME")
    p.add_argument("--revision", help="commit sha, tag or branch (resolved to a sha)")
    p.add_argument("--configs", type=csv_list)
    p.add_argument("--cache-dir", help="Hub cache folder (default: HF_HOME's)")
    p.add_argument("--mask", help="imagenet-star-upstream: the authors' masks.npy")
    p.add_argument("--force-download", action="store_true", help="re-download files even if cached")
    return p


def run(args) -> int:
    from benchmark import hub

    suite = hub.open_suite(args.suite, revision=args.revision, configs=args.configs, cache_dir=args.cache_dir,
                           mask=args.mask, force_download=args.force_download)
    print(f"{suite.root}")
    print(f"suite {suite.suite_id} @ {suite.revision} (configs {', '.join(suite.select(args.configs))}; "
          f"manifest sha256 {suite.manifest.sha256}) verified")
    return 0
