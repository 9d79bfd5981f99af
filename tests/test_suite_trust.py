"""Suites from outside are hostile: every bad manifest, path, card or row is one clear error
(a BenchError line), before any model loads, with nothing written; every suite the project
writes loads config by config with the real ``datasets`` client."""

import copy
import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from datasets import ClassLabel, Image, load_dataset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from genshift.cli import main
from genshift.data_cards import demo_card, render_card
from genshift.errors import BenchError, IntegrityError
from genshift.fsutil import sha256_file
from genshift.hub import open_suite
from genshift.suite_format import LocalSuite, SuiteWriter, rows_digest
from genshift.synthetic import make_synthetic_suite

SHARD = "data/base/test-00000-of-00002.parquet"


def _listing(root: Path) -> dict:
    """Every path under ``root`` with its size and mtime (to prove nothing was written)."""
    return {str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in root.rglob("*")}


def _one_line_cli_error(argv, capsys) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def _load_manifest(root):
    return json.loads((root / "manifest.json").read_text())


def _save_manifest(root, raw):
    (root / "manifest.json").write_text(json.dumps(raw))


def _forge(root: Path, rel: str, edit, **write) -> None:
    """Rewrite one shard's rows with ``edit(table) -> table`` (``write``: pq.write_table options) and
    recompute, as a forger would, every number the manifest holds for it: size, sha256, rows, kept
    and rows digest."""
    t = pq.read_table(root / rel)
    pq.write_table(edit(t), root / rel, **write)  # keeps the 'huggingface' schema metadata
    raw = _load_manifest(root)
    raw["files"][rel] = {"size": (root / rel).stat().st_size, "sha256": sha256_file(root / rel)}
    config = rel.split("/")[1]
    c = raw["configs"][config]
    tables = [pq.read_table(root / f, columns=["image_id", "label", "keep"]) for f in c["files"]]
    table = pa.concat_tables(tables, promote_options="permissive")
    c["rows"], c["kept"] = table.num_rows, sum(table["keep"].to_pylist())
    c["rows_digest"] = rows_digest(*(table[k].to_pylist() for k in ("image_id", "label", "keep")))
    _save_manifest(root, raw)


def _set_label(row: int, value: int):
    def edit(t):
        labels = t["label"].to_pylist()
        labels[row] = value
        return t.set_column(t.schema.get_field_index("label"), t.schema.field("label"), pa.array(labels, pa.int64()))
    return edit


def _set_image_id(row: int, value: str):
    def edit(t):
        ids = t["image_id"].to_pylist()
        ids[row] = value
        return t.set_column(t.schema.get_field_index("image_id"), t.schema.field("image_id"), pa.array(ids))
    return edit


def _replace_column(name: str, make):
    def edit(t):
        i = t.schema.get_field_index(name)
        col = make(t[name])
        return t.set_column(i, pa.field(name, col.type), col)
    return edit


def _duplicate_row(row: int):
    return lambda t: pa.concat_tables([t, t.slice(row, 1)])


def _grow_to(rows: int):
    """The shard's first row repeated under new image ids up to ``rows`` rows."""
    def edit(t):
        grown = pa.concat_tables([t.slice(0, 1)] * rows)
        ids = pa.array([f"base/many/{i:05d}" for i in range(rows)])
        return grown.set_column(grown.schema.get_field_index("image_id"), grown.schema.field("image_id"), ids)
    return edit


def _huge_footer(t):
    """33 MiB of schema metadata: the footer, not the rows, is over the limit."""
    return t.replace_schema_metadata({**t.schema.metadata, b"padding": b"0" * (33 << 20)})


# -- every writer's suite is a Hub dataset: load_dataset(folder, config), one config at a time ------------

def _check_loads_by_config(root: Path):
    suite = LocalSuite.open(root)
    assert suite.card is not None
    for config in suite.configs:
        ds = load_dataset(str(root), config, split="test")
        assert len(ds) == suite.manifest.configs[config].rows
        assert set(ds["config"]) == {config}  # this config only, not the shifts merged
        assert isinstance(ds.features["label"], ClassLabel) and isinstance(ds.features["image"], Image)
        assert ds.features["label"].names[:2] == ["n01440764", "n01443537"]
    if len(suite.configs) > 1:
        with pytest.raises(ValueError, match="Config name is missing"):
            load_dataset(str(root), split="test")


