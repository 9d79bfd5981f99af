"""The board record: what verification signs (``verification.json``) and the leaderboard page reads
(``docs/leaderboard.md``, "The board record", "Signing"). :func:`build_record`: a result's (unsigned) record;
:func:`make_stamp` + :func:`sign` (or :func:`write_stamp`): a verified one's; :func:`check_stamp`: whether one counts.
ed25519 keys (``cryptography``) sign the exact bytes of the record's canonical JSON (``fsutil.canonical_json``), which
the stamp file holds verbatim (:data:`ENVELOPE`).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from genshift import fsutil
from genshift.errors import BenchError
from genshift.fsutil import atomic_write_bytes, canonical_json, read_limited, sha256_bytes
from genshift.identity import identity_of

STAMP_KIND = "genshift-board-record"
STAMP_VERSION = 4
ALGORITHM = "ed25519"
MAX_STAMP_BYTES = 4 << 20
MAX_PRIVATE_KEY_BYTES = 1 << 14


@dataclass(frozen=True)
class PublicKey:
    key_id: str  # first 16 hex digits of the sha256 of the raw 32-byte key
    raw: bytes
    name: str

    def line(self) -> str:
        return f"{ALGORITHM} {base64.b64encode(self.raw).decode()} {self.name}".rstrip()


def key_id(raw: bytes) -> str:
    return sha256_bytes(raw)[:16]


def generate_key(path: str | os.PathLike, *, name: str = "") -> PublicKey:
    """Write a new private key to ``path`` (0600, hard-linked into place: whole or absent, never replacing a file
    or written through a link) and its public line to ``path.pub``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = Path(path)
    if path.is_symlink():
        raise BenchError(f"{path} is a symbolic link (to {os.readlink(path)!r}); a private key is never written "
                         "through a link: give the path of a new plain file")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=fsutil.INCOMPLETE, dir=path.parent)  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path, follow_symlinks=False)
        except FileExistsError:  # there already (or a link placed there meanwhile): refused, never replaced
            raise BenchError(f"{path} already exists; choose another path (a key is never overwritten)") from None
    finally:
        os.unlink(tmp)
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    pub = PublicKey(key_id(raw), raw, name or path.stem)
    atomic_write_bytes(Path(str(path) + ".pub"), (pub.line() + "\n").encode())
    return pub


def load_private_key(path: str | os.PathLike):
    """The ed25519 signing key at ``path``; refused, as ssh does, when group or others may read or write it."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = Path(path)
    if not path.is_file():
        raise BenchError(f"signing key {str(path)!r} does not exist; create one with `bench keygen {path}`")
    mode = stat.S_IMODE(path.stat().st_mode)
    if os.name == "posix" and mode & 0o077:
        raise BenchError(f"signing key {str(path)!r} has permissions {mode:04o}, open to group or others (allowed: "
                         f"0600 or stricter); run: chmod 600 {path}")
    data = read_limited(path, max_bytes=MAX_PRIVATE_KEY_BYTES, what="signing key",
                        fix="an ed25519 PEM key is about 120 bytes: is it the right file?")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise BenchError(f"{path} is not an unencrypted PEM private key ({e}); create one with `bench keygen`") \
            from None
    if not isinstance(key, Ed25519PrivateKey):
        raise BenchError(f"{path} is not an ed25519 key; create one with `bench keygen`")
    return key


def parse_public_key(line: str, *, where: str) -> PublicKey:
    parts = line.split(None, 2)
    if len(parts) < 2 or parts[0] != ALGORITHM:
        raise BenchError(f"{where}: expected 'ed25519 <base64 key> [name]', got {line[:60]!r}")
    try:
        raw = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        raise BenchError(f"{where}: the key is not valid base64") from None
    if len(raw) != 32:
        raise BenchError(f"{where}: an ed25519 public key has 32 bytes, this one {len(raw)}")
    return PublicKey(key_id(raw), raw, parts[2].strip() if len(parts) > 2 else "")


def load_trusted_keys(path: str | os.PathLike) -> dict[str, PublicKey]:
    """Public keys from a trusted-keys file, by key id."""
    path = Path(path)
    if not path.exists():
        raise BenchError(f"trusted keys file {str(path)!r} does not exist; it holds the maintainers' KEY.pub lines")
    text = fsutil.read_text_limited(path, max_bytes=fsutil.MAX_LIST_BYTES, what="trusted keys file",
                             fix="it holds one 'ed25519 KEY name' line per maintainer: is it the right file?")
    keys = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if line and not line.startswith("#"):
            k = parse_public_key(line, where=f"{path}:{n}")
            keys[k.key_id] = k
    return keys


def signature(data: bytes, private_key) -> dict:
    """An ed25519 signature over exactly ``data``: ``{"algorithm", "key_id", "value"}`` (base64)."""
    from cryptography.hazmat.primitives import serialization

    raw = private_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return {"algorithm": ALGORITHM, "key_id": key_id(raw), "value": base64.b64encode(private_key.sign(data)).decode()}


def check_signature(data: bytes, sig: dict, trusted: dict[str, PublicKey]) -> str | None:
    """None if ``sig`` (:func:`signature`'s, its fields as :data:`ENVELOPE` or a review marker's pattern admits
    them) is a trusted key's signature over exactly ``data``, else why not."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    key = trusted.get(sig["key_id"])
    if key is None:
        return f"the stamp is signed by key {sig['key_id'][:16]!r}, which this leaderboard does not trust"
    try:
        Ed25519PublicKey.from_public_bytes(key.raw).verify(base64.b64decode(sig["value"], validate=True), data)
    except (binascii.Error, ValueError, InvalidSignature):
        return "the stamp's signature does not match its content (edited after signing, or forged)"
    return None


