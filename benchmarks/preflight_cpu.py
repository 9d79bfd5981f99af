"""Real-size CPU run of the builder stages whose numerics or memory matter, random weights.

    python benchmarks/preflight_cpu.py --out /tmp/preflight-cpu            # every stage, one at a time
    python benchmarks/preflight_cpu.py --stage blip2-caption --out /tmp/p  # one stage

What ``bench build --preflight`` cannot run on the meta device (scheduler loops, the optimiser
step, beam search, image output) runs here, at the published architectures' real sizes
(``genshift.builders.real_models``), through the builders' own classes, on CPU in float32 (bf16 for
BLIP-2):

- ``sd2-generate``: ``SDGenerator`` with SD 2 (UNet + VAE + OpenCLIP-H text encoder, 1000 class
  tokens injected), one 768 px image, 2 Euler steps, JPEG out;
- ``ti-step``: one textual-inversion step (``train_class_token``, 768 px, v-prediction loss,
  backward, AdamW) on SD 2;
- ``nti-p2p``: SD 1.4 ``Editor``: DDIM inversion, null-text inversion with one inner step per
  step, a prompt-to-prompt edit of the five f values in one batched pass (2 DDIM steps stand for
  the 50: seconds per step are reported);
- ``blip2-caption``: one BLIP-2 OPT-2.7b caption in bf16 (``Captioner.caption``: 5 beams, 20 new
  tokens; the tokenizer is the tiny in-memory one, as the real one is not reachable offline).

Each stage runs in its own process (its peak RSS is that process's ``ru_maxrss``); a stage whose
preflight estimate exceeds ``--max-gib`` is skipped and said so. Prints a table and writes
``<out>/preflight_cpu.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

STAGES = ("sd2-generate", "ti-step", "nti-p2p", "blip2-caption")
SD2, SD14, BLIP2 = "stabilityai/stable-diffusion-2", "CompVis/stable-diffusion-v1-4", "Salesforce/blip2-opt-2.7b-coco"


class Timer:
    """Seconds spent in each module's forward (hooks), so a pipeline call splits into its parts."""

    def __init__(self, **modules) -> None:
        self.seconds = {k: 0.0 for k in modules}
        self.calls = {k: 0 for k in modules}
        for name, m in modules.items():
            m.register_forward_pre_hook(lambda mod, a, name=name: self._start(name))
            m.register_forward_hook(lambda mod, a, out, name=name: self._stop(name))
        self._t0: dict[str, float] = {}

    def _start(self, name):
        self._t0[name] = time.perf_counter()

    def _stop(self, name):
        self.seconds[name] += time.perf_counter() - self._t0.pop(name)
        self.calls[name] += 1


def sd2_generate() -> dict:
    from genshift.builders import real_models as rm
    from genshift.builders.sd_generate import GenerationSettings, SDGenerator
    from genshift.builders.textual_inversion import token_name

    c = rm.stable_diffusion(SD2, device="cpu")
    settings = GenerationSettings(model_id=SD2, steps=2, height=768, width=768, output_size=512, jpeg_quality=75,
                                  dtype="float32", batch_size=1)
    width = c["text_encoder"].config.hidden_size
    tokens = {i: torch.randn(width, generator=torch.Generator().manual_seed(i)) * 0.4 for i in range(1000)}
    gen = SDGenerator.from_components(c, settings, device="cpu", tokens=tokens)
    timer = Timer(unet=gen.pipe.unet, vae_decoder=gen.pipe.vae.decoder, text_encoder=gen.pipe.text_encoder)
    t0 = time.perf_counter()
    jpegs = gen.generate([f"a photo of a {token_name(207)} in the snow"], [0])
    total = time.perf_counter() - t0
    assert len(jpegs) == 1 and jpegs[0][:2] == b"\xff\xd8" and timer.calls["unet"] == 2
    return {"what": "SD 2, 1 image, 768 px, 2 Euler steps (CFG: UNet batch 2), JPEG out", "seconds_total": total,
            "seconds_per_step": timer.seconds["unet"] / timer.calls["unet"], "unet_calls": timer.calls["unet"],
            "seconds_vae_decode": timer.seconds["vae_decoder"], "seconds_text_encoder": timer.seconds["text_encoder"],
            "jpeg_bytes": len(jpegs[0])}


