"""`bench build <suite>`: regenerate a benchmark suite (GPU; `--smoke` runs tiny models on CPU)."""

from __future__ import annotations

import argparse
import importlib

from benchmark.cli._common import add_verb


def add_parser(sub):
    from builders import BUILDERS

    p = add_verb(sub, "build", help="regenerate a benchmark suite into a folder (format 1)",
                 description="Regenerate a suite with its builder. Shards are written atomically and a rerun "
                             "resumes; `accelerate launch -m benchmark build ...` spreads shards over GPUs.",
                 examples="  bench build imagenet-star --smoke --out /tmp/star-smoke\n"
                          "  accelerate launch -m benchmark build imagenet-star --out star/ --tokens tokens.zip\n"
                          "  bench build in-g-rn --smoke --out /tmp/ing\n")
    builders = p.add_subparsers(dest="suite", metavar="<suite>", required=True)
    for suite_id in BUILDERS:
        bp = builders.add_parser(suite_id, help=f"build {suite_id}",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        try:
            module = importlib.import_module(BUILDERS.get(suite_id))
        except ModuleNotFoundError as e:  # builder not available in this checkout
            bp.set_defaults(_builder_error=str(e))
            continue
        module.add_arguments(bp)
        bp.set_defaults(_builder=module)
    return p


def run(args) -> int:
    from benchmark.errors import BenchError

    if getattr(args, "_builder_error", None):
        raise BenchError(f"builder for {args.suite!r} is not available: {args._builder_error}; "
                         "install the builder extras: pip install 'genshift-bench[builders]'")
    return args._builder.run(args)
