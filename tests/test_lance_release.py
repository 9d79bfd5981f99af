"""The released LANCE perturber (lit-llama LLaMA + LoRA) converted to transformers, checked against
an independent lit-llama forward pass (Meta's interleaved rotary pairs, LoRA applied unmerged)."""

import math

import pytest
import torch
import torch.nn.functional as F

from genshift.builders.lance_litllama import convert_release, lit_llama_to_hf

D, N_HEAD, LAYERS, FF, R, ALPHA = 16, 2, 2, 24, 2, 4


def tiny_lit_llama(vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = lambda *s: torch.randn(*s, generator=g) * 0.3  # noqa: E731
    base = {"transformer.wte.weight": w(vocab, D), "transformer.ln_f.scale": 1 + w(D), "lm_head.weight": w(vocab, D)}
    lora = {}
    for i in range(LAYERS):
        p = f"transformer.h.{i}."
        base.update({p + "rms_1.scale": 1 + w(D), p + "rms_2.scale": 1 + w(D), p + "attn.c_attn.weight": w(3 * D, D),
                     p + "attn.c_proj.weight": w(D, D), p + "mlp.c_fc1.weight": w(FF, D),
                     p + "mlp.c_fc2.weight": w(FF, D), p + "mlp.c_proj.weight": w(D, FF)})
        lora.update({p + "attn.c_attn.lora_A": w(2 * R, D), p + "attn.c_attn.lora_B": w(2 * D, R)})
    return base, lora


def lit_forward(sd, lora, ids):
    """lit-llama's forward, written from its model.py: RMSNorm eps 1e-5, RoPE on interleaved pairs,
    fused q|k|v with loralib's Q and V LoRA groups added unmerged, SwiGLU MLP."""
    x = sd["transformer.wte.weight"][ids]
    t, hs = len(ids), D // N_HEAD
    theta = 1.0 / (10000 ** (torch.arange(0, hs, 2).float() / hs))
    ang = torch.outer(torch.arange(t).float(), theta)
    cos, sin = ang.cos(), ang.sin()

    def rms(v, scale):
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-5) * scale

    def rope(v):
        pairs = v.reshape(*v.shape[:-1], -1, 2)
        a, b = pairs[..., 0], pairs[..., 1]
        return torch.stack([a * cos - b * sin, b * cos + a * sin], -1).flatten(-2)

    for i in range(LAYERS):
        p = f"transformer.h.{i}."
        h = rms(x, sd[p + "rms_1.scale"])
        qkv = h @ sd[p + "attn.c_attn.weight"].T
        a, b = lora[p + "attn.c_attn.lora_A"], lora[p + "attn.c_attn.lora_B"]
        s = ALPHA / R
        qkv[:, :D] += s * (h @ a[:R].T) @ b[:D].T
        qkv[:, 2 * D:] += s * (h @ a[R:].T) @ b[D:].T
        q, k, v = (z.view(t, N_HEAD, hs).transpose(0, 1) for z in qkv.split(D, -1))
        q, k = rope(q), rope(k)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hs)
        att = att.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf")).softmax(-1)
        x = x + (att @ v).transpose(0, 1).reshape(t, D) @ sd[p + "attn.c_proj.weight"].T
        h = rms(x, sd[p + "rms_2.scale"])
        gated = F.silu(h @ sd[p + "mlp.c_fc1.weight"].T) * (h @ sd[p + "mlp.c_fc2.weight"].T)
        x = x + gated @ sd[p + "mlp.c_proj.weight"].T
    return rms(x, sd["transformer.ln_f.scale"]) @ sd["lm_head.weight"].T


def test_converted_llama_reproduces_the_lit_llama_forward_with_lora():
    from transformers import LlamaConfig, LlamaForCausalLM

    base, lora = tiny_lit_llama(vocab=50)
    cfg, sd = lit_llama_to_hf(base, lora, n_head=N_HEAD, r=R, alpha=ALPHA)
    model = LlamaForCausalLM(LlamaConfig(**cfg)).eval()
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and not [k for k in missing if "rotary" not in k]
    ids = torch.tensor([1, 7, 3, 44, 12, 9, 30, 2])
    with torch.no_grad():
        ours = model(ids[None]).logits[0]
    ref = lit_forward(base, lora, ids)
    assert torch.allclose(ours, ref, atol=1e-4), (ours - ref).abs().max()
    # without the merge, or without the rotary permutation, the logits differ: the test can fail
    _, plain = lit_llama_to_hf(base, None, n_head=N_HEAD)
    model.load_state_dict(plain, strict=False)
    with torch.no_grad():
        assert not torch.allclose(model(ids[None]).logits[0], ref, atol=1e-2)