def test_synthetic_cli_suite_loads_config_by_config(tmp_path):
    from genshift.cli import main

    out = tmp_path / "demo"
    assert main(["demo-suite", "--out", str(out), "--configs", "base,in_the_snow", "--classes", "3",
                 "--per-class", "2"]) == 0
    _check_loads_by_config(out)
    head = (out / "README.md").read_text().split("---")[1]
    assert "size_categories:\n- n<1K" in head and "n01440764" not in head  # compact: features are in the parquet


def test_suite_writer_suite_with_card_loads_config_by_config(tmp_path):
    root = tmp_path / "w"
    with SuiteWriter(root, suite_id="mine") as w:
        for config in ("night", "fog"):
            w.write_shard(config, 0, 1, ({"image": {"bytes": _jpeg(i), "path": None},
                                          "label": 7 * i, "image_id": f"{config}/{i}", "config": config,
                                          "keep": i % 2 == 0, "pair_id": None} for i in range(3)))
        m = w.finalize(generator={}, card=lambda m: render_card(m, license="other"))
    assert m.format_version == "1.1" and all(len(c.rows_digest) == 64 for c in m.configs.values())
    head = (root / "README.md").read_text()
    assert "license_name: imagenet-terms-of-access" in head and "license_link: https://image-net.org/download" in head
    _check_loads_by_config(root)


def _jpeg(i: int) -> bytes:
    import io

    from PIL import Image as PILImage

    buf = io.BytesIO()
    PILImage.new("RGB", (8, 8), (i * 40 % 256, 10, 20)).save(buf, format="JPEG")
    return buf.getvalue()


# -- format 1.1 and old format-1 suites -------------------------------------------------------------------

def test_rows_digest_is_recorded_and_recomputed_for_format_1(toy_suite):
    suite = LocalSuite.open(toy_suite)
    recorded = {c: suite.rows_digest(c) for c in suite.configs}
    t = pa.concat_tables(pq.read_table(p, columns=["image_id", "label", "keep"]) for p in suite.files("base"))
    assert recorded["base"] == rows_digest(*(t[k].to_pylist() for k in ("image_id", "label", "keep")))
    raw = _load_manifest(toy_suite)  # the same suite as format 1: no digests in the manifest
    raw["format_version"] = 1
    for c in raw["configs"].values():
        del c["rows_digest"]
    _save_manifest(toy_suite, raw)
    old = LocalSuite.open(toy_suite)
    assert old.manifest.configs["base"].rows_digest is None
    assert {c: old.rows_digest(c) for c in old.configs} == recorded


@pytest.mark.parametrize("version", [2, "1.2", 1.0, True, "1", None])
def test_other_format_versions_are_refused(toy_suite, version):
    raw = _load_manifest(toy_suite)
    raw["format_version"] = version
    _save_manifest(toy_suite, raw)
    with pytest.raises(IntegrityError, match="format_version .* is not supported"):
        LocalSuite.open(toy_suite)


# -- issue 11's hostile suites, each one line, nothing written -------------------------------------------

def _config_traversal(root, outside):
    raw = _load_manifest(root)
    raw["configs"]["../../x"] = raw["configs"].pop("base")
    _save_manifest(root, raw)


def _shard_traversal(root, outside):
    shutil.copy(root / SHARD, root.parent / "x.parquet")
    raw = _load_manifest(root)
    raw["files"]["../x.parquet"] = raw["files"].pop(SHARD)
    raw["configs"]["base"]["files"] = ["../x.parquet" if f == SHARD else f for f in raw["configs"]["base"]["files"]]
    _save_manifest(root, raw)


def _absolute_path(root, outside):
    raw = _load_manifest(root)
    raw["files"]["/etc/passwd"] = {"size": os.path.getsize("/etc/passwd"), "sha256": sha256_file("/etc/passwd")}
    raw["configs"]["base"]["files"][0] = "/etc/passwd"
    _save_manifest(root, raw)


