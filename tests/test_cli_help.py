"""Every verb of `bench` has a description and examples, and every option of every verb a help text."""

import argparse

import pytest

from benchmark.cli import build_parser, main


def _parsers(parser, path=("bench",)):
    """(command path, parser) for the top-level parser and every sub-command, at any depth."""
    yield " ".join(path), parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, path + (name,))


PARSERS = dict(_parsers(build_parser()))
VERBS = [name for name in PARSERS if name != "bench"]


def test_the_walk_reaches_every_verb_and_every_builder():
    from builders import BUILDERS

    assert {"bench eval", "bench publish", "bench discover", "bench build"} <= set(PARSERS)
    assert {f"bench build {s}" for s in BUILDERS} <= set(PARSERS)


@pytest.mark.parametrize("name", VERBS)
def test_every_verb_has_a_description_and_examples(name):
    p = PARSERS[name]
    assert p.description and len(p.description) > 20, f"{name}: no description"
    epilog = p.epilog or ""
    assert epilog.startswith("examples:") and f"{name.split(' ', 1)[1].split()[0]}" in epilog, \
        f"{name}: no examples"


@pytest.mark.parametrize("name", list(PARSERS))
def test_every_option_has_help(name):
    missing = [a.option_strings[0] if a.option_strings else a.dest for a in PARSERS[name]._actions
               if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
               and not (a.help and a.help.strip() and a.help != argparse.SUPPRESS)]
    assert not missing, f"{name}: options without help: {missing}"


def test_build_suite_help_prints_description_and_examples(capsys):
    with pytest.raises(SystemExit) as e:
        main(["build", "imagenet-star", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    assert "Vendrow et al." in out and "examples:" in out and "bench build imagenet-star --smoke" in out


def test_errors_print_as_one_clean_line(capsys, monkeypatch):
    """Whatever a message quotes (file names, exception texts), the CLI prints one line without escapes."""
    import benchmark.cli.suites as suites_cli
    from benchmark.errors import BenchError

    def boom(args):
        raise BenchError("file 'a\nb.pth' says \x1b[31mno\x1b[0m")

    monkeypatch.setattr(suites_cli, "run", boom)
    assert main(["suites"]) == 2
    assert capsys.readouterr().err == "error: file 'a b.pth' says no\n"


def test_classes_as_users_write_them():
    """Verbs that take a class (`bench discover --class`) accept an index or a wnid through one library function."""
    from benchmark import imagenet
    from benchmark.errors import BenchError

    assert imagenet.parse_class("283") == 283 and imagenet.parse_class(" n01440764 ") == 0
    with pytest.raises(BenchError, match="not an ImageNet-1k index"):
        imagenet.parse_class("1000")
    with pytest.raises(BenchError, match="wnid"):
        imagenet.parse_class("n99999999")


# -- the environment's OSErrors (full disk, read-only folder) are one line, and a rerun resumes ----------------

def _enospc_on(monkeypatch, needle: str):
    """pyarrow's write_table raising what it raises on a full disk (errno 28, no file name) for paths
    containing ``needle``; returns the paths it refused."""
    import errno

    import pyarrow.parquet as pq

    real, refused = pq.write_table, []

    def full_disk(table, where, *a, **k):
        if needle in str(where):
            refused.append(str(where))
            raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")
        return real(table, where, *a, **k)

    monkeypatch.setattr(pq, "write_table", full_disk)
    return refused


def test_full_disk_during_eval_is_one_line_nothing_half_written_and_the_rerun_resumes(tmp_path, toy_suite, capsys,
                                                                                         monkeypatch, tiny_checkpoint):
    import json

    out = tmp_path / "runs"
    argv = ["eval", "--model", "test_resnet.r160_in1k", "--checkpoint", str(tiny_checkpoint), "--suite", str(toy_suite), "--out",
            str(out), "--batch-size", "8", "--workers", "0", "--compile", "off", "--bootstrap", "10", "--no-progress"]
    refused = _enospc_on(monkeypatch, "/shifted/part-")  # the second config's checkpoint: the first one is done
    assert main(argv) == 74
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert refused, "the write that fails was never attempted"
    assert err.startswith("error: No space left on device (ENOSPC) on ") and "shifted/part-" in err, err
    assert "free disk space or write elsewhere (--out)" in err and "rerun resumes" in err
    assert not list(out.rglob("*.incomplete")) and not list(out.rglob("result.json"))  # nothing half-written
    (work,) = out.rglob(".work")
    assert list((work / "base").glob("part-*.parquet")) and not list((work / "shifted").glob("part-*.parquet"))

    monkeypatch.undo()
    assert main(argv) == 0
    (result,) = out.rglob("result.json")
    timings = json.loads(result.read_text())["run"]["timings"]
    assert timings["base"]["resumed_units"] >= 1 and timings["shifted"]["resumed_units"] == 0  # base was not re-run


@pytest.mark.parametrize("code, fix", [(30, r"Read-only file system (EROFS) on '/data/runs/x\n.parquet'; choose a writable path"),
                                       (13, "fix its permissions or choose another path"),
                                       (122, "disk quota"), (5, "input/output error")])
def test_os_errors_name_the_errno_the_path_and_the_fix(code, fix, capsys, monkeypatch):
    """EROFS, EACCES, EDQUOT, EIO raised by a verb: one line through the CLI's funnel, exit 74."""
    import benchmark.cli.suites as suites_cli

    def fail(args):
        raise OSError(code, "ignored", "/data/runs/x\n.parquet")

    monkeypatch.setattr(suites_cli, "run", fail)
    assert main(["suites"]) == 74
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "/data/runs/x" in err and fix in err, err
