"""The papers' model populations: registry data, `bench eval --models <population>`, `bench suites`."""

import importlib.util
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import yaml
from timm.models import get_pretrained_cfg

from genshift.cli import main
from genshift.errors import BenchError
from genshift.eval.options import ModelSpec, resolve_models
from genshift.suites import ROLES, get_population, list_populations

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("pin_imagenet_star", ROOT / "scripts" / "pin_imagenet_star.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _wheel(version, tmp_path):
    """timm ``version``'s wheel from PyPI (its own source), or a skip naming why."""
    proc = subprocess.run([sys.executable, "-m", "pip", "download", f"timm=={version}", "--no-deps", "-q", "-d",
                           str(tmp_path)], capture_output=True, text=True, timeout=300)
    wheels = list(tmp_path.glob(f"timm-{version}-*.whl"))
    if proc.returncode or not wheels:
        pytest.skip(f"PyPI unreachable, cannot download timm=={version} to compare: {proc.stderr.strip()[-200:]}")
    return wheels[0]


def test_every_public_member_is_a_pretrained_1000_class_timm_tag_with_a_role():
    have = set(timm.list_pretrained())
    for name in list_populations():
        for m in get_population(name).members:
            assert m.role in ROLES
            if m.local:
                continue
            assert m.model in have, f"{name}: {m.model} is not a timm pretrained tag"
            assert "." in m.model, f"{name}: {m.model} is not pinned to a tag"
            assert get_pretrained_cfg(m.model).num_classes == 1000


@pytest.mark.slow
def test_imagenet_star_pins_are_what_timm_0_6_12_loaded(tmp_path):
    """Every pin and data config re-derived from timm 0.6.12's own ``default_cfgs`` (the PyPI wheel):
    0.6.12's ``resnet18`` loads ``https://download.pytorch.org/models/resnet18-5c106cde.pth`` (today
    ``resnet18.tv_in1k``), ``resnet34`` ``.../v0.1-weights/resnet34-43635321.pth`` (``resnet34.bt_in1k``),
    ``resnet50`` ``resnet50_a1_0-14fe96d1.pth`` with ``crop_pct=0.95`` and no test size (224 px)."""
    script = _script()
    derived = script.derive(_wheel("0.6.12", tmp_path), script.read_names())
    shipped = yaml.safe_load((ROOT / "benchmark/_data/imagenet_star_61.yaml").read_text())["models"]
    assert derived == shipped
    by = {m["paper"]: m for m in shipped}
    assert by["resnet18"]["model"] == "resnet18.tv_in1k" and by["resnet34"]["model"] == "resnet34.bt_in1k"
    rn50 = by["resnet50"]["data_config"]
    assert rn50["input_size"] == [3, 224, 224] and rn50["crop_pct"] == 0.95


@pytest.mark.slow
def test_lance_table2_pins_are_timm_0_5_4s_plain_name_defaults(tmp_path):
    """The stated rule of lance-table2: the weights the plain names loaded in timm 0.5.4 (the first
    timm with ConvNeXt), read from its ``default_cfgs``; matched to today's tags by URL."""
    wheel = _wheel("0.5.4", tmp_path)
    script = _script()
    code = script._READ_OLD.replace('"0.6.12"', '"0.5.4"')
    import json
    import tempfile
    import zipfile
    with tempfile.TemporaryDirectory() as tmp:
        zipfile.ZipFile(wheel).extractall(tmp)
        out = subprocess.run([sys.executable, "-c", code, tmp, json.dumps(["resnet50", "vit_base_patch16_224",
                                                                           "convnext_base"]),
                              json.dumps(["resnet", "vision_transformer", "convnext"])],
                             capture_output=True, text=True, check=True).stdout
    urls = {n: v["url"] for n, v in json.loads(out).items()}
    pins = {m.paper: m.model for m in get_population("lance-table2").members}
    assert {p: get_pretrained_cfg(pins[p]).url for p in pins} == {
        "ResNet-50": urls["resnet50"], "ViT-B": urls["vit_base_patch16_224"], "ConvNext": urls["convnext_base"]}


def test_population_sizes_roles_and_the_stated_conflicts():
    """Every member names its role; lance-table2 states its rule and each conflict with the paper: App. F,
    "All the models that we evaluate are trained with supervised learning on ImageNet-1K" (its ViT-B was
    pretrained on ImageNet-21k), and the authors' walkthrough, which scores torchvision's ResNet-50 V1."""
    star = get_population("imagenet-star-61")
    assert len(star.members) == 61 and len({m.paper for m in star.members}) == 61
    assert {m.role for m in star.members} == {"fit"} and star.data_config_from == "timm 0.6.12"
    by_paper = {m.paper: m for m in star.members}
    assert by_paper["convnext_tiny"].model == "convnext_tiny.fb_in1k"  # plain names whose default changed
    assert by_paper["resnet18"].model == "resnet18.tv_in1k" and by_paper["resnet34"].model == "resnet34.bt_in1k"
    lance = get_population("lance-table2")
    assert lance.paper_names() == ["ResNet-50", "ViT-B", "ConvNext"] and {m.role for m in lance.members} == {"column"}
    # the rule and every conflict with the paper's text are written in the choice
    assert "timm 0.5.4" in lance.choice
    assert "trained with supervised learning on ImageNet-1K" in lance.choice and "ImageNet-21k" in lance.choice
    assert "walkthrough" in lance.choice and "resnet50.tv_in1k" in lance.choice
    fig4 = get_population("in-g-fig4")
    roles = {m.paper: m.role for m in fig4.members}
    assert [p for p, r in roles.items() if r == "in21k"] == ["BiT-M R101x1", "ViT-B/16 (IN-21k)", "ViT-B/32 (IN-21k)"]
    replicas = {p for p, r in roles.items() if r == "replica"}
    assert {m.paper for m in fig4.members if m.local} == {"RN2", "VIT2"} == replicas


def test_models_takes_a_population_by_name_at_its_recorded_data_config(caplog):
    specs, _ = resolve_models(None, models_file="lance-table2")
    assert [s.name for s in specs] == ["resnet50.a1_in1k", "vit_base_patch16_224.augreg_in21k_ft_in1k",
                                       "convnext_base.fb_in1k"]
    assert all(s.data_config is None for s in specs)  # no recorded config: today's timm
    specs, _ = resolve_models(None, models_file="imagenet-star-61")
    rn50 = next(s for s in specs if s.name == "resnet50.a1_in1k")
    assert rn50.data_config["input_size"] == [3, 224, 224] and rn50.data_config["crop_pct"] == 0.95
    assert rn50.data_config_from == "timm 0.6.12"
    today, _ = resolve_models(None, models_file="imagenet-star-61", population_config="today")
    assert all(s.data_config is None and s.data_config_from is None for s in today)
    with caplog.at_level(logging.INFO, logger="genshift.suites"):
        specs, _ = resolve_models(None, models_file="in-g-fig4")
    assert len(specs) == 5 and all(s.checkpoint is None for s in specs)
    assert "RN2" in caplog.text and "bench eval --model resnet50=<file>" in caplog.text
    assert "bench reproduce --member RN2=<model id>" in caplog.text


def test_a_recorded_data_config_is_what_the_model_runs_at_and_the_protocol_says(toy_suite, tmp_path, tiny_checkpoint):
    from genshift.eval.options import EvalOptions
    from genshift.eval.results import load_result
    from genshift.eval.sweep import SweepRequest, run_sweep

    recorded = {"input_size": [3, 48, 48], "crop_pct": 0.95, "interpolation": "bilinear"}
    spec = ModelSpec("test_resnet.r160_in1k", str(tiny_checkpoint), data_config=recorded,
                     data_config_from="timm 0.6.12")
    jobs = run_sweep(SweepRequest(models=(spec,), suite=str(toy_suite), out=str(tmp_path / "runs"),
                                  options=EvalOptions(workers=0, progress=False)))
    result = load_result(jobs[0].run_dir / "result.json")  # the schema accepts the protocol's data_config
    assert result["protocol"]["data_config"] == "timm 0.6.12"
    dc = result["data_config"]
    assert (dc["input_size"], dc["crop_pct"], dc["interpolation"]) == ([3, 48, 48], 0.95, "bilinear")


def test_a_file_of_the_same_name_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lance-table2").write_text("resnet18.a1_in1k\n")
    specs, _ = resolve_models(None, models_file="lance-table2")
    assert [s.name for s in specs] == ["resnet18.a1_in1k"]


def test_unknown_models_name_is_one_line_listing_populations(tmp_path):
    with pytest.raises(BenchError, match=r"no such file and no such population\..*\(populations: imagenet-star-61, "
                                         r"in-g-fig4, lance-table2\)"):
        resolve_models(None, models_file=str(tmp_path / "lance-tabel2"))


def test_bench_suites_lists_populations(capsys):
    assert main(["suites"]) == 0
    out = capsys.readouterr().out
    assert "imagenet-star-61  61" in out and "lance-table2" in out
    assert main(["suites", "--populations"]) == 0
    out = capsys.readouterr().out
    assert "vit_base_patch16_224 (your checkpoint)" in out and "VIT2" in out and "replica" in out
