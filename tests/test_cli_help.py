"""Every verb of `bench` has a description and examples, and every option of every verb a help text."""

import argparse

import pytest

from genshift.cli import build_parser, main


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
    from genshift.builders import BUILDERS

    assert {"bench eval", "bench publish", "bench discover", "bench build"} <= set(PARSERS)
    assert {f"bench build {s}" for s in BUILDERS} <= set(PARSERS)


@pytest.mark.parametrize("name", VERBS)
def test_every_verb_has_a_description_and_examples(name):
    p = PARSERS[name]
    assert p.description and len(p.description) > 20, f"{name}: no description"
    epilog = p.epilog or ""
    assert epilog.startswith("examples:") and f"{name.split(' ', 1)[1].split()[0]}" in epilog, \
        f"{name}: no examples"


def _without_help(parser) -> list[str]:
    """Options, positionals and sub-command groups (`bench <verb>`, `bench build <suite>`) without help."""
    return [a.option_strings[0] if a.option_strings else a.metavar or a.dest for a in parser._actions
            if not isinstance(a, argparse._HelpAction)
            and not (a.help and a.help.strip() and a.help != argparse.SUPPRESS)]


@pytest.mark.parametrize("name", list(PARSERS))
def test_every_option_and_positional_has_help(name):
    missing = _without_help(PARSERS[name])
    assert not missing, f"{name}: options or positionals without help: {missing}"


def test_the_help_check_fails_on_a_missing_help():
    """The check sees a positional or a sub-command group without help (as `bench build`'s suite was)."""
    p = argparse.ArgumentParser()
    p.add_argument("path")
    p.add_argument("--flag", help="documented")
    p.add_subparsers(dest="suite", metavar="<suite>")
    assert _without_help(p) == ["path", "<suite>"]


def _shows_its_default(parser, action) -> bool:
    return "%(default)" in parser._get_formatter()._get_help_string(action) or "default" in (action.help or "")


@pytest.mark.parametrize("name", list(PARSERS))
def test_every_help_shows_the_defaults(name):
    """Every option that takes a value and has a default says it in --help (e.g. --bootstrap 1000, --seed 0)."""
    p = PARSERS[name]
    hidden = [a.option_strings[0] for a in p._actions if a.option_strings and a.nargs != 0
              and a.default not in (None, "", argparse.SUPPRESS) and not _shows_its_default(p, a)]
    assert not hidden, f"{name}: --help hides the defaults of {hidden}"


