"""`bench verify`: check a result (hashes, recomputed metrics, optional re-run) or a suite folder."""

from __future__ import annotations

from pathlib import Path

from benchmark.cli._common import add_verb, print_json


def add_parser(sub):
    p = add_verb(
        sub, "verify", help="verify a result or a suite folder",
        description="Verify a result: predictions files match their sha256, the config hash recomputes, and every "
                    "metric recomputes from the stored predictions; --recheck N also re-runs N random images "
                    "through the model. Given a suite folder, check every file against its manifest. "
                    "Exits 1 on any mismatch, naming what differs.",
        examples="  bench verify runs/imagenet-star/timm--resnet50.a1_in1k/result.json\n"
                 "  bench verify runs/imagenet-star/timm--resnet50.a1_in1k --recheck 50\n"
                 "  bench verify ./my-suite\n")
    p.add_argument("path", help="result.json, a run folder holding one, or a suite folder")
    p.add_argument("--recheck", type=int, default=0, metavar="N", help="re-run N random images through the model")
    p.add_argument("--suite", help="where to read the suite for --recheck (default: as recorded)")
    p.add_argument("--mask", help="ImageNet* upstream masks.npy for --recheck (default: the file the result recorded)")
    p.add_argument("--checkpoint", help="local weights, for results made with --checkpoint")
    p.add_argument("--device", default="cpu", help="device for --recheck (cpu, cuda or cuda:N)")
    p.add_argument("--seed", type=int, default=0, help="which images --recheck picks")
    p.add_argument("--stamp", action="store_true",
                   help="with --recheck: on success write verification.json (the leaderboard's verified badge)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def run(args) -> int:
    from benchmark.errors import BenchError
    from eval.verify import verify_result, verify_suite_dir

    target = Path(args.path)
    if target.is_dir() and (target / "manifest.json").is_file():
        print(verify_suite_dir(target))
        return 0
    if args.recheck < 0:
        raise BenchError(f"--recheck must be >= 0, got {args.recheck}")
    if args.stamp and args.recheck < 1:
        raise BenchError("--stamp needs --recheck N (a verified badge means images were re-run through the model)")
    report = verify_result(target, recheck=args.recheck, suite=args.suite, mask=args.mask, checkpoint=args.checkpoint,
                           device=args.device, seed=args.seed)
    if args.stamp and report.ok:
        from leaderboard.store import write_stamp

        print(f"stamp: {write_stamp(report.path, recheck=args.recheck, checked=report.checked)}")
    if args.json:
        print_json({"path": str(report.path), "ok": report.ok, "problems": report.problems, "checked": report.checked})
    else:
        for line in report.checked:
            print(f"checked: {line}")
        for line in report.problems:
            print(f"MISMATCH: {line}")
        print(("OK: " if report.ok else "FAILED: ") + str(report.path))
    return 0 if report.ok else 1