def ti_step() -> dict:
    import numpy as np
    from PIL import Image

    from genshift.builders import real_models as rm
    from genshift.builders.textual_inversion import TIConfig, TIRun, TrainingClass, train_class_token

    run = TIRun.from_components(rm.stable_diffusion(SD2, device="cpu"), "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "0.png"
        Image.fromarray(np.random.default_rng(0).integers(0, 256, (800, 900, 3), dtype=np.uint8)).save(f)
        t0 = time.perf_counter()
        vec, losses = train_class_token(run, TrainingClass(207, "Golden Retriever", (f,)), TIConfig(steps=1))
        total = time.perf_counter() - t0
    assert vec.shape == (1024,) and len(losses) == 1 and np.isfinite(losses[0])
    return {"what": "one textual-inversion step on SD 2 at 768 px (VAE encode, UNet forward + backward, AdamW)",
            "seconds_per_step": total, "loss": losses[0]}


def nti_p2p() -> dict:
    from diffusers import StableDiffusionPipeline
    from PIL import Image

    from genshift.builders import real_models as rm
    from genshift.builders.lance_editor import Editor, EditorConfig

    c = rm.stable_diffusion(SD14, device="cpu")
    pipe = StableDiffusionPipeline(**c, safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    cfg = EditorConfig(model_id=SD14, steps=2, nti_inner_steps=1)
    ed = Editor(pipe, cfg, device="cpu")
    timer = Timer(unet=ed.unet)
    image = Image.new("RGB", (512, 512), (90, 140, 60))
    t0 = time.perf_counter()
    inv = ed.null_text_inversion(image, "a photo of a dog on the grass")
    t_inv = time.perf_counter() - t0
    unet_inv = timer.calls["unet"]
    t1 = time.perf_counter()
    z, ctl = ed.edit(inv, "a photo of a dog on the beach", "beach")
    t_edit = time.perf_counter() - t1
    images = ed.decode(z)
    assert len(images) == 1 + len(cfg.fs) and ctl.calls == cfg.steps * ctl.num_layers and len(inv.nti_losses) == 2
    return {"what": "SD 1.4 at 512 px: DDIM inversion + null-text inversion (1 inner step per step), then a P2P edit "
                    f"of {len(cfg.fs)} f values in one pass ({1 + len(cfg.fs)} branches, CFG: UNet batch "
                    f"{2 * (1 + len(cfg.fs))}); {cfg.steps} steps stand for 50",
            "seconds_inversion": t_inv, "unet_calls_inversion": unet_inv,
            "seconds_per_nti_step": t_inv / cfg.steps, "seconds_per_edit_step": t_edit / cfg.steps,
            "p2p_layers": ctl.num_layers, "nti_losses": inv.nti_losses}


def blip2_caption() -> dict:
    from PIL import Image
    from transformers import Blip2Processor, BlipImageProcessor

    from genshift.builders import real_models as rm
    from genshift.builders.captioner import Captioner

    tok = Captioner.tiny().processor.tokenizer  # the real OPT tokenizer is not reachable offline
    model = rm.blip2(BLIP2, device="cpu", dtype=torch.bfloat16)
    model.config.image_token_index = tok.convert_tokens_to_ids("<image>")  # the tiny tokenizer's image token id
    n_q = model.config.num_query_tokens
    processor = Blip2Processor(BlipImageProcessor(size={"height": 224, "width": 224}), tok, num_query_tokens=n_q)
    cap = Captioner(model, processor, model_id=BLIP2, device="cpu", dtype=torch.bfloat16)
    t0 = time.perf_counter()
    text = cap.caption([Image.new("RGB", (512, 512), (90, 140, 60))], prefix="a photo of", num_beams=5,
                       min_new_tokens=20, max_new_tokens=20)
    total = time.perf_counter() - t0
    assert text[0].startswith("a photo of")
    return {"what": "BLIP-2 OPT-2.7b in bf16 (Q-Former fp32), 1 image, 5 beams, 20 new tokens",
            "seconds_total": total, "seconds_per_token": total / 20}


def _child(stage: str) -> dict:
    torch.manual_seed(0)
    t0 = time.perf_counter()
    runs = {"sd2-generate": sd2_generate, "ti-step": ti_step, "nti-p2p": nti_p2p, "blip2-caption": blip2_caption}
    out = runs[stage]()
    out["seconds_wall"] = time.perf_counter() - t0
    out["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
    return out


def _estimate_gib(stage: str) -> float:
    """The preflight's meta estimate (CPU dtypes) of the stage's peak, to skip what would not fit."""
    from functools import partial

    from genshift.builders import preflight as pf

    runs = {"sd2-generate": partial(pf.sd_generation, SD2, 768, 768, torch.float32, class_tokens=True,
                                    prompts=["a photo of a <TOKEN>"]),
            "ti-step": partial(pf.ti_step, SD2, 768, torch.float32),
            "nti-p2p": partial(pf.p2p_edit, SD14, 512, (0.4, 0.5, 0.6, 0.7, 0.8)),
            "blip2-caption": partial(pf.blip2_caption, BLIP2, torch.bfloat16, new_tokens=20)}
    st = pf.Stage(stage, stage, torch.float32, 1, runs[stage])
    rep = pf.check_stage(st)
    return rep.peak / pf.GiB


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stage", choices=STAGES, action="append", help="run only these stages (default: all)")
    ap.add_argument("--out", required=True, help="folder for preflight_cpu.json")
    ap.add_argument("--max-gib", type=float, default=10.0, help="skip a stage whose estimated peak is above this")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    ap.add_argument("--child", choices=STAGES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.child:
        print(json.dumps(_child(args.child)))
        return 0
    from genshift.fsutil import atomic_write_json

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"torch": torch.__version__, "threads": args.threads, "cpus": os.cpu_count(), "stages": {}}
    for stage in args.stage or STAGES:
        est = _estimate_gib(stage)
        if est > args.max_gib:
            results["stages"][stage] = {"skipped": f"estimated peak {est:.1f} GiB > --max-gib {args.max_gib:g}"}
            print(f"{stage}: skipped (estimated {est:.1f} GiB)", flush=True)
            continue
        print(f"{stage}: running (estimated peak {est:.1f} GiB) ...", flush=True)
        proc = subprocess.run([sys.executable, __file__, "--child", stage, "--out", str(out), "--threads",
                               str(args.threads)], capture_output=True, text=True)
        if proc.returncode:
            results["stages"][stage] = {"error": proc.stderr.strip().splitlines()[-1:], "estimated_gib": est}
        else:
            results["stages"][stage] = {**json.loads(proc.stdout.strip().splitlines()[-1]), "estimated_gib": est}
        print(f"{stage}: {json.dumps(results['stages'][stage])}", flush=True)
        atomic_write_json(out / "preflight_cpu.json", results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
