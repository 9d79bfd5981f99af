"""`bench submit`: open a pull request with a result on the results repo."""

from __future__ import annotations

from benchmark.cli._common import add_verb


def add_parser(sub):
    p = add_verb(sub, "submit", help="propose a result to the leaderboard (a pull request)",
                 description="Check a result locally (schema, hashes, recomputed metrics, size limits), then open ONE "
                             "pull request adding it and its predictions to the results dataset repo. Maintainers "
                             "verify with `bench verify --recheck N --sign KEY` and merge (docs/leaderboard.md).",
                 examples="  bench submit runs/imagenet-star/timm--resnet50.a1_in1k --repo genshift-bench/results\n")
    p.add_argument("result", help="result.json or its run folder")
    p.add_argument("--repo", required=True, help="results dataset repo ORG/NAME")
    p.add_argument("--message", help="pull request title")
    return p


def run(args) -> int:
    from leaderboard.submit import submit

    print(submit(args.result, args.repo, message=args.message))
    return 0
