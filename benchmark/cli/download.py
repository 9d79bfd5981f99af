"""`bench download`: fetch a suite (or some configs) at a pinned commit and verify it."""

from __future__ import annotations

import sys

from genshift.cli._common import add_mask_options, add_verb, csv_list, mask_arg


def add_parser(sub):
    p = add_verb(sub, "download", help="download a suite at a pinned commit and verify it",
                 description="Download a suite (registered, or any ORG/NAME repo in format 1) at a commit sha, only "
                             "the configs named, verify them and print the local path and the sha; afterwards it works "
                             "offline. The upstream ImageNet* release (or its zips) is converted once and cached.",
                 examples="  bench download imagenet-star --configs base,in_the_snow\n"
                          "  bench download my-org/my-suite --revision 3f2a...c9\n"
                          "  bench download imagenet-star-upstream --configs base,in_the_snow   # + the released mask\n"
                          "  bench download ./imagenet-star-zips --mask masks.npy --strict\n"
                          "  HF_ENDPOINT=http://127.0.0.1:8090 bench download org/suite --revision <sha>\n")
    p.add_argument("suite", help="registry id, ORG/NAME, or a local folder (suite or upstream release)")
    p.add_argument("--revision", help="commit sha, tag or branch (resolved to a sha; offline: a sha only)")
    p.add_argument("--configs", type=csv_list, help="comma-separated configs (default: all)")
    p.add_argument("--cache-dir", help="Hub cache folder (default: HF_HOME's)")
    add_mask_options(p)
    p.add_argument("--strict", action="store_true", help="upstream ImageNet* only: refuse missing or unexpected files")
    p.add_argument("--force-download", action="store_true", help="re-download files even if cached")
    p.add_argument("--endpoint", help="Hub endpoint URL (default: HF_ENDPOINT, else https://huggingface.co)")
    return p


def run(args) -> int:
    from genshift import hub

    suite = hub.open_suite(args.suite, revision=args.revision, configs=args.configs, cache_dir=args.cache_dir,
                           mask=mask_arg(args), strict=args.strict, force_download=args.force_download,
                           endpoint=args.endpoint)
    configs = suite.select(args.configs)
    print(suite.root)
    print(suite.revision or "local")
    source = f"{suite.repo_id}@{suite.revision}" if suite.repo_id else "local folder"
    rows = sum(suite.manifest.config(c).rows for c in configs)
    print(f"verified {suite.suite_id} ({source}{'' if suite.pinned else ', unpinned'}): {len(configs)} config(s), "
          f"{rows} rows, manifest sha256 {suite.manifest.sha256}", file=sys.stderr)
    return 0
