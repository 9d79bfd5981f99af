"""LANCE's evaluation setting (`--preprocess lance-square`): the whole image squashed to 224x224."""

import numpy as np
import pytest
import torch
from PIL import Image

from genshift.errors import BenchError


def _stripes(width=448, height=224):
    """A wide image: a red band at the left edge, a blue band at the right edge, grey between."""
    a = np.full((height, width, 3), 128, np.uint8)
    a[:, :40] = (255, 0, 0)
    a[:, -40:] = (0, 0, 255)
    return Image.fromarray(a)


def test_lance_square_squashes_the_whole_image_to_224_without_a_crop():
    import timm
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

    from genshift.eval.inference import make_transform
    from genshift.eval.models import eval_transform

    model = timm.create_model("resnet18.tv_in1k", pretrained=False)  # timm config: 224, crop_pct 0.875
    square_cfg, square = eval_transform(model, "lance-square")
    timm_cfg, timm_tf = eval_transform(model, "timm")
    assert square_cfg["input_size"] == [3, 224, 224]
    assert square_cfg["crop_mode"] == "squash" and square_cfg["crop_pct"] == 1.0
    assert timm_cfg["crop_pct"] < 1.0  # timm's own: resize the shorter side, centre crop
    img = _stripes()
    mean = torch.tensor(IMAGENET_DEFAULT_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_DEFAULT_STD).view(3, 1, 1)
    x = (square(img) * std + mean)  # back to [0, 1]
    assert tuple(x.shape) == (3, 224, 224)
    # squashed 2:1 horizontally: each 40-px band is 20 px wide and still at the edges
    assert x[0, :, :15].min() > 0.95 and x[2, :, :15].max() < 0.05      # red on the left
    assert x[2, :, -15:].min() > 0.95 and x[0, :, -15:].max() < 0.05    # blue on the right
    assert abs(float(x[0, 112, 112]) - 128 / 255) < 0.01
    # timm's centre crop of the same image loses both bands
    y = timm_tf(img) * std + mean
    assert y[0, :, :5].max() < 0.6 and y[2, :, -5:].max() < 0.6
    # the harness builds its transform from the recorded data config: same pixels
    assert torch.allclose(make_transform(square_cfg, uint8=False)(img), square(img))
    with pytest.raises(BenchError, match="unknown preprocessing 'lance'"):
        eval_transform(model, "lance")


def test_bench_eval_records_the_preprocessing_and_verify_reruns_with_it(tmp_path, toy_suite, tiny_checkpoint,
                                                                        tiny_folder):
    from genshift.cli import main
    from genshift.eval.results import config_hash, load_result
    from genshift.eval.verify import verify_result

    code = main(["eval", "--model", "test_resnet.r160_in1k", "--checkpoint", str(tiny_checkpoint), "--suite",
                 str(toy_suite), "--preprocess", "lance-square", "--out", str(tmp_path), "--workers", "0",
                 "--compile", "off", "--no-progress"])
    assert code == 0
    path = tmp_path / "toy" / tiny_folder / "result.json"
    r = load_result(path)
    assert r["protocol"]["preprocess"] == "lance-square" and r["data_config"]["crop_mode"] == "squash"
    assert r["data_config"]["input_size"] == [3, 224, 224]  # the tiny model's own test size is 160
    # both the option and the data config are in the config hash
    timm_protocol = {**r["protocol"], "preprocess": "timm"}
    assert config_hash(r["model"], r["suite"], timm_protocol, r["data_config"]) != r["config_hash"]
    assert config_hash(r["model"], r["suite"], r["protocol"], {**r["data_config"], "crop_mode": "center"}) != \
        r["config_hash"]
    report = verify_result(path, recheck=4, checkpoint=str(tiny_checkpoint),
                           suite=str(toy_suite))  # re-runs with the recorded setting
    assert report.ok, report.problems


def test_lance_square_normalises_every_model_with_imagenet_mean_std_as_the_authors():
    """The walkthrough applies ImageNet mean/std to every model; a ViT augreg model's own is 0.5.
    By hand, a uniform grey of 128/255 = 0.50196: ImageNet red (0.50196 - 0.485) / 0.229 = 0.07406,
    own (0.50196 - 0.5) / 0.5 = 0.00392."""
    import timm
    from PIL import Image

    from genshift.eval.models import eval_transform

    model = timm.create_model("vit_tiny_patch16_224.augreg_in21k_ft_in1k", pretrained=False)
    assert tuple(model.pretrained_cfg["mean"]) == (0.5, 0.5, 0.5)
    grey = Image.new("RGB", (300, 200), (128, 128, 128))
    cfg, tf = eval_transform(model, "lance-square")
    own_cfg, own_tf = eval_transform(model, "lance-square-model-norm")
    assert cfg["mean"] == [0.485, 0.456, 0.406] and cfg["std"] == [0.229, 0.224, 0.225]
    assert own_cfg["mean"] == [0.5, 0.5, 0.5] and own_cfg["crop_mode"] == "squash"
    assert abs(float(tf(grey)[0, 100, 100]) - 0.07406) < 1e-3
    assert abs(float(own_tf(grey)[0, 100, 100]) - 0.00392) < 1e-3
