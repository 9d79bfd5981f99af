"""`bench discover`: find captions that make a model fail on a class (Wiles et al. s4.1)."""

from __future__ import annotations

from genshift.cli._common import add_verb, positive_int, print_table


def add_parser(sub):
    p = add_verb(sub, "discover", help="open-ended failure search for one class",
                 description="Generate images of a class from its prompt, caption the ones the model gets wrong, "
                             "regenerate from each caption and report which captions raise the failure (or target-"
                             "class) rate, with counts, ratio and a one-sided Fisher exact test.",
                 examples="  bench discover --model resnet50.tv_in1k --class n01985128\n"
                          "  bench discover --model resnet50.tv_in1k --class 283 --target 287 --n-baseline 500\n")
    p.add_argument("--model", required=True, help="timm model to probe")
    p.add_argument("--checkpoint", help="local weights for --model")
    p.add_argument("--class", dest="klass", required=True, help="class index or wnid")
    p.add_argument("--target", help="count predictions of this class (index or wnid) instead of any failure")
    p.add_argument("--n-baseline", type=positive_int, default=200, help="images generated from the class prompt")
    p.add_argument("--n-per-caption", type=positive_int, default=100, help="images generated per candidate caption")
    p.add_argument("--max-captions", type=positive_int, default=10, help="candidate captions tested at most")
    p.add_argument("--no-refine", dest="refine", action="store_false",
                   help="skip refining the winning caption sentence by sentence")
    p.add_argument("--generator", default="stabilityai/stable-diffusion-2-1-base",
                   help="Stable Diffusion checkpoint (Hub repo) that generates the images")
    p.add_argument("--captioner", default="Salesforce/blip2-opt-2.7b",
                   help="BLIP-2 checkpoint (Hub repo) that captions the failures")
    p.add_argument("--steps", type=positive_int, default=50, help="diffusion steps per image")
    p.add_argument("--size", type=positive_int, default=512, help="generated image size in pixels")
    p.add_argument("--batch-size", type=positive_int, default=8, help="images per generation batch")
    p.add_argument("--seed", type=int, default=0, help="seed of the generation")
    p.add_argument("--device", help="default: cuda when available")
    p.add_argument("--smoke", action="store_true", help="tiny random generator/captioner/model on CPU (plumbing check)")
    p.add_argument("--out", help="write the JSON report here")
    return p


def run(args) -> int:
    import torch

    from genshift import imagenet
    from genshift.fsutil import atomic_write_json
    from genshift.builders.captioner import Captioner
    from genshift.builders.discover import DiscoverConfig, captioner_fn, discover, format_report
    from genshift.builders.in_g_mining import classifier_from_timm
    from genshift.builders.sd_generate import GenerationSettings, SDGenerator

    label, target = imagenet.parse_class(args.klass), (imagenet.parse_class(args.target) if args.target else None)
    device = "cpu" if args.smoke else (args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.smoke:
        settings = GenerationSettings(model_id="tiny", scheduler="default", steps=2, height=64, width=64,
                                      output_size=64, dtype="float32", batch_size=args.batch_size)
        gen = SDGenerator.tiny(settings, prediction_type="epsilon")
        cap = Captioner.tiny()
        classify, _ = classifier_from_timm(args.model, pretrained=False) if not args.checkpoint else \
            classifier_from_timm(args.model, checkpoint=args.checkpoint)
    else:
        settings = GenerationSettings(model_id=args.generator, scheduler="default", steps=args.steps, height=args.size,
                                      width=args.size, output_size=args.size, batch_size=args.batch_size)
        gen = SDGenerator.from_pretrained(settings, device=device)
        cap = Captioner.from_pretrained(args.captioner, device=device)
        classify, _ = classifier_from_timm(args.model, device=device, checkpoint=args.checkpoint)
    cfg = DiscoverConfig(n_baseline=args.n_baseline, n_per_caption=args.n_per_caption, max_captions=args.max_captions,
                         batch_size=args.batch_size, seed=args.seed, refine=args.refine)
    report = discover(label, generate=gen.generate, classify=classify, caption=captioner_fn(cap), target=target,
                      cfg=cfg)
    b = report["baseline"]
    print(f"{report['class_prompt']}  baseline {report['rate']}: {b['failures']}/{b['n']} = {100 * b['rate']:.2f}%")
    if report["hypotheses"]:
        print_table(format_report(report), ["caption", "failures", "rate %", "ratio", "p", "q (BH)", "significant"])
    else:
        print(report.get("note", "no hypotheses"))
    if args.out:
        atomic_write_json(args.out, report)
        print(f"report: {args.out}")
    return 0
