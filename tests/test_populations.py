"""The papers' model populations: registry data, `bench eval --models <population>`, `bench suites`."""

import logging

import pytest
import timm
from timm.models import get_pretrained_cfg

from genshift.cli import main
from genshift.errors import BenchError
from genshift.identity import timm_name as model_key
from genshift.populations import get_population, list_populations
from genshift.eval.model_list import resolve_models


def test_every_public_member_is_a_pretrained_1000_class_timm_tag():
    have = set(timm.list_pretrained())
    for name in list_populations():
        for m in get_population(name).public():
            assert m.model in have, f"{name}: {m.model} is not a timm pretrained tag"
            assert "." in m.model, f"{name}: {m.model} is not pinned to a tag"
            assert get_pretrained_cfg(m.model).num_classes == 1000


def test_population_sizes_and_names_follow_the_papers():
    star = get_population("imagenet-star-61")
    assert len(star.members) == 61 and len({m.paper for m in star.members}) == 61
    # plain names whose default changed since timm 0.6 are pinned to the 0.6.12 weights
    by_paper = {m.paper: m.model for m in star.members}
    assert by_paper["convnext_tiny"] == "convnext_tiny.fb_in1k"
    assert by_paper["vit_base_patch16_224"] == "vit_base_patch16_224.augreg_in21k_ft_in1k"
    assert by_paper["tf_efficientnetv2_s"] == "tf_efficientnetv2_s.in1k"
    lance = get_population("lance-table2")
    assert lance.paper_names() == ["ResNet-50", "ViT-B", "ConvNext"]
    assert "0.4.12" in lance.choice  # the reason for the tags is recorded
    fig4 = get_population("in-g-fig4")
    roles = {m.paper: m.role for m in fig4.members}
    assert [p for p, r in roles.items() if r == "in21k"] == ["BiT-M R101x1", "ViT-B/16 (IN-21k)", "ViT-B/32 (IN-21k)"]
    assert {m.paper for m in fig4.members if m.local} == {"RN2", "VIT2"}


def test_models_takes_a_population_by_name(caplog):
    specs, _ = resolve_models(None, models_file="lance-table2")
    assert [s.name for s in specs] == ["resnet50.a1_in1k", "vit_base_patch16_224.augreg_in21k_ft_in1k",
                                       "convnext_base.fb_in1k"]
    with caplog.at_level(logging.INFO, logger="genshift.populations"):
        specs, _ = resolve_models(None, models_file="in-g-fig4")
    assert len(specs) == 5 and all(s.checkpoint is None for s in specs)
    assert "RN2" in caplog.text and "bench eval --model resnet50=<file>" in caplog.text


def test_a_file_of_the_same_name_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lance-table2").write_text("resnet18.a1_in1k\n")
    specs, _ = resolve_models(None, models_file="lance-table2")
    assert [s.name for s in specs] == ["resnet18.a1_in1k"]


def test_unknown_models_name_is_one_line_listing_populations(tmp_path):
    with pytest.raises(BenchError, match=r"no such file and no such population \(populations: imagenet-star-61, "
                                         r"in-g-fig4, lance-table2\)"):
        resolve_models(None, models_file=str(tmp_path / "lance-tabel2"))


def test_bench_suites_lists_populations(capsys):
    assert main(["suites"]) == 0
    out = capsys.readouterr().out
    assert "imagenet-star-61  61" in out and "lance-table2" in out
    assert main(["suites", "--populations"]) == 0
    out = capsys.readouterr().out
    assert "vit_base_patch16_224 (your checkpoint)" in out and "VIT2" in out


def test_model_key_strips_every_id_form():
    for form in ("resnet50.a1_in1k", "timm/resnet50.a1_in1k", "hf-hub:timm/resnet50.a1_in1k@" + "a" * 40,
                 "hf_hub:timm/resnet50.a1_in1k"):
        assert model_key(form) == "resnet50.a1_in1k"
    assert model_key("hf-hub:org/net@main") == "org/net"
