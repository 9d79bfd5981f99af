"""LANCE's editor on current diffusers: DDIM inversion, null-text inversion, prompt-to-prompt.

Null-text inversion (Mokady et al.; LANCE Eq. 1) fits one unconditional embedding per step so a guided
DDIM step lands on the inversion trajectory, :math:`\\min_{\\emptyset_k} \\|z_{k-1} - S_{k-1}(\\hat z_k,
\\emptyset_k, c)\\|^2` (Adam, at most 10 iterations, the released code's lr and early stop). Prompt-to-prompt
(Hertz et al.) runs through diffusers attention processors (``unet.set_attn_processor``): cross-attention
refined and the edit words reweighted for 80% of the steps, self-attention injected for the first
fraction f; the f sweep is ONE batched pass (branch 0: the reconstruction). Probabilities are only
materialised where they are edited; other layers use SDPA. ``docs/builders.md`` (Editor).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class EditorConfig:
    model_id: str = "CompVis/stable-diffusion-v1-4"
    revision: str | None = None
    steps: int = 50
    guidance: float = 7.5
    size: int = 512
    nti_inner_steps: int = 10
    nti_early_stop: float = 1e-5
    cross_replace: float = 0.8
    fs: tuple[float, ...] = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # Table 6 self_replace_steps
    reweight: float = 2.0
    self_max_queries: int = 32 * 32
    eq_bug_compat: bool = False
    dtype: str = "float32"   # the released code runs SD 1.4 in fp32


@dataclass
class Inversion:
    """A null-text inversion: the inverted noise latent, per-step null embeddings, the trajectory."""

    prompt: str
    z_T: torch.Tensor
    uncond: list[torch.Tensor]
    trajectory: list[torch.Tensor] = field(repr=False)
    nti_losses: list[float] = field(default_factory=list)


def align_tokens(src: list[int], tgt: list[int]) -> np.ndarray:
    """Global alignment (match +1, mismatch -1, gap -1); for each target position, the aligned
    source position or -1 (a new token). Prompt-to-prompt's refinement mapper."""
    n, m = len(src), len(tgt)
    score = np.zeros((n + 1, m + 1))
    score[:, 0] = -np.arange(n + 1)
    score[0, :] = -np.arange(m + 1)
    for i, j in itertools.product(range(1, n + 1), range(1, m + 1)):
        score[i, j] = max(score[i - 1, j] - 1, score[i, j - 1] - 1,
                          score[i - 1, j - 1] + (1 if src[i - 1] == tgt[j - 1] else -1))
    mapper = np.full(m, -1, dtype=np.int64)
    i, j = n, m
    while i > 0 and j > 0:
        same = src[i - 1] == tgt[j - 1]
        if score[i, j] == score[i - 1, j - 1] + (1 if same else -1):
            if same:
                mapper[j - 1] = i - 1
            i, j = i - 1, j - 1
        elif score[i, j] == score[i - 1, j] - 1:
            i -= 1
        else:
            j -= 1
    return mapper


@dataclass(kw_only=True, eq=False)
class P2PController:
    """Edits attention probabilities of the conditional half of the batch, step by step."""

    branches: int
    cross_steps: int            # cross-attention refined and reweighted in the steps before this one
    self_steps: list[int]       # per edit branch: self-attention injected in the steps before this one
    mapper: torch.Tensor        # (77,) source index per target token, -1 = new
    equalizer: torch.Tensor     # (branches - 1, 77)
    self_max_queries: int       # self-attention maps with more queries are never edited
    num_layers: int = 0
    cross_layers: int = 0
    cur_step: int = 0
    cur_layer: int = 0
    calls: int = 0

    def __call__(self, probs: torch.Tensor, is_cross: bool) -> torch.Tensor:
        cond = probs.view(2 * self.branches, -1, *probs.shape[1:])[self.branches:]
        base, repl = cond[0], cond[1:]
        if is_cross and self.cur_step < self.cross_steps:
            alphas = (self.mapper >= 0).to(probs.dtype)
            refined = base[..., self.mapper.clamp(min=0)] * alphas + repl * (1 - alphas)
            cond[1:] = refined * self.equalizer[:, None, None, :].to(probs.dtype)
        elif not is_cross:  # the processor hands over only the self-attention maps edited at this step
            for j, s in enumerate(self.self_steps):
                if self.cur_step < s:
                    cond[1 + j] = base
        self.tick()
        return probs

    def tick(self) -> None:
        """Count one attention layer's call (the step clock)."""
        self.calls += 1
        self.cur_layer += 1
        if self.cur_layer == self.num_layers:
            self.cur_layer = 0
            self.cur_step += 1


