"""The papers' reported numbers on the board: a separate table, cited, never verified or ranked."""

import numpy as np
import pytest

from genshift.leaderboard.aggregate import reported_frame
from genshift.leaderboard.ui import REPORTED as HEADING


@pytest.fixture(autouse=True)
def clear_streamlit_caches():
    import streamlit as st
    st.cache_data.clear()
    st.cache_resource.clear()


def test_reported_frame_cites_every_number():
    lance = reported_frame("lance-hardimagenet")
    assert len(lance) == 4 * 4 * 2  # Table 2: 4 rows x 4 models x acc@1/acc@5
    row = lance[(lance["row"] == "4 LANCE") & (lance["model"] == "ResNet-50") & (lance["metric"] == "acc@1 %")]
    assert row["reported"].tolist() == ["74.01"] and row["timm"].tolist() == ["resnet50.a1_in1k"]
    assert set(lance["where"]) == {"Table 2"} and all(p.startswith("Prabhu et al., LANCE") for p in lance["paper"])
    assert lance.loc[lance["model"] == "CLIP", "timm"].eq("").all()  # not a timm classifier: no tag invented
    rn = reported_frame("in-g-rn")
    assert rn[["model", "timm", "reported"]].values.tolist() == [
        ["RN2", "resnet50 (own checkpoint)", "78"],
        ["BiT-M R101x1, ViT-B/16 (IN-21k), ViT-B/32 (IN-21k)", "resnetv2_101x1_bit.goog_in21k_ft_in1k, "
         "vit_base_patch16_224.augreg_in21k_ft_in1k, vit_base_patch32_224.augreg_in21k_ft_in1k", "39-53"]]
    assert "78% of the failures in IN-G-RN transfer to RN2" in rn["row"].iloc[0]
    assert not {"rank", "verified", "value"} & set(rn.columns)  # nothing to rank or verify
    assert reported_frame("imagenet-star").empty  # the blog post plots, it prints no numbers


def _app(source):
    from tests.boardkit import app

    return app(source)


def test_board_shows_the_reported_table_before_the_first_result(tmp_path):
    (tmp_path / "empty").mkdir()
    at = _app(tmp_path / "empty")
    assert not at.exception and "No results yet" in at.info[0].value
    assert [s.value for s in at.subheader] == [HEADING]
    assert len(at.dataframe[0].value) == len(reported_frame())


def test_reported_rows_sit_beside_the_ranked_table_never_in_it(tmp_path):
    from tests.synthetic_store import write_model

    rng = np.random.default_rng(0)
    difficulty = {"generated": rng.normal(0, 1, 40)}
    for i, arch in enumerate(("resnet50", "vit_base_patch16_224")):
        write_model(tmp_path / "store", suite_id="in-g-rn", configs=["generated"], model_id=f"timm/{arch}.x_in1k",
                    architecture=arch, tag="x_in1k", num_params=25e6, skill=1.0 + i, difficulty=difficulty, rng=rng,
                    family="accuracy")
    at = _app(tmp_path / "store")
    assert not at.exception
    heads = [s.value for s in at.subheader]
    assert "Official ranking (verified, complete entries)" in heads and HEADING in heads
    ranked = at.dataframe[0].value
    assert len(ranked) == 2 and not ranked.astype(str).apply(lambda c: c.str.contains("RN2")).any().any()
    shown = next(d.value for d in at.dataframe if "reported" in d.value.columns)
    assert shown["reported"].tolist() == ["78", "39-53"] and set(shown["suite"]) == {"in-g-rn"}
