"""Checkpoints as timm's train.py writes them: loaded weights-only, EMA or model weights, one-line errors."""

import argparse
import copy

import pyarrow.parquet as pq
import pytest
import torch

from genshift.cli import main
from genshift.errors import BenchError
from genshift.eval.models import load_checkpoint, read_checkpoint

ARCH = "test_resnet.r160_in1k"


@pytest.fixture(scope="module")
def train_checkpoint(tmp_path_factory):
    """A checkpoint saved by timm's own CheckpointSaver (what train.py uses), with args, optimizer and EMA.

    Returns (checkpoint path, plain model state dict path, plain EMA state dict path).
    """
    import timm
    from timm.utils import CheckpointSaver, ModelEmaV3

    d = tmp_path_factory.mktemp("train")
    torch.manual_seed(1)
    model = timm.create_model(ARCH, pretrained=False)
    ema = ModelEmaV3(model, decay=0.5)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with torch.no_grad():  # one step so that model, EMA and optimizer state all differ from init
        loss = model(torch.randn(2, 3, 64, 64)).logsumexp(1).mean()
    loss = model(torch.randn(2, 3, 64, 64)).logsumexp(1).mean()
    loss.backward()
    opt.step()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ema.update(model)
    # args exactly as train.py holds them: an argparse.Namespace from its parser
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=ARCH)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--model-ema", action="store_true", default=True)
    parser.add_argument("--input-size", type=int, nargs=3, default=None)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args([])
    saver = CheckpointSaver(model, opt, args=args, model_ema=ema, checkpoint_dir=str(d), recovery_dir=str(d))
    saver.save_checkpoint(epoch=3, metric=0.5)
    ckpt = d / "last.pth.tar"
    assert ckpt.is_file()
    raw = torch.load(ckpt, map_location="cpu", weights_only=False)  # the test's own file, to check its layout
    assert isinstance(raw["args"], argparse.Namespace) and {"optimizer", "epoch", "state_dict_ema"} <= set(raw)
    plain, plain_ema = d / "model.pth", d / "ema.pth"
    torch.save(copy.deepcopy(model.state_dict()), plain)
    torch.save({f"module.{k}": v for k, v in ema.module.state_dict().items()}, plain_ema)  # DDP-style prefixes
    return ckpt, plain, plain_ema


def test_training_checkpoint_loads_weights_only_with_model_default_and_ema(train_checkpoint, monkeypatch):
    ckpt, plain, plain_ema = train_checkpoint
    seen = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **kw: seen.append(kw.get("weights_only")) or real_load(*a, **kw))
    sd, entry = read_checkpoint(ckpt)
    assert entry == "state_dict" and seen == [True]  # never a full unpickling
    ref = torch.load(plain, weights_only=True)
    assert sd.keys() == ref.keys() and all(torch.equal(sd[k], ref[k]) for k in ref)
    sd_ema, entry = read_checkpoint(ckpt, weights="ema")
    ema_ref, _ = read_checkpoint(plain_ema)  # module. prefixes stripped as timm's clean_state_dict does
    assert entry == "state_dict_ema" and sd_ema.keys() == ema_ref.keys()
    assert all(torch.equal(sd_ema[k], ema_ref[k]) for k in ema_ref)
    assert not all(torch.equal(sd_ema[k], sd[k]) for k in sd)  # the two choices really differ


def _eval(tmp_path, suite, ckpt, *extra):
    out = tmp_path / "runs"
    rc = main(["-q", "eval", "--model", ARCH, "--suite", str(suite), "--checkpoint", str(ckpt), "--out", str(out),
               "--batch-size", "16", "--workers", "0", "--compile", "off", "--bootstrap", "10", "--no-progress",
               "--json", *extra])
    assert rc == 0
    (path,) = out.rglob("result.json")
    return path.parent


def _top(run):
    t = pq.read_table(run / "predictions" / "base.parquet")
    return t["topk_idx"].to_pylist(), t["true_prob"].to_pylist()


