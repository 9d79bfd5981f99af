"""The suite format: writer -> reader -> datasets round trip, manifest checks, resume, bad input."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import ClassLabel, Image, Value, load_dataset

from genshift import imagenet
from genshift.errors import BenchError, IntegrityError, NotFoundError
from genshift.suite_format import FORMAT_VERSION, LocalSuite, Manifest, SuiteWriter, read_row_group
from genshift.synthetic import make_synthetic_suite


def test_round_trip_features_rows_and_manifest(toy_suite):
    suite = LocalSuite.open(toy_suite)
    suite.verify()
    assert suite.configs == ["base", "shifted"]
    m = suite.manifest
    assert m.configs["base"].rows == 40 and len(m.configs["base"].files) == 2
    # the datasets view keeps Image and ClassLabel(wnids)
    ds = suite.dataset("base")
    assert isinstance(ds.features["image"], Image)
    assert isinstance(ds.features["label"], ClassLabel)
    assert ds.features["label"].names == list(imagenet.wnids())
    assert ds.features["seed"] == Value("int64")
    assert len(ds) == 40
    assert sorted(ds["image_id"]) == sorted(f"base/{c:03d}/{i:02d}" for c in range(10) for i in range(4))
    # manifest counts agree with the rows
    assert m.configs["base"].kept == sum(ds["keep"])
    # plain load_dataset on the folder (the Hub's own view via the card's configs) agrees too
    ds2 = load_dataset("parquet", data_files=[str(p) for p in suite.files("shifted")], split="train")
    assert ds2.features == ds.features and len(ds2) == 40


def test_streaming_row_groups_cover_every_row_once(toy_suite):
    suite = LocalSuite.open(toy_suite)
    suite.verify(["shifted"])
    ids = []
    for g in suite.row_groups("shifted"):
        t = read_row_group(toy_suite, g, columns=["image_id", "label"])
        assert t.num_rows == g.num_rows
        ids += t["image_id"].to_pylist()
    assert len(ids) == len(set(ids)) == 40


def test_same_inputs_give_byte_identical_suites(tmp_path):
    a = make_synthetic_suite(tmp_path / "a", classes=range(3), per_class=2)
    b = make_synthetic_suite(tmp_path / "b", classes=range(3), per_class=2)
    assert a.sha256 == b.sha256
    c = make_synthetic_suite(tmp_path / "c", classes=range(3), per_class=2, seed=1)
    assert c.sha256 != a.sha256


def test_tampered_shard_is_named(toy_suite):
    rel = "data/shifted/test-00001-of-00002.parquet"
    p = toy_suite / rel
    data = bytearray(p.read_bytes())
    data[100] ^= 0xFF
    p.write_bytes(bytes(data))
    suite = LocalSuite.open(toy_suite)
    suite.verify(["base"])  # other configs still verify
    with pytest.raises(IntegrityError, match="test-00001-of-00002.parquet sha256"):
        suite.verify(["shifted"])


def test_missing_shard_and_truncated_shard(toy_suite):
    (toy_suite / "data/base/test-00000-of-00002.parquet").unlink()
    with pytest.raises(IntegrityError, match="missing"):
        LocalSuite.open(toy_suite).verify(["base"])
    p = toy_suite / "data/shifted/test-00000-of-00002.parquet"
    p.write_bytes(p.read_bytes()[:-10])
    with pytest.raises(IntegrityError, match="bytes, the manifest says"):
        LocalSuite.open(toy_suite).verify(["shifted"])


@pytest.mark.parametrize("content, match", [
    (None, "has no manifest.json"),
    (b"{not json", "not valid JSON"),
    (json.dumps({"format": "genshift-suite", "format_version": 99}).encode(), "format_version 99 is not supported"),
    (json.dumps({"format": "something-else"}).encode(), "not a genshift-suite manifest"),
    (json.dumps({"format": "genshift-suite", "format_version": FORMAT_VERSION}).encode(), "'suite_id' is missing"),
])
def test_bad_manifest(toy_suite, content, match):
    path = toy_suite / "manifest.json"
    if content is None:
        path.unlink()
    else:
        path.write_bytes(content)
    with pytest.raises(IntegrityError, match=match):
        LocalSuite.open(toy_suite)


def test_unknown_config_suggests(toy_suite):
    suite = LocalSuite.open(toy_suite)
    with pytest.raises(NotFoundError, match="Did you mean 'shifted'"):
        suite.select(["shiftd"])


def test_plain_pyarrow_parquet_is_rejected(tmp_path, toy_suite):
    # rewrite one shard without the HF schema metadata and fix the manifest hash: still refused
    rel = "data/base/test-00000-of-00002.parquet"
    t = pq.read_table(toy_suite / rel)
    pq.write_table(t.replace_schema_metadata(None), toy_suite / rel)
    raw = json.loads((toy_suite / "manifest.json").read_text())
    from genshift.fsutil import sha256_file
    raw["files"][rel] = {"size": (toy_suite / rel).stat().st_size, "sha256": sha256_file(toy_suite / rel)}
    (toy_suite / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(IntegrityError, match="no 'huggingface' schema metadata"):
        LocalSuite.open(toy_suite).verify(["base"])


def _rows(config, n, start=0):
    for i in range(start, start + n):
        yield {"image": {"bytes": b"\xff\xd8\xff" + bytes([i % 256]) * 10, "path": None}, "label": i % 1000,
               "image_id": f"{config}/{i}", "config": config, "keep": True, "pair_id": None}


def test_resume_skips_finished_shards_and_cleans_incomplete(tmp_path):
    root = tmp_path / "s"
    w = SuiteWriter(root, suite_id="x", fingerprint={"v": 1})
    w.write_shard("a", 0, 2, _rows("a", 3))
    first = (root / "data/a/test-00000-of-00002.parquet").stat().st_mtime_ns
    (root / "data/a/test-00001-of-00002.parquet.abc.incomplete").write_bytes(b"half")  # crash leftover
    w2 = SuiteWriter(root, suite_id="x", fingerprint={"v": 1})
    assert not list(root.rglob("*.incomplete"))
    assert w2.shard_done("a", 0, 2) and not w2.shard_done("a", 1, 2)
    with pytest.raises(BenchError, match=r"missing shard\(s\) \[1\]"):
        w2.finalize(generator={})
    w2.write_shard("a", 1, 2, _rows("a", 3, start=3))
    m = w2.finalize(generator={})
    assert (root / "data/a/test-00000-of-00002.parquet").stat().st_mtime_ns == first
    assert m.configs["a"].rows == 6


def test_different_build_is_refused_unless_overwrite(tmp_path):
    root = tmp_path / "s"
    SuiteWriter(root, suite_id="x", fingerprint={"v": 1}).write_shard("a", 0, 1, _rows("a", 2))
    with pytest.raises(BenchError, match="holds a different build"):
        SuiteWriter(root, suite_id="x", fingerprint={"v": 2})
    w = SuiteWriter(root, suite_id="x", fingerprint={"v": 2}, overwrite=True)
    assert not w.shard_done("a", 0, 1)


def test_non_bench_folder_is_never_deleted(tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(BenchError, match="holds no bench build"):
        SuiteWriter(tmp_path, suite_id="x", overwrite=True)
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_duplicate_image_ids_are_refused(tmp_path):
    w = SuiteWriter(tmp_path / "s", suite_id="x")
    w.write_shard("a", 0, 1, _rows("a", 2))
    w.write_shard("b", 0, 1, ({**r, "image_id": "a/0"} for r in _rows("b", 1)))
    with pytest.raises(IntegrityError, match="duplicate image_id 'a/0'"):
        w.finalize(generator={})
    assert not (tmp_path / "s" / "manifest.json").exists()


@pytest.mark.parametrize("bad, match", [
    ({"label": 1000}, "label must be an ImageNet-1k index"),
    ({"label": "n01440764"}, "label must be an ImageNet-1k index"),
    ({"config": "b"}, "has config 'b'"),
    ({"image_id": ""}, "image_id must be a non-empty string"),
    ({"unknown": 1}, "undeclared column"),
])
def test_bad_rows_leave_no_shard(tmp_path, bad, match):
    w = SuiteWriter(tmp_path / "s", suite_id="x")
    row = {**next(_rows("a", 1)), **bad}
    with pytest.raises(ValueError, match=match):
        w.write_shard("a", 0, 1, [row])
    assert not list((tmp_path / "s").rglob("*.parquet*"))


def test_bad_config_name(tmp_path):
    w = SuiteWriter(tmp_path / "s", suite_id="x")
    with pytest.raises(BenchError, match="config name 'In The Snow' is not valid"):
        w.write_shard("In The Snow", 0, 1, _rows("x", 1))


def test_manifest_hash_is_hash_of_file_bytes(toy_suite):
    from genshift.fsutil import sha256_file
    m = Manifest.load(toy_suite)
    assert m.sha256 == sha256_file(toy_suite / "manifest.json")


def test_vectorised_rows_digest_equals_the_reference():
    from genshift.suite_format import rows_digest, rows_digest_table

    ids = ['a"b', "é/ü", "x\\y", "tab\there", "\x01ctrl", "z", "€uro", "😀", "ab", "a", "new\nline", "ｆｕｌｌ"]
    labels = [(7 * i) % 1000 for i in range(len(ids))]
    keeps = [i % 3 != 0 for i in range(len(ids))]
    table = pa.table({"image_id": ids, "label": pa.array(labels, pa.int64()), "keep": keeps})
    assert rows_digest_table(table) == rows_digest(ids, labels, keeps)
    # chunked input (several shards) and an empty config
    assert rows_digest_table(pa.concat_tables([table.slice(0, 5), table.slice(5)])) == rows_digest(ids, labels, keeps)
    assert rows_digest_table(table.slice(0, 0)) == rows_digest([], [], [])
    # the worked example of docs/format.md section 4.1
    assert rows_digest(["snow/n01443537/00", "snow/n01440764/01", "snow/n01440764/00"], [1, 0, 0],
                       [True, False, True]) == WORKED_EXAMPLE


WORKED_EXAMPLE = "7add674a465aed9d1a1232b3f4215b09646d825f0e3b9ca22e1d3f9250f781aa"  # = printf ... | sha256sum


@pytest.mark.parametrize("rows, bucket", [(0, "n<1K"), (999, "n<1K"), (1000, "1K<n<10K"), (40_000, "10K<n<100K"),
                                          (1_200_000, "1M<n<10M")])
def test_card_size_categories(rows, bucket):
    from genshift.data_cards import size_category

    assert size_category(rows) == bucket


def test_row_groups_read_from_threads_at_once_each_use_their_own_handle(tmp_path):
    # two sweep groups in flight load in their own lanes: one shared ParquetFile read from two
    # threads at once raised "ReadRangeCache did not find matching cache entry" or hung
    import os
    import threading

    from genshift import suite_format
    from genshift.fsutil import StatKey
    from genshift.suite_format import RowGroup

    rows, per_group = 6000, 50
    pq.write_table(pa.table({"i": list(range(rows)), "blob": [os.urandom(1500) for _ in range(rows)]}),
                   tmp_path / "s.parquet", row_group_size=per_group)
    groups = [RowGroup("c", "s.parquet", g, per_group) for g in range(rows // per_group)]
    start, errors, handles = threading.Barrier(4), [], set()

    def read_all():
        try:
            start.wait()
            for g in groups:
                t = read_row_group(tmp_path, g, columns=["i", "blob"])
                assert t["i"].to_pylist() == list(range(g.index * per_group, (g.index + 1) * per_group))
            handles.add(id(suite_format._open_shard(str(tmp_path / "s.parquet"), StatKey.of(tmp_path / "s.parquet"),
                                              os.getpid(), threading.get_ident())))
        except Exception as e:  # reported below with the thread's failure
            errors.append(repr(e))

    threads = [threading.Thread(target=read_all, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "reading one shard from four threads hung"
    assert errors == []
    assert len(handles) == 4  # each thread opened the shard itself


@pytest.mark.parametrize("data, match", [
    (b'{"a": 1, "a": 2}', r"duplicate key 'a'"),
    (b'{"a": NaN}', r"NaN is not valid JSON"),
    (b'[Infinity]', r"Infinity is not valid JSON"),
    (b"[" * 33 + b"]" * 33, r"nests deeper than 32 levels"),
    (b"[" * 100_000 + b"]" * 100_000, r"nests deeper than 32 levels"),
    (b'"\xff"', r"is not valid JSON"),
    (b"[" + b"0," * 600 + b"0]", r"is 1203 bytes, over the limit of 1000"),
])
def test_the_one_json_parser_refuses_what_parsers_disagree_on(data, match):
    """Every reader of outside JSON (manifests, results, stamps, job files) goes through one parser."""
    from genshift.eval.results import parse_result
    from genshift.fsutil import parse_json

    with pytest.raises(IntegrityError, match=f"^x.json: manifest .*{match}.*; it was not written by genshift-bench"):
        parse_json(data, where="x.json", what="manifest", max_bytes=1000 if b"0," in data else 1 << 20)
    if b"Infinity" not in data and b"0," not in data:  # the result loader is the same parser
        with pytest.raises(IntegrityError, match=match):
            parse_result(data, where="r.json")


@pytest.mark.parametrize("text, match", [
    ("a: 1\na: 2\n", r"duplicate key 'a'"),
    ("a: .nan\n", r"'.nan' is not a finite number"),
    ("a: [-.inf]\n", r"'-.inf' is not a finite number"),
    ("a: &x [1]\nb: *x\n", r"uses aliases"),
    ("a: " + "[" * 9 + "]" * 9 + "\n", r"nests deeper than 8 levels"),
    ("a: [\n", r"does not parse"),
])
def test_the_one_yaml_parser_refuses_the_same(text, match):
    from genshift.fsutil import load_yaml

    with pytest.raises(IntegrityError, match=f"^card: the YAML .*{match}"):
        load_yaml(text, where="card", what="the YAML", max_depth=8)
    assert load_yaml("a: 1.5\nb: [x, {c: d}]\n", where="card", what="the YAML", max_depth=8) == \
        {"a": 1.5, "b": ["x", {"c": "d"}]}


def test_cache_root_follows_hf_home_then_xdg_cache_home(monkeypatch, tmp_path):
    """One cache root for every cache of the project, by huggingface_hub's rule, read at each call."""
    from genshift.fsutil import cache_root

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "hf" / "genshift"
    monkeypatch.delenv("HF_HOME")
    assert cache_root() == tmp_path / "xdg" / "huggingface" / "genshift"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "huggingface" / "genshift"


def test_stat_key_changes_with_the_file(tmp_path):
    import os

    from genshift.fsutil import StatKey

    p = tmp_path / "f"
    p.write_bytes(b"abc")
    key = StatKey.of(p)
    assert StatKey.of(p) == key and hash(StatKey.of(p)) == hash(key)
    os.utime(p, ns=(key.mtime_ns + 1, key.mtime_ns + 1))  # touched: same bytes, same size
    assert StatKey.of(p) != key
    key = StatKey.of(p)
    (tmp_path / "g").write_bytes(b"xyz")
    os.utime(tmp_path / "g", ns=(key.mtime_ns, key.mtime_ns))
    os.replace(tmp_path / "g", p)  # replaced by a rename: same size and mtime, another inode
    assert StatKey.of(p) != key
