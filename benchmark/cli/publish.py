"""`bench publish`: upload a built suite to the Hub in one commit and tag it."""

from __future__ import annotations

from benchmark.cli._common import add_verb


def add_parser(sub):
    p = add_verb(sub, "publish", help="upload a built suite in one commit and tag it",
                 description="Verify a suite folder, then upload its card, manifest and shards to a Hub dataset repo in "
                             "ONE commit (against the current head, so a concurrent commit makes it fail), and tag "
                             "that commit (default v<suite_version>). Prints the commit sha to pin. Only README.md, "
                             "manifest.json and the files the manifest lists are uploaded. Needs a token with write "
                             "access (`hf auth login` or HF_TOKEN); HF_ENDPOINT or --endpoint picks the Hub.",
                 examples="  bench publish ./imagenet-star --repo my-org/imagenet-star\n"
                          "  bench publish ./in-g-rn --repo my-org/in-g-rn --tag v1.0.1 --private\n")
    p.add_argument("folder", help="a finished suite folder (has manifest.json)")
    p.add_argument("--repo", required=True, help="ORG/NAME of the dataset repo (created if needed)")
    p.add_argument("--tag", help="tag for the commit (default: v<suite_version>)")
    p.add_argument("--private", action="store_true", help="create the repo private (only when it does not exist yet)")
    p.add_argument("--message", help="commit message")
    p.add_argument("--endpoint", help="Hub endpoint URL (default: HF_ENDPOINT, else https://huggingface.co)")
    return p


def run(args) -> int:
    from benchmark.hub import publish_suite

    sha = publish_suite(args.folder, args.repo, tag=args.tag, private=args.private, commit_message=args.message,
                        endpoint=args.endpoint)
    print(sha)
    return 0
