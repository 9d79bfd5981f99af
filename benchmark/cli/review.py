"""`bench review`: verify, sign, comment on and publish pull requests to the results repo."""

from __future__ import annotations

from genshift.cli._common import add_verb, bounded_int, positive_int, print_table
from genshift.cli.verify import recheck_arg


def add_parser(sub):
    p = add_verb(sub, "review", help="verify every open pull request on the results repo (maintainers)",
                 description="Review every open pull request on the results dataset repo not yet answered at its "
                             "head (at most 3 per submitter, oldest first): check each entry's identity and folder, "
                             "re-run rows drawn from the suite through the model, answer in a comment ending with a "
                             "marker signed by --key, and with --merge commit exactly the reviewed files and their "
                             "signed records to main (docs/leaderboard.md, \"Automatic verification\"). Exits non-zero "
                             "only when the service failed, never for a bad submission. Needs HF_TOKEN with write "
                             "access.",
                 examples="  bench review --repo my-org/genshift-results --key maintainer.key --merge\n"
                          "  bench review --repo my-org/genshift-results --key maintainer.key --merge --watch 600\n"
                          "  bench review --repo my-org/genshift-results --key maintainer.key --again 12 "
                          "--checkpoint w.pt\n")
    p.add_argument("--repo", required=True, help="results dataset repo ORG/NAME on the Hub")
    p.add_argument("--key", required=True,
                   help="maintainer's ed25519 private key (bench keygen) that signs stamps and the review answers")
    p.add_argument("--recheck", type=recheck_arg, default="auto", metavar="N|all|auto",
                   help="rows per entry re-run through the model, drawn with a fresh seed (default auto: the "
                        "guaranteed sample; every row for Hub weights with --device cuda)")
    p.add_argument("--batch-size", type=positive_int, default=32, help="images per forward pass (default 32)")
    p.add_argument("--merge", action="store_true", help="publish what passes: commit exactly the reviewed files and "
                                                        "their stamps to main, close the pull request")
    p.add_argument("--publish-model-results", action="store_true",
                   help="with --merge: open (or update) a pull request on each published Hub model's repo adding "
                        ".eval_results/<suite id>.yaml, linked in the answer (docs/hub.md)")
    p.add_argument("--watch", type=bounded_int(1, 604800, "seconds"), metavar="SECONDS",
                   help="keep running: a pass every SECONDS, a failed pass retried at the next (default: one pass, "
                        "for scheduled CI)")
    p.add_argument("--suite", help="the suite the entries were scored on, a trusted folder or Hub repo (default: found "
                                   "among --suites / the registry's pinned suites)")
    p.add_argument("--suites", metavar="DIR", help="a folder of trusted suite manifests (*.json) and/or suite folders")
    p.add_argument("--checkpoint", help="local weights for results scored with --checkpoint (default: the recorded "
                                        "Hub weights); other local weights are answered 'cannot be checked'")
    p.add_argument("--device", default="cpu", help="device for the image re-runs (default: cpu)")
    p.add_argument("--again", type=positive_int, action="append", default=[], metavar="PR",
                   help="review pull request PR again although it was answered at its head (e.g. now with "
                        "--checkpoint, or with the --recheck sample after a failed re-run); repeatable")
    return p


def _print(outcomes) -> None:
    rows = [{"PR": f"#{o.pr}", "head": o.head[:12],
             "outcome": o.status + (f" ({o.earlier} earlier)" if o.earlier else "") + (" + merged" if o.merged else ""),
             "entries": ", ".join(o.entries) or "-", "first problem": (o.problems[0][:100] if o.problems else "-")}
            for o in outcomes]
    if rows:
        print_table(rows, ["PR", "head", "outcome", "entries", "first problem"])
    else:
        print("no open pull requests")


def run(args) -> int:
    from genshift.leaderboard.review import Reviewer, watch

    reviewer = Reviewer(args.repo, key_path=args.key, recheck=args.recheck, merge=args.merge, suite=args.suite,
                        suites=args.suites, checkpoint=args.checkpoint, device=args.device, again=tuple(args.again),
                        batch_size=args.batch_size, publish_model_results=args.publish_model_results)
    if args.watch:
        watch(reviewer, args.watch, report=_print)
        return 0
    outcomes = reviewer.run_once()
    _print(outcomes)
    return 1 if any(o.status == "error" for o in outcomes) else 0  # "error": the service failed on that PR
