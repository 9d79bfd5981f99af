"""``bench build <suite> --preflight``: every builder stage checked at the real models' sizes.

Each stage builds its default model(s) from the published configs (``genshift.builders.real_models``) on
the **meta** device (no memory, no download) and runs the builder's own code path on tensors of
the real shapes: the textual-inversion loss and its backward (``TIRun``), prompt encoding with the
1000 injected class tokens, one guided UNet call and the VAE decode (``SDGenerator``), open_clip
image and text embeddings (``ClipScorer``), the BLIP-2 forward with the processor's image-token
layout, the perturber LLM's forward over its prompt, DDIM inversion, one null-text-inversion
step and a prompt-to-prompt edit through the attention processors (``Editor``), the timm
target's forward. A shape error is a failed stage.

What meta tensors cannot run is data-dependent: the schedulers' sigma comparisons, beam search
and sampling, PIL conversion, Python floats of scores. Those run in
``benchmarks/preflight_cpu.py`` (real-size random weights on CPU).

Memory is estimated from the pass itself (``genshift.builders.meta_memory``: the live tensors' bytes,
weights at the device's dtype + the activation peak, attention counted as a fused kernel). The
peak is taken at batch 1 and at the requested batch; the line through them says which batch fits.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from genshift.errors import BenchError, one_line
from genshift.builders import real_models as rm
from genshift.builders.meta_memory import GiB, Probe

USABLE = 0.9  # of the device memory (allocator fragmentation, CUDA context)


# --------------------------------------------------------------------------------------------------
# stages


@dataclass
class Report:
    stage: str
    model: str
    params: int = 0
    components: dict[str, int] = field(default_factory=dict)  # parameters per model of the stage
    dtype: str = ""
    batch: int = 1
    weights: int = 0            # bytes
    peak: int = 0               # bytes: weights + activation peak at ``batch`` (measured when ``measured``)
    estimate: int = 0           # bytes: the meta pass's estimate of ``peak``
    per_image: int = 0          # activation bytes one more image adds
    seconds: float | None = None  # per image, when measured on a real device
    measured: bool = False
    checks: list[str] = field(default_factory=list)
    not_on_meta: str = ""
    error: str | None = None
    fits: bool | None = None
    max_batch: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class Stage:
    name: str
    model: str
    dtype: torch.dtype
    batch: int                  # the batch the builder runs (1 where it works image by image)
    run: Callable               # run(device, batch, probe) -> checks; calls probe.built(**models) once built
    scales: bool = True         # memory grows with the batch
    not_on_meta: str = ""


def _check(cond: bool, what: str, checks: list[str]) -> None:
    if not cond:
        raise AssertionError(what)
    checks.append(what)


def _pil(size: int):
    from PIL import Image

    return Image.new("RGB", (size, size), (120, 90, 60))


def ti_step(model_id: str, resolution: int, dtype: torch.dtype):
    """One textual-inversion step: the loss of ``TIRun`` (v-prediction target) and its backward."""
    def run(device, batch, probe):
        from genshift.builders.textual_inversion import TEMPLATES, TIRun, initializer, template_ids

        c = rm.stable_diffusion(model_id, device=device, dtype=dtype)
        r = TIRun.from_components(c, device)
        probe.built(unet=r.unet, vae=r.vae, text_encoder=r.text_encoder)
        checks: list[str] = []
        width = r.text_encoder.config.hidden_size
        _check(width == r.unet.config.cross_attention_dim, f"token width {width} = UNet cross-attention width", checks)
        split, base = r.install(initializer(r.tokenizer, r.text_encoder, "Golden Retriever"))
        try:
            ids = torch.tensor([template_ids(r.tokenizer, TEMPLATES[i % len(TEMPLATES)], r.token_id)
                                for i in range(batch)], device=device)
            _check(ids.shape[1] == r.tokenizer.model_max_length == 77, "template ids padded to 77 tokens", checks)
            pixels = torch.empty(batch, 3, resolution, resolution, device=device, dtype=r.dtype)
            loss = r.loss(pixels, ids, torch.Generator().manual_seed(0))
            loss.backward()
            _check(split.vector.grad is not None and split.vector.grad.shape == (width,),
                   f"gradient reaches the learned row ({width},)", checks)
        finally:
            r.text_encoder.set_input_embeddings(base)
        return checks
    return run


def sd_generation(model_id: str, height: int, width: int, dtype: torch.dtype, *, class_tokens: bool,
                  prompts: list[str]):
    """``SDGenerator``: prompt embeddings (with the 1000 class tokens), seeded latents, one guided
    UNet call, the VAE decode."""
    def run(device, batch, probe):
        from diffusers import StableDiffusionPipeline

        from genshift.builders.sd_generate import GenerationSettings, SDGenerator
        from genshift.builders.tokens import inject_tokens, token_name

        c = rm.stable_diffusion(model_id, device=device, dtype=dtype)
        probe.built(unet=c["unet"], vae=c["vae"], text_encoder=c["text_encoder"])
        width_t = c["text_encoder"].config.hidden_size
        checks: list[str] = []
        texts = list(prompts)
        if class_tokens:
            ids = inject_tokens(c["tokenizer"], c["text_encoder"], {i: torch.zeros(width_t) for i in range(1000)})
            _check(ids[0] == 49408 and ids[999] == 50407, "class tokens injected as ids 49408..50407", checks)
            longest = max(range(1000), key=lambda i: len(c["tokenizer"].tokenize(token_name(i))))
            texts = [p.replace("<TOKEN>", token_name(longest)) for p in prompts]
        longest_prompt = max(len(c["tokenizer"](t).input_ids) for t in texts)
        _check(longest_prompt <= 77, f"longest prompt {longest_prompt} <= 77 tokens (no truncation)", checks)
        pipe = StableDiffusionPipeline(**c, safety_checker=None, feature_extractor=None, requires_safety_checker=False)
        s = GenerationSettings(model_id=model_id, height=height, width=width, dtype=str(dtype).split(".")[-1],
                               batch_size=batch)
        gen = SDGenerator(pipe, s, device=device)
        cond = gen.encode_prompts([texts[i % len(texts)] for i in range(batch)])
        uncond = gen.encode_prompts([""] * batch)
        _check(cond.shape == (batch, 77, width_t) and cond.dtype == dtype, f"prompt embeddings ({batch}, 77, {width_t}) "
               f"{str(dtype).split('.')[-1]}", checks)
        lat = gen.initial_latents(range(batch))
        f = gen.pipe.vae_scale_factor
        _check(lat.shape == (batch, 4, height // f, width // f), f"latents {tuple(lat.shape)}", checks)
        with torch.inference_mode():
            gen.pipe.scheduler.set_timesteps(s.steps)
            t = gen.pipe.scheduler.timesteps[0].to(device)
            eps = gen.pipe.unet(torch.cat([lat, lat]), t, encoder_hidden_states=torch.cat([uncond, cond])).sample
            _check(eps.shape == (2 * batch, *lat.shape[1:]), "guided UNet call (2 x batch)", checks)
            img = gen.pipe.vae.decode(lat / gen.pipe.vae.config.scaling_factor).sample
        _check(img.shape == (batch, 3, height, width), f"decoded images {height}x{width}", checks)
        return checks
    return run


def clip_embed(name: str, dtype: torch.dtype, *, texts: int = 2):
    """``ClipScorer``: image embeddings of a batch and the text embeddings it is scored against."""
    def run(device, batch, probe):
        from genshift.builders.clip_scoring import ClipScorer

        model, preprocess, tokenizer = rm.open_clip_model(name, device=device, dtype=dtype)
        probe.built(model=model)
        scorer = ClipScorer(model, preprocess, tokenizer, model_id=f"open_clip:{name}", device=device)
        checks: list[str] = []
        img = scorer.encode_images([_pil(512)] * batch)
        txt = scorer.encode_texts(["a photo of a Golden Retriever"] * texts)
        d = model.text_projection.shape[1] if model.text_projection is not None else img.shape[1]
        _check(img.shape == (batch, d) and txt.shape == (texts, d), f"image and text embeddings of width {d}", checks)
        return checks
    return run


def blip2_caption(model_id: str, dtype: torch.dtype, *, prefix_tokens: int = 12, new_tokens: int = 100, beams: int = 5):
    """BLIP-2 at the processor's layout: the image through the vision tower and the Q-Former's
    ``num_query_tokens`` queries, projected to the language model's width, in front of the prompt
    (decoder-only), or as the encoder's input with the prefix starting the decoder (Flan-T5); the
    language model runs ``beams`` sequences per image, as beam search does.

    By parts on meta: ``Blip2ForConditionalGeneration.forward`` reads the values of the all-ones
    Q-Former mask it builds (``.all()``), which meta tensors do not have; the whole forward and beam
    search run in ``benchmarks/preflight_cpu.py``."""
    def run(device, batch, probe):
        model = rm.blip2(model_id, device=device, dtype=dtype)
        probe.built(model=model, vision_model=model.vision_model, qformer=model.qformer,
                    language_model=model.language_model)
        cfg = model.config
        checks: list[str] = []
        size = cfg.vision_config.image_size
        with torch.inference_mode():
            image = model.vision_model(torch.empty(batch, 3, size, size, device=device, dtype=dtype))[0]
            patches = (size // cfg.vision_config.patch_size) ** 2 + 1
            _check(image.shape == (batch, patches, cfg.vision_config.hidden_size), f"{patches} image tokens", checks)
            queries = cfg.num_query_tokens
            q = model.qformer(query_embeds=model.query_tokens.expand(batch, -1, -1), encoder_hidden_states=image)[0]
            lm_in = model.language_projection(q[:, :queries]).repeat_interleave(beams, 0)
            lm = model.language_model
            width = lm.get_input_embeddings().embedding_dim
            _check(lm_in.shape == (batch * beams, queries, width), f"{queries} queries projected to the LM width {width}",
                   checks)
            text = lm.get_input_embeddings()(torch.full((batch * beams, prefix_tokens + new_tokens), 5, device=device))
            if cfg.text_config.is_encoder_decoder:
                out = lm(inputs_embeds=torch.cat([lm_in, text[:, :prefix_tokens]], 1), decoder_inputs_embeds=text)
            else:
                out = lm(inputs_embeds=torch.cat([lm_in, text], 1))
        _check(out.logits.shape[-1] == cfg.text_config.vocab_size, f"logits over {cfg.text_config.vocab_size} tokens",
               checks)
        return checks
    return run


def llm_prompt(model_id: str, dtype: torch.dtype, *, prompt_tokens: int, new_tokens: int):
    """The perturber's forward over its prompt plus the answer it may write (the KV cache of generate)."""
    def run(device, batch, probe):
        model = rm.causal_lm(model_id, device=device, dtype=dtype)
        probe.built(model=model)
        checks: list[str] = []
        ids = torch.full((batch, prompt_tokens + new_tokens), 3, dtype=torch.long, device=device)
        with torch.inference_mode():
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        _check(out.logits.shape == (batch, 1, model.config.vocab_size), "next-token logits", checks)
        return checks
    return run


