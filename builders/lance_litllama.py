"""The released LANCE perturber (lit-llama LLaMA-7B + LoRA) as a transformers ``LlamaForCausalLM``.

The authors' files (``LANCE-release/checkpoints``, ``caption_editing/``; ``docs/builders.md``) exist only
in lit-llama's format; they are converted once into a cached transformers folder: the LoRA (loralib
``MergedLinear`` on the fused ``c_attn``, Q and V, r 8, alpha 16) merged as ``W += (alpha/r) B A`` per
group, the fused Q|K|V rows split, Q and K permuted from Meta's interleaved rotary pairs to transformers'
rotate-half layout (as transformers' ``convert_llama_weights_to_hf``); RMSNorm eps 1e-5.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch

from genshift.errors import BenchError, first_line
from genshift.fsutil import cache_root

log = logging.getLogger(__name__)
RELEASE_REPO = "LANCE-release/checkpoints"
# the spec describes commit d04bc78; "main" is resolved to a full sha, which names the cached conversion
RELEASE_REVISION = "main"
FILES = {"base": "caption_editing/lit-llama.pth", "lora": "caption_editing/lit-llama-lora-finetuned.pth",
         "tokenizer": "caption_editing/tokenizer.model"}
LORA_R, LORA_ALPHA = 8, 16
HEAD_DIM = 128  # LLaMA
# transformers' name <- lit-llama's, per layer (the fused attention projection is split apart)
LAYER_KEYS = {"self_attn.o_proj.weight": "attn.c_proj.weight", "mlp.gate_proj.weight": "mlp.c_fc1.weight",
              "mlp.up_proj.weight": "mlp.c_fc2.weight", "mlp.down_proj.weight": "mlp.c_proj.weight",
              "input_layernorm.weight": "rms_1.scale", "post_attention_layernorm.weight": "rms_2.scale"}


def _permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Rows of a Q/K projection from interleaved rotary pairs (Meta, lit-llama) to rotate-half (HF)."""
    d_out, d_in = w.shape
    return w.view(n_head, d_out // n_head // 2, 2, d_in).transpose(1, 2).reshape(d_out, d_in)


def lit_llama_to_hf(base: Mapping[str, torch.Tensor], lora: Mapping[str, torch.Tensor] | None = None, *,
                    n_head: int | None = None, r: int = LORA_R, alpha: int = LORA_ALPHA,
                    dtype: torch.dtype = torch.float32) -> tuple[dict, dict[str, torch.Tensor]]:
    """``(LlamaConfig kwargs, state dict)`` of a lit-llama checkpoint with its LoRA merged in."""
    def get(sd, key):
        if key not in sd:
            raise BenchError(f"not a lit-llama checkpoint: no {key!r} (has e.g. {', '.join(list(sd)[:3])})")
        return sd[key]

    wte = get(base, "transformer.wte.weight")
    vocab, d = wte.shape
    n_head = n_head or d // HEAD_DIM
    layers = sorted({int(m.group(1)) for k in base if (m := re.match(r"transformer\.h\.(\d+)\.", k))})
    out = {"model.embed_tokens.weight": wte, "model.norm.weight": get(base, "transformer.ln_f.scale"),
           "lm_head.weight": get(base, "lm_head.weight")}
    for i in layers:
        p, q = f"transformer.h.{i}.", f"model.layers.{i}."
        w = get(base, p + "attn.c_attn.weight").float()
        if w.shape != (3 * d, d):
            raise BenchError(f"{p}attn.c_attn.weight has shape {tuple(w.shape)}, expected {(3 * d, d)}")
        if lora is not None:
            a, b = get(lora, p + "attn.c_attn.lora_A").float(), get(lora, p + "attn.c_attn.lora_B").float()
            if a.shape != (2 * r, d) or b.shape != (2 * d, r):
                raise BenchError(f"LoRA of layer {i} has shapes {tuple(a.shape)}, {tuple(b.shape)}; expected Q and V "
                                 f"groups of rank {r}: {(2 * r, d)}, {(2 * d, r)}")
            w = w.clone()
            w[:d] += alpha / r * (b[:d] @ a[:r])        # Q
            w[2 * d:] += alpha / r * (b[d:] @ a[r:])    # V
        out[q + "self_attn.q_proj.weight"] = _permute(w[:d], n_head)
        out[q + "self_attn.k_proj.weight"] = _permute(w[d:2 * d], n_head)
        out[q + "self_attn.v_proj.weight"] = w[2 * d:]
        out.update({q + hf: get(base, p + lit) for hf, lit in LAYER_KEYS.items()})
    ffn = out["model.layers.0.mlp.gate_proj.weight"].shape[0] if layers else 4 * d
    config = {"vocab_size": vocab, "hidden_size": d, "intermediate_size": ffn, "num_hidden_layers": len(layers),
              "num_attention_heads": n_head, "num_key_value_heads": n_head, "rms_norm_eps": 1e-5,
              "max_position_embeddings": 2048, "rope_theta": 10000.0, "tie_word_embeddings": False, "bos_token_id": 1,
              "eos_token_id": 2}
    return config, {k: v.to(dtype).contiguous() for k, v in out.items()}


def convert_release(base_path: str | Path, lora_path: str | Path, tokenizer_path: str | Path, out: str | Path, *,
                    dtype: torch.dtype = torch.bfloat16, n_head: int | None = None, r: int = LORA_R,
                    alpha: int = LORA_ALPHA) -> Path:
    """Write a transformers folder (config, safetensors, tokenizer) from the released files; atomic."""
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaTokenizer

    out = Path(out)
    if (out / "config.json").is_file():
        return out
    base = torch.load(base_path, map_location="cpu", mmap=True, weights_only=True)
    lora = torch.load(lora_path, map_location="cpu", weights_only=True)
    cfg, sd = lit_llama_to_hf(base, lora, n_head=n_head, r=r, alpha=alpha, dtype=dtype)
    tmp = out.with_name(out.name + ".incomplete")
    shutil.rmtree(tmp, ignore_errors=True)
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**cfg, torch_dtype=str(dtype).split(".")[-1]))
    missing, unexpected = model.load_state_dict(sd, strict=False, assign=True)
    missing = [k for k in missing if "rotary" not in k]
    if missing or unexpected:
        raise BenchError(f"converted LANCE perturber does not fit LLaMA: missing {missing[:3]}, unexpected "
                         f"{unexpected[:3]}")
    model.save_pretrained(tmp)
    tok = LlamaTokenizer(vocab_file=str(tokenizer_path), legacy=True, add_bos_token=True, add_eos_token=False)
    tok.save_pretrained(tmp)
    source = {"base": str(base_path), "lora": str(lora_path), "tokenizer": str(tokenizer_path)}
    (tmp / "lance_release.json").write_text(json.dumps({"source": source, "lora": {"r": r, "alpha": alpha}}, indent=1))
    os.replace(tmp, out)
    return out