def _symlink_escape(root, outside):
    target = outside / "elsewhere.parquet"
    shutil.copy(root / SHARD, target)  # same bytes: size and sha256 still match the manifest
    (root / SHARD).unlink()
    (root / SHARD).symlink_to(target)


def _symlinked_data_folder(root, outside):
    shutil.move(root / "data" / "base", outside / "base")
    (root / "data" / "base").symlink_to(outside / "base", target_is_directory=True)


def _symlink_loop(root, outside):
    (root / SHARD).unlink()
    (root / SHARD).symlink_to(root / SHARD)


def _deep_json(root, outside):
    (root / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)


def _huge_manifest(root, outside):
    raw = (root / "manifest.json").read_bytes()
    (root / "manifest.json").write_bytes(raw[:-2] + b" " * (17 << 20) + raw[-2:])


def _manifest_not_json(root, outside):
    (root / "manifest.json").write_bytes(b"\xff\xfe{")


def _duplicate_key(root, outside):
    text = (root / "manifest.json").read_text()
    (root / "manifest.json").write_text(text.replace('"format":', '"suite_id": "other", "format":', 1))


def _wrong_row_count(root, outside):
    raw = _load_manifest(root)
    raw["configs"]["base"]["rows"] = 50000
    _save_manifest(root, raw)


def _wrong_kept_count(root, outside):
    raw = _load_manifest(root)
    raw["configs"]["base"]["kept"] -= 1
    _save_manifest(root, raw)


def _relabelled_without_digest(root, outside):
    _forge(root, SHARD, _set_label(0, 999))
    raw = _load_manifest(root)
    raw["configs"]["base"]["rows_digest"] = LocalSuite.open(root.parent / "pristine").rows_digest("base")
    _save_manifest(root, raw)


def _card_bomb(root, outside):
    (root / "README.md").write_text("---\n" + "a: " + "[" * 50_000 + "]" * 50_000 + "\n---\n")


def _card_for_other_configs(root, outside):
    text = (root / "README.md").read_text()
    (root / "README.md").write_text(text.replace("config_name: shifted", "config_name: other"))


