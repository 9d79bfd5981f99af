"""Compile once per machine (genshift.eval.compile_cache): the package is built once, then loaded, never rebuilt."""

from __future__ import annotations

import os

import pytest
import timm
import torch

from genshift.eval import compile_cache
from genshift.eval.inference import Forward, InferenceOptions, wants_compile


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GENSHIFT_COMPILE_CACHE", str(tmp_path / "compiled"))
    return tmp_path / "compiled"


def _model(seed=0):
    torch.manual_seed(seed)
    m = timm.create_model("test_resnet.r160_in1k")
    return m, timm.data.resolve_data_config(model=m)


def test_second_forward_loads_the_package_and_never_compiles(cache, monkeypatch):
    model, dc = _model()
    x, labels = torch.randn(5, *dc["input_size"]), torch.tensor([0, 1, 2, 3, 4])
    opts = InferenceOptions(batch_size=8, workers=0, compile="on")
    eager = Forward(model, InferenceOptions(batch_size=8, workers=0, compile="off"), n_images=5, data_config=dc)(x, labels)

    calls = []
    real = compile_cache._compile_to
    monkeypatch.setattr(compile_cache, "_compile_to", lambda *a: (calls.append(a), real(*a)))
    first = Forward(model, opts, n_images=5, data_config=dc)
    out1 = first(x, labels)
    assert first.compile_info["mode"] == "aot" and first.compile_info["source"] == "compiled" and len(calls) == 1
    packages = list(cache.glob("*.pt2"))
    assert [p.name for p in packages] == [f"{first.compile_info['key']}.pt2"]  # no temporary file left
    assert (out1[0][:, 0] == eager[0][:, 0]).all()  # same top-1 as eager; probabilities within float noise
    assert abs(out1[2] - eager[2]).max() < 1e-4

    # a new process would do the same: a fresh Forward on a freshly built model with the same weights
    twin, _ = _model()
    auto = InferenceOptions(batch_size=8, workers=0, compile="auto", forward_threads=1)  # one core per process
    assert wants_compile(twin, auto, n_images=5, data_config=dc)  # a short run compiles: the package exists
    second = Forward(twin, auto, n_images=5, data_config=dc)
    out2 = second(x, labels)
    assert second.compile_info["source"] == "cache" and len(calls) == 1  # loaded, not compiled again
    for a, b in zip(out1, out2):
        assert (a == b).all()  # the same compiled code: bit-identical predictions

    # other weights: another key, so a short auto run stays eager rather than reuse the wrong package
    other, _ = _model(seed=1)
    assert not wants_compile(other, auto, n_images=5, data_config=dc)

    # a damaged package is rebuilt, never trusted
    packages[0].write_bytes(b"not a package")
    third = Forward(twin, opts, n_images=5, data_config=dc)
    out3 = third(x, labels)
    assert third.compile_info["source"] == "compiled" and len(calls) == 2
    assert (out3[0] == out1[0]).all()


def test_key_covers_weights_shape_layout_and_device():
    model, dc = _model()
    x = torch.zeros(8, *dc["input_size"])
    key = compile_cache.package_key(model, x)
    assert key == compile_cache.package_key(_model()[0], x)  # content, not object identity
    assert key != compile_cache.package_key(_model(seed=1)[0], x)
    assert key != compile_cache.package_key(model, torch.zeros(4, *dc["input_size"]))
    assert key != compile_cache.package_key(model, x.contiguous(memory_format=torch.channels_last))
    assert key != compile_cache.package_key(model, x.to(torch.bfloat16))
    with torch.no_grad():
        next(model.parameters()).add_(1e-3)
    assert key != compile_cache.package_key(model, x)


def test_eviction_keeps_the_folder_under_its_bound_least_recently_used_first(cache, monkeypatch):
    cache.mkdir()
    for i, name in enumerate(("old", "mid", "new")):
        p = cache / f"{name}.pt2"
        p.write_bytes(b"x" * 1000)
        os.utime(p, (1000 + i, 1000 + i))
    (cache / ".tmp-1-busy.pt2").write_bytes(b"x" * 5000)  # a compile in progress is never evicted
    monkeypatch.setenv("GENSHIFT_COMPILE_CACHE_GB", str(2500 / 2**30))
    removed = compile_cache.evict()
    assert [p.name for p in removed] == ["old.pt2"]
    assert sorted(p.name for p in cache.iterdir()) == [".tmp-1-busy.pt2", "mid.pt2", "new.pt2"]
    assert compile_cache.evict(limit=0, keep=cache / "new.pt2") == [cache / "mid.pt2"]


def test_a_compiled_model_runs_one_batch_at_a_time_and_auto_prefers_threads(cache):
    """A package's call holds the GIL for the whole forward, so batches on threads would only queue:
    a compiled model runs on one thread, and ``auto`` keeps eager batches side by side when the
    process has more than one core (``benchmarks/forward_threads.py`` measures both)."""
    from genshift.determinism import fixed_threads

    model, dc = _model()
    x, labels = torch.randn(12, *dc["input_size"]), torch.arange(12)
    with fixed_threads(1):
        fwd = Forward(model, InferenceOptions(batch_size=4, workers=0, compile="on", forward_threads=2),
                      n_images=12, data_config=dc)
        outs = fwd.map(x, labels)
    assert fwd.compile_info["mode"] == "aot" and fwd.threads == 1 and len(fwd.thread_ids) == 1
    assert [o[0].shape[0] for o in outs] == [4, 4, 4]
    # the package is on the machine now, yet with two forward threads auto stays eager
    assert not wants_compile(model, InferenceOptions(batch_size=4, workers=0, forward_threads=2), n_images=12,
                             data_config=dc)
    with fixed_threads(1):
        assert wants_compile(model, InferenceOptions(batch_size=4, workers=0, forward_threads=1), n_images=12,
                             data_config=dc)


def test_key_covers_the_intra_op_thread_count():
    from genshift.determinism import fixed_threads

    model, dc = _model()
    x = torch.zeros(8, *dc["input_size"])
    with fixed_threads(1):
        one = compile_cache.package_key(model, x)
    with fixed_threads(2):
        two = compile_cache.package_key(model, x)
    assert one != two  # the generated loops are laid out for the thread count
