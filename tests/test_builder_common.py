"""Shared builder components: seeds, sharding, OOM back-off, tiny models, CLIP scoring."""

import pytest
import torch

from genshift.builders.seeding import derive_seed, generator
from genshift.distributed import Process, plan_shards, shard_of
from genshift.errors import BenchError
from genshift.oom import BatchBackoff


def test_seeds_are_stable_and_distinct():
    a = derive_seed(1234, "in_the_snow", 7, 3)
    assert a == derive_seed(1234, "in_the_snow", 7, 3)
    seeds = {derive_seed(1234, c, k, i) for c in ("base", "in_the_snow") for k in range(20) for i in range(50)}
    assert len(seeds) == 2000
    assert derive_seed(1, "x") != derive_seed(2, "x")
    assert 0 <= a < 2**63
    assert torch.equal(torch.randn(3, generator=generator(a)), torch.randn(3, generator=generator(a)))


def test_sharding_is_a_function_of_the_key_only():
    items = [f"base/{c}/{i}" for c in range(30) for i in range(5)]
    shards = plan_shards(items, 4, key=str)
    assert sorted(sum(shards, [])) == sorted(items)
    fewer = plan_shards(items[::2], 4, key=str)  # removing items never moves the others
    for k in range(4):
        assert fewer[k] == [x for x in shards[k] if x in set(items[::2])]
    assert all(shard_of(x, 4) == k for k in range(4) for x in shards[k])
    procs = [Process(i, 3) for i in range(3)]
    owned = [p.my_shards(list(range(10))) for p in procs]
    assert sorted(sum(owned, [])) == list(range(10)) and procs[0].is_main and not procs[1].is_main


def test_batch_backoff_halves_on_oom_and_keeps_results():
    calls = []

    def fn(chunk):
        calls.append(len(chunk))
        if len(chunk) > 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
        return [x * 2 for x in chunk]

    b = BatchBackoff(16)
    assert b.call(fn, list(range(10))) == [x * 2 for x in range(10)]
    assert b.batch_size == 2 and calls[:3] == [10, 8, 4]


def test_batch_backoff_gives_up_with_a_clear_error_and_reraises_others():
    def always_oom(chunk):
        raise RuntimeError("CUDA error: out of memory")

    with pytest.raises(BenchError, match="even with a batch of 1"):
        BatchBackoff(4).call(always_oom, [1, 2])

    def bug(chunk):
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        BatchBackoff(4).call(bug, [1])


def test_offline_clip_tokenizer_matches_open_clip():
    import open_clip

    from genshift.builders.real_models import clip_tokenizer
    tok = clip_tokenizer()
    text = "a photo of a Golden Retriever in the snow, at dusk!"
    ids = tok(text).input_ids
    ref = open_clip.tokenize([text])[0]
    assert ids == ref[: len(ids)].tolist() and len(tok) == 49408


def test_clip_scorer_tiny_embeddings_are_normalised():
    import numpy as np
    from PIL import Image

    from genshift.builders.clip_scoring import ClipScorer, cosine
    s = ClipScorer.tiny()
    img = Image.fromarray(np.random.default_rng(0).integers(0, 255, (48, 48, 3), dtype=np.uint8))
    e = s.encode_images([img, img.convert("L")])
    t = s.encode_texts(["a photo of a dog", "a photo in the grass"])
    assert e.shape == t.shape == (2, 32)
    assert torch.allclose(e.norm(dim=-1), torch.ones(2), atol=1e-5)
    assert torch.allclose(cosine(e, e), torch.ones(2), atol=1e-5)


def test_fixed_threads_sets_and_restores_the_thread_count():
    from genshift.builders.common import fixed_threads

    before = torch.get_num_threads()
    with fixed_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_files_digest_names_content_not_location(tmp_path):
    from genshift.builders.common import files_digest

    for root in (tmp_path / "a" / "imgs", tmp_path / "b" / "imgs"):
        (root / "n01").mkdir(parents=True)
        (root / "n01" / "0.png").write_bytes(b"x")
    a = files_digest(tmp_path / "a" / "imgs", [tmp_path / "a" / "imgs" / "n01" / "0.png"])
    assert a == files_digest(tmp_path / "b" / "imgs", [tmp_path / "b" / "imgs" / "n01" / "0.png"])
    import hashlib
    line = f"n01/0.png:{hashlib.sha256(b'x').hexdigest()}\n"  # hand-computed
    assert a == {"name": "imgs", "files": 1, "sha256": hashlib.sha256(line.encode()).hexdigest()}
    (tmp_path / "b" / "imgs" / "n01" / "0.png").write_bytes(b"y")
    assert a != files_digest(tmp_path / "b" / "imgs", [tmp_path / "b" / "imgs" / "n01" / "0.png"])


SMALLEST = {"imagenet-star": ["--shifts", "base", "--samples-per-class", "1"],
            "lance-hardimagenet": ["--max-edits", "1"],
            "in-g-rn": ["--n-max", "4"]}


@pytest.mark.parametrize("suite", sorted(SMALLEST))
@pytest.mark.slow
def test_smoke_builds_do_not_depend_on_the_folder_or_the_thread_count(suite, tmp_path):
    """Two builds to different --out folders under 1 and 2 torch threads: the same files, byte for
    byte, and the same manifest (no local path in it; model steps run with --cpu-threads)."""
    from genshift.cli import main
    from genshift.suite_format import LocalSuite

    before = torch.get_num_threads()
    outs = [tmp_path / "first" / "suite", tmp_path / "elsewhere" / "other-name"]
    try:
        for out, threads in zip(outs, (1, 2)):
            torch.set_num_threads(threads)
            assert main(["build", suite, "--smoke", "--out", str(out), "--no-progress", *SMALLEST[suite]]) == 0
    finally:
        torch.set_num_threads(before)

    def tree(root):
        return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    a, b = tree(outs[0]), tree(outs[1])
    assert a.keys() == b.keys() and "manifest.json" in a
    assert [k for k in a if a[k] != b[k]] == []
    assert LocalSuite.open(outs[0]).manifest.sha256 == LocalSuite.open(outs[1]).manifest.sha256
    text = a["manifest.json"].decode()
    assert str(tmp_path) not in text and "first" not in text
    assert LocalSuite.open(outs[0]).manifest.generator["determinism"]["cpu_intra_op_threads"] == 1


def test_builders_never_import_the_cli_and_eval_never_imports_builders():
    """Data flows one way (issue 33.3): builders take typed configs, never argparse or the CLI; eval,
    the core and the board never import builders (the CLI's build/discover verbs are the only way in)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]

    def imports(path):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                yield from (a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                yield node.module

    for path in (root / "builders").glob("*.py"):
        bad = [m for m in imports(path) if m == "argparse" or m.startswith("genshift.cli")]
        assert not bad, (path.name, bad)
    for folder in ("eval", "leaderboard", "data_cards"):
        for path in (root / folder).glob("*.py"):
            assert not [m for m in imports(path) if m.startswith("genshift.builders")], path
    for path in (root / "benchmark").glob("*.py"):  # the core (the CLI is benchmark/cli/)
        assert not [m for m in imports(path) if m.startswith("genshift.builders")], path
