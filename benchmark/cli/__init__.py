"""The ``bench`` command: one module per verb, each with ``add_parser`` and ``run`` (heavy imports inside ``run``:
``bench --help`` stays fast). A ``BenchError``, or an ``OSError`` from the environment, is one ``error:`` line and a
non-zero exit (``-vv`` adds the traceback of the latter); anything else is a bug and keeps its traceback."""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import re
import sys
import traceback

from genshift import __version__
from genshift.cli._common import add_verbosity
from genshift.errors import BenchError, one_line, os_error_message

OS_ERROR_EXIT = 74  # sysexits.h EX_IOERR: an input/output error from the environment

# Verbs and their modules under genshift.cli, in the order `bench --help` lists them.
VERBS = {"suites": "suites", "download": "download", "eval": "eval_cmd", "verify": "verify", "keygen": "keygen",
         "slope": "slope", "reproduce": "reproduce", "submit": "submit", "leaderboard": "leaderboard_cmd",
         "review": "review", "build": "build", "publish": "publish", "diagnose": "diagnose", "discover": "discover",
         "import-folder": "import_folder", "demo-suite": "demo_suite"}


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one ``error:`` line naming the option and the fix (exit code 2)."""

    def error(self, message: str):
        wrong = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if wrong:  # `bench evl`, `--compile onn`: the close match first
            choices = re.findall(r"'([^']*)'", wrong.group(2))
            close = difflib.get_close_matches(wrong.group(1), choices, n=1)
            message = (message[:wrong.start()] + f"invalid choice: '{wrong.group(1)}'"
                       + (f"; did you mean '{close[0]}'?" if close else "") + f" (choose from {wrong.group(2)})")
        self.exit(2, f"error: {self.prog}: {one_line(message)} (see `{self.prog} --help`)\n")


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """``bench``'s parser; with ``verb``, only that verb's module is imported (the others are there by name), so
    a command does not load every other verb's modules before it starts."""
    parser = OneLineParser(prog="bench", epilog="Run `bench <verb> --help` for a verb's options and examples.",
                           description="Benchmarks and a leaderboard for ImageNet classifiers under generated "
                                       "distribution shifts.")
    parser.add_argument("--version", action="version", version=f"genshift-bench {__version__}")
    add_verbosity(parser)
    sub = parser.add_subparsers(dest="verb", metavar="<verb>", required=True, parser_class=OneLineParser,
                                help="what to do; `bench <verb> --help` shows its options and examples")
    for name, module_name in VERBS.items():
        if verb in (None, name):
            module = importlib.import_module(f"genshift.cli.{module_name}")
            module.add_parser(sub).set_defaults(_run=module.run)
        else:
            sub.add_parser(name)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    verb = next((a for a in argv if not a.startswith("-")), None)  # bench's own options take no value
    args = build_parser(verb if verb in VERBS else None).parse_args(argv)
    # logs to stderr: a process-wide setting, the CLI's, never the library's (genshift.evaluate leaves logging be)
    level = logging.WARNING if args.quiet else logging.INFO if args.verbose == 0 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(message)s" if args.verbose == 0 else "%(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "urllib3", "filelock", "huggingface_hub", "datasets", "PIL"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))
    where = f"bench {args.verb}: "
    try:
        return int(args._run(args) or 0)
    except BenchError as e:
        print(f"error: {where}{one_line(e)}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:  # `bench suites --json | head`
        sys.stderr.close()
        return 0
    except OSError as e:  # ENOSPC, EACCES, EROFS: the environment, not a bug (writes are atomic: nothing half-written)
        if args.verbose >= 2:
            traceback.print_exc()
        print(f"error: {where}{os_error_message(e)}", file=sys.stderr)
        return OS_ERROR_EXIT
    except KeyboardInterrupt:
        print("interrupted; finished outputs are kept and a rerun resumes", file=sys.stderr)
        return 130
