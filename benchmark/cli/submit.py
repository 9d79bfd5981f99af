"""`bench submit`: open a pull request with a result on the results repo."""

from __future__ import annotations

from genshift.cli._common import add_verb


def add_parser(sub):
    p = add_verb(sub, "submit", help="propose a result to the leaderboard (a pull request)",
                 description="Check a result locally, then open ONE pull request adding it to the results dataset repo "
                             "(docs/leaderboard.md); with --model-repo, once merged, one adding .eval_results/<suite "
                             "id>.yaml to the model's Hub repo (docs/hub.md).",
                 examples="  bench submit runs/imagenet-star/timm--resnet50.a1_in1k --repo genshift-bench/results\n"
                          "  bench submit runs/imagenet-star/timm--resnet50.a1_in1k --repo genshift-bench/results "
                          "--model-repo timm/resnet50.a1_in1k --trusted-keys trusted\n")
    p.add_argument("result", help="result.json or its run folder")
    p.add_argument("--repo", required=True, help="results dataset repo ORG/NAME")
    p.add_argument("--message", help="pull request title")
    p.add_argument("--model-repo", metavar="ORG/NAME",
                   help="report the merged entry on this Hub model repo instead (a Hub model's only on its own repo)")
    p.add_argument("--trusted-keys", metavar="FILE",
                   help="with --model-repo: maintainers' public keys; verified only if its stamp is signed by one")
    p.add_argument("--endpoint", help="Hub endpoint URL (default: HF_ENDPOINT, else https://huggingface.co)")
    return p


def run(args) -> int:
    from genshift.leaderboard.submit import submit, submit_to_model_repo

    if args.model_repo:
        url, what = submit_to_model_repo(args.result, args.repo, args.model_repo, trusted_keys=args.trusted_keys,
                                         endpoint=args.endpoint)
        print(f"{url} ({what})")
        return 0
    print(submit(args.result, args.repo, message=args.message, endpoint=args.endpoint))
    return 0
