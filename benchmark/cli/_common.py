"""Helpers shared by the verb modules."""

from __future__ import annotations

import argparse
import json
import sys

from benchmark.errors import BenchError


def add_verb(sub, name: str, *, help: str, description: str, examples: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help, description=description,
                          epilog="examples:\n" + examples.rstrip(),
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def csv_list(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list, got an empty value")
    return items


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def non_negative_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return v


def print_table(rows: list[dict], columns: list[str], *, file=None) -> None:
    """A plain aligned text table on stdout (results go to stdout, logs to stderr)."""
    file = file or sys.stdout
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip(), file=file)
    print("  ".join("-" * w for w in widths), file=file)
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip(), file=file)


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


def require(cond: bool, message: str) -> None:
    if not cond:
        raise BenchError(message)
