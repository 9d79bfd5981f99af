"""Image captioning with BLIP-2 through transformers (LANCE captions; IN-G seed captions), with a
decoder-only (OPT) or an encoder-decoder (Flan-T5: the decoder starts with the prefix) language model."""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

from genshift.errors import BenchError

DEFAULT_MODEL = "Salesforce/blip2-opt-2.7b-coco"


class Captioner:
    def __init__(self, model, processor, *, model_id: str, device: str = "cpu", dtype: torch.dtype | None = None):
        self.model = model.to(device).eval()
        self.processor = processor
        self.model_id = model_id
        self.device = torch.device(device)
        self.dtype = dtype or next(model.parameters()).dtype
        self.is_encoder_decoder = bool(model.config.text_config.is_encoder_decoder)

    @classmethod
    def from_pretrained(cls, model_id: str = DEFAULT_MODEL, *, device: str = "cpu", dtype: str | None = None):
        from transformers import Blip2ForConditionalGeneration, Blip2Processor

        from genshift.builders.common import loading

        torch_dtype = getattr(torch, dtype or ("float16" if device.startswith("cuda") else "float32"))
        with loading(f"captioner {model_id!r}", "check the id (a BLIP-2 checkpoint such as "
                                                "Salesforce/blip2-opt-2.7b-coco) and that it is cached"):
            processor = Blip2Processor.from_pretrained(model_id)
            model = Blip2ForConditionalGeneration.from_pretrained(model_id, torch_dtype=torch_dtype)
        return cls(model, processor, model_id=model_id, device=device, dtype=torch_dtype)

    @classmethod
    def tiny(cls, *, seed: int = 0, lm: str = "opt") -> Captioner:
        """Random weights; ``lm="opt"`` (decoder-only) or ``"t5"`` (encoder-decoder, as Flan-T5)."""
        import transformers
        from tokenizers import ByteLevelBPETokenizer

        corpus = ["a photo of a dog on the grass in the snow", "a realistic photograph of a fly (insect).",
                  "the background is blurred. it is on a yellow flower. the background is green."] * 20
        bpe = ByteLevelBPETokenizer()
        bpe.train_from_iterator(corpus, vocab_size=300, min_frequency=1,
                                special_tokens=["<pad>", "</s>", "<s>", "<unk>", "<image>"])
        tok = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="</s>",
                                                   eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
        n_query = 4
        vocab = len(tok)
        ids = dict(pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
        if lm == "opt":
            text_config = transformers.OPTConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, ffn_dim=37,
                                                 num_attention_heads=4, max_position_embeddings=1024,
                                                 word_embed_proj_dim=32, **ids)
        else:  # "t5"
            text_config = transformers.T5Config(vocab_size=vocab, d_model=32, d_kv=8, d_ff=37, num_layers=2,
                                                num_heads=4, decoder_start_token_id=tok.pad_token_id, **ids)
        cfg = transformers.Blip2Config(
            vision_config=transformers.Blip2VisionConfig(hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                                                         num_attention_heads=4, image_size=32, patch_size=8),
            qformer_config=transformers.Blip2QFormerConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                           intermediate_size=37, encoder_hidden_size=32,
                                                           vocab_size=vocab),
            text_config=text_config, num_query_tokens=n_query, image_token_index=tok.convert_tokens_to_ids("<image>"))
        torch.manual_seed(seed)
        model = transformers.Blip2ForConditionalGeneration(cfg)
        pixels = transformers.BlipImageProcessor(size={"height": 32, "width": 32})
        processor = transformers.Blip2Processor(pixels, tok, num_query_tokens=n_query)
        name = "tiny-random-blip2" if lm == "opt" else "tiny-random-blip2-t5"
        return cls(model, processor, model_id=f"{name}(seed={seed})")

    @torch.inference_mode()
    def caption(self, images: Sequence, *, prefix: str | None = None, num_beams: int = 5, min_new_tokens: int = 20,
                max_new_tokens: int = 100, repetition_penalty: float = 1.0, do_sample: bool = False,
                seed: int | None = None, min_words: int | None = None, shots: Sequence = ()) -> list[str]:
        """One caption per image, continuing ``prefix`` (the text starts with it); the defaults are LANCE's Table 6
        (5 beams, 20-100 new tokens); ``min_words`` holds the end back until the continuation has that many words;
        ``shots``: (image, caption) pairs placed before each image (IN-G's few-shot prompt)."""
        if min_new_tokens > max_new_tokens:
            raise BenchError(f"min_new_tokens {min_new_tokens} > max_new_tokens {max_new_tokens}")
        images = [im.convert("RGB") for im in images]
        prefix = prefix or ""
        if shots:
            inputs = self._few_shot_inputs(images, prefix, shots)
        else:
            inputs = self.processor(images=images, text=[prefix] * len(images), return_tensors="pt")
        inputs = inputs.to(self.device)
        inputs["pixel_values"] = inputs["pixel_values"].to(self.dtype)
        start = inputs["input_ids"].shape[1]  # decoder-only: the output repeats the prompt
        if self.is_encoder_decoder:  # the output is the decoder's: start it with the prefix to continue
            forced = [self.model.config.text_config.decoder_start_token_id]
            if prefix:
                forced += self.processor.tokenizer(prefix, add_special_tokens=False)["input_ids"]
            inputs["decoder_input_ids"] = torch.tensor([forced] * len(images), device=self.device)
            start = len(forced)
        extra = {"logits_processor": [MinWords(self.processor.tokenizer, start, min_words)]} if min_words else {}
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            out = self.model.generate(**inputs, num_beams=num_beams, min_new_tokens=min_new_tokens,
                                      max_new_tokens=max_new_tokens, repetition_penalty=repetition_penalty,
                                      do_sample=do_sample, **extra)
        tails = self.processor.tokenizer.batch_decode(out[:, start:], skip_special_tokens=True)
        return [normalize(f"{prefix} {t}") for t in tails]

    def _few_shot_inputs(self, images: list, prefix: str, shots: Sequence):
        """Token ids of [shot image, shot caption]... [image, prefix] (each image: its query tokens, then the text
        with the tokenizer's special tokens, as the processor lays out one image) and, per image, the shots'
        pixels before its own."""
        from transformers import BatchFeature

        tok, cfg = self.processor.tokenizer, self.model.config
        ids: list[int] = []
        for text in [c for _, c in shots] + [prefix]:
            ids += [cfg.image_token_id] * cfg.num_query_tokens + tok(text)["input_ids"]
        shot_images = [im.convert("RGB") for im, _ in shots]
        pixels = self.processor.image_processor([im for q in images for im in (*shot_images, q)],
                                                return_tensors="pt")["pixel_values"]
        input_ids = torch.tensor([ids] * len(images))
        return BatchFeature({"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids),
                             "pixel_values": pixels})


class MinWords:
    """A logits processor that forbids the end of the text until the generated part (from ``start``) has
    ``n`` words: transformers' ``min_new_tokens`` counts tokens, the LANCE paper counts words."""

    def __init__(self, tokenizer, start: int, n: int) -> None:
        self.tokenizer, self.start, self.n = tokenizer, start, n
        self.eos = tokenizer.eos_token_id

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        texts = self.tokenizer.batch_decode(input_ids[:, self.start:], skip_special_tokens=True)
        short = torch.tensor([len(t.split()) < self.n for t in texts], device=scores.device)
        scores[short, self.eos] = -float("inf")
        return scores


def normalize(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()