def released_perturber_dir(*, revision: str | None = None, cache_dir: str | None = None,
                           endpoint: str | None = None) -> Path:
    """Download the released files at a resolved commit and convert them once (cached by that sha)."""
    from huggingface_hub import hf_hub_download

    from genshift import hubio

    sha = hubio.resolve_revision(RELEASE_REPO, revision or RELEASE_REVISION, endpoint=endpoint, cache_dir=cache_dir,
                                 pin_hint="as a commit of LANCE-release/checkpoints")
    out = (Path(cache_dir) / "genshift" if cache_dir else cache_root()) / f"lance-perturber-{sha[:12]}"
    if (out / "config.json").is_file():
        return out
    try:
        paths = {k: hf_hub_download(RELEASE_REPO, f, repo_type="dataset", revision=sha, cache_dir=cache_dir,
                                    endpoint=endpoint)
                 for k, f in FILES.items()}
    except Exception as e:  # noqa: BLE001 - mapped to one clear line
        raise BenchError(f"cannot get the released LANCE perturber from {RELEASE_REPO}@{sha[:12]} "
                         f"({type(e).__name__}: {first_line(e)}); it needs ~27 GB and the network") from None
    log.info("converting the released LANCE perturber into %s (once)", out)
    return convert_release(paths["base"], paths["lora"], paths["tokenizer"], out)
