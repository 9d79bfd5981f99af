"""`bench diagnose`: failure directions (Jain et al.) of an evaluated model, explained in words."""

from __future__ import annotations

from genshift.cli._common import add_verb, csv_list, print_table


def add_parser(sub):
    p = add_verb(sub, "diagnose", help="failure directions: where a model fails, in words",
                 description="Fit per class a linear SVM on CLIP embeddings that predicts the model's mistakes "
                             "(Jain et al., ICLR 2023); report its strength, hardest images and captions; write "
                             "diagnose.json and diagnose.html next to the result (scores never change).",
                 examples="  bench diagnose runs/imagenet-star/timm--resnet50.a1_in1k\n"
                          "  bench diagnose runs/imagenet-star/timm--resnet50.a1_in1k --configs in_the_snow "
                          "--whiten-reference base\n"
                          "  bench diagnose runs/in-g-rn/timm--vit_base_patch16_224.augreg_in1k --criterion parent\n")
    p.add_argument("result", help="result.json or its run folder")
    p.add_argument("--configs", type=csv_list, help="configs to pool (default: all evaluated)")
    p.add_argument("--classes", type=csv_list, help="class indices or wnids (default: all present)")
    p.add_argument("--criterion", choices=("top1", "top3", "parent"), default="top1",
                   help="what counts as correct (IN-G suites: top3 or parent)")
    p.add_argument("--clip-model", default="ViT-B-32-quickgelu", help="open_clip architecture of the embeddings")
    p.add_argument("--clip-pretrained", default="openai", help="open_clip pretrained tag of --clip-model")
    p.add_argument("--clip-image", choices=("classifier-square", "center-crop"), default="classifier-square",
                   help="what CLIP sees: classifier-square (the authors' code: the classifier's input, un-normalised)"
                        " or center-crop (the stored image's centre square)")
    p.add_argument("--clip-precision", choices=("auto", "fp32", "fp16", "bf16"), default="auto",
                   help="CLIP autocast: auto = fp16 on a GPU (as the authors), fp32 on the CPU")
    p.add_argument("--whiten-reference", metavar="SPEC",
                   help="whiten with the CLIP statistics of 'analysed' (default), CONFIG[,CONFIG] or SUITE:CONFIG[,..]")
    p.add_argument("--reference-caption", choices=("code", "paper"), default="code",
                   help="reference caption: 'a photo of a <class>' (code) or 'a photo of a <ancestor>' (paper)")
    p.add_argument("--no-caption-whitening", dest="caption_whitening", action="store_false",
                   help="the paper's plain caption normalisation instead of the code's image pre-processing")
    p.add_argument("--null", type=int, default=10, help="permutation repeats for the null strength")
    p.add_argument("--suite", help="where to read the suite (default: as recorded in the result)")
    p.add_argument("--mask", help="ImageNet* upstream masks.npy (default: the file the result recorded)")
    p.add_argument("--cache-dir", default=None, help="embedding cache (default: <HF_HOME>/genshift/embeddings)")
    p.add_argument("--device", default="cpu", help="device for CLIP (cpu, cuda or cuda:N)")
    p.add_argument("--top", type=int, default=10, help="classes to print")
    return p


def run(args) -> int:
    from genshift import imagenet
    from genshift.eval.diagnose import ClipEncoder, DirectionOptions, diagnose
    from genshift.fsutil import cache_root

    cache = args.cache_dir or cache_root() / "embeddings"
    enc = ClipEncoder.from_pretrained(args.clip_model, args.clip_pretrained, device=args.device,
                                      precision=args.clip_precision)
    opts = DirectionOptions(n_null=args.null, reference_caption=args.reference_caption,
                            caption_whitening=args.caption_whitening)
    classes = [imagenet.parse_class(c) for c in args.classes] if args.classes else None
    report, path = diagnose(args.result, encoder=enc, cache_dir=cache, configs=args.configs, classes=classes,
                            criterion=args.criterion, options=opts, suite=args.suite, mask=args.mask,
                            image_view=args.clip_image, whiten_reference=args.whiten_reference)
    rows = [{"class": f"{d['label']} {d['name']}", "n": d["n"], "errors": d["n_errors"],
             "strength": "-" if d["strength"] is None else f"{d['strength']:.3f}",
             "null p95": "-" if d["null_p95"] is None else f"{d['null_p95']:.3f}",
             "hardest caption": d["hard_captions"][0][0] if d["hard_captions"] else d["status"]}
            for d in report["classes"][: args.top]]
    print_table(rows, ["class", "n", "errors", "strength", "null p95", "hardest caption"])
    print(f"\nreport: {path}\npictures: {path.with_name('diagnose.html')}")
    return 0