def test_bench_eval_scores_a_train_checkpoint_as_its_plain_state_dicts(tmp_path, toy_suite, train_checkpoint, capsys):
    ckpt, plain, plain_ema = train_checkpoint
    runs = {name: _eval(tmp_path / name, toy_suite, path, *extra) for name, path, extra in (
        ("train", ckpt, ()), ("plain", plain, ()), ("train-ema", ckpt, ("--checkpoint-weights", "ema")),
        ("plain-ema", plain_ema, ()))}
    capsys.readouterr()
    assert _top(runs["train"]) == _top(runs["plain"])
    assert _top(runs["train-ema"]) == _top(runs["plain-ema"])
    assert _top(runs["train"]) != _top(runs["train-ema"])
    import json

    model = json.loads((runs["train-ema"] / "result.json").read_text())["model"]
    assert model["checkpoint_weights"] == "ema"
    assert "checkpoint_weights" not in json.loads((runs["plain"] / "result.json").read_text())["model"]
    from genshift.eval.verify import verify_result

    # recheck re-reads the EMA weights
    assert verify_result(runs["train-ema"], recheck=3, checkpoint=str(ckpt), suite=str(toy_suite)).ok


class _Evil:
    def __reduce__(self):
        return (print, ("\x1b[31mpwned\x1b[0m",))


@pytest.mark.parametrize("content, match", [
    ({"state_dict": {"w": torch.zeros(1)}, "hook": _Evil()}, r"holds Python objects \(builtins.print\)"),
    ({"state_dict_ema": {"conv1.weight": torch.zeros(1)}}, "only EMA weights.*--checkpoint-weights ema"),
    ({"epoch": 3}, "not a state dict of tensors"),
    (b"\x1b[31mnot a\ncheckpoint", "cannot read checkpoint"),
])
def test_bad_checkpoints_are_one_clean_line(tmp_path, capsys, toy_suite, content, match):
    path = tmp_path / "bad.pth"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        torch.save(content, path)
    rc = main(["eval", "--model", ARCH, "--suite", str(toy_suite), "--checkpoint", str(path), "--out",
               str(tmp_path / "runs"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and err.startswith("error: ") and "\n" not in err and "\x1b" not in err, err
    import re

    assert re.search(match, err), err
    assert "pwned" not in capsys.readouterr().out


def test_ema_requested_on_a_plain_state_dict(train_checkpoint):
    import timm

    _, plain, _ = train_checkpoint
    with pytest.raises(BenchError, match="no EMA weights"):
        load_checkpoint(timm.create_model(ARCH), plain, weights="ema")


def _missing(tmp_path):
    return "/nonexistent.pth"


def _folder(tmp_path):
    (tmp_path / "weights").mkdir()
    return str(tmp_path / "weights")


def _empty(tmp_path):
    (tmp_path / "empty.pth").write_bytes(b"")
    return str(tmp_path / "empty.pth")


def _over_limit(tmp_path):
    """A sparse file one byte over the limit: no disk used, nothing read."""
    from genshift.eval.models import MAX_CHECKPOINT_BYTES

    path = tmp_path / "huge.pth"
    with open(path, "wb") as f:
        f.truncate(MAX_CHECKPOINT_BYTES + 1)
    return str(path)


@pytest.mark.parametrize("make, match", [
    (_missing, r"checkpoint '/nonexistent\.pth' does not exist"),
    (_folder, r"checkpoint '.*/weights' is a folder; give the weights file"),
    (lambda tmp_path: "/dev/zero", r"checkpoint '/dev/zero' is not a regular file \(a device, pipe or socket\)"),
    (_empty, r"checkpoint '.*empty\.pth' is empty \(0 bytes\)"),
    (_over_limit, r"checkpoint '.*huge\.pth' is 34359738369 bytes, over the 32 GiB limit"),
])
def test_checkpoint_is_checked_before_the_architecture_is_built(tmp_path, toy_suite, capsys, monkeypatch, make, match):
    """`--model eva_giant_patch14_224 --checkpoint BAD` is one line at once: the 1B-parameter model
    (3.7 GB) is never built, and nothing is read from the file beyond a stat."""
    import re
    import time

    import timm

    import genshift.eval.models

    path = make(tmp_path)
    built = []
    monkeypatch.setattr(timm, "create_model", lambda *a, **k: built.append(a) or pytest.fail("model built"))
    t0 = time.perf_counter()
    with pytest.raises(BenchError, match=match):
        genshift.eval.models.load_classifier("eva_giant_patch14_224", checkpoint=path)
    assert time.perf_counter() - t0 < 0.5
    rc = main(["eval", "--model", "eva_giant_patch14_224", "--checkpoint", path, "--suite", str(toy_suite),
               "--out", str(tmp_path / "runs"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and re.search(match, err), err
    assert not built and not list((tmp_path / "runs").rglob("*.json"))