# A stamp file: the record's canonical JSON, verbatim, after a signature over exactly those bytes (nothing is
# re-encoded to check it), e.g. ``{"signature": {"algorithm": "ed25519", "key_id": ..., "value": ...}, "record": {
# ...canonical JSON... }}``: one JSON document, readable as it stands (``jq .record verification.json``).
ENVELOPE = re.compile(rb'\{"signature": (\{"algorithm": "ed25519", "key_id": "[0-9a-f]{16}", "value": '
                      rb'"[A-Za-z0-9+/]{86}=="\}), "record": (\{.*\}\n)\}\n', re.DOTALL)


def sign(record: dict, private_key) -> bytes:
    """The stamp file of ``record`` (:data:`ENVELOPE`): its canonical JSON and a signature over exactly those bytes."""
    data = canonical_json(record)
    return b'{"signature": %s, "record": %s}\n' % (json.dumps(signature(data, private_key)).encode(), data)


def open_stamp(raw: bytes, trusted: dict[str, PublicKey]) -> tuple[dict | None, str]:
    """``(record, "")`` if ``raw`` is a stamp file (:func:`sign`'s) whose signature by a trusted key covers its
    record's bytes, the record parsed (strictly) from exactly the bytes signed; else ``(None, why not)``."""
    m = ENVELOPE.fullmatch(raw)
    if m is None:  # not laid out as `sign` writes it: say what it is
        try:
            doc = fsutil.parse_json(raw, where="the stamp", max_bytes=MAX_STAMP_BYTES)
        except BenchError as e:
            return None, str(e)
        if isinstance(doc, dict) and doc.get("kind") == STAMP_KIND and doc.get("version") == STAMP_VERSION:
            return None, "the stamp is not signed"
        return None, f"the stamp is not a {STAMP_KIND} v{STAMP_VERSION} (re-verify with `bench verify --sign`)"
    sig = json.loads(m[1])  # the pattern admits nothing but its own fields
    if why := check_signature(m[2], sig, trusted):
        return None, why
    try:  # the maintainer's bytes: still parsed as any file from outside
        record = fsutil.parse_json(m[2], where="the stamp's record", max_bytes=MAX_STAMP_BYTES)
    except BenchError as e:
        return None, str(e)
    return {**record, "signature": sig}, ""


STAMP_FILE = "verification.json"
# what a record copies from the result as it is: top-level fields, then the model's and the suite's
RECORD_FIELDS = ("protocol", "data_config", "flags", "metrics")
MODEL_FIELDS = ("weights_sha256", "declared_name", "architecture", "tag", "num_params")
SUITE_FIELDS = ("id", "manifest_sha256", "metric_family", "configs", "repo_id", "revision")


def unrankable(result: dict) -> str:
    """Why a (schema-valid) result or record can never be ranked and so is never signed, or "" if it can be: a
    partial run (``--limit-per-class``, or ``flags.partial`` as ``bench verify`` recomputes it)."""
    if result["protocol"]["limit_per_class"] is not None:
        return (f"the result was scored with --limit-per-class {result['protocol']['limit_per_class']} (a partial "
                "run); re-run `bench eval` on every image of every config")
    if result["flags"]["partial"]:
        return "the result is partial (not every config of the suite); re-run `bench eval` on every config"
    return ""


def build_record(result: dict, *, result_sha256: str, predictions_sha256: dict[str, str], tables=None) -> dict:
    """The board record of a (schema-valid) result; ``BenchError`` if its model id is not the canonical id of
    the weights it records. ``tables`` (config -> predictions table, as checked): add the per-image
    correctness the rank intervals need."""
    m, ident = result["model"], identity_of(result["model"])
    record = {
        "kind": STAMP_KIND, "version": STAMP_VERSION, "ok": True,
        "model": {"id": ident.id, "source": ident.source, "weights_revision": ident.revision,
                  "tensors_sha256": ident.tensors_sha256, **{k: m.get(k) for k in MODEL_FIELDS},
                  "paper_ids": (m.get("pretrained_cfg") or {}).get("paper_ids")},
        "suite": {k: result["suite"].get(k) for k in SUITE_FIELDS},
        **{k: result[k] for k in RECORD_FIELDS},
        "files": {"result.json": result_sha256, **dict(sorted(predictions_sha256.items()))},
    }
    if tables is not None:
        record["correct"] = correctness(result, tables)
    return record


