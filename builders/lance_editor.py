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


# --------------------------------------------------------------------------------------------------
# prompt-to-prompt: token alignment and the attention controller


def align_tokens(src: list[int], tgt: list[int]) -> np.ndarray:
    """Global alignment (match +1, mismatch -1, gap -1); for each target position, the aligned
    source position or -1 (a new token). Prompt-to-prompt's refinement mapper."""
    n, m = len(src), len(tgt)
    score = np.zeros((n + 1, m + 1))
    score[:, 0] = -np.arange(n + 1)
    score[0, :] = -np.arange(m + 1)
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            score[i, j] = max(score[i - 1, j] - 1, score[i, j - 1] - 1,
                              score[i - 1, j - 1] + (1 if src[i - 1] == tgt[j - 1] else -1))
    mapper = np.full(m, -1, dtype=np.int64)
    i, j = n, m
    while i > 0 and j > 0:
        if score[i, j] == score[i - 1, j - 1] + (1 if src[i - 1] == tgt[j - 1] else -1):
            if src[i - 1] == tgt[j - 1]:
                mapper[j - 1] = i - 1
            i, j = i - 1, j - 1
        elif score[i, j] == score[i - 1, j] - 1:
            i -= 1
        else:
            j -= 1
    return mapper


class P2PController:
    """Edits attention probabilities of the conditional half of the batch, step by step."""

    def __init__(self, *, steps: int, branches: int, cross_replace: float, self_fractions: list[float],
                 mapper: torch.Tensor, equalizer: torch.Tensor, self_max_queries: int) -> None:
        self.steps = steps
        self.branches = branches
        self.cross_steps = int(cross_replace * steps)
        self.self_steps = [int(f * steps) for f in self_fractions]
        self.mapper = mapper          # (77,) source index per target token, -1 = new
        self.equalizer = equalizer    # (branches - 1, 77)
        self.self_max_queries = self_max_queries
        self.cur_step = 0
        self.cur_layer = 0
        self.num_layers = 0
        self.cross_layers = 0
        self.calls = 0

    def __call__(self, probs: torch.Tensor, is_cross: bool) -> torch.Tensor:
        b2 = 2 * self.branches
        heads = probs.shape[0] // b2
        p = probs.view(b2, heads, *probs.shape[1:])
        cond = p[self.branches:]
        base, repl = cond[0], cond[1:]
        if is_cross and self.cur_step < self.cross_steps:
            idx = self.mapper.clamp(min=0)
            alphas = (self.mapper >= 0).to(probs.dtype)
            refined = base[..., idx] * alphas + repl * (1 - alphas)
            cond[1:] = refined * self.equalizer[:, None, None, :].to(probs.dtype)
        elif not is_cross and probs.shape[1] <= self.self_max_queries:
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
    """A diffusers attention processor that hands probabilities to a controller.

    Mirrors diffusers' ``AttnProcessor`` (spatial norm, group norm, 4-d inputs, residual and
    rescale handling included); layers whose maps are not edited at this step use SDPA.
    """

    def __init__(self, controller: P2PController, is_cross: bool) -> None:
        self.controller = controller
        self.is_cross = is_cross

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, *args, **kw):
        residual = hidden_states
        if attn.spatial_norm is not None:
            hidden_states = attn.spatial_norm(hidden_states, temb)
        input_ndim = hidden_states.ndim
        if input_ndim == 4:
            b, c, h, w = hidden_states.shape
            hidden_states = hidden_states.view(b, c, h * w).transpose(1, 2)
        batch, seq, _ = hidden_states.shape if encoder_hidden_states is None else encoder_hidden_states.shape
        attention_mask = attn.prepare_attention_mask(attention_mask, seq, batch)
        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)
        query = attn.to_q(hidden_states)
        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states
        elif attn.norm_cross:
            encoder_hidden_states = attn.norm_encoder_hidden_states(encoder_hidden_states)
        key = attn.to_k(encoder_hidden_states)
        value = attn.to_v(encoder_hidden_states)
        ctl = self.controller
        edited = self.is_cross or (query.shape[1] <= ctl.self_max_queries and ctl.cur_step < max(ctl.self_steps or [0]))
        if edited:
            q, k, v = (attn.head_to_batch_dim(t) for t in (query, key, value))
            probs = ctl(attn.get_attention_scores(q, k, attention_mask), self.is_cross)
            out = attn.batch_to_head_dim(torch.bmm(probs, v))
        else:
            ctl.tick()  # a layer not edited at this step
            heads = attn.heads
            q, k, v = (t.view(t.shape[0], -1, heads, t.shape[-1] // heads).transpose(1, 2) for t in (query, key, value))
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, scale=attn.scale)
            out = out.transpose(1, 2).reshape(out.shape[0], -1, heads * out.shape[-1]).to(query.dtype)
        out = attn.to_out[1](attn.to_out[0](out))
        if input_ndim == 4:
            out = out.transpose(-1, -2).reshape(b, c, h, w)
        if attn.residual_connection:
            out = out + residual
        return out / attn.rescale_output_factor


def install_controller(unet, controller: P2PController) -> dict:
    """Attach the controller to every attention layer; returns the previous processors."""
    previous = dict(unet.attn_processors)
    procs = {name: P2PAttnProcessor(controller, is_cross=name.endswith("attn2.processor")) for name in previous}
    controller.num_layers = len(procs)
    controller.cross_layers = sum(p.is_cross for p in procs.values())
    unet.set_attn_processor(dict(procs))  # (diffusers pops entries from the dict it is given)
    return previous


# --------------------------------------------------------------------------------------------------
# the editor


class Editor:
    def __init__(self, pipe, cfg: EditorConfig, *, device: str = "cpu") -> None:
        from diffusers import DDIMScheduler

        self.cfg = cfg
        self.device = torch.device(device)
        self.pipe = pipe.to(device)
        self.pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config, clip_sample=False,
                                                        set_alpha_to_one=False, steps_offset=1)
        self.unet, self.vae, self.tokenizer, self.text_encoder = pipe.unet, pipe.vae, pipe.tokenizer, pipe.text_encoder
        for m in (self.unet, self.vae, self.text_encoder):
            m.requires_grad_(False)
        self.sched = self.pipe.scheduler
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

        from genshift.builders.tiny import tiny_sd_components

        pipe = StableDiffusionPipeline(**tiny_sd_components(seed=seed, prediction_type="epsilon"), safety_checker=None,
                                       feature_extractor=None, requires_safety_checker=False)
        return cls(pipe, cfg, device="cpu")

    # -- basics -------------------------------------------------------------------------------
    def _unet(self, latents, t, context):
        self.unet_calls += 1
        return self.unet(latents, t, encoder_hidden_states=context).sample

    @torch.no_grad()
    def embed(self, prompts: list[str]) -> torch.Tensor:
        ids = self.tokenizer(prompts, padding="max_length", max_length=self.tokenizer.model_max_length,
                             truncation=True, return_tensors="pt").input_ids.to(self.device)
        return self.text_encoder(ids)[0]

    def token_ids(self, prompt: str) -> list[int]:
        return self.tokenizer(prompt, padding="max_length", max_length=self.tokenizer.model_max_length,
                              truncation=True).input_ids

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

    def _prev(self, eps, t, z):
        """One deterministic DDIM step t -> t - T/steps (LANCE/Google's ``prev_step``)."""
        prev_t = t - self.sched.config.num_train_timesteps // self.cfg.steps
        a_t = self.alphas[t]
        a_prev = self.alphas[prev_t] if prev_t >= 0 else self.final_alpha
        x0 = (z - (1 - a_t) ** 0.5 * eps) / a_t ** 0.5
        return a_prev ** 0.5 * x0 + (1 - a_prev) ** 0.5 * eps

    def _next(self, eps, t, z):
        """One DDIM inversion step (``next_step``)."""
        cur_t = min(t - self.sched.config.num_train_timesteps // self.cfg.steps, 999)
        a_t = self.alphas[cur_t] if cur_t >= 0 else self.final_alpha
        a_next = self.alphas[t]
        x0 = (z - (1 - a_t) ** 0.5 * eps) / a_t ** 0.5
        return a_next ** 0.5 * x0 + (1 - a_next) ** 0.5 * eps

    # -- inversion ------------------------------------------------------------------------------
    @torch.no_grad()
    def ddim_inversion(self, z0: torch.Tensor, prompt: str) -> list[torch.Tensor]:
        cond = self.embed([prompt])
        traj = [z0]
        z = z0
        for t in reversed(self.sched.timesteps):
            z = self._next(self._unet(z, t, cond), int(t), z)
            traj.append(z)
        return traj

    def nti_step(self, z: torch.Tensor, t: int, uncond: torch.Tensor, eps_c: torch.Tensor, target: torch.Tensor,
                 opt: torch.optim.Optimizer) -> torch.Tensor:
        """One inner step of Eq. 1: a guided DDIM step with ``uncond``, its distance to ``target``, one
        optimiser step on ``uncond``; returns the (detached) loss."""
        eps_u = self._unet(z, t, uncond)
        eps = eps_u + self.cfg.guidance * (eps_c - eps_u)
        loss = F.mse_loss(self._prev(eps, t, z), target)
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
            target = traj[len(traj) - i - 2]
            with torch.no_grad():
                eps_c = self._unet(z, t, cond)
            loss_v = float("nan")
            for _ in range(self.cfg.nti_inner_steps):
                loss_v = float(self.nti_step(z, t, uncond, eps_c, target, opt))
                if loss_v < self.cfg.nti_early_stop + i * 2e-5:
                    break
            losses.append(loss_v)
            uncond = uncond.detach()
            per_step.append(uncond.clone())
            with torch.no_grad():
                eps_u = self._unet(z, t, uncond)
                z = self._prev(eps_u + self.cfg.guidance * (eps_c - eps_u), t, z)
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
            z = self._prev(eps_u + self.cfg.guidance * (eps_c - eps_u), int(t), z)
        return z

    def reconstruct(self, inv: Inversion) -> torch.Tensor:
        return self.sample(inv.z_T, [inv.prompt], inv.uncond)

    # -- editing ------------------------------------------------------------------------------
    def edit_word_positions(self, prompt: str, words: str) -> list[int]:
        """Token positions of ``words`` inside the tokenized ``prompt``."""
        ids = self.token_ids(prompt)
        sub = self.tokenizer(words, add_special_tokens=False).input_ids
        if not sub:
            return []
        for s in range(len(ids) - len(sub) + 1):
            if ids[s:s + len(sub)] == sub:
                return list(range(s, s + len(sub)))
        return []

    def edit(self, inv: Inversion, target_prompt: str, edit_words: str, *, fs: tuple[float, ...] | None = None
             ) -> tuple[torch.Tensor, P2PController]:
        """One batched pass: branch 0 = source (reconstruction), branch j = edit with fraction fs[j-1].

        Returns the final latents of every branch, (1 + len(fs), 4, h, w), and the controller.
        """
        fs = tuple(self.cfg.fs if fs is None else fs)
        src, tgt = self.token_ids(inv.prompt), self.token_ids(target_prompt)
        mapper = torch.from_numpy(align_tokens(src, tgt)).to(self.device)
        eq = torch.ones(len(fs), len(tgt), device=self.device)
        pos = self.edit_word_positions(target_prompt, edit_words) if edit_words else []
        for j in range(len(fs)):
            if not self.cfg.eq_bug_compat or j == 0:  # the released code's bug: only the first f is reweighted
                eq[j, pos] = self.cfg.reweight
        ctl = P2PController(steps=self.cfg.steps, branches=1 + len(fs), cross_replace=self.cfg.cross_replace,
                            self_fractions=list(fs), mapper=mapper, equalizer=eq,
                            self_max_queries=self.cfg.self_max_queries)
        previous = install_controller(self.unet, ctl)
        try:
            z = self.sample(inv.z_T, [inv.prompt] + [target_prompt] * len(fs), inv.uncond)
        finally:
            self.unet.set_attn_processor(dict(previous))
        if ctl.num_layers == 0 or ctl.cross_layers == 0:
            raise RuntimeError("the prompt-to-prompt controller is attached to no attention layer")
        return z, ctl
