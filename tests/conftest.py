"""Test configuration. Environment variables that huggingface_hub reads at import are set here,
before anything imports it (specs/ecosystem.md s2.4)."""

import os
import tempfile

_HF_HOME = tempfile.mkdtemp(prefix="genshift-test-hf-")
os.environ.setdefault("HF_HOME", _HF_HOME)
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")

import pytest  # noqa: E402


@pytest.fixture
def toy_suite(tmp_path):
    """A small synthetic suite (2 configs x 10 classes x 4 images, 2 shards per config)."""
    from benchmark.synthetic import make_synthetic_suite

    root = tmp_path / "toy"
    make_synthetic_suite(root, configs=("base", "shifted"), classes=range(10), per_class=4, num_shards=2)
    return root