def correctness(result: dict, tables: dict) -> dict:
    """Per config: the scored images' order (sha256 of their ids, sorted as stored), their count, and whether the
    true class is in the top ``Family.rank_k`` (the board's rank outcome), bit-packed in base64; for a family
    ranked by a paired Δ (LANCE) the counterfactuals' originals (``match``: int32, base64) that pair them."""
    import numpy as np

    from genshift.eval.metrics import pair_up
    from genshift.families import get_family

    family = get_family(result["suite"]["metric_family"])
    out, pairs = {}, {}
    for p in result["predictions"]:
        t = tables[p["config"]]
        if result["protocol"]["scoring"]["filter"]:
            t = t.filter(t["keep"])
        ids = t["image_id"].to_pylist()
        hits = t["true_rank"].to_numpy() < family.rank_k
        out[p["config"]] = {"images": sha256_bytes("\n".join(ids).encode()), "n": len(ids), "k": family.rank_k,
                            "hits": base64.b64encode(np.packbits(hits).tobytes()).decode()}
        pairs[p["config"]] = t["pair_id"].to_pylist()
    if family.rank_paired_delta:
        match = pair_up(pairs["original"], pairs["counterfactual"]).astype("<i4")
        out["counterfactual"]["match"] = base64.b64encode(match.tobytes()).decode()
    return out


def hits(records: list[dict], config: str):
    """``(image-order digest, bool hits (n images, M records))`` of one config of M signed records
    (:func:`correctness`); ``ValueError`` unless all were scored on the same images in the same order."""
    import numpy as np

    c = [r["correct"][config] for r in records]
    if len({(x["images"], x["n"]) for x in c}) != 1:
        raise ValueError(f"the records' {config!r} image sets differ")
    packed = np.frombuffer(b"".join(base64.b64decode(x["hits"]) for x in c), dtype=np.uint8).reshape(len(c), -1)
    return c[0]["images"], np.unpackbits(packed, axis=1, count=int(c[0]["n"])).astype(bool).T


def make_stamp(report) -> dict:
    """The (unsigned) record of a passed ``genshift.eval.verify.VerifyReport`` with a recheck."""
    from datetime import UTC, datetime

    from genshift import __version__

    if not report.ok or not report.recheck or not report.suite_checked or not report.suite.trusted:
        raise BenchError("only a verification that passed, re-ran images and checked the predictions against a "
                         "trusted suite manifest can be stamped")
    if why := unrankable(report.result):
        raise BenchError(f"not signed: {why}")
    record = build_record(report.result, result_sha256=report.result_sha256,
                          predictions_sha256=report.predictions_sha256, tables=report.tables)
    record["suite"].update(trust_root=report.suite.origin, rows_digests=dict(sorted(report.rows_digests.items())))
    return {**record, "recheck": report.recheck, "checks": list(report.checked),
            "verified_at": datetime.now(UTC).isoformat(timespec="seconds"), "genshift_bench": __version__}


def write_stamp(report, private_key) -> Path:
    """Sign the record of ``report`` and write it next to the result (temp name + rename)."""
    out = report.path.parent / STAMP_FILE
    atomic_write_bytes(out, sign(make_stamp(report), private_key))
    return out


def check_stamp(raw: bytes, *, result_sha256: str, predictions_sha256: dict[str, str] | None = None,
                trusted: dict[str, PublicKey]) -> tuple[dict | None, str]:
    """``(record, "")`` if the bytes are a record signed by a trusted key for ``result.json`` as it is now
    (and, when given, these predictions files), else ``(None, why not)``: unsigned, unknown key, bad
    signature, stale, or not a record."""
    record, why = open_stamp(raw, trusted)
    if record is None:
        return None, why
    if record.get("kind") != STAMP_KIND or record.get("version") != STAMP_VERSION:
        return None, f"the stamp is not a {STAMP_KIND} v{STAMP_VERSION} (re-verify with `bench verify --sign`)"
    files = record.get("files")
    if record.get("ok") is not True or not isinstance(files, dict):
        return None, "the stamp does not record a passed verification"
    if files.get("result.json") != result_sha256:
        return None, "the stamp is stale: result.json changed after it was verified"
    if predictions_sha256 is not None and {k: v for k, v in files.items() if k != "result.json"} != predictions_sha256:
        return None, "the stamp is stale: the predictions files changed after they were verified"
    recheck = record.get("recheck")
    if not (isinstance(recheck, dict) and isinstance(recheck.get("n"), int) and recheck["n"] >= 1
            and isinstance(recheck.get("seed"), int)):
        return None, "the stamp records no re-run of images"
    return record, ""