HOSTILE = {
    "config ../../x": (_config_traversal, r"config name '\.\./\.\./x' is not valid"),
    "shard ../x.parquet": (_shard_traversal, r"file '\.\./x\.parquet' is not a shard path"),
    "/etc/passwd": (_absolute_path, r"file '/etc/passwd' is not a shard path"),
    "symlink escape": (_symlink_escape, r"outside the suite folder"),
    "symlinked folder": (_symlinked_data_folder, r"outside the suite folder"),
    "symlink loop": (_symlink_loop, r"is a symlink loop"),
    "deep json": (_deep_json, r"nests deeper than 32 levels"),
    "huge manifest": (_huge_manifest, r"larger than 16777216 bytes"),
    "not utf-8": (_manifest_not_json, r"manifest is not valid JSON"),
    "duplicate key": (_duplicate_key, r"duplicate key 'suite_id'"),
    "label 1000": (lambda r, o: _forge(r, SHARD, _set_label(3, 1000)),
                   r"config 'base', data/base/test-00000-of-00002\.parquet row 3: "
                   r"label 1000 is not an ImageNet-1k index"),
    "label -1": (lambda r, o: _forge(r, SHARD, _set_label(0, -1)), r"row 0: label -1 is not an ImageNet-1k index"),
    "duplicate image_id": (lambda r, o: _forge(r, SHARD, _set_image_id(2, "base/000/00")),
                           r"row 2 repeats its image_id \(image_id 'base/000/00' is also .* row 0\)"),
    "duplicated row": (lambda r, o: _forge(r, SHARD, _duplicate_row(2)), r"row 20 is a duplicated row"),
    "image as strings": (lambda r, o: _forge(r, SHARD, _replace_column("image", lambda c: pa.array(["x"] * len(c)))),
                         r"column 'image' has type string, expected struct<bytes: binary, path: string>"),
    "float labels": (lambda r, o: _forge(r, SHARD, _replace_column("label", lambda c: pc.cast(c, pa.float64()))),
                     r"column 'label' has type double, expected int64"),
    "row count 50000": (_wrong_row_count, r"config 'base' has 40 rows, the manifest says 50000"),
    "kept count": (_wrong_kept_count, r"config 'base' has \d+ rows with keep=true, the manifest says"),
    "rows digest": (_relabelled_without_digest, r"config 'base': rows digest .* differs from the manifest's"),
    "2049 row groups": (lambda r, o: _forge(r, SHARD, _grow_to(2049), row_group_size=1),
                        r"data/base/test-00000-of-00002\.parquet: 2049 row groups, over the limit of 2048 per shard"),
    "33 MiB footer": (lambda r, o: _forge(r, SHARD, _huge_footer),
                      r"test-00000-of-00002\.parquet: parquet footer is \d+ bytes, over the limit of 33554432"),
    "card yaml bomb": (_card_bomb, r"README\.md: the card's YAML nests deeper than 32 levels"),
    "card configs": (_card_for_other_configs, r"the card's configs differ from the manifest's"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_suite_is_one_line_before_any_model(tmp_path, case, capsys, monkeypatch):
    make_synthetic_suite(tmp_path / "pristine", configs=("base", "shifted"), classes=range(10), per_class=4,
                         num_shards=2, card=demo_card)
    root = tmp_path / "suite"
    shutil.copytree(tmp_path / "pristine", root)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    mutate, match = HOSTILE[case]
    mutate(root, outside)
    before = _listing(tmp_path)

    # no model is ever loaded: any attempt fails the test
    import genshift.eval.models
    monkeypatch.setattr(genshift.eval.models, "load_classifier", lambda *a, **k: pytest.fail("a model was loaded"))

    with pytest.raises(BenchError, match=match) as err:  # the eval harness's one entry point
        open_suite(str(root))
    assert "\n" not in str(err.value)
    _one_line_cli_error(["verify", str(root)], capsys)  # bench verify SUITE_DIR: the same line
    _one_line_cli_error(["eval", "--model", "test_resnet.r160_in1k", "--suite", str(root), "--out",
                         str(outside / "runs"), "--no-progress"], capsys)  # before the model loads
    assert not (outside / "runs").exists() or not any((outside / "runs").rglob("*"))
    after = {k: v for k, v in _listing(tmp_path).items() if k != "outside/runs"}
    assert after == before  # nothing written, nothing removed


def test_bench_verify_refuses_a_suite_without_its_card(toy_suite, capsys):
    assert main(["verify", str(toy_suite)]) == 0
    assert "card present" in capsys.readouterr().out
    (toy_suite / "README.md").unlink()
    err = _one_line_cli_error(["verify", str(toy_suite)], capsys)
    assert "has no README.md (dataset card)" in err


# -- property test: any mutation of a manifest is accepted or one BenchError, never anything else ---------

NAMES = st.sampled_from(["../x", "../../etc", "/etc/passwd", "", ".", "..", "a" * 300, "data/base/../../x.parquet",
                         "data/base/test-00000-of-00002.parquet", "data/base/test-00009-of-00002.parquet",
                         "Base", "base", "shifted", "rows", "kept", "files", "rows_digest", "sha256", "size", "é",
                         "con", "a\x00b", "format_version", "suite_id", "configs", "1.1"])
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70) | st.floats(allow_nan=False)
    | st.text(max_size=20) | NAMES,
    lambda children: (st.lists(children, max_size=3)
                      | st.dictionaries(NAMES | st.text(max_size=8), children, max_size=3)),
    max_leaves=8)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