def test_eval_help_shows_the_defaults_that_change_the_numbers(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for text in ("(default: 1000)", "bootstrap seed (0..2**63-1) (default: 0)", "(5..1000) (default: 10)"):
        assert text in out


def test_verbosity_is_read_before_and_after_the_verb():
    parser = build_parser()
    assert parser.parse_args(["suites", "-q"]).quiet and not parser.parse_args(["suites"]).quiet
    assert parser.parse_args(["-v", "suites"]).verbose == 1 and parser.parse_args(["suites", "-vv"]).verbose == 2
    assert parser.parse_args(["-q", "suites"]).quiet  # given before the verb, kept after it


@pytest.mark.parametrize("argv, match", [
    (["evl"], "invalid choice: 'evl'; did you mean 'eval'?"),
    (["eval", "--compile", "onn"], "error: bench eval: argument --compile: invalid choice: 'onn'; did you mean 'on'?"),
])
def test_a_mistyped_verb_or_choice_gets_the_close_match(capsys, argv, match):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and match in err and err.count("\n") == 1, err


def test_a_mistyped_suite_gets_the_close_match(capsys):
    assert main(["download", "imagenet-strar"]) != 0
    err = capsys.readouterr().err
    assert err.startswith("error: bench download: unknown suite 'imagenet-strar'") and "'imagenet-star'" in err
    assert main(["suites", "imagenet-strar"]) == 1
    assert "did you mean 'imagenet-star'?" in capsys.readouterr().out


def test_build_lists_its_suites_with_help(capsys):
    with pytest.raises(SystemExit):
        main(["build", "--help"])
    out = capsys.readouterr().out
    assert "which suite to build" in out


def test_build_suite_help_prints_description_and_examples(capsys):
    with pytest.raises(SystemExit) as e:
        main(["build", "imagenet-star", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    assert "Vendrow et al." in out and "examples:" in out and "bench build imagenet-star --smoke" in out


def test_errors_print_as_one_clean_line(capsys, monkeypatch):
    """Whatever a message quotes (file names, exception texts), the CLI prints one line without escapes."""
    import genshift.cli.suites as suites_cli
    from genshift.errors import BenchError

    def boom(args):
        raise BenchError("file 'a\nb.pth' says \x1b[31mno\x1b[0m")

    monkeypatch.setattr(suites_cli, "run", boom)
    assert main(["suites"]) == 2
    assert capsys.readouterr().err == "error: bench suites: file 'a b.pth' says no\n"  # the verb, then the line


def test_classes_as_users_write_them():
    """Verbs that take a class (`bench discover --class`) accept an index or a wnid through one library function."""
    from genshift import imagenet
    from genshift.errors import BenchError

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
    argv = ["eval", "--model", "test_resnet.r160_in1k", "--checkpoint", str(tiny_checkpoint), "--suite", str(toy_suite),
            "--out", str(out), "--batch-size", "8", "--workers", "0", "--compile", "off", "--bootstrap", "10",
            "--no-progress"]
    refused = _enospc_on(monkeypatch, "/shifted/part-")  # the second config's checkpoint: the first one is done
    assert main(argv) == 74
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert refused, "the write that fails was never attempted"
    assert err.startswith("error: bench eval: No space left on device (ENOSPC) on ") and "shifted/part-" in err, err
    assert "free disk space or write elsewhere (--out)" in err and "rerun resumes" in err
    assert not list(out.rglob("*.incomplete")) and not list(out.rglob("result.json"))  # nothing half-written
    (work,) = out.rglob(".work")
    assert list((work / "base").glob("part-*.parquet")) and not list((work / "shifted").glob("part-*.parquet"))

    monkeypatch.undo()
    assert main(argv) == 0
    (result,) = out.rglob("result.json")
    timings = json.loads(result.read_text())["run"]["timings"]
    assert timings["base"]["resumed_units"] >= 1 and timings["shifted"]["resumed_units"] == 0  # base was not re-run


@pytest.mark.parametrize("code, fix", [(30, r"Read-only file system (EROFS) on '/data/runs/x\n.parquet'; choose a "
                                            "writable path"),
                                       (13, "fix its permissions or choose another path"),
                                       (122, "disk quota"), (5, "input/output error"),
                                       (111, "Connection refused (ECONNREFUSED) on '/data/runs/x\\n.parquet'; the "
                                             "network or the Hub did not answer")])
def test_os_errors_name_the_errno_the_path_and_the_fix(code, fix, capsys, monkeypatch):
    """EROFS, EACCES, EDQUOT, EIO raised by a verb: one line through the CLI's funnel, exit 74."""
    import genshift.cli.suites as suites_cli

    def fail(args):
        raise OSError(code, "ignored", "/data/runs/x\n.parquet")

    monkeypatch.setattr(suites_cli, "run", fail)
    assert main(["suites"]) == 74
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "/data/runs/x" in err and fix in err, err


# -- signing keys: written 0600 in one step, never through a link; a key open to others is refused ------------

def test_keygen_writes_0600_atomically_and_refuses_links(tmp_path, capsys):
    import os
    import stat

    from genshift.eval.stamps import load_private_key

    key = tmp_path / "keys" / "maintainer.key"
    assert main(["keygen", str(key), "--name", "alice"]) == 0
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.read_bytes().startswith(b"-----BEGIN PRIVATE KEY")
    assert sorted(p.name for p in key.parent.iterdir()) == ["maintainer.key", "maintainer.key.pub"]  # no temp left
    assert load_private_key(key) is not None
    capsys.readouterr()

    target = tmp_path / "elsewhere" / "stolen.key"  # a dangling link: following it would write the key there
    link = tmp_path / "link.key"
    os.symlink(target, link)
    assert main(["keygen", str(link)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "link.key is a symbolic link" in err and "never written through a link" in err
    assert not target.exists() and not (tmp_path / "elsewhere").exists() and link.is_symlink()
    before = key.read_bytes()
    assert main(["keygen", str(key)]) == 2 and "already exists" in capsys.readouterr().err
    assert key.read_bytes() == before


def test_a_signing_key_open_to_group_or_others_is_refused(tmp_path, capsys):
    import os

    key = tmp_path / "maintainer.key"
    assert main(["keygen", str(key)]) == 0
    capsys.readouterr()
    os.chmod(key, 0o644)
    assert main(["verify", str(tmp_path / "no-result"), "--recheck", "1", "--sign", str(key)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has permissions 0644" in err and f"chmod 600 {key}" in err, err
    os.chmod(key, 0o600)  # the same key, private again: accepted (the run then fails on the missing result)
    assert main(["verify", str(tmp_path / "no-result"), "--recheck", "1", "--sign", str(key)]) != 0
    assert "permissions" not in capsys.readouterr().err


# -- list files from outside are read with a byte limit, whatever st_size says -----------------------------

LIST_FILES = {
    "--models": (["eval", "--models", "FILE", "--suite", "no-such-suite", "--out", "OUT", "--no-progress"],
                 "--models file", 1 << 20),
    "--csv": (["import-folder", "SRC", "--csv", "FILE", "--name", "x", "--out", "OUT", "--no-progress"],
              "--csv file", 256 << 20),
    "--id-accuracy": (["slope", "RESULT", "--id-accuracy", "FILE"], "--id-accuracy CSV", 16 << 20),
    "--trusted-keys": (["leaderboard", "--results", "OUT", "--trusted-keys", "FILE"], "trusted keys file", 1 << 20),
}


@pytest.mark.parametrize("flag", list(LIST_FILES))
def test_list_files_are_read_with_a_byte_limit(flag, tmp_path, capsys, monkeypatch):
    """/dev/zero has st_size 0 and never ends; it and a regular file over the limit are one line naming
    the file and the limit. Each file goes through read_limited with its documented limit (lowered
    to 4 KiB here so the test reads 4 KiB, not up to 256 MiB of zeros)."""
    import sys
    import time

    import genshift.fsutil as fsutil

    argv_t, what, limit = LIST_FILES[flag]
    (tmp_path / "src" / "n01440764").mkdir(parents=True)
    (tmp_path / "r.json").write_text("{}")
    (tmp_path / "big.txt").write_text("x" * 4097)
    subs = {"SRC": str(tmp_path / "src"), "OUT": str(tmp_path / "out"), "RESULT": str(tmp_path / "r.json")}
    reads, real = [], fsutil.read_limited

    def spy(path, *, max_bytes, **k):
        reads.append((str(path), max_bytes))
        t0 = time.perf_counter()
        try:
            return real(path, max_bytes=min(max_bytes, 4096), **k)
        finally:
            assert time.perf_counter() - t0 < 0.5

    for module in [m for m in list(sys.modules.values()) if getattr(m, "read_limited", None) is real]:
        monkeypatch.setattr(module, "read_limited", spy)  # also where it was imported by name
    try:
        for f in ("/dev/zero", str(tmp_path / "big.txt")):
            code = main([subs.get(a, f if a == "FILE" else a) for a in argv_t])
            err = capsys.readouterr().err
            assert code != 0 and err.count("\n") == 1, err
            assert f": {what} {f!r} is larger than 4096 bytes" in err, err
            assert reads[-1] == (f, limit)  # read through read_limited, with the documented limit
        assert not (tmp_path / "out").exists()
    finally:  # a module first imported during the test took the spy by name: give it the real one back
        for module in list(sys.modules.values()):
            if getattr(module, "read_limited", None) is spy:
                module.read_limited = real


def test_os_error_traceback_with_vv(capsys, monkeypatch):
    """-vv keeps the traceback of an OSError (a bug may raise one too), then the same one line."""
    import genshift.cli.suites as suites_cli

    def fail(args):
        raise OSError(28, "No space left on device", "/data/x")

    monkeypatch.setattr(suites_cli, "run", fail)
    assert main(["-vv", "suites"]) == 74
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "in fail" in err
    assert err.rstrip().splitlines()[-1].startswith("error: bench suites: No space left on device (ENOSPC) "
                                                       "on '/data/x'")


def test_an_os_error_from_a_dataloader_worker_is_one_line(capsys, monkeypatch):
    """torch re-raises a worker's OSError with the worker's traceback as its text and no errno: the
    line is the original error (errno, path, fix), not the traceback."""
    from torch._utils import ExceptionWrapper

    import genshift.cli.suites as suites_cli

    def fail(args):
        try:
            raise OSError(5, "Input/output error", "/data/suite/test-00000-of-00002.parquet")
        except OSError:
            wrapped = ExceptionWrapper(where="in DataLoader worker process 0")
        wrapped.reraise()

    monkeypatch.setattr(suites_cli, "run", fail)
    assert main(["suites"]) == 74
    err = capsys.readouterr().err
    assert err == ("error: bench suites: Input/output error (EIO) on '/data/suite/test-00000-of-00002.parquet'; "
                   "the disk reported an input/output error; check it, then rerun: finished outputs are kept and "
                   "the rerun resumes\n")


def test_slope_id_accuracy_csv_is_read_through_the_bounded_reader(tmp_path):
    """What the bounded reader returns is parsed as before: Excel's BOM and CRLF dropped, top-1 in percent."""
    from genshift.eval.slope import read_id_table

    path = tmp_path / "top1.csv"
    path.write_bytes("\ufeffmodel,top1\r\ntimm/a,81.5\r\ntimm/b,0.7\r\n".encode())
    rows = read_id_table(str(path)).rows
    assert {m: r[None].top1 for m, r in rows.items()} == {"a": pytest.approx(0.815), "b": pytest.approx(0.007)}


def test_a_verb_loads_only_its_own_module():
    """`bench leaderboard ...` imports the leaderboard verb, not the fifteen others (their modules pull in the
    eval options, the suites and the builders' settings); `bench --help` still lists every verb."""
    import subprocess
    import sys

    code = ("import sys; from genshift.cli import main\n"
            "try:\n    main(['leaderboard', '--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('genshift.cli.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "['genshift.cli._common', 'genshift.cli.leaderboard_cmd']"
    verbs = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert {"eval", "leaderboard", "import-folder"} <= set(verbs) and all(verbs[v].description for v in verbs)