def p2p_edit(model_id: str, size: int, fs: tuple[float, ...], steps: int = 2):
    """``Editor``: DDIM inversion, one null-text-inversion step (Eq. 1), a prompt-to-prompt edit of
    every f in one batched pass through the attention processors, the VAE decode (fp32, as the
    released code). ``steps`` scheduler steps stand for the 50."""
    def run(device, batch, probe):
        from diffusers import StableDiffusionPipeline

        from genshift.builders.lance_editor import Editor, EditorConfig, Inversion

        c = rm.stable_diffusion(model_id, device=device)
        pipe = StableDiffusionPipeline(**c, safety_checker=None, feature_extractor=None, requires_safety_checker=False)
        ed = Editor(pipe, EditorConfig(model_id=model_id, steps=steps, size=size, fs=fs), device=device)
        probe.built(unet=c["unet"], vae=c["vae"], text_encoder=c["text_encoder"])
        checks: list[str] = []
        src, tgt = "a photo of a dog on the grass", "a photo of a dog on the beach in the snow"
        z0 = ed.encode(_pil(size))
        _check(z0.shape == (1, 4, size // 8, size // 8), f"source latent {tuple(z0.shape)}", checks)
        traj = ed.ddim_inversion(z0, src)
        cond, uncond = ed.embed([src]), ed.embed([""]).clone().requires_grad_(True)
        opt = torch.optim.Adam([uncond], lr=1e-2)
        t = int(ed.sched.timesteps[0])
        with torch.no_grad():
            eps_c = ed._unet(traj[-1], t, cond)
        ed.nti_step(traj[-1], t, uncond, eps_c, traj[-2], opt)
        _check(uncond.grad is not None and uncond.grad.shape == cond.shape, "null-text embedding optimised", checks)
        inv = Inversion(src, traj[-1], [uncond.detach()] * steps, traj)
        calls = ed.unet_calls
        z, ctl = ed.edit(inv, tgt, "beach in the snow")
        _check(z.shape == (1 + len(fs), 4, size // 8, size // 8), f"{1 + len(fs)} branches in one pass", checks)
        _check(ctl.num_layers == len(ed.unet.attn_processors) and ctl.calls == (ed.unet_calls - calls) * ctl.num_layers,
               f"controller ran on all {ctl.num_layers} attention layers ({ctl.cross_layers} cross) every step", checks)
        with torch.inference_mode():
            img = ed.vae.decode(z / ed.vae.config.scaling_factor).sample
        _check(img.shape == (1 + len(fs), 3, size, size), "decoded edits", checks)
        return checks
    return run


def timm_classify(name: str, dtype: torch.dtype):
    def run(device, batch, probe):
        import timm.data

        model = rm.timm_model(name, device=device, dtype=dtype)
        probe.built(model=model)
        size = timm.data.resolve_data_config(model=model)["input_size"]
        with torch.inference_mode():
            out = model(torch.empty(batch, *size, device=device, dtype=dtype))
        checks: list[str] = []
        _check(out.shape == (batch, 1000), f"{size[1]} px input -> 1000 logits", checks)
        return checks
    return run


# --------------------------------------------------------------------------------------------------
# the stages of each suite, from the builder's own options


def _gpu(device: str) -> bool:
    return device.startswith("cuda")


def stages(suite_id: str, args, device: str) -> list[Stage]:
    """The stages ``bench build suite_id`` runs with ``args``, at the dtypes it uses on ``device``."""
    gpu = _gpu(device)
    f32 = torch.float32
    batch = getattr(args, "batch_size", None) or 1
    if suite_id == "imagenet-star":
        from genshift.suites import imagenet_star_shifts

        gen_dtype = getattr(torch, args.dtype) if gpu else f32
        prompts = [s.prompt for s in imagenet_star_shifts()]
        return [
            Stage("textual inversion (--train-tokens)", args.model, gen_dtype, 1, ti_step(args.model, args.width, gen_dtype),
                  scales=False, not_on_meta="the optimiser loop's loss values (covered: benchmarks/preflight_cpu.py)"),
            Stage("generation", args.model, gen_dtype, batch,
                  sd_generation(args.model, args.height, args.width, gen_dtype, class_tokens=args.tokens != "none"
                                and not args.no_tokens, prompts=prompts),
                  not_on_meta="the Euler loop (sigma comparisons) and the JPEG output (covered: benchmarks/preflight_cpu.py)"),
            Stage("CLIP filter", f"open_clip:{args.clip_model}", f32, batch, clip_embed(args.clip_model, f32),
                  not_on_meta="the scores as numbers"),
        ]
    if suite_id == "lance-hardimagenet":
        fs = tuple(float(f) for f in args.fs)
        llm = "lance-release" if args.perturber == "lance-release" else args.perturber
        return [
            Stage("caption", args.captioner, torch.float16 if gpu else f32, 1, blip2_caption(args.captioner,
                  torch.float16 if gpu else f32), scales=False,
                  not_on_meta="the one-call forward (its Q-Former mask is read) and beam search (covered: "
                              "benchmarks/preflight_cpu.py)"),
            Stage("perturbation prompting", llm, torch.bfloat16 if gpu else f32, 1,
                  llm_prompt(llm, torch.bfloat16 if gpu else f32, prompt_tokens=1024, new_tokens=400), scales=False,
                  not_on_meta="sampling"),
            Stage("NTI + P2P editing", args.editor, f32, 1, p2p_edit(args.editor, 512, fs), scales=False,
                  not_on_meta="NTI's early stop on the loss value; PNG output (covered: benchmarks/preflight_cpu.py)"),
            Stage("CLIP checks", f"open_clip:{args.clip_model}", f32, 1 + len(fs), clip_embed(args.clip_model, f32, texts=4),
                  scales=False, not_on_meta="the pass/fail comparisons"),
        ]
    if suite_id in ("in-g-rn", "in-g-vit"):
        from genshift.builders.in_g import TARGETS

        gen_dtype = getattr(torch, args.dtype) if gpu else f32
        target = args.target or TARGETS[suite_id]
        return [
            Stage("caption (--imagenet-a)", args.captioner, torch.float16 if gpu else f32, 16,
                  blip2_caption(args.captioner, torch.float16 if gpu else f32, new_tokens=40), scales=False,
                  not_on_meta="the one-call forward (its Q-Former mask is read) and beam search"),
            Stage("generation", args.generator, gen_dtype, batch,
                  sd_generation(args.generator, args.size, args.size, gen_dtype, class_tokens=False,
                                prompts=["a realistic photograph of a Golden Retriever (dog). It is lying in the snow "
                                         "next to a red sled, and the background is a pine forest."]),
                  not_on_meta="the scheduler loop and the JPEG output"),
            Stage("target", f"timm:{target}", f32, batch, timm_classify(target, f32), not_on_meta="top-3 test"),
        ]
    raise BenchError(f"no preflight for {suite_id!r}")


def resident_groups(suite_id: str, args=None) -> list[tuple[str, ...]]:
    """The sets of stages whose models a builder holds on the device at the same time, one set after the
    other. LANCE runs its stages over all images in turn (``genshift.builders.lance``): the captioner alone, then the
    perturber (with CLIP when ``--text-filter clip``), then the editor with CLIP."""
    if suite_id == "lance-hardimagenet":
        clip_text = getattr(args, "text_filter", "sbert") == "clip"
        return [("caption",), ("perturbation prompting",) + (("CLIP checks",) if clip_text else ()),
                ("NTI + P2P editing", "CLIP checks")]
    return {"imagenet-star": [("generation", "CLIP filter")], "in-g-rn": [("generation", "target")],
            "in-g-vit": [("generation", "target")]}.get(suite_id, [])


def _group_peak(group: list[Report]) -> int:
    """All the group's weights plus the largest activation peak among them (one stage runs at a time)."""
    return sum(r.weights for r in group) + max(r.peak - r.weights for r in group)


def _resident(suite_id: str, reports: list[Report], args=None) -> list[list[Report]]:
    """:func:`resident_groups` as the reports of their stages that passed (empty sets left out)."""
    groups = [[r for r in reports if r.ok and r.stage in g] for g in resident_groups(suite_id, args)]
    return [g for g in groups if g]


def together(suite_id: str, reports: list[Report], args=None) -> tuple[list[str], int]:
    """(stage names, peak bytes) of the largest set of models the builder keeps loaded at once."""
    groups = _resident(suite_id, reports, args)
    if not groups:
        return [], 0
    top = max(groups, key=_group_peak)
    return [r.stage for r in top], _group_peak(top)


def _capacity(device: str, memory_gib: float | None) -> tuple[int | None, str]:
    if memory_gib:
        return int(memory_gib * GiB), f"{memory_gib:g} GiB (--device-memory)"
    if _gpu(device):
        if not torch.cuda.is_available():
            return None, "no CUDA device here: give --device-memory GIB to plan for one"
        props = torch.cuda.get_device_properties(torch.device(device))
        return props.total_memory, f"{props.name}, {props.total_memory / GiB:.1f} GiB"
    if device == "cpu":
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return total, f"CPU RAM {total / GiB:.1f} GiB"
    raise BenchError(f"--device {device!r}: use cpu, cuda or cuda:N")


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {one_line(e, 300)}"


def check_stage(st: Stage, *, batch: int | None = None) -> Report:
    """The meta pass of one stage at ``batch`` (and at 1 for the per-image slope)."""
    b = st.batch if not st.scales or batch is None else batch
    rep = Report(st.name, st.model, dtype=str(st.dtype).split(".")[-1], batch=b, not_on_meta=st.not_on_meta)
    try:
        probe = Probe("meta")
        with probe.watching():
            rep.checks = st.run("meta", b, probe)
        rep.components, rep.weights = probe.params, probe.weights
        rep.params = probe.total
        rep.peak = rep.estimate = probe.peak
        if st.scales and b > 1:
            one = Probe("meta")
            with one.watching():
                st.run("meta", 1, one)
            rep.per_image = max(0, (rep.peak - one.peak) // (b - 1))
    except Exception as e:  # noqa: BLE001 - a stage that fails its pass is reported, not raised
        rep.error = _one_line(e)
    return rep


def measure_stage(st: Stage, rep: Report, device: str) -> None:
    """On a real GPU: the same pass with random weights on ``device``; measured peak and seconds per image
    (from the built models on: building is not timed)."""
    probe = Probe(device)
    st.run(device, rep.batch, probe)
    rep.seconds = probe.seconds() / rep.batch
    rep.peak = probe.peak
    rep.measured = True
    torch.cuda.empty_cache()


def advise(rep: Report, st: Stage, capacity: int) -> None:
    """Whether the stage fits ``capacity`` bytes (``USABLE`` of them), and the largest batch that does
    (peak = weights + fixed activations + batch x per-image activations)."""
    usable = USABLE * capacity
    if rep.fits is None:
        rep.fits = rep.peak <= usable
    if st.scales and rep.per_image:
        base = rep.peak - rep.per_image * rep.batch
        rep.max_batch = int((usable - base) // rep.per_image)


def preflight(suite_id: str, args, *, device: str, memory_gib: float | None = None, measure: bool = False
              ) -> tuple[list[Report], str]:
    capacity, where = _capacity(device, memory_gib)
    checked = []
    for st in stages(suite_id, args, device):
        rep = check_stage(st, batch=getattr(args, "batch_size", None))
        if rep.ok and measure and _gpu(device) and torch.cuda.is_available():
            try:
                measure_stage(st, rep, device)
            except torch.cuda.OutOfMemoryError:
                rep.fits = False
        checked.append((st, rep))
    reports = [rep for _, rep in checked]
    groups = _resident(suite_id, reports, args)
    for st, rep in checked:
        if rep.ok and capacity:  # a stage shares the device with the weights of the models loaded with it
            others = max((sum(r.weights for r in g if r is not rep) for g in groups if rep in g), default=0)
            advise(rep, st, capacity - int(others / USABLE))
    return reports, where


def render(suite_id: str, reports: list[Report], device: str, where: str, capacity: int | None = None,
           args=None) -> str:
    lines = [f"preflight of {suite_id} on {device} ({where}); real architectures, random weights, meta-device pass",
             f"{'stage':<34} {'model':<40} {'params':>15} {'dtype':<9} {'batch':>5} {'est. GiB':>8} {'meas. GiB':>9} "
             f"{'s/img':>7}  fit"]
    for r in reports:
        if not r.ok:
            lines.append(f"{r.stage:<34} {r.model:<40} FAILED: {r.error}")
            continue
        fit = "?" if r.fits is None else ("yes" if r.fits else "NO")
        if r.max_batch is not None and r.max_batch >= 1:
            fit += f" (batch <= {r.max_batch} fits)"
        elif r.fits is False:
            fit += " (at no batch size: use a bigger device or a smaller dtype)"
        secs = f"{r.seconds:7.3f}" if r.seconds is not None else "      -"
        measured = f"{r.peak / GiB:9.2f}" if r.measured else "        -"
        lines.append(f"{r.stage:<34} {r.model:<40} {r.params:>15,} {r.dtype:<9} {r.batch:>5} "
                     f"{r.estimate / GiB:8.2f} {measured} {secs}  {fit}")
        if len(r.components) > 1:
            lines += [f"{'':<36}{name:<38} {n:>15,}" for name, n in r.components.items() if name != "model"]
    names, peak = together(suite_id, reports, args)
    if names:
        verdict = "" if not capacity else ("; fits" if peak <= USABLE * capacity else
                                           "; does NOT fit: the builder holds these models at once")
        lines.append(f"most loaded at once ({', '.join(names)}): {peak / GiB:.2f} GiB{verdict}")
    lines.append("est.: peak memory estimated from the meta pass (weights + activation peak, fused attention); "
                 "meas.: measured on the device (--measure); fit: against the device memory")
    for r in reports:
        if r.ok and r.not_on_meta:
            lines.append(f"  {r.stage}: checked {'; '.join(r.checks)}; not on meta: {r.not_on_meta}")
    return "\n".join(lines)


def run(suite_id: str, args) -> int:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    reports, where = preflight(suite_id, args, device=device, memory_gib=args.device_memory,
                               measure=args.measure)
    print(render(suite_id, reports, device, where, _capacity(device, args.device_memory)[0], args))
    failed = [r.stage for r in reports if not r.ok]
    if failed:
        raise BenchError(f"preflight: {len(failed)} stage(s) failed their shape pass ({', '.join(failed)}); "
                         "see the lines marked FAILED")
    return 0