@st.composite
def mutated_manifests(draw, raw):
    raw = copy.deepcopy(raw)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(raw) if p and not (p[0] == "features" and len(p) > 2)]
        path = draw(st.sampled_from(paths))
        parent = raw
        for k in path[:-1]:
            parent = parent[k]
        key = path[-1]
        action = draw(st.sampled_from(["replace", "delete", "rename", "number"]))
        if action == "replace":
            parent[key] = draw(JSON_VALUES)
        elif action == "delete":
            del parent[key]
        elif action == "rename" and isinstance(parent, dict):
            parent[draw(NAMES)] = parent.pop(key)
        elif action == "number":
            parent[key] = draw(st.sampled_from([-1, 0, 1, 39, 40, 41, 50000, 2**53, 2**63, 1.5, -0.0, 1e308]))
    return raw


@pytest.fixture(scope="module")
def fuzz_sandbox(tmp_path_factory):
    sandbox = tmp_path_factory.mktemp("fuzz")
    make_synthetic_suite(sandbox / "suite", configs=("base", "shifted"), classes=range(5), per_class=4, num_shards=2)
    (sandbox / "outside").mkdir()
    (sandbox / "outside" / "precious.txt").write_text("keep me")
    return sandbox


def test_any_mutated_manifest_is_accepted_or_one_bench_error(fuzz_sandbox):
    root = fuzz_sandbox / "suite"
    pristine = (root / "manifest.json").read_bytes()
    raw = json.loads(pristine)
    outcomes = {"accepted": 0, "refused": 0}

    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(mutated_manifests(raw))
    def check(mutated):
        (root / "manifest.json").write_text(json.dumps(mutated))
        before = _listing(fuzz_sandbox)
        try:
            suite = LocalSuite.open(root)
            suite.verify()
            [suite.rows_digest(c) for c in suite.configs]
            outcomes["accepted"] += 1
        except BenchError as e:
            assert str(e) and "\n" not in str(e)
            outcomes["refused"] += 1
        assert _listing(fuzz_sandbox) == before

    try:
        check()
    finally:
        (root / "manifest.json").write_bytes(pristine)
    assert outcomes["refused"] > 50  # the mutations did reach the checks


# -- many small row groups read in linear time: each shard's footer is parsed once per process -------------

def test_row_groups_are_read_with_the_shard_opened_once(tmp_path, monkeypatch):
    """600 one-row groups (within the bounds): reading every group opens the shard once, not 600
    times (each open parses the whole footer: quadratic); a shard replaced at the same path is
    opened anew, never read through a stale handle."""
    from genshift import suite_format

    root = tmp_path / "s"

    def write(label):
        with SuiteWriter(root, suite_id="small-groups", rows_per_group=1, overwrite=True) as w:
            w.write_shard("base", 0, 1, ({"image": {"bytes": _jpeg(i), "path": None}, "label": label,
                                          "image_id": f"base/{i:04d}", "config": "base", "keep": True,
                                          "pair_id": None} for i in range(600)))
            w.finalize(generator={}, card=lambda m: render_card(m, license="other"))

    write(7)
    opened = []
    real = pq.ParquetFile
    monkeypatch.setattr(pq, "ParquetFile", lambda path, *a, **k: opened.append(path) or real(path, *a, **k))
    suite = LocalSuite.open(root)
    suite.verify()
    groups = suite.row_groups("base")
    assert len(groups) == 600
    labels = [suite_format.read_row_group(root, g, ["label"])["label"][0].as_py() for g in groups]
    assert labels == [7] * 600 and len(opened) == 1
    write(9)  # same path, new file
    assert suite_format.read_row_group(root, groups[0], ["label"])["label"][0].as_py() == 9 and len(opened) == 2


def test_a_predictions_file_with_a_huge_footer_is_one_line(tmp_path):
    """Predictions are read through the same footer bound as suites (bench verify, the board)."""
    from genshift.eval.predictions import read_predictions

    path = tmp_path / "base.parquet"
    pq.write_table(pa.table({"image_id": ["a"]}).replace_schema_metadata({b"pad": b"0" * (33 << 20)}), path)
    with pytest.raises(IntegrityError, match=r"predictions file .*base\.parquet: parquet footer is \d+ bytes, over the "
                                             r"limit of 33554432") as e:
        read_predictions(path)
    assert "\n" not in str(e.value)
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(IntegrityError, match="not a parquet file"):
        read_predictions(tmp_path / "junk.parquet")
