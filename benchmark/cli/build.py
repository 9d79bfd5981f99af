"""`bench build <suite>`: regenerate a benchmark suite (GPU; `--smoke` runs tiny models on CPU). A builder's flags
are its typed config's fields (``genshift.builders.common.BuildConfig``); the builder never sees argparse."""

from __future__ import annotations

import argparse
import dataclasses
import importlib

from genshift.builders.common import ConfigError
from genshift.cli._common import HelpFormatter, add_verb, csv_list
from genshift.errors import BenchError

EXAMPLES = """examples:
  bench build {s} --smoke --out /tmp/{s}-smoke      # whole pipeline, tiny models, CPU
  bench build {s} --out {s}/                        # one GPU; rerun to resume
  accelerate launch -m genshift build {s} --out {s}/   # every GPU (and node)"""  # the three ways every builder runs


def flag(name: str, cls) -> str:
    """The command-line flag of config field ``name``."""
    f = next((f for f in dataclasses.fields(cls) if f.name == name), None)
    return (f.metadata.get("flag") if f else None) or "--" + name.replace("_", "-")


def add_config(p: argparse.ArgumentParser, cls, *, int_type=int) -> None:
    """One flag per field of the config dataclass ``cls`` that has help (type, default, choices from the field)."""
    for f in dataclasses.fields(cls):
        m, t = f.metadata, str(f.type)
        if "help" not in m:
            continue
        kw = {"dest": f.name, "help": m["help"], "default": f.default, "required": m.get("required", False)}
        if t == "bool":  # absent: the config's default (and no "(default: ...)" after a switch's help)
            kw.update(action="store_false" if f.default else "store_true", default=argparse.SUPPRESS)
        else:
            conv = float if "float" in t else int_type if "int" in t else str
            kw["type"] = (lambda s, c=conv: tuple(c(x) for x in csv_list(s))) if t.startswith("tuple") else conv
            kw.update({k: m[k] for k in ("choices", "metavar") if k in m and not t.startswith("tuple")})
        p.add_argument(flag(f.name, cls), **kw)


def flagged(cls, fn, *a, **kw):
    """``fn(*a, **kw)`` with a bad config value reported by its flag (one line)."""
    try:
        return fn(*a, **kw)
    except ConfigError as e:
        raise BenchError(f"{flag(e.field, cls)}: {e.message}") from None


def config_from(cls, args):
    """The config ``cls`` from parsed flags."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    return flagged(cls, cls, **given)


def add_parser(sub):
    from genshift.builders import BUILDERS

    p = add_verb(sub, "build", help="regenerate a benchmark suite into a folder (format 1)",
                 description="Regenerate a suite with its builder. Shards are written atomically and a rerun "
                             "resumes; `accelerate launch -m genshift build ...` spreads shards over GPUs. "
                             "`bench build <suite> --help` lists that builder's options.",
                 examples="  bench build imagenet-star --smoke --out /tmp/star-smoke\n"
                          "  accelerate launch -m genshift build imagenet-star --out star/ --tokens tokens.zip\n"
                          "  bench build in-g-rn --smoke --out /tmp/ing\n")
    builders = p.add_subparsers(dest="suite", metavar="<suite>", required=True, help="which suite to build "
                                "(`bench suites` lists them); `bench build <suite> --help` shows its options")
    for suite_id in BUILDERS:
        module = importlib.import_module(BUILDERS.get(suite_id))
        what_and_how = "\n\n".join((module.__doc__ or "").strip().split("\n\n")[:2])  # the docstring's first two
        bp = builders.add_parser(suite_id, help=f"build {suite_id}", description=what_and_how.replace("``", "`"),
                                 epilog=EXAMPLES.format(s=suite_id), formatter_class=HelpFormatter)
        add_config(bp, module.Config)
        g = bp.add_argument_group("preflight (no download, no output: the real architectures with random weights)")
        g.add_argument("--preflight", action="store_true",
                       help="check every stage at the real models' sizes on the meta device and print per stage the "
                            "model, parameters, dtype, estimated peak memory on --device and whether it fits")
        g.add_argument("--device-memory", type=float, metavar="GIB",
                       help="--preflight: plan for a device with this much memory (e.g. 24 for a GPU not present here)")
        bp.set_defaults(_builder=module)
    return p


def run(args) -> int:
    module = args._builder
    cfg = config_from(module.Config, args)  # (IN-G's config takes <suite> as its suite)
    if args.preflight:
        from genshift.builders import preflight
        return preflight.run(args.suite, cfg, device_memory=args.device_memory)
    if not cfg.out:
        raise BenchError(f"bench build {args.suite}: --out is required (the output suite folder), unless --preflight")
    return flagged(module.Config, module.run, cfg)
