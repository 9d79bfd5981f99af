"""`bench build <suite>`: regenerate a benchmark suite (GPU; `--smoke` runs tiny models on CPU)."""

from __future__ import annotations

import argparse
import importlib

from genshift.cli._common import add_verb


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown after each option's help; the description and examples kept as written."""


def _examples(suite_id: str, module) -> str:
    """The builder's own EXAMPLES, else the three ways every builder runs."""
    own = getattr(module, "EXAMPLES", None)
    if own:
        return own
    return (f"  bench build {suite_id} --smoke --out /tmp/{suite_id}-smoke      # whole pipeline, tiny models, CPU\n"
            f"  bench build {suite_id} --out {suite_id}/                        # one GPU; rerun to resume\n"
            f"  accelerate launch -m genshift build {suite_id} --out {suite_id}/   # every GPU (and node)\n")


def _description(module) -> str:
    """The builder module's docstring, its first two paragraphs (what it builds, and how)."""
    doc = (module.__doc__ or "").strip()
    return "\n\n".join(doc.split("\n\n")[:2]).replace("``", "`")


def add_parser(sub):
    from genshift.builders import BUILDERS

    p = add_verb(sub, "build", help="regenerate a benchmark suite into a folder (format 1)",
                 description="Regenerate a suite with its builder. Shards are written atomically and a rerun "
                             "resumes; `accelerate launch -m genshift build ...` spreads shards over GPUs. "
                             "`bench build <suite> --help` lists that builder's options.",
                 examples="  bench build imagenet-star --smoke --out /tmp/star-smoke\n"
                          "  accelerate launch -m genshift build imagenet-star --out star/ --tokens tokens.zip\n"
                          "  bench build in-g-rn --smoke --out /tmp/ing\n")
    builders = p.add_subparsers(dest="suite", metavar="<suite>", required=True,
                                help="which suite to build (`bench suites` lists them); "
                                     "`bench build <suite> --help` shows its options")
    for suite_id in BUILDERS:
        try:
            module = importlib.import_module(BUILDERS.get(suite_id))
        except ModuleNotFoundError as e:  # builder not available in this checkout
            bp = builders.add_parser(suite_id, help=f"build {suite_id}",
                                     description=f"Build {suite_id} (not available here: {e}).",
                                     epilog="examples:\n" + _examples(suite_id, None).rstrip(),
                                     formatter_class=_Formatter)
            bp.set_defaults(_builder_error=str(e))
            continue
        bp = builders.add_parser(suite_id, help=f"build {suite_id}", description=_description(module),
                                 epilog="examples:\n" + _examples(suite_id, module).rstrip(),
                                 formatter_class=_Formatter)
        module.add_arguments(bp)
        _add_preflight(bp)
        bp.set_defaults(_builder=module)
    return p


def _add_preflight(bp) -> None:
    """``--preflight`` and its options, on every builder."""
    from genshift.cli._common import positive_int

    g = bp.add_argument_group("preflight (no download, no output: the real architectures with random weights)")
    g.add_argument("--preflight", action="store_true",
                   help="check every stage at the real models' sizes on the meta device and print per stage the "
                        "model, parameters, dtype, peak memory at --batch-size on --device and whether it fits")
    g.add_argument("--device-memory", type=float, metavar="GIB",
                   help="--preflight: plan for a device with this much memory (e.g. 24 for a GPU not present here)")
    g.add_argument("--measure", action="store_true",
                   help="--preflight on a CUDA device: also run every stage there with random weights and report "
                        "the measured peak memory and seconds per image")
    try:
        g.add_argument("--batch-size", type=positive_int, default=1, help="--preflight: batch to size memory for")
    except argparse.ArgumentError:
        pass  # the builder's own --batch-size


def run(args) -> int:
    from genshift.errors import BenchError

    if getattr(args, "_builder_error", None):
        raise BenchError(f"builder for {args.suite!r} is not available: {args._builder_error}; "
                         "install the builder extras: pip install 'genshift-bench[builders]'")
    if getattr(args, "preflight", False):
        from genshift.builders import preflight
        return preflight.run(args.suite, args)
    if not args.out:
        raise BenchError(f"bench build {args.suite}: --out is required (the output suite folder), "
                         "unless --preflight")
    return args._builder.run(args)
