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