class P2PAttnProcessor:
    """A diffusers attention processor that hands probabilities to a controller: where the maps are edited at this
    step, diffusers' ``AttnProcessor`` with the controller after its ``attn.get_attention_scores``; elsewhere
    ``AttnProcessor2_0`` (SDPA)."""

    def __init__(self, controller: P2PController, is_cross: bool) -> None:
        from diffusers.models.attention_processor import AttnProcessor, AttnProcessor2_0

        self.controller = controller
        self.is_cross = is_cross
        self.sdpa, self.plain = AttnProcessor2_0(), AttnProcessor()

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, *args, **kw):
        ctl = self.controller
        queries = math.prod(hidden_states.shape[2:]) if hidden_states.ndim == 4 else hidden_states.shape[1]
        if not self.is_cross and (queries > ctl.self_max_queries or ctl.cur_step >= max(ctl.self_steps or [0])):
            ctl.tick()  # a layer not edited at this step
            return self.sdpa(attn, hidden_states, encoder_hidden_states, attention_mask, temb)
        scores = type(attn).get_attention_scores  # served for this call only, by an instance attribute
        attn.get_attention_scores = lambda q, k, mask=None: ctl(scores(attn, q, k, mask), self.is_cross)
        try:
            return self.plain(attn, hidden_states, encoder_hidden_states, attention_mask, temb)
        finally:
            del attn.get_attention_scores


