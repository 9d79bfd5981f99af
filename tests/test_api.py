"""genshift.evaluate, the one way in: a module scores as bench eval of its weights file, options check
themselves, a call leaves the process as it found it, and the README's notebook snippet runs."""

import doctest
import json
import logging
import os
import re
import tempfile
import threading
from pathlib import Path

import pytest
import torch

import genshift
from genshift.cli import main
from genshift.errors import BenchError
from genshift.eval.options import EvalOptions, OptionError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def small_suite(tmp_path_factory):
    from genshift.synthetic import make_synthetic_suite

    root = tmp_path_factory.mktemp("api") / "small"
    make_synthetic_suite(root, configs=("base", "shifted"), classes=range(5), per_class=3, image_size=96)
    return root


def _lite0_module(path):
    import timm

    from genshift.eval.models import load_checkpoint

    model = timm.create_model("tf_efficientnet_lite0")
    load_checkpoint(model, path, remap_by_order=True)
    return model


@pytest.mark.slow
def test_a_module_scores_as_bench_eval_of_its_weights_file(tmp_path, small_suite, lite0_weights, capsys):
    """The real Lite0 weights as a timm module: the metrics and the predictions' bytes of `bench eval
    --checkpoint FILE --remap-by-order`; the module's id is its architecture and tensors' digest."""
    from genshift.identity import tensors_sha256

    assert main(["eval", "--model", "tf_efficientnet_lite0", "--checkpoint", lite0_weights, "--remap-by-order",
                 "--suite", str(small_suite), "--out", str(tmp_path / "cli"), "--workers", "0", "--no-progress",
                 "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    model = _lite0_module(lite0_weights)
    result = genshift.evaluate(model, str(small_suite), model_id="lite0", workers=0, progress=False)
    assert result.path is None and result.metrics == cli["metrics"]
    run = next((tmp_path / "cli").rglob("result.json")).parent
    for config in ("base", "shifted"):
        assert result.predictions_bytes(config) == (run / "predictions" / f"{config}.parquet").read_bytes()
    digest = tensors_sha256(model.state_dict())
    assert result.model["id"] == f"tf_efficientnet_lite0@sha256:{digest[:16]}" and result.model["source"] == "module"
    assert result.record["data_config"] == cli["data_config"]


def test_a_call_leaves_the_process_as_it_found_it(tmp_path, small_suite, tiny_checkpoint, monkeypatch):
    """Threads, inductor's freezing flag, cuDNN autotuning, logging, the environment, threads started,
    and the caller's module (mode, memory format) are as they were after evaluate() returns."""
    import timm
    import torch._inductor.config as inductor
    from safetensors.torch import load_file

    monkeypatch.setenv("GENSHIFT_TEST_MARK", "1")
    torch.set_num_threads(2)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    root = logging.getLogger()

    def state():
        return (torch.get_num_threads(), inductor.freezing, torch.backends.cudnn.benchmark, list(root.handlers),
                root.level, dict(os.environ))

    model = timm.create_model("test_resnet.r160_in1k")
    model.load_state_dict(load_file(str(tiny_checkpoint)))
    before, params = state(), {k: v.clone() for k, v in model.state_dict().items()}
    try:
        result = genshift.evaluate(model, str(small_suite), out=tmp_path, cpu_threads=1, forward_threads=2,
                                   compile="on", batch_size=4, workers=0, progress=False)
        assert result.run["forward_threads"] == 1 and result.record["environment"]["torch_threads"] == 1
        assert state() == before
        assert model.training and all(p.is_contiguous() for p in model.parameters())
        assert all(torch.equal(v, params[k]) for k, v in model.state_dict().items())
        genshift.evaluate(model, str(small_suite), out=tmp_path / "eager", cpu_threads=1, forward_threads=2,
                          workers=0, compile="off", progress=False)
        assert state() == before
        assert not [t for t in threading.enumerate() if t.name.startswith("forward")]  # the call's pool ended
    finally:
        torch.set_num_threads(before[0])


@pytest.mark.parametrize("kwargs, match", [
    ({"topk": 3}, "topk must be in 5..1000, got 3"),
    ({"bootstrap": 0}, "bootstrap must be in 1..100000, got 0"),
    ({"batch_size": "8"}, "batch_size must be a whole number in 1..65536, got '8'"),
    ({"device": "tpu"}, "device must be 'cpu', 'cuda' or 'cuda:N', got 'tpu'"),
    ({"compile": "maybe"}, "compile must be one of auto, on, off, got 'maybe'"),
    ({"amp": "yes"}, "amp must be True or False, got 'yes'"),
    ({"reference_accuracy": 1.5}, "reference_accuracy is a fraction in [0, 1], got 1.5"),
    ({"tpok": 5}, "unknown option 'tpok'; did you mean 'topk'?"),
])
def test_options_check_themselves_and_name_the_option(tmp_path, kwargs, match):
    with pytest.raises(OptionError, match=re.escape(match)):
        EvalOptions.build(**kwargs)
    with pytest.raises(OptionError, match=re.escape(match)):  # before anything is read: the suite is not there
        genshift.evaluate("test_resnet.r160_in1k", str(tmp_path / "no-suite"), **kwargs)
    assert "--" not in match


def test_a_module_timm_does_not_know_takes_a_data_config_or_a_transform_and_an_id(tmp_path, small_suite):
    from torchvision import transforms

    class Net(torch.nn.Module):
        num_classes = 1000

        def __init__(self):
            super().__init__()
            self.pool = torch.nn.AdaptiveAvgPool2d(1)
            self.fc = torch.nn.Linear(3, 1000)

        def forward(self, x):
            return self.fc(self.pool(x).flatten(1))

    net = Net()
    with pytest.raises(BenchError, match="needs model_id= and data_config= \\(or transform=\\)"):
        genshift.evaluate(net, str(small_suite))
    by_config = genshift.evaluate(net, str(small_suite), model_id="mynet", data_config={"input_size": (3, 64, 64)},
                                  workers=0, progress=False)
    assert re.fullmatch(r"mynet@sha256:[0-9a-f]{16}", by_config.model["id"])
    assert by_config.record["data_config"]["input_size"] == [3, 64, 64]  # the rest defaulted as timm does
    own = transforms.Compose([transforms.Resize((64, 64)), transforms.ToTensor()])
    by_transform = genshift.evaluate(net, str(small_suite), model_id="mynet", transform=own, workers=0,
                                     progress=False)
    assert by_transform.record["data_config"] == {"transform": repr(own)}
    assert by_transform.predictions("base").num_rows == 15
    with pytest.raises(OptionError, match="model_id, data_config and transform go with a module"):
        genshift.evaluate("test_resnet.r160_in1k", str(small_suite), model_id="x")


def test_out_none_leaves_nothing_behind_and_verify_needs_the_files(small_suite, tiny_checkpoint):
    before = set(Path(tempfile.gettempdir()).glob("genshift-eval-*"))
    result = genshift.evaluate(f"test_resnet.r160_in1k={tiny_checkpoint}", str(small_suite), workers=0,
                               progress=False)
    assert set(Path(tempfile.gettempdir()).glob("genshift-eval-*")) == before
    assert result.path is None and result.predictions("shifted").num_rows == 15
    with pytest.raises(BenchError, match="made with out=None and its files are gone"):
        genshift.verify(result)


def test_verify_and_slope_take_results(tmp_path, small_suite, tiny_checkpoint):
    results = [genshift.evaluate(f"test_resnet.r160_in1k={tiny_checkpoint}", str(small_suite), out=tmp_path,
                                 workers=0, progress=False, seed=seed) for seed in (0,)]
    assert genshift.verify(results[0], suite=str(small_suite)).ok
    assert genshift.load_suite(str(small_suite)).suite_id == results[0].suite["id"]
    with pytest.raises(BenchError, match="at least 2 models"):
        genshift.slope(results)


@pytest.mark.slow
def test_the_readme_notebook_snippet_runs(tmp_path, monkeypatch, lite0_weights):
    """README.md's ```python block, run as a doctest on the offline route's demo suite (smaller here)."""
    from genshift.synthetic import make_synthetic_suite

    text = (ROOT / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if ">>>" in b]
    make_synthetic_suite(tmp_path / "demo-suite", configs=("base", "in_the_snow"), classes=range(3), per_class=2,
                         image_size=96)
    monkeypatch.chdir(tmp_path)
    test = doctest.DocTestParser().get_doctest(block, {}, "README.md", "README.md", 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
