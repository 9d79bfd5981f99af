"""Generation throughput: the builders' batched path vs a plain one-image-per-call diffusers loop.

    python benchmarks/build_throughput.py                      # tiny random SD2-like models on CPU
    python benchmarks/build_throughput.py --sd2-size --device cuda --dtype float16   # SD2-sized UNet, random weights

Both paths use the same pipeline object, prompts, seeds and settings; the baseline calls
``StableDiffusionPipeline`` once per image with its own generator (what the authors' ImageNet*
script does), ours is ``genshift.builders.sd_generate.SDGenerator.generate`` (batched, per-image
generators). Throughput does not depend on the weights, so ``--sd2-size`` builds SD2's
architecture (UNet, VAE, OpenCLIP-H-sized text encoder) from configs with random weights: the
figure transfers to the real model. Also prints the estimated GPU-hours for all 24 ImageNet*
configs (1.2 M images) at the measured rate.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--size", type=int, default=64, help="generated height = width")
    ap.add_argument("--sd2-size", action="store_true", help="SD2 architecture, random weights (use a GPU)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    args = ap.parse_args(argv)

    from genshift.builders.sd_generate import GenerationSettings, SDGenerator
    from genshift.builders.seeding import derive_seed, generator

    dtype = getattr(torch, args.dtype)
    settings = GenerationSettings(model_id="benchmark", steps=args.steps, height=args.size, width=args.size,
                                  output_size=args.size, batch_size=args.batch_size, dtype=args.dtype)
    if args.sd2_size:
        from genshift.builders.real_models import stable_diffusion  # SD 2's published configs, random weights

        gen = SDGenerator.from_components(stable_diffusion("stabilityai/stable-diffusion-2", device=args.device,
                                                           dtype=dtype), settings, device=args.device)
    else:
        gen = SDGenerator.tiny(settings)
    prompts = [f"a photo of a <tench-0> in the snow {i % 3}" for i in range(args.images)]
    seeds = [derive_seed(0, "bench", i) for i in range(args.images)]
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    gen.generate(prompts[:2], seeds[:2])  # warm-up (kernels, allocator)

    sync()
    t = time.perf_counter()
    for p, s in zip(prompts, seeds):  # baseline: one pipeline call per image
        gen.pipe(p, num_inference_steps=args.steps, guidance_scale=7.5, height=args.size, width=args.size,
                 generator=generator(s, "cpu"), output_type="pil")
    sync()
    base = time.perf_counter() - t
    t = time.perf_counter()
    gen.generate(prompts, seeds)
    sync()
    ours = time.perf_counter() - t
    rate = args.images / ours
    report = {
        "device": args.device, "dtype": args.dtype, "sd2_size": args.sd2_size, "images": args.images,
        "batch_size": args.batch_size, "steps": args.steps, "size": args.size,
        "baseline_images_per_s": args.images / base, "ours_images_per_s": rate, "speedup": base / ours,
        "gpu_hours_for_1_2M_images_at_this_rate_x_50_steps": (1_200_000 / rate) * (50 / args.steps) / 3600
        if args.sd2_size else None,
    }
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
