"""`bench publish`: upload a built suite to the Hub, tag it, gate it when its card asks."""

from __future__ import annotations

from genshift.cli._common import add_verb, non_negative_float


def add_parser(sub):
    p = add_verb(sub, "publish", help="upload a built suite, tag it, and gate it when its card asks",
                 description="Verify a suite folder, then upload its card, manifest and shards to a Hub dataset repo "
                             "(ONE commit against the head, or resumably above --large-threshold), tag it, gate it "
                             "when the card asks and print the commit sha to pin (docs/hub.md section 6). Needs a "
                             "token with write access; HF_ENDPOINT or --endpoint picks the Hub.",
                 examples="  bench publish ./imagenet-star --repo my-org/imagenet-star\n"
                          "  bench publish ./in-g-rn --repo my-org/in-g-rn --tag v1.0.1 --private\n"
                          "  bench publish ./lance --repo my-org/lance-hardimagenet --gating manual\n"
                          "  bench publish ./big-suite --repo my-org/big --large-threshold 0   # always resumable\n")
    p.add_argument("folder", help="a finished suite folder (has manifest.json)")
    p.add_argument("--repo", required=True, help="ORG/NAME of the dataset repo (created if needed)")
    p.add_argument("--tag", help="tag for the commit (default: v<suite_version>)")
    p.add_argument("--private", action="store_true", help="create the repo private (only when it does not exist yet)")
    p.add_argument("--message", help="commit message")
    p.add_argument("--large-threshold", type=non_negative_float, default=5.0, metavar="GB",
                   help="suites above this many GB upload resumably in several commits (default: 5; 0: always)")
    p.add_argument("--gating", choices=("auto", "manual"), default="auto",
                   help="how access requests are approved when the card asks for gating (default: auto)")
    p.add_argument("--endpoint", help="Hub endpoint URL (default: HF_ENDPOINT, else https://huggingface.co)")
    return p


def run(args) -> int:
    from genshift.hub import publish_suite

    sha = publish_suite(args.folder, args.repo, tag=args.tag, private=args.private, commit_message=args.message,
                        endpoint=args.endpoint, large_threshold=int(args.large_threshold * 1e9), gating=args.gating)
    print(sha)
    return 0
