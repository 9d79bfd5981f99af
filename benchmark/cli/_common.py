"""Helpers shared by the verb modules."""

from __future__ import annotations

import argparse
import json


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Description and examples as written; each option's default after its help unless it says it."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (action.option_strings and action.nargs != 0 and action.default is not None
                and action.default is not argparse.SUPPRESS and action.default != "" and "default" not in text):
            text += " (default: %(default)s)"
        return text


def add_verbosity(p: argparse.ArgumentParser, *, after_verb: bool = False) -> None:
    """``-v``/``-q`` on ``bench`` and after every verb (not given after it: the value before it stands)."""
    p.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS if after_verb else 0,
                   help="more log output (-vv for debug)")
    p.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS if after_verb else False,
                   help="only warnings and errors on stderr")


def add_verb(sub, name: str, *, help: str, description: str, examples: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help, description=description, epilog="examples:\n" + examples.rstrip(),
                       formatter_class=HelpFormatter)
    add_verbosity(p, after_verb=True)
    return p


def csv_list(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list, got an empty value")
    return items


def bounded_int(lo: int, hi: int | None = None, what: str = "an integer"):
    """An argparse ``type`` for integers in ``lo..hi`` (``hi`` None: no upper bound)."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"expected {what} in {lo}..{hi if hi is not None else 'any'}, got {v}")
        return v
    return parse


positive_int = bounded_int(1, None, "a positive integer")


def non_negative_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return v


def print_table(rows: list[dict], columns: list[str]) -> None:
    """A plain aligned text table on stdout (results go to stdout, logs to stderr)."""
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip())
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())


def percent(m: dict | None) -> str:
    """A metric ``{"value", "ci"}`` (fractions) in percent or points with its interval; '-' when undefined."""
    if not m or m.get("value") is None or m["value"] != m["value"]:
        return "-"
    text = f"{100 * m['value']:.2f}"
    if m.get("ci") and m["ci"][0] == m["ci"][0]:
        text += f" [{100 * m['ci'][0]:.2f}, {100 * m['ci'][1]:.2f}]"
    return text


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))


def add_mask_options(p: argparse.ArgumentParser) -> None:
    """``--mask FILE`` / ``--no-mask`` for the upstream ImageNet* release (default: the authors' released mask)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--mask", help="upstream ImageNet* only: a mask file instead of the authors' released masks.npy "
                                  "(which is fetched at a pinned commit, sha256-checked and applied by default)")
    g.add_argument("--no-mask", action="store_true",
                   help="upstream ImageNet* only: keep every image (the paper scored the masked set)")


def mask_arg(args) -> str | None:
    """The ``mask`` argument of ``genshift.hub.open_suite`` for :func:`add_mask_options`."""
    from genshift.upstream import NO_MASK

    return NO_MASK if args.no_mask else args.mask
