"""``bench build <suite> --preflight``: every builder stage run on the **meta** device at the real models' sizes,
with the memory it needs: the storages alive at once (:class:`LiveBytes`), attention counted as the fused kernel
(:class:`FusedAttention`); the largest set of models a builder holds together must fit (``docs/builders.md``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from genshift.builders import real_models as rm
from genshift.errors import BenchError, one_line
from genshift.suites import imagenet_star_shifts

GiB = 2 ** 30
USABLE = 0.9  # of the device memory (allocator fragmentation, CUDA context)


class LiveBytes(TorchDispatchMode):
    """Peak bytes of the storages created inside the mode and alive at once (held by anything but this
    tracker: its use count, read when the total would pass the peak). Off (``active``) while models are
    built: their weights are counted from the modules."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.active = False
        self._storages: dict[int, tuple[torch.UntypedStorage, int]] = {}

    def _sweep(self) -> None:
        dead = [k for k in self._storages if torch._C._storage_Use_Count(k) <= 1]  # only our reference left
        for k in dead:
            self.live -= self._storages.pop(k)[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.active:
            return out
        given = {t.untyped_storage()._cdata for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                # a view or an in-place result shares a storage it was given: nothing new allocated
                if storage._cdata not in self._storages and storage._cdata not in given:
                    self._storages[storage._cdata] = (storage, storage.nbytes())
                    self.live += storage.nbytes()  # an upper bound until swept
                    if self.live > self.peak:  # a new peak only if it survives a sweep
                        self._sweep()
                        self.peak = max(self.peak, self.live)
        return out


class _Fused(torch.autograd.Function):
    """A fused attention kernel's footprint: the output; q, k, v saved for the backward."""

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return q.new_empty((*q.shape[:-1], v.shape[-1]))

    @staticmethod
    def backward(ctx, grad):
        q, k, v = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


class FusedAttention(TorchFunctionMode):
    """``F.scaled_dot_product_attention`` as a fused kernel: the output, no L x S probability matrix (on
    meta, SDPA decomposes into the math path, which fused kernels never hold)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.scaled_dot_product_attention:
            q, k, v = args[:3]
            if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
                raise RuntimeError(f"attention shapes do not match: q {tuple(q.shape)}, k {tuple(k.shape)}, "
                                   f"v {tuple(v.shape)}")
            return _Fused.apply(q, k, v)
        return func(*args, **(kwargs or {}))


@dataclass
class Report:
    """A stage's pass: ``built(**models)`` records the models' parameters and weight bytes and starts counting
    live bytes (:attr:`mem`); ``check`` records what passed; ``peak`` = weights + the activation peak."""

    stage: str
    model: str
    params: int = 0
    components: dict[str, int] = field(default_factory=dict)  # parameters per model of the stage
    dtype: str = ""
    batch: int = 1
    weights: int = 0            # bytes
    peak: int = 0               # bytes: weights + activation peak at ``batch``
    checks: list[str] = field(default_factory=list)
    not_on_meta: str = ""
    error: str | None = None
    fits: bool | None = None
    mem: LiveBytes = field(default_factory=LiveBytes, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.error is None

    def built(self, **models: torch.nn.Module) -> None:
        self.components = {k: rm.param_count(m) for k, m in models.items()}
        self.params = rm.param_count(*models.values())
        tensors = {id(t): t for m in models.values() for t in [*m.parameters(), *m.buffers()]}
        self.weights = sum(t.numel() * t.element_size() for t in tensors.values())
        self.mem.active = True

    def check(self, cond: bool, what: str) -> None:
        if not cond:
            raise AssertionError(what)
        self.checks.append(what)


@dataclass(frozen=True)
class Stage:
    name: str
    model: str
    dtype: torch.dtype
    batch: int                  # the batch the builder runs (1 where it works image by image)
    run: Callable               # run(batch=, probe=report): probe.built(**models) once built, then probe.check(...)
    not_on_meta: str = ""


def _pil(size: int):
    from PIL import Image

    return Image.new("RGB", (size, size), (120, 90, 60))


def ti_step(model_id: str, resolution: int, dtype: torch.dtype, *, batch: int, probe: Report) -> None:
    """One textual-inversion step: the loss of ``TIRun`` (v-prediction target) and its backward."""
    from genshift.builders.textual_inversion import TEMPLATES, TIRun, initializer, template_ids

    r = TIRun.from_components(rm.stable_diffusion(model_id, dtype=dtype), "meta")
    probe.built(unet=r.unet, vae=r.vae, text_encoder=r.text_encoder)
    width = r.text_encoder.config.hidden_size
    probe.check(width == r.unet.config.cross_attention_dim, f"token width {width} = UNet cross-attention width")
    with r.installed(initializer(r.tokenizer, r.text_encoder, "Golden Retriever")) as split:
        ids = torch.tensor([template_ids(r.tokenizer, TEMPLATES[i % len(TEMPLATES)], r.token_id)
                            for i in range(batch)], device="meta")
        probe.check(ids.shape[1] == r.tokenizer.model_max_length == 77, "template ids padded to 77 tokens")
        pixels = torch.empty(batch, 3, resolution, resolution, device="meta", dtype=r.dtype)
        r.loss(pixels, ids, torch.Generator().manual_seed(0)).backward()
        probe.check(split.vector.grad is not None and split.vector.grad.shape == (width,),
                    f"gradient reaches the learned row ({width},)")


def sd_generation(model_id: str, height: int, width: int, dtype: torch.dtype, *, class_tokens: bool,
                  prompts: list[str], batch: int, probe: Report) -> None:
    """``SDGenerator``: prompt embeddings (1000 class tokens), seeded latents, a guided UNet call, the decode."""
    from genshift.builders.sd_generate import GenerationSettings, SDGenerator
    from genshift.builders.textual_inversion import inject_tokens, token_name

    c = rm.stable_diffusion(model_id, dtype=dtype)
    probe.built(unet=c["unet"], vae=c["vae"], text_encoder=c["text_encoder"])
    width_t = c["text_encoder"].config.hidden_size
    texts = list(prompts)
    if class_tokens:
        ids = inject_tokens(c["tokenizer"], c["text_encoder"], {i: torch.zeros(width_t) for i in range(1000)})
        probe.check(ids[0] == 49408 and ids[999] == 50407, "class tokens injected as ids 49408..50407")
        longest = max(range(1000), key=lambda i: len(c["tokenizer"].tokenize(token_name(i))))
        texts = [p.replace("<TOKEN>", token_name(longest)) for p in prompts]
    longest_prompt = max(len(c["tokenizer"](t).input_ids) for t in texts)
    probe.check(longest_prompt <= 77, f"longest prompt {longest_prompt} <= 77 tokens (no truncation)")
    s = GenerationSettings(model_id=model_id, scheduler="default", height=height, width=width,
                           dtype=str(dtype).split(".")[-1], batch_size=batch)
    gen = SDGenerator.from_components(c, s, device="meta")
    cond = gen.encode_prompts([texts[i % len(texts)] for i in range(batch)])
    uncond = gen.encode_prompts([""] * batch)
    probe.check(cond.shape == (batch, 77, width_t) and cond.dtype == dtype,
                f"prompt embeddings ({batch}, 77, {width_t}) {str(dtype).split('.')[-1]}")
    lat = gen.initial_latents(range(batch))
    f = gen.pipe.vae_scale_factor
    probe.check(lat.shape == (batch, 4, height // f, width // f), f"latents {tuple(lat.shape)}")
    with torch.inference_mode():
        gen.pipe.scheduler.set_timesteps(s.steps)
        t = gen.pipe.scheduler.timesteps[0].to("meta")
        eps = gen.pipe.unet(torch.cat([lat, lat]), t, encoder_hidden_states=torch.cat([uncond, cond])).sample
        probe.check(eps.shape == (2 * batch, *lat.shape[1:]), "guided UNet call (2 x batch)")
        img = gen.pipe.vae.decode(lat / gen.pipe.vae.config.scaling_factor).sample
    probe.check(img.shape == (batch, 3, height, width), f"decoded images {height}x{width}")


def clip_embed(name: str, dtype: torch.dtype, *, texts: int = 2, batch: int, probe: Report) -> None:
    """``ClipScorer``: image embeddings of a batch and the text embeddings it is scored against."""
    from genshift.builders.clip_scoring import ClipScorer

    model, preprocess, tokenizer = rm.open_clip_model(name, dtype=dtype)
    probe.built(model=model)
    scorer = ClipScorer(model, preprocess, tokenizer, model_id=f"open_clip:{name}", device="meta")
    img = scorer.encode_images([_pil(512)] * batch)
    txt = scorer.encode_texts(["a photo of a Golden Retriever"] * texts)
    d = model.text_projection.shape[1] if model.text_projection is not None else img.shape[1]
    probe.check(img.shape == (batch, d) and txt.shape == (texts, d), f"image and text embeddings of width {d}")


def blip2_caption(model_id: str, dtype: torch.dtype, *, images: int = 1, prompt_tokens: int = 12,
                  new_tokens: int = 100, beams: int = 5, batch: int, probe: Report) -> None:
    """BLIP-2 by parts, at the processor's layout: the prompt's ``images`` (few-shot images, then the image)
    as queries at the LM width before ``prompt_tokens`` of text; ``beams`` sequences per image."""
    model = rm.blip2(model_id, dtype=dtype)
    probe.built(model=model, vision_model=model.vision_model, qformer=model.qformer,
                language_model=model.language_model)
    cfg = model.config
    size, n = cfg.vision_config.image_size, batch * images
    with torch.inference_mode():
        image = model.vision_model(torch.empty(n, 3, size, size, device="meta", dtype=dtype))[0]
        patches = (size // cfg.vision_config.patch_size) ** 2 + 1
        probe.check(image.shape == (n, patches, cfg.vision_config.hidden_size), f"{patches} image tokens")
        q = model.qformer(query_embeds=model.query_tokens.expand(n, -1, -1), encoder_hidden_states=image)[0]
        queries = cfg.num_query_tokens * images
        lm_in = model.language_projection(q[:, :cfg.num_query_tokens]).reshape(batch, queries, -1)
        lm_in = lm_in.repeat_interleave(beams, 0)
        lm = model.language_model
        width = lm.get_input_embeddings().embedding_dim
        probe.check(lm_in.shape == (batch * beams, queries, width),
                    f"{queries} queries ({images} image(s)) projected to the LM width {width}")
        text = lm.get_input_embeddings()(torch.full((batch * beams, prompt_tokens + new_tokens), 5, device="meta"))
        if cfg.text_config.is_encoder_decoder:
            out = lm(inputs_embeds=torch.cat([lm_in, text[:, :prompt_tokens]], 1), decoder_inputs_embeds=text)
        else:
            out = lm(inputs_embeds=torch.cat([lm_in, text], 1))
    vocab = cfg.text_config.vocab_size
    probe.check(out.logits.shape[-1] == vocab, f"logits over {vocab} tokens")


def llm_prompt(model_id: str, dtype: torch.dtype, *, prompt_tokens: int, new_tokens: int, batch: int,
               probe: Report) -> None:
    """The perturber's forward over its prompt plus the answer it may write (the KV cache of generate)."""
    model = rm.causal_lm(model_id, dtype=dtype)
    probe.built(model=model)
    with torch.inference_mode():
        out = model(input_ids=torch.full((batch, prompt_tokens + new_tokens), 3, dtype=torch.long, device="meta"),
                    use_cache=True, logits_to_keep=1)
    probe.check(out.logits.shape == (batch, 1, model.config.vocab_size), "next-token logits")


def p2p_edit(model_id: str, size: int, fs: tuple[float, ...], steps: int = 2, *, batch: int, probe: Report) -> None:
    """``Editor``: DDIM inversion, one null-text-inversion step (Eq. 1), every f's prompt-to-prompt edit in
    one pass, the VAE decode (fp32, as the released code); ``steps`` scheduler steps stand for the 50."""
    from diffusers import StableDiffusionPipeline

    from genshift.builders.lance_editor import Editor, EditorConfig, Inversion

    c = rm.stable_diffusion(model_id)
    pipe = StableDiffusionPipeline(**c, safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    ed = Editor(pipe, EditorConfig(model_id=model_id, steps=steps, size=size, fs=fs), device="meta")
    probe.built(unet=c["unet"], vae=c["vae"], text_encoder=c["text_encoder"])
    src, tgt = "a photo of a dog on the grass", "a photo of a dog on the beach in the snow"
    z0 = ed.encode(_pil(size))
    probe.check(z0.shape == (1, 4, size // 8, size // 8), f"source latent {tuple(z0.shape)}")
    traj = ed.ddim_inversion(z0, src)
    cond, uncond = ed.embed([src]), ed.embed([""]).clone().requires_grad_(True)
    t = int(ed.sched.timesteps[0])
    with torch.no_grad():
        eps_c = ed._unet(traj[-1], t, cond)
    ed.nti_step(traj[-1], t, uncond, eps_c, traj[-2], torch.optim.Adam([uncond], lr=1e-2))
    probe.check(uncond.grad is not None and uncond.grad.shape == cond.shape, "null-text embedding optimised")
    calls = ed.unet_calls
    z, ctl = ed.edit(Inversion(src, traj[-1], [uncond.detach()] * steps, traj), tgt, "beach in the snow")
    probe.check(z.shape == (1 + len(fs), 4, size // 8, size // 8), f"{1 + len(fs)} branches in one pass")
    every_step = ctl.calls == (ed.unet_calls - calls) * ctl.num_layers
    probe.check(ctl.num_layers == len(ed.unet.attn_processors) and every_step,
                f"controller ran on all {ctl.num_layers} attention layers ({ctl.cross_layers} cross) every step")
    with torch.inference_mode():
        img = ed.vae.decode(z / ed.vae.config.scaling_factor).sample
    probe.check(img.shape == (1 + len(fs), 3, size, size), "decoded edits")


def timm_classify(name: str, dtype: torch.dtype, *, batch: int, probe: Report) -> None:
    import timm.data

    model = rm.timm_model(name, dtype=dtype)
    probe.built(model=model)
    size = timm.data.resolve_data_config(model=model)["input_size"]
    with torch.inference_mode():
        out = model(torch.empty(batch, *size, device="meta", dtype=dtype))
    probe.check(out.shape == (batch, 1000), f"{size[1]} px input -> 1000 logits")


def stages(suite_id: str, cfg, device: str) -> list[Stage]:
    """The stages ``bench build suite_id`` runs with ``cfg``, at the dtypes it uses on ``device``."""
    gpu, f32 = device.startswith("cuda"), torch.float32
    batch = getattr(cfg, "batch_size", 1)
    half, bf16 = (torch.float16, torch.bfloat16) if gpu else (f32, f32)
    gen_dtype = getattr(torch, cfg.dtype) if gpu and hasattr(cfg, "dtype") else f32  # the generators' (ImageNet*, IN-G)
    if suite_id == "imagenet-star":
        prompts = [s.prompt for s in imagenet_star_shifts()]
        return [
            Stage("textual inversion (--train-tokens)", cfg.model, gen_dtype, 1,
                  partial(ti_step, cfg.model, cfg.width, gen_dtype),
                  "the optimiser loop's loss values (covered: benchmarks/preflight_cpu.py)"),
            Stage("generation", cfg.model, gen_dtype, batch,
                  partial(sd_generation, cfg.model, cfg.height, cfg.width, gen_dtype,
                          class_tokens=cfg.tokens != "none", prompts=prompts),
                  "the Euler loop (sigma comparisons) and the JPEG output (covered: benchmarks/preflight_cpu.py)"),
            Stage("CLIP filter", f"open_clip:{cfg.clip_model}", f32, batch, partial(clip_embed, cfg.clip_model, f32),
                  "the scores as numbers"),
        ]
    if suite_id == "lance-hardimagenet":
        return [
            Stage("caption", cfg.captioner, half, 1, partial(blip2_caption, cfg.captioner, half),
                  "the one-call forward (its Q-Former mask is read) and beam search (covered: "
                  "benchmarks/preflight_cpu.py)"),
            Stage("perturbation prompting", cfg.perturber, bf16, 1,
                  partial(llm_prompt, cfg.perturber, bf16, prompt_tokens=1024, new_tokens=400), "sampling"),
            Stage("NTI + P2P editing", cfg.editor, f32, 1, partial(p2p_edit, cfg.editor, 512, cfg.fs),
                  "NTI's early stop on the loss value; PNG output (covered: benchmarks/preflight_cpu.py)"),
            Stage("CLIP checks", f"open_clip:{cfg.clip_model}", f32, 1 + len(cfg.fs),
                  partial(clip_embed, cfg.clip_model, f32, texts=4), "the pass/fail comparisons"),
        ]
    if suite_id in ("in-g-rn", "in-g-vit"):
        from genshift.builders.in_g import TARGETS, caption_batch

        target = cfg.target or TARGETS[suite_id]
        shots = cfg.captioning == "three-shot"  # three image and caption pairs (~60 tokens each) before each image
        return [
            Stage("caption (--imagenet-a)", cfg.captioner, half, caption_batch(3 if shots else 0),
                  partial(blip2_caption, cfg.captioner, half, images=4 if shots else 1,
                          prompt_tokens=200 if shots else 12, new_tokens=40),
                  "the one-call forward (its Q-Former mask is read) and beam search"),
            Stage("generation", cfg.generator, gen_dtype, batch,
                  partial(sd_generation, cfg.generator, cfg.size, cfg.size, gen_dtype, class_tokens=False,
                          prompts=["a realistic photograph of a Golden Retriever (dog). It is lying in the snow "
                                   "next to a red sled, and the background is a pine forest."]),
                  "the scheduler loop and the JPEG output"),
            Stage("target", f"timm:{target}", f32, batch, partial(timm_classify, target, f32), "top-3 test"),
        ]
    raise BenchError(f"no preflight for {suite_id!r}")


def _groups(suite_id: str, reports: list[Report], cfg=None) -> list[list[Report]]:
    """The passed stages whose models a builder holds on the device at the same time, one set after the other.
    LANCE runs its stages over all images in turn (``genshift.builders.lance``): the captioner alone, then the
    perturber (with CLIP when ``--text-filter clip``), then the editor with CLIP."""
    clip_text = ("CLIP checks",) if getattr(cfg, "text_filter", "sbert") == "clip" else ()
    names = {"imagenet-star": [("generation", "CLIP filter")], "in-g-rn": [("generation", "target")],
             "in-g-vit": [("generation", "target")], "lance-hardimagenet": [
                 ("caption",), ("perturbation prompting", *clip_text), ("NTI + P2P editing", "CLIP checks")]}
    groups = [[r for r in reports if r.ok and r.stage in g] for g in names.get(suite_id, [])]
    return [g for g in groups if g]


def together(suite_id: str, reports: list[Report], cfg=None) -> tuple[list[str], int]:
    """(stage names, peak bytes) of the largest set of models the builder keeps loaded at once: all their
    weights plus the largest activation peak among them (one stage runs at a time)."""
    def peak(group: list[Report]) -> int:
        return sum(r.weights for r in group) + max(r.peak - r.weights for r in group)

    top = max(_groups(suite_id, reports, cfg), key=peak, default=[])
    return [r.stage for r in top], peak(top) if top else 0


def check_stage(st: Stage) -> Report:
    """The meta pass of one stage at its batch."""
    rep = Report(st.name, st.model, dtype=str(st.dtype).split(".")[-1], batch=st.batch, not_on_meta=st.not_on_meta)
    try:
        with FusedAttention(), rep.mem:
            st.run(batch=st.batch, probe=rep)
        rep.peak = rep.weights + rep.mem.peak
    except Exception as e:  # noqa: BLE001 - a stage that fails its pass is reported, not raised
        rep.error = f"{type(e).__name__}: {one_line(e, 300)}"
    return rep


def _capacity(device: str, memory_gib: float | None) -> tuple[int | None, str]:
    if memory_gib:
        return int(memory_gib * GiB), f"{memory_gib:g} GiB (--device-memory)"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            return None, "no CUDA device here: give --device-memory GIB to plan for one"
        props = torch.cuda.get_device_properties(torch.device(device))
        return props.total_memory, f"{props.name}, {props.total_memory / GiB:.1f} GiB"
    if device == "cpu":
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return total, f"CPU RAM {total / GiB:.1f} GiB"
    raise BenchError(f"--device {device!r}: use cpu, cuda or cuda:N")


def render(suite_id: str, reports: list[Report], device: str, where: str, capacity: int | None = None,
           cfg=None) -> str:
    lines = [f"preflight of {suite_id} on {device} ({where}); real architectures, random weights, meta-device pass",
             f"{'stage':<34} {'model':<40} {'params':>15} {'dtype':<9} {'batch':>5} {'est. GiB':>8}  fit"]
    for r in reports:
        if not r.ok:
            lines.append(f"{r.stage:<34} {r.model:<40} FAILED: {r.error}")
            continue
        fit = "?" if r.fits is None else ("yes" if r.fits else "NO (use a bigger device or a smaller dtype or batch)")
        row = f"{r.stage:<34} {r.model:<40} {r.params:>15,} {r.dtype:<9} {r.batch:>5} {r.peak / GiB:8.2f}"
        lines.append(f"{row}  {fit}")
        if len(r.components) > 1:
            lines += [f"{'':<36}{name:<38} {n:>15,}" for name, n in r.components.items() if name != "model"]
    names, peak = together(suite_id, reports, cfg)
    if names:
        verdict = "" if not capacity else ("; fits" if peak <= USABLE * capacity else
                                           "; does NOT fit: the builder holds these models at once")
        lines.append(f"most loaded at once ({', '.join(names)}): {peak / GiB:.2f} GiB{verdict}")
    lines.append("est.: peak memory estimated from the meta pass (weights + activation peak, fused attention); "
                 "fit: with the models loaded beside it, against the device memory")
    lines += [f"  {r.stage}: checked {'; '.join(r.checks)}; not on meta: {r.not_on_meta}" for r in reports if r.ok]
    return "\n".join(lines)


def run(suite_id: str, cfg, *, device_memory: float | None = None) -> int:
    device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    capacity, where = _capacity(device, device_memory)
    reports = [check_stage(st) for st in stages(suite_id, cfg, device)]
    for rep in reports:  # a stage shares the device with the weights of the models loaded with it
        others = max((sum(r.weights for r in g if r is not rep) for g in _groups(suite_id, reports, cfg) if rep in g),
                     default=0)
        if rep.ok and capacity:
            rep.fits = rep.peak + others <= USABLE * capacity
    print(render(suite_id, reports, device, where, capacity, cfg))
    failed = [r.stage for r in reports if not r.ok]
    if failed:
        raise BenchError(f"preflight: {len(failed)} stage(s) failed their shape pass ({', '.join(failed)}); "
                         "see the lines marked FAILED")
    return 0
