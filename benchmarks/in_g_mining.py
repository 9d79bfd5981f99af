"""IN-G mining throughput: batched generate + classify vs one image at a time, in one run.

    python benchmarks/in_g_mining.py                 # tiny random SD + timm test_resnet on CPU

Both arms mine the same captions with the same seeds, cap and N (``genshift.builders.in_g``); the
one-at-a-time arm uses batch size 1 for generation and classification. Reports images/s and
kept failures per hour for each arm, the speedup, and the cost model for regenerating the sets:
GPU-hours = captions x (images sampled per caption) / (images/s) / 3600.
"""

from __future__ import annotations

import argparse
import json
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--captions", type=int, default=3)
    ap.add_argument("--n-max", type=int, default=16)
    ap.add_argument("--cap", type=int, default=16, help="high cap: every caption samples n-max images")
    ap.add_argument("--batch-size", type=int, default=8)
    args = ap.parse_args(argv)

    from genshift import imagenet
    from genshift.builders.in_g import MiningConfig, class_prompt, classifier_from_timm, mine_caption
    from genshift.builders.sd_generate import GenerationSettings, SDGenerator

    labels = list(imagenet.imagenet_a_indices()[: args.captions])
    caps = [(y, class_prompt(y).text + " it is on a table.") for y in labels]
    classify, _ = classifier_from_timm("test_resnet.r160_in1k", pretrained=False)
    report = {"captions": len(caps), "n_max": args.n_max, "cap": args.cap}
    for name, bs in (("one_at_a_time", 1), ("batched", args.batch_size)):
        settings = GenerationSettings(model_id="tiny", scheduler="default", steps=4, height=64, width=64,
                                      output_size=64, dtype="float32", batch_size=bs)
        gen = SDGenerator.tiny(settings, prediction_type="epsilon")
        gen.generate(["warm up"], [0])
        cfg = MiningConfig(n_max=args.n_max, cap=args.cap, batch_size=bs)
        t = time.perf_counter()
        results = [mine_caption(y, c, generate=gen.generate, classify=classify, cfg=cfg) for y, c in caps]
        dt = time.perf_counter() - t
        sampled = sum(r.sampled for r in results)
        kept = sum(len(r.kept) for r in results)
        report[name] = {"seconds": dt, "images_per_s": sampled / dt, "kept": kept,
                        "kept_per_hour": kept / dt * 3600}
    report["speedup"] = report["batched"]["images_per_s"] / report["one_at_a_time"]["images_per_s"]
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