def test_bad_lit_llama_files_are_one_clear_error():
    from genshift.errors import BenchError

    base, lora = tiny_lit_llama(vocab=50)
    with pytest.raises(BenchError, match="not a lit-llama checkpoint: no 'transformer.wte.weight'"):
        lit_llama_to_hf({"model.embed_tokens.weight": base["transformer.wte.weight"]})
    lora["transformer.h.1.attn.c_attn.lora_A"] = torch.zeros(3 * R, D)
    with pytest.raises(BenchError, match="LoRA of layer 1 has shapes"):
        lit_llama_to_hf(base, lora, n_head=N_HEAD, r=R, alpha=ALPHA)


def test_release_folder_loads_with_transformers_and_prompts_without_examples(tmp_path):
    import sentencepiece as spm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from genshift.builders.lance_perturb import Perturber, perturb_prompt

    corpus = ["a photo of a dog pulling a sled on the grass in the snow", "### Variations: a cat on a table",
              "Below is an instruction that describes a task"] * 30
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_prefix=str(tmp_path / "tok"), vocab_size=60,
                                   model_type="bpe", bos_id=1, eos_id=2, unk_id=0, pad_id=-1)
    base, lora = tiny_lit_llama(vocab=60)
    torch.save(base, tmp_path / "lit-llama.pth")
    torch.save({k: v.bfloat16() for k, v in lora.items()}, tmp_path / "lora.pth")
    out = convert_release(tmp_path / "lit-llama.pth", tmp_path / "lora.pth", tmp_path / "tok.model",
                          tmp_path / "converted", dtype=torch.float32, n_head=N_HEAD, r=R, alpha=ALPHA)
    assert (out / "config.json").is_file() and not (tmp_path / "converted.incomplete").exists()
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.tensor([1, 5, 9, 33, 2])
    with torch.no_grad():  # the saved folder (config, weights) is the same network as lit-llama's
        ref = lit_forward(base, {k: v.bfloat16().float() for k, v in lora.items()}, ids)
        assert torch.allclose(model(ids[None]).logits[0], ref, atol=1e-4)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok("a dog").input_ids[0] == 1  # bos first, as lit-llama's tokenizer.encode(bos=True)
    pert = Perturber(model, tok, model_id="release", max_new_tokens=5,
                     examples=False)
    assert isinstance(pert.answer("a photo of a dog", "weather", seed=0), str)
    with_ex, without = perturb_prompt("a dog", "weather"), perturb_prompt("a dog", "weather", examples=False)
    assert "For example" in with_ex and "For example" not in without and without.endswith("### Variations:\n")


def test_released_files_are_downloaded_at_a_resolved_commit_and_converted_once(tmp_path, monkeypatch):
    import sentencepiece as spm
    from huggingface_hub import HfApi

    from genshift.builders import lance_litllama as ll
    from tests.fakehub import FakeHub

    spm.SentencePieceTrainer.train(sentence_iterator=iter(["a photo of a dog on the grass"] * 20),
                                   model_prefix=str(tmp_path / "tok"), vocab_size=30, model_type="bpe")
    g = torch.Generator().manual_seed(1)
    d = 256  # two heads of LLaMA's 128, the LoRA at the released rank 8
    base = {"transformer.wte.weight": torch.randn(30, d, generator=g), "transformer.ln_f.scale": torch.ones(d),
            "lm_head.weight": torch.randn(30, d, generator=g)}
    p = "transformer.h.0."
    base.update({p + "rms_1.scale": torch.ones(d), p + "rms_2.scale": torch.ones(d),
                 p + "attn.c_attn.weight": torch.randn(3 * d, d, generator=g), p + "attn.c_proj.weight": torch.eye(d),
                 p + "mlp.c_fc1.weight": torch.randn(8, d, generator=g),
                 p + "mlp.c_fc2.weight": torch.randn(8, d, generator=g),
                 p + "mlp.c_proj.weight": torch.randn(d, 8, generator=g)})
    lora = {p + "attn.c_attn.lora_A": torch.randn(16, d, generator=g).bfloat16(),
            p + "attn.c_attn.lora_B": torch.randn(2 * d, 8, generator=g).bfloat16()}
    torch.save(base, tmp_path / "b.pth")
    torch.save(lora, tmp_path / "l.pth")
    with FakeHub() as fh:
        api = HfApi(endpoint=fh.endpoint, token="t")
        api.create_repo(ll.RELEASE_REPO, repo_type="dataset")
        for key, src in (("base", "b.pth"), ("lora", "l.pth"), ("tokenizer", "tok.model")):
            sha = api.upload_file(path_or_fileobj=str(tmp_path / src), path_in_repo=ll.FILES[key],
                                  repo_id=ll.RELEASE_REPO, repo_type="dataset").oid
        out = ll.released_perturber_dir(cache_dir=str(tmp_path / "cache"), endpoint=fh.endpoint)
        assert out.name == f"lance-perturber-{sha[:12]}" and (out / "config.json").is_file()
        monkeypatch.setattr(ll, "convert_release", lambda *a, **k: pytest.fail("converted twice"))
        assert ll.released_perturber_dir(cache_dir=str(tmp_path / "cache"), endpoint=fh.endpoint) == out