class Editor:
    """Null-text inversion and prompt-to-prompt edits on one Stable Diffusion pipeline (DDIM, ``cfg.steps``)."""

    def __init__(self, pipe, cfg: EditorConfig, *, device: str = "cpu") -> None:
        from diffusers import DDIMScheduler

        self.cfg = cfg
        self.device = torch.device(device)
        self.pipe = pipe.to(device)
        self.sched = self.pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config, clip_sample=False,
                                                                     set_alpha_to_one=False, steps_offset=1)
        self.unet, self.vae, self.tokenizer, self.text_encoder = pipe.unet, pipe.vae, pipe.tokenizer, pipe.text_encoder
        for m in (self.unet, self.vae, self.text_encoder):
            m.requires_grad_(False)
        self.sched.set_timesteps(cfg.steps)
        self.alphas = self.sched.alphas_cumprod.to(self.device)
        self.final_alpha = self.sched.alphas_cumprod[0].to(self.device)  # set_alpha_to_one=False
        self.unet_calls = 0

    @classmethod
    def from_pretrained(cls, cfg: EditorConfig, *, device: str = "cpu") -> Editor:
        from diffusers import StableDiffusionPipeline

        from genshift.builders.common import loading

        with loading(f"editor {cfg.model_id!r}", "check the id (SD 1.4 is CompVis/stable-diffusion-v1-4) and that "
                                                 "the weights are cached"):
            pipe = StableDiffusionPipeline.from_pretrained(cfg.model_id, revision=cfg.revision,
                                                           torch_dtype=getattr(torch, cfg.dtype),
                                                           safety_checker=None, requires_safety_checker=False)
        return cls(pipe, cfg, device=device)

    @classmethod
    def tiny(cls, cfg: EditorConfig, *, seed: int = 0) -> Editor:
        from diffusers import StableDiffusionPipeline

        from genshift.builders.real_models import tiny_sd_components

        pipe = StableDiffusionPipeline(**tiny_sd_components(seed=seed, prediction_type="epsilon"), safety_checker=None,
                                       feature_extractor=None, requires_safety_checker=False)
        return cls(pipe, cfg, device="cpu")

    def _unet(self, latents, t, context):
        self.unet_calls += 1
        return self.unet(latents, t, encoder_hidden_states=context).sample

    def token_ids(self, prompt: str) -> list[int]:
        return self.tokenizer(prompt, padding="max_length", max_length=self.tokenizer.model_max_length,
                              truncation=True).input_ids

    @torch.no_grad()
    def embed(self, prompts: list[str]) -> torch.Tensor:
        return self.text_encoder(torch.tensor([self.token_ids(p) for p in prompts]).to(self.device))[0]

    @torch.no_grad()
    def encode(self, image) -> torch.Tensor:
        x = torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.float32) / 127.5 - 1).permute(2, 0, 1)[None]
        post = self.vae.encode(x.to(self.device, self.vae.dtype)).latent_dist
        return post.mean * self.vae.config.scaling_factor

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> list:
        from PIL import Image

        x = self.vae.decode(latents / self.vae.config.scaling_factor).sample
        x = ((x.float().clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).cpu().numpy()
        return [Image.fromarray(a) for a in x]

    def _ddim_step(self, eps, t: int, z, *, inverse: bool = False):
        """One deterministic DDIM step t -> t - T/steps, or back with ``inverse`` (the inversion), as the
        released code's ``prev_step`` and ``next_step``."""
        s = min(t - self.sched.config.num_train_timesteps // self.cfg.steps, 999)
        a_s = self.alphas[s] if s >= 0 else self.final_alpha
        a_from, a_to = (a_s, self.alphas[t]) if inverse else (self.alphas[t], a_s)
        x0 = (z - (1 - a_from) ** 0.5 * eps) / a_from ** 0.5
        return a_to ** 0.5 * x0 + (1 - a_to) ** 0.5 * eps

    @torch.no_grad()
    def ddim_inversion(self, z0: torch.Tensor, prompt: str) -> list[torch.Tensor]:
        cond = self.embed([prompt])
        traj = [z0]
        for t in reversed(self.sched.timesteps):
            traj.append(self._ddim_step(self._unet(traj[-1], t, cond), int(t), traj[-1], inverse=True))
        return traj

    def nti_step(self, z: torch.Tensor, t: int, uncond: torch.Tensor, eps_c: torch.Tensor, target: torch.Tensor,
                 opt: torch.optim.Optimizer) -> torch.Tensor:
        """One inner step of Eq. 1: a guided DDIM step with ``uncond``, its distance to ``target``, one
        optimiser step on ``uncond``; returns the (detached) loss."""
        eps_u = self._unet(z, t, uncond)
        eps = eps_u + self.cfg.guidance * (eps_c - eps_u)
        loss = F.mse_loss(self._ddim_step(eps, t, z), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()

    def null_text_inversion(self, image, prompt: str) -> Inversion:
        """DDIM-invert the image, then fit one null-text embedding per step (Eq. 1)."""
        z0 = self.encode(image)
        traj = self.ddim_inversion(z0, prompt)
        cond = self.embed([prompt])
        uncond = self.embed([""]).clone()
        z = traj[-1]
        per_step, losses = [], []
        for i, t in enumerate(self.sched.timesteps):
            t = int(t)
            uncond = uncond.detach().requires_grad_(True)
            opt = torch.optim.Adam([uncond], lr=1e-2 * (1.0 - i / 100.0))
            with torch.no_grad():
                eps_c = self._unet(z, t, cond)
            loss_v = float("nan")
            for _ in range(self.cfg.nti_inner_steps):
                loss_v = float(self.nti_step(z, t, uncond, eps_c, traj[-i - 2], opt))
                if loss_v < self.cfg.nti_early_stop + i * 2e-5:
                    break
            losses.append(loss_v)
            uncond = uncond.detach()
            per_step.append(uncond.clone())
            with torch.no_grad():
                eps_u = self._unet(z, t, uncond)
                z = self._ddim_step(eps_u + self.cfg.guidance * (eps_c - eps_u), t, z)
        return Inversion(prompt, traj[-1], per_step, traj, losses)

    @torch.no_grad()
    def sample(self, z_T: torch.Tensor, prompts: list[str], uncond: list[torch.Tensor] | torch.Tensor) -> torch.Tensor:
        """Guided DDIM sampling from ``z_T`` for each prompt (one branch each), per-step null embeddings."""
        b = len(prompts)
        cond = self.embed(prompts)
        z = z_T.expand(b, *z_T.shape[1:]).clone()
        for i, t in enumerate(self.sched.timesteps):
            u = uncond[i] if isinstance(uncond, list) else uncond
            ctx = torch.cat([u.expand(b, *u.shape[1:]), cond])
            eps_u, eps_c = self._unet(torch.cat([z, z]), int(t), ctx).chunk(2)
            z = self._ddim_step(eps_u + self.cfg.guidance * (eps_c - eps_u), int(t), z)
        return z

    def reconstruct(self, inv: Inversion) -> torch.Tensor:
        return self.sample(inv.z_T, [inv.prompt], inv.uncond)

    def edit_word_positions(self, prompt: str, words: str) -> list[int]:
        """Token positions of ``words`` inside the tokenized ``prompt`` (the first occurrence; [] if none)."""
        ids, sub = self.token_ids(prompt), self.tokenizer(words, add_special_tokens=False).input_ids
        starts = [s for s in range(len(ids) - len(sub) + 1) if sub and ids[s:s + len(sub)] == sub]
        return list(range(starts[0], starts[0] + len(sub))) if starts else []

    def edit(self, inv: Inversion, target_prompt: str, edit_words: str, *, fs: tuple[float, ...] | None = None
             ) -> tuple[torch.Tensor, P2PController]:
        """One batched pass: branch 0 = source (reconstruction), branch j = edit with fraction fs[j-1]; returns the
        final latents of every branch, (1 + len(fs), 4, h, w), and the controller."""
        fs = tuple(self.cfg.fs if fs is None else fs)
        src, tgt = self.token_ids(inv.prompt), self.token_ids(target_prompt)
        eq = torch.ones(len(fs), len(tgt), device=self.device)
        reweighted = slice(1) if self.cfg.eq_bug_compat else slice(None)  # the released code's bug: the first f only
        eq[reweighted, self.edit_word_positions(target_prompt, edit_words)] = self.cfg.reweight
        ctl = P2PController(branches=1 + len(fs), cross_steps=int(self.cfg.cross_replace * self.cfg.steps),
                            self_steps=[int(f * self.cfg.steps) for f in fs],
                            mapper=torch.from_numpy(align_tokens(src, tgt)).to(self.device), equalizer=eq,
                            self_max_queries=self.cfg.self_max_queries)
        previous = dict(self.unet.attn_processors)
        procs = {name: P2PAttnProcessor(ctl, is_cross=name.endswith("attn2.processor")) for name in previous}
        ctl.num_layers, ctl.cross_layers = len(procs), sum(p.is_cross for p in procs.values())
        if ctl.num_layers == 0 or ctl.cross_layers == 0:
            raise RuntimeError("the prompt-to-prompt controller is attached to no attention layer")
        self.unet.set_attn_processor(procs)  # (diffusers pops entries from the dict it is given)
        try:
            z = self.sample(inv.z_T, [inv.prompt] + [target_prompt] * len(fs), inv.uncond)
        finally:
            self.unet.set_attn_processor(previous)
        return z, ctl
