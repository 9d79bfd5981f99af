"""Generate ``benchmark/_data/imagenet_hierarchy.json`` from Princeton WordNet 3.0 (committed; byte for byte).

    apt-get install wordnet-base            # Debian 12, 1:3.0-37 = Princeton WordNet 3.0 (2026-11-22)
    python scripts/make_imagenet_hierarchy.py --wordnet /usr/share/wordnet

Inputs: WordNet's ``data.noun`` (offsets are wnids), timm's ImageNet-1k and ImageNet-A wnid lists, and
open_clip's OpenAI class names (those of the ImageNet* tokens). Per class: lemmas, direct hypernyms
(``@`` and ``@i``, sorted by offset: no hash order), the hypernym closure with minimum hop distances, the
grandparents, the IN-G parent (the grandparent with the smallest offset, Wiles et al. as reconstructed
here) and the closest failure-directions ancestor (Jain et al.'s list; BFS, ties by name).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections import deque
from pathlib import Path

from genshift.fsutil import atomic_write_bytes

OUT = Path(__file__).resolve().parents[1] / "benchmark" / "_data" / "imagenet_hierarchy.json"

# Ancestor names of the failure-directions caption generator (MadryLab/failure-directions).
FD_ANCESTORS = (
    "reptile amphibian marsupial swine bovid feline canine rodent fungus food geological_formation "
    "train mammal structure entity wheeled_vehicle bus vehicle fruit flower fish aquatic_mammal person "
    "equipment instrumentality appliance container fabric covering device implement primate "
    "invertebrate bird aircraft furniture vessel"
).split()


def parse_data_noun(path: Path) -> dict[str, dict]:
    """Parse WordNet's ``data.noun``: wnid -> {lemmas, hypernyms}."""
    synsets: dict[str, dict] = {}
    with open(path, encoding="latin-1") as f:
        for line in f:
            if line.startswith("  "):  # licence header
                continue
            fields = line.split(" | ")[0].split()
            offset, _lex, ss_type, w_cnt = fields[0], fields[1], fields[2], int(fields[3], 16)
            if ss_type != "n":
                continue
            pos = 4 + 2 * w_cnt
            pointers = [fields[pos + 1 + 4 * i: pos + 4 + 4 * i] for i in range(int(fields[pos]))]
            hyper = {"n" + target for sym, target, tpos in pointers if sym in ("@", "@i") and tpos == "n"}
            synsets["n" + offset] = {"lemmas": fields[4:pos:2], "hypernyms": sorted(hyper)}
    return synsets


def closure(wnid: str, synsets: dict[str, dict]) -> dict[str, int]:
    """Hypernym closure of ``wnid`` with the minimum number of hops to each ancestor."""
    depth: dict[str, int] = {}
    queue = deque([(wnid, 0)])
    while queue:
        node, d = queue.popleft()
        for h in synsets[node]["hypernyms"]:
            if h not in depth:
                depth[h] = d + 1
                queue.append((h, d + 1))
    return depth


def readable(lemma: str) -> str:
    return lemma.replace("_", " ")


def fd_ancestor(wnid: str, synsets: dict[str, dict]) -> str | None:
    """Closest failure-directions ancestor by BFS (hops), ties broken by name."""
    found = [(d, synsets[a]["lemmas"][0].lower()) for a, d in closure(wnid, synsets).items()]
    return min(((d, name) for d, name in found if name in FD_ANCESTORS), default=(None, None))[1]


def build(wordnet: Path) -> dict:
    import open_clip.zero_shot_metadata as ocz
    import timm

    info = Path(timm.__file__).parent / "data" / "_info"
    wnids = (info / "imagenet_synsets.txt").read_text().split()
    in_a = (info / "imagenet_a_synsets.txt").read_text().split()
    names = list(ocz.IMAGENET_CLASSNAMES)
    if len(wnids) != 1000 or len(names) != 1000 or len(in_a) != 200:
        raise SystemExit("unexpected class list sizes")
    synsets = parse_data_noun(wordnet / "data.noun")

    classes = []
    referenced: set[str] = set()
    for index, (wnid, name) in enumerate(zip(wnids, names)):
        anc = closure(wnid, synsets)
        grand = sorted({g for h in synsets[wnid]["hypernyms"] for g in synsets[h]["hypernyms"]})
        parent = min(grand) if grand else None  # wnids are 'n' + zero-padded offset: str order = offset order
        referenced.update(anc)
        classes.append({"index": index, "wnid": wnid, "name": name, "lemma": readable(synsets[wnid]["lemmas"][0]),
                        "lemmas": [readable(x) for x in synsets[wnid]["lemmas"]],
                        "hypernyms": synsets[wnid]["hypernyms"], "ancestors": {a: anc[a] for a in sorted(anc)},
                        "grandparents": grand, "parent": parent, "fd_ancestor": fd_ancestor(wnid, synsets)})
    index_of = {c["wnid"]: c["index"] for c in classes}
    return {
        "source": {
            "wordnet": "Princeton WordNet 3.0 (Debian package wordnet-base 1:3.0-37), data.noun",
            "class_names": "open_clip.zero_shot_metadata.IMAGENET_CLASSNAMES (OpenAI clean names)",
            "class_wnids": "timm/data/_info/imagenet_synsets.txt",
            "imagenet_a": "timm/data/_info/imagenet_a_synsets.txt",
            "parent_rule": "grandparent (two hypernym hops, @ and @i) with the smallest offset",
            "fd_ancestor_rule": "closest failure-directions ancestor by BFS, ties by name",
            "generator": "scripts/make_imagenet_hierarchy.py",
            "wordnet_data_noun_sha256": hashlib.sha256((wordnet / "data.noun").read_bytes()).hexdigest(),
        },
        "classes": classes,
        "synsets": {
            s: {"name": readable(synsets[s]["lemmas"][0]), "lemmas": [readable(x) for x in synsets[s]["lemmas"]]}
            for s in sorted(referenced)
        },
        "imagenet_a": sorted(index_of[w] for w in in_a),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wordnet", type=Path, default=Path("/usr/share/wordnet"),
                    help="folder holding WordNet 3.0's data.noun (Debian: /usr/share/wordnet)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    if not (args.wordnet / "data.noun").is_file():
        ap.error(f"no data.noun in {args.wordnet}; install Debian's wordnet-base or pass --wordnet DIR")
    data = (json.dumps(build(args.wordnet), indent=1, sort_keys=False, ensure_ascii=False) + "\n").encode()
    atomic_write_bytes(args.out, data)
    print(f"wrote {args.out} ({len(data):,} bytes, sha256 {hashlib.sha256(data).hexdigest()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
