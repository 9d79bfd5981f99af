"""`bench verify`: check a result against its suite (hashes, rows, recomputed metrics, optional re-run
and signed stamp) or a suite folder against its manifest."""

from __future__ import annotations

from pathlib import Path

from genshift.cli._common import add_verb, bounded_int, print_json


def recheck_arg(text: str) -> int | str:
    """``--recheck`` of ``bench verify`` and ``bench review``: ``auto`` (the guaranteed sample), ``all`` or N."""
    if text in ("auto", "all"):
        return text
    return bounded_int(1, 10**8, "a number of images, 'auto' or 'all'")(text)


def add_parser(sub):
    p = add_verb(
        sub, "verify", help="verify a result against its suite, or a suite folder",
        description="Verify a result against the suite it claims: schema, predictions files, the suite's "
                    "trusted manifest, config hash and every metric recomputed; --recheck re-runs rows drawn from "
                    "the suite through the model (docs/leaderboard.md), --sign KEY then writes a signed "
                    "verification.json. Given a suite folder, check its files against its manifest. Exits 1 on any "
                    "mismatch, naming what differs. Trust roots: docs/results.md.",
        examples="  bench verify runs/imagenet-star/timm--resnet50.a1_in1k --suite imagenet-star\n"
                 "  bench verify ENTRY --suites trusted-suites/ --sign ~/.genshift/maintainer.key\n"
                 "  bench verify ENTRY --suite imagenet-star --recheck all --device cuda\n"
                 "  bench verify ./my-suite\n")
    p.add_argument("path", help="result.json, a run folder holding one, or a suite folder")
    p.add_argument("--recheck", type=recheck_arg, nargs="?", const="auto", default=None, metavar="N|all",
                   help="re-run rows drawn from the suite through the model and compare the stored rows (default "
                        "when given without a value, and with --sign: the guaranteed sample size)")
    p.add_argument("--batch-size", type=bounded_int(1, 4096, "a batch size"), default=32,
                   help="images per forward pass of --recheck (bounds its memory; default 32)")
    p.add_argument("--suite", help="the suite to check against (a trust root): a suite folder, a manifest.json, a "
                                   "registry id or a Hub repo; also where --recheck reads images")
    p.add_argument("--suites", metavar="DIR", help="a folder of trusted suite manifests (*.json) and/or suite folders")
    p.add_argument("--mask", help="ImageNet* upstream masks.npy for --recheck (default: the file the result recorded)")
    p.add_argument("--checkpoint", help="local weights, for results made with --checkpoint (never for Hub weights)")
    p.add_argument("--device", default="cpu", help="device for --recheck (cpu, cuda, cuda:1)")
    p.add_argument("--seed", type=bounded_int(0, 2**63 - 1, "a seed"), default=None,
                   help="which rows --recheck draws (default: a fresh random seed, recorded)")
    p.add_argument("--sign", metavar="KEY", help="on success write verification.json signed with this private key "
                                                 "(bench keygen); re-checks images (--recheck, default guaranteed)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def run(args) -> int:
    from genshift.errors import BenchError
    from genshift.eval.results import load_result
    from genshift.eval.stamps import load_private_key, unrankable, write_stamp
    from genshift.eval.suite_trust import TrustedSuites
    from genshift.eval.verify import result_path, verify_result, verify_suite_dir

    target = Path(args.path)
    if target.is_dir() and (target / "manifest.json").is_file():
        print(verify_suite_dir(target))
        return 0
    key = None
    if args.sign:
        args.recheck = args.recheck or "auto"  # a verified badge means images were re-run through the model
        key = load_private_key(args.sign)  # before minutes of work, as is a partial result: one line, nothing re-run
        if result_path(target).is_file() and (why := unrankable(load_result(result_path(target)))):
            raise BenchError(f"--sign refused for {target}: {why}")
    suites = TrustedSuites.from_paths([args.suites], registry=True, download=True) if args.suites else None
    report = verify_result(target, recheck=args.recheck, suite=args.suite, suites=suites, mask=args.mask,
                           checkpoint=args.checkpoint, device=args.device, seed=args.seed,
                           batch_size=args.batch_size, use_recorded_suite=key is None)
    stamp = write_stamp(report, key) if key is not None and report.ok else None
    if args.json:
        print_json({"path": str(report.path), "ok": report.ok, "problems": report.problems, "checked": report.checked,
                    "recheck": report.recheck, "stamp": str(stamp) if stamp else None})
    else:
        for line in report.checked:
            print(f"checked: {line}")
        for line in report.problems:
            print(f"MISMATCH: {line}")
        if stamp:
            print(f"stamp: {stamp}")
        print(("OK: " if report.ok else "FAILED: ") + str(report.path))
    return 0 if report.ok else 1
