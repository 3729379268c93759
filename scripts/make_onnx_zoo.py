"""Regenerate the ONNX zoo in `tests/fixtures/onnx/zoo/`: tiny random-weight Hugging Face models exported the ways
users export them, each with PyTorch's own outputs.

PyTorch and transformers are NOT project dependencies: run this in a throwaway venv:

    python3 -m venv /tmp/zoo && /tmp/zoo/bin/pip install torch==2.13.0 transformers onnx onnxscript numpy
    /tmp/zoo/bin/python scripts/make_onnx_zoo.py [ARCH ...] [--forms dynamo-eager,dynamo-sdpa,ts-eager]

Forms (the file is `ARCH.FORM.onnx`):

- `dynamo-eager`: `torch.onnx.export(dynamo=True)`, opset 18, `attn_implementation="eager"`;
- `dynamo-sdpa`: the same with transformers' default attention (`sdpa`: torch writes its scale split over q and
  k and its `IsNaN` guard into the graph);
- `ts-eager`: the TorchScript exporter (`dynamo=False`, opset 17), eager attention.

Every model gets batch 2, seq 8, a padding mask where the model takes one (the second row's last 3 tokens
padded), random weights (`_randomize`: norm gammas near 1, biases non-zero), 2 layers, hidden 32, 4 heads.
`ARCH.FORM.npz` holds the inputs and PyTorch's output as `out:last_hidden_state`; `zoo.json` records the
versions and each file's config. A model the exporter refuses is recorded in `zoo.json` with its error.
"""

from __future__ import annotations

import json
import platform
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import torch
import transformers
from make_onnx_fixtures import _randomize  # the fixtures' random weights: norm gammas near 1

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "onnx" / "zoo"
BATCH, SEQ, VOCAB = 2, 8, 96
SMALL = {"hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64, "num_hidden_layers": 2}


class _LastHidden(torch.nn.Module):
    """Positional inputs in `names` order -> the wrapped model's `last_hidden_state` (both exporters take it)."""

    def __init__(self, model: torch.nn.Module, names: list[str]) -> None:
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(self.names, args, strict=True))).last_hidden_state


def _text(seed: int, mask: bool = True, ids: str = "input_ids") -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {ids: torch.randint(3, VOCAB, (BATCH, SEQ), generator=g)}
    if mask:
        m = torch.ones(BATCH, SEQ, dtype=torch.int64)
        m[1, SEQ - 3:] = 0
        out["attention_mask"] = m
    return out


def _image(seed: int, size: int = 32, channels: int = 3) -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.randn(BATCH, channels, size, size, generator=torch.Generator().manual_seed(seed))}


def _cfg(name: str, **kw: object) -> object:
    return getattr(transformers, name)(**kw)


# Each entry: config and model class, and the inputs. Dimensions of text inputs are dynamic (batch, seq).
def _zoo() -> dict[str, Callable[[str], tuple[torch.nn.Module, dict[str, torch.Tensor], dict]]]:
    t = transformers

    def text(cls: str, cfg: str, seed: int, mask: bool = True, **kw: object):
        def make(attn: str):
            c = _cfg(cfg, vocab_size=VOCAB, attn_implementation=attn, **{**SMALL, **kw})
            return getattr(t, cls)(c), _text(seed, mask), c
        return make

    def decoder(cls: str, cfg: str, seed: int, **kw: object):
        def make(attn: str):
            c = _cfg(cfg, vocab_size=VOCAB, attn_implementation=attn, use_cache=False, **{**SMALL, **kw})
            return getattr(t, cls)(c), _text(seed, True), c
        return make

    def bert_like(cls: str, cfg: str, seed: int, **kw: object):
        def make(attn: str):
            c = _cfg(cfg, vocab_size=VOCAB, attn_implementation=attn, max_position_embeddings=64,
                     **{**SMALL, **kw})
            try:
                m = getattr(t, cls)(c, add_pooling_layer=False)
            except TypeError:
                m = getattr(t, cls)(c)
            return m, _text(seed, True), c
        return make

    def distilbert(attn: str):
        c = t.DistilBertConfig(vocab_size=VOCAB, dim=32, n_heads=4, hidden_dim=64, n_layers=2,
                               max_position_embeddings=64, attn_implementation=attn)
        return t.DistilBertModel(c), _text(4), c

    def t5(attn: str):
        c = t.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_heads=4, num_layers=2,
                       attn_implementation=attn, relative_attention_num_buckets=8)
        return t.T5EncoderModel(c), _text(5), c

    def bart(attn: str):
        c = t.BartConfig(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4,
                         decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                         max_position_embeddings=64, attn_implementation=attn)
        return t.BartModel(c).get_encoder(), _text(6), c

    def whisper(attn: str):
        c = t.WhisperConfig(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=1,
                            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                            decoder_ffn_dim=64, num_mel_bins=8, max_source_positions=8, attn_implementation=attn,
                            pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
        feats = torch.randn(BATCH, 8, 16, generator=torch.Generator().manual_seed(7))
        return t.WhisperModel(c).get_encoder(), {"input_features": feats}, c

    def clip_text(attn: str):
        c = t.CLIPTextConfig(vocab_size=VOCAB, max_position_embeddings=16, attn_implementation=attn, **SMALL)
        return t.CLIPTextModel(c), _text(8), c

    def clip_vision(attn: str):
        c = t.CLIPVisionConfig(image_size=32, patch_size=8, attn_implementation=attn, **SMALL)
        return t.CLIPVisionModel(c), _image(9), c

    def vit(attn: str):
        c = t.ViTConfig(image_size=32, patch_size=8, attn_implementation=attn, **SMALL)
        return t.ViTModel(c, add_pooling_layer=False), _image(10), c

    def gpt2(attn: str):
        c = t.GPT2Config(vocab_size=VOCAB, n_embd=32, n_head=4, n_layer=2, n_positions=64, attn_implementation=attn,
                         use_cache=False)
        return t.GPT2Model(c), _text(11), c

    def bloom(attn: str):
        c = t.BloomConfig(vocab_size=VOCAB, hidden_size=32, n_head=4, n_layer=2, attn_implementation=attn,
                          use_cache=False)
        return t.BloomModel(c), _text(12), c

    def falcon(attn: str):
        c = t.FalconConfig(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, num_hidden_layers=2,
                           new_decoder_architecture=False, multi_query=True, parallel_attn=True, bias=False,
                           attn_implementation=attn, use_cache=False)
        return t.FalconModel(c), _text(13), c

    def opt(attn: str):
        c = t.OPTConfig(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, ffn_dim=64, num_hidden_layers=2,
                        word_embed_proj_dim=32, max_position_embeddings=64, attn_implementation=attn,
                        use_cache=False)
        return t.OPTModel(c), _text(14), c

    def albert(attn: str):
        c = t.AlbertConfig(vocab_size=VOCAB, embedding_size=16, max_position_embeddings=64,
                           attn_implementation=attn, **SMALL)
        return t.AlbertModel(c, add_pooling_layer=False), _text(24), c

    def mpnet(attn: str):
        c = t.MPNetConfig(vocab_size=VOCAB, max_position_embeddings=64,  # 32 buckets: compute_position_bias fixes it
                          attn_implementation=attn, pad_token_id=1, **SMALL)
        return t.MPNetModel(c, add_pooling_layer=False), _text(25), c

    def swin(attn: str):
        c = t.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4,
                         attn_implementation=attn)
        return t.SwinModel(c, add_pooling_layer=False), _image(30), c

    def swin_pad(attn: str):  # windows of 3 on 8x8 and 4x4 maps: both stages pad to whole windows (ONNX Pad)
        c = t.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=3,
                         attn_implementation=attn)
        return t.SwinModel(c, add_pooling_layer=False), _image(31), c

    def gptj(attn: str):  # interleaved RoPE (rotate_every_two) on the first rotary_dim of each head
        c = t.GPTJConfig(vocab_size=VOCAB, n_embd=32, n_head=4, n_layer=2, n_inner=64, rotary_dim=4, n_positions=64,
                         attn_implementation=attn, use_cache=False)
        return t.GPTJModel(c), _text(26), c

    def ernie(attn: str):
        c = t.ErnieConfig(vocab_size=VOCAB, max_position_embeddings=64, use_task_id=False, attn_implementation=attn,
                          **SMALL)
        return t.ErnieModel(c, add_pooling_layer=False), _text(40), c

    def convbert(attn: str):  # span-based dynamic convolution heads beside self-attention (head_ratio 2)
        c = t.ConvBertConfig(vocab_size=VOCAB, max_position_embeddings=64, embedding_size=32, head_ratio=2,
                             conv_kernel_size=3, attn_implementation=attn, **SMALL)
        return t.ConvBertModel(c), _text(41), c

    def mobilebert(attn: str):  # bottlenecks, NoNorm (an elementwise affine), stacked FFNs
        c = t.MobileBertConfig(vocab_size=VOCAB, max_position_embeddings=64, embedding_size=16,
                               intra_bottleneck_size=16, true_hidden_size=16, num_feedforward_networks=2,
                               attn_implementation=attn, **{**SMALL, "num_attention_heads": 2})
        return t.MobileBertModel(c, add_pooling_layer=False), _text(42), c

    def esm(attn: str):  # rotary position embeddings on an encoder, Q scaled before its RoPE
        c = t.EsmConfig(vocab_size=VOCAB, max_position_embeddings=64, position_embedding_type="rotary",
                        pad_token_id=1, mask_token_id=2, token_dropout=False, attn_implementation=attn, **SMALL)
        return t.EsmModel(c, add_pooling_layer=False), _text(43), c

    def deit(attn: str):
        c = t.DeiTConfig(image_size=32, patch_size=8, attn_implementation=attn, **SMALL)
        return t.DeiTModel(c, add_pooling_layer=False), _image(44), c

    def beit(attn: str):  # relative position bias per layer, layer-scale gammas
        c = t.BeitConfig(image_size=32, patch_size=8, use_relative_position_bias=True, layer_scale_init_value=0.5,
                         attn_implementation=attn, **SMALL)
        return t.BeitModel(c, add_pooling_layer=False), _image(45), c

    def gpt_bigcode(attn: str):  # multi-query K/V sliced from the fused c_attn
        c = t.GPTBigCodeConfig(vocab_size=VOCAB, n_embd=32, n_head=4, n_layer=2, n_positions=64, multi_query=True,
                               attn_implementation=attn, use_cache=False)
        return t.GPTBigCodeModel(c), _text(46), c

    def codegen(attn: str):  # qkv fused per model-parallel shard (mp_num 4), interleaved RoPE on rotary_dim
        c = t.CodeGenConfig(vocab_size=VOCAB, n_embd=32, n_head=4, n_layer=2, n_inner=64, rotary_dim=4,
                            n_positions=64, n_ctx=64, attn_implementation=attn, use_cache=False)
        return t.CodeGenModel(c), _text(47), c

    return {
        "bert": bert_like("BertModel", "BertConfig", 1),
        "albert": albert,
        "mpnet": mpnet,
        "swin": swin,
        "swin-pad": swin_pad,
        "roberta": bert_like("RobertaModel", "RobertaConfig", 2, pad_token_id=1),
        "xlm-roberta": bert_like("XLMRobertaModel", "XLMRobertaConfig", 3, pad_token_id=1),
        "electra": bert_like("ElectraModel", "ElectraConfig", 15, embedding_size=32),
        "distilbert": distilbert,
        "deberta-v2": bert_like("DebertaV2Model", "DebertaV2Config", 16, relative_attention=True,
                                pos_att_type=["p2c", "c2p"], max_relative_positions=16, position_buckets=8),
        "modernbert": text("ModernBertModel", "ModernBertConfig", 17, global_attn_every_n_layers=1,
                           max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                           cls_token_id=2, sep_token_id=1),
        "t5-encoder": t5,
        "bart-encoder": bart,
        "whisper-encoder": whisper,
        "clip-text": clip_text,
        "clip-vision": clip_vision,
        "vit": vit,
        "gpt2": gpt2,
        "gpt-neox": decoder("GPTNeoXModel", "GPTNeoXConfig", 18, max_position_embeddings=64),
        "falcon": falcon,
        "llama": decoder("LlamaModel", "LlamaConfig", 19, num_key_value_heads=2, max_position_embeddings=64),
        "qwen2": decoder("Qwen2Model", "Qwen2Config", 20, num_key_value_heads=2, max_position_embeddings=64),
        "mistral": decoder("MistralModel", "MistralConfig", 21, num_key_value_heads=2, max_position_embeddings=64,
                           sliding_window=None),
        "phi3": decoder("Phi3Model", "Phi3Config", 22, num_key_value_heads=2, max_position_embeddings=64,
                        pad_token_id=0),
        "gemma": decoder("GemmaModel", "GemmaConfig", 23, num_key_value_heads=1, head_dim=8,
                         max_position_embeddings=64),
        "qwen3": decoder("Qwen3Model", "Qwen3Config", 26, num_key_value_heads=2, head_dim=8,
                         max_position_embeddings=64),
        "gemma2": decoder("Gemma2Model", "Gemma2Config", 27, num_key_value_heads=2, head_dim=8,
                          max_position_embeddings=64, sliding_window=4, attn_logit_softcapping=50.0,
                          query_pre_attn_scalar=8),
        "olmo2": decoder("Olmo2Model", "Olmo2Config", 28, num_key_value_heads=2, max_position_embeddings=64),
        "qwen2-moe": decoder("Qwen2MoeModel", "Qwen2MoeConfig", 29, num_key_value_heads=2, max_position_embeddings=64,
                             num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                             shared_expert_intermediate_size=32,
                             experts_implementation="batched_mm"),  # torch.onnx has no grouped_mm; batched is dense
        "mixtral": decoder("MixtralModel", "MixtralConfig", 32, num_key_value_heads=2, max_position_embeddings=64,
                           num_local_experts=4, num_experts_per_tok=2, sliding_window=None,
                           experts_implementation="batched_mm"),
        "gpt-oss": decoder("GptOssModel", "GptOssConfig", 31, num_key_value_heads=2, head_dim=8,
                           max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2,
                           sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                           experts_implementation="batched_mm"),  # attention sinks
        "bloom": bloom,
        "phi": decoder("PhiModel", "PhiConfig", 24, partial_rotary_factor=0.5, max_position_embeddings=64),
        "stablelm": decoder("StableLmModel", "StableLmConfig", 25, num_key_value_heads=2, partial_rotary_factor=0.25,
                            max_position_embeddings=64),
        "gptj": gptj,
        "opt": opt,
        # Architectures of the deployed-file forms (issue 37): each in at least one plain form, and the source
        # of the quantized / float16 / optimized / KV-cache forms (DEPLOY_FORMS).
        "ernie": ernie,
        "convbert": convbert,
        "mobilebert": mobilebert,
        "esm": esm,
        "deit": deit,
        "beit": beit,
        "gpt-bigcode": gpt_bigcode,
        "codegen": codegen,
        "granite": decoder("GraniteModel", "GraniteConfig", 48, num_key_value_heads=2, max_position_embeddings=64,
                           embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.3),
        "cohere": decoder("CohereModel", "CohereConfig", 49, num_key_value_heads=2, max_position_embeddings=64,
                          logit_scale=0.5),
        "starcoder2": decoder("Starcoder2Model", "Starcoder2Config", 50, num_key_value_heads=2,
                              max_position_embeddings=64, sliding_window=None),
        "olmo": decoder("OlmoModel", "OlmoConfig", 51, num_key_value_heads=2, max_position_embeddings=64),
        "glm": decoder("GlmModel", "GlmConfig", 52, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                       pad_token_id=0, partial_rotary_factor=0.5),
        "deepseek-v3": decoder("DeepseekV3Model", "DeepseekV3Config", 54, num_key_value_heads=4,
                               max_position_embeddings=64, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=4,
                               qk_nope_head_dim=8, v_head_dim=8, first_k_dense_replace=2, n_routed_experts=4,
                               num_experts_per_tok=2, moe_intermediate_size=32, rope_interleave=False),
        "gemma3": decoder("Gemma3TextModel", "Gemma3TextConfig", 53, num_key_value_heads=2, head_dim=8,
                          max_position_embeddings=64, sliding_window=4, query_pre_attn_scalar=8,
                          layer_types=["sliding_attention", "full_attention"]),
    }


# The TorchScript form for these (at least six, the issue asks): encoders and decoders both.
TS_ARCHS = ("bert", "roberta", "distilbert", "vit", "gpt2", "llama", "qwen2", "clip-text", "t5-encoder",
            "bart-encoder", "phi", "stablelm", "gptj", "qwen3", "olmo2", "albert", "mpnet")


def _export(wrapped: object, args: tuple, inputs: dict, path: Path, exporter: str) -> None:
    """Export `wrapped(*args)` to `path` with `exporter` (`dynamo`: opset 18, dynamic batch and seq; else the
    TorchScript exporter, opset 17, the same axes named): int64 inputs are [batch, seq], float inputs [batch, ...]."""
    names = list(inputs)
    if exporter == "dynamo":
        batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", min=2, max=64)
        dyn = (tuple({0: batch, 1: seq} if inputs[k].dtype == torch.int64 else {0: batch} for k in names),)
        torch.onnx.export(wrapped, args, str(path), input_names=names, output_names=["last_hidden_state"],
                          opset_version=18, dynamo=True, dynamic_shapes=dyn, external_data=False)
    else:
        axes = {k: ({0: "batch", 1: "seq"} if inputs[k].dtype == torch.int64 else {0: "batch"}) for k in names}
        torch.onnx.export(wrapped, args, str(path), input_names=names, output_names=["last_hidden_state"],
                          opset_version=17, dynamo=False, dynamic_axes=axes)


def _export(arch: str, form: str, make: Callable) -> dict:
    exporter, attn = form.split("-")
    torch.manual_seed(0)
    model, inputs, cfg = make(attn)
    model = _randomize(model.eval(), zlib.crc32(arch.encode()) % 1000, scale=0.08)
    names = list(inputs)
    wrapped = _LastHidden(model, names).eval()
    args = tuple(inputs[k] for k in names)
    path = OUT / f"{arch}.{form}.onnx"
    with torch.no_grad():
        ref = wrapped(*args)
        _export(wrapped, args, inputs, path, exporter)
    m = onnx.load(str(path))
    onnx.checker.check_model(m)
    np.savez_compressed(OUT / f"{arch}.{form}.npz", **{k: v.numpy() for k, v in inputs.items()},
                        **{"out:last_hidden_state": ref.numpy()})
    kb = path.stat().st_size / 1e3
    print(f"{arch}.{form}: {kb:.0f} kB, {len(m.graph.node)} nodes", flush=True)
    return {"file": path.name, "kB": round(kb), "nodes": len(m.graph.node), "config": cfg.to_diff_dict()}


# The deployed-file forms (issue 37), each from a model of `_zoo()`; the reference outputs of the derived forms
# (fp16, qdq, qdyn, ortopt) are ONNX Runtime's on the written file (the numbers of the file), the others PyTorch's.
DEPLOY_FORMS = {
    "kv": ("granite", "starcoder2", "gpt-bigcode", "cohere", "olmo", "qwen2"),
    "fp16": ("granite", "ernie", "deit", "starcoder2", "olmo"),
    "qdq": ("ernie", "deit", "granite", "convbert"),
    "qdyn": ("convbert", "codegen", "mobilebert", "beit", "starcoder2"),
    "ortopt": ("ernie", "convbert", "deit", "beit", "gpt-bigcode", "starcoder2"),
    "encdec": ("bart", "t5", "marian"),
}
ORTOPT_TYPE = {"ernie": "bert", "convbert": "bert", "mobilebert": "bert", "deit": "vit", "beit": "vit",
               "gpt-bigcode": "gpt2", "starcoder2": "gpt2", "codegen": "gpt2"}
"""arch -> the model_type the transformer optimizer is given for it (`bert` where none fits)."""


def _ort_outputs(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds), strict=True))


def _plain(arch: str, make: Callable, path: Path, exporter: str = "dynamo", half: bool = False) -> tuple:
    """Export `arch` (eager attention) to `path`; return (inputs as numpy, config, PyTorch's output)."""
    torch.manual_seed(0)
    model, inputs, cfg = make("eager")
    model = _randomize(model.eval(), zlib.crc32(arch.encode()) % 1000, scale=0.08)
    if half:
        model = model.half()
        inputs = {k: (v.half() if v.is_floating_point() else v) for k, v in inputs.items()}
    names = list(inputs)
    wrapped = _LastHidden(model, names).eval()
    args = tuple(inputs[k] for k in names)
    with torch.no_grad():
        ref = wrapped(*args)
        _export(wrapped, args, inputs, path, exporter)
    return {k: v.numpy() for k, v in inputs.items()}, cfg, ref.float().numpy()


class _KvStep(torch.nn.Module):
    """One decode step: (input_ids [B, 1], attention_mask [B, P+1], past K/V of each layer [B, kv_heads, P, d]) ->
    (last_hidden_state [B, 1, H], the present K/V of each layer [B, kv_heads, P+1, d])."""

    def __init__(self, model: torch.nn.Module, layers: int) -> None:
        super().__init__()
        self.model, self.layers = model, layers

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, k0: torch.Tensor, v0: torch.Tensor,
                k1: torch.Tensor, v1: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cache = transformers.DynamicCache(config=self.model.config)
        for i, (k, v) in enumerate(((k0, v0), (k1, v1))):
            cache.update(k, v, i)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True)
        res = [out.last_hidden_state]
        for layer in out.past_key_values.layers[:self.layers]:
            res += [layer.keys, layer.values]
        return tuple(res)


class _Seq2Seq(torch.nn.Module):
    """(input_ids, attention_mask, decoder_input_ids) -> (decoder last_hidden_state, encoder_last_hidden_state)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                decoder_input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
                         use_cache=False)
        return out.last_hidden_state, out.encoder_last_hidden_state


def _encdec(arch: str, path: Path) -> tuple[dict, dict, object]:
    """A full encoder-decoder (2 encoder and 2 decoder layers), dynamo, eager attention; PyTorch's outputs."""
    t = transformers
    common = {"vocab_size": VOCAB, "d_model": 32, "encoder_layers": 2, "decoder_layers": 2,
              "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 64,
              "decoder_ffn_dim": 64, "max_position_embeddings": 64, "attn_implementation": "eager",
              "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "decoder_start_token_id": 2}
    if arch == "bart":
        cfg = t.BartConfig(**common)
        model = t.BartModel(cfg)
    elif arch == "marian":
        cfg = t.MarianConfig(**{**common, "pad_token_id": 1, "decoder_start_token_id": 1})
        model = t.MarianModel(cfg)
    elif arch == "t5":
        cfg = t.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_heads=4, num_layers=2,
                         num_decoder_layers=2, relative_attention_num_buckets=8, attn_implementation="eager",
                         decoder_start_token_id=0)
        model = t.T5Model(cfg)
    else:
        raise ValueError(f"no encoder-decoder for {arch!r}")
    torch.manual_seed(0)
    model = _randomize(model.eval(), zlib.crc32(arch.encode()) % 1000, scale=0.08)
    inputs = _text(zlib.crc32(arch.encode()) % 100)
    g = torch.Generator().manual_seed(1)
    inputs["decoder_input_ids"] = torch.randint(3, VOCAB, (BATCH, 6), generator=g)
    names = list(inputs)
    wrapped = _Seq2Seq(model).eval()
    args = tuple(inputs[k] for k in names)
    with torch.no_grad():
        ref = wrapped(*args)
        batch = torch.export.Dim("batch")
        seq, dseq = torch.export.Dim("seq", min=2, max=64), torch.export.Dim("dseq", min=2, max=64)
        dyn = ({0: batch, 1: seq}, {0: batch, 1: seq}, {0: batch, 1: dseq})
        torch.onnx.export(wrapped, args, str(path), input_names=names,
                          output_names=["last_hidden_state", "encoder_last_hidden_state"], opset_version=18,
                          dynamo=True, dynamic_shapes=dyn, external_data=False)
    outs = {"last_hidden_state": ref[0].numpy(), "encoder_last_hidden_state": ref[1].numpy()}
    return {k: v.numpy() for k, v in inputs.items()}, outs, cfg


def _deploy(arch: str, form: str, make: Callable | None) -> dict:
    """Write `ARCH.FORM.onnx` and `ARCH.FORM.npz` (inputs and `out:NAME` for every output) for a deployed form."""
    import tempfile

    path = OUT / f"{arch}.{form}.onnx"
    ref_by = "onnxruntime"
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.onnx"
        if form == "kv":
            torch.manual_seed(0)
            model, _, cfg = make("eager")
            model = _randomize(model.eval(), zlib.crc32(arch.encode()) % 1000, scale=0.08)
            model.config.use_cache = True
            past_len, kv_heads = SEQ - 1, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
            if getattr(cfg, "multi_query", False):
                kv_heads = 1
            d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
            g = torch.Generator().manual_seed(zlib.crc32(arch.encode()))
            ids = torch.randint(3, VOCAB, (BATCH, 1), generator=g)
            mask = torch.ones(BATCH, past_len + 1, dtype=torch.int64)
            mask[1, :2] = 0  # the second row left-padded
            past = [0.5 * torch.randn(BATCH, kv_heads, past_len, d, generator=g) for _ in range(4)]
            names = ["input_ids", "attention_mask"] + [f"past_key_values.{i}.{kv}" for i in range(2)
                                                      for kv in ("key", "value")]
            onames = ["last_hidden_state"] + [f"present.{i}.{kv}" for i in range(2) for kv in ("key", "value")]
            step = _KvStep(model, 2).eval()
            args = (ids, mask, *past)
            with torch.no_grad():
                ref = step(*args)
                batch, p = torch.export.Dim("batch"), torch.export.Dim("past", min=1, max=62)
                dyn = ({0: batch}, {0: batch, 1: p + 1}, *[{0: batch, 2: p}] * 4)
                torch.onnx.export(step, args, str(path), input_names=names, output_names=onames, opset_version=18,
                                  dynamo=True, dynamic_shapes=dyn, external_data=False)
            feeds = {k: v.numpy() for k, v in zip(names, args, strict=True)}
            outs = {k: v.numpy() for k, v in zip(onames, ref, strict=True)}
            ref_by = "pytorch"
        elif form == "fp16":
            feeds, cfg, _ = _plain(arch, make, path, half=True)
            outs = _ort_outputs(path, feeds)
        elif form in ("qdq", "qdyn"):
            from onnxruntime.quantization import (
                CalibrationDataReader,
                QuantFormat,
                QuantType,
                quantize_dynamic,
                quantize_static,
            )

            feeds, cfg, _ = _plain(arch, make, base)
            if form == "qdyn":
                quantize_dynamic(str(base), str(path), weight_type=QuantType.QUInt8)
            else:
                class _Reader(CalibrationDataReader):
                    def __init__(self) -> None:
                        rng = np.random.default_rng(0)
                        batches = [feeds] + [{k: (rng.integers(3, VOCAB, v.shape).astype(v.dtype)
                                                  if k == "input_ids" else
                                                  rng.standard_normal(v.shape).astype(v.dtype)
                                                  if v.dtype.kind == "f" else v) for k, v in feeds.items()}
                                             for _ in range(3)]
                        self.it = iter(batches)

                    def get_next(self) -> dict | None:
                        return next(self.it, None)

                quantize_static(str(base), str(path), _Reader(), quant_format=QuantFormat.QDQ,
                                activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
            outs = _ort_outputs(path, feeds)
        elif form == "ortopt":
            from onnxruntime.transformers import optimizer

            feeds, cfg, _ = _plain(arch, make, base, exporter="ts")
            heads = getattr(cfg, "num_attention_heads", 0) or getattr(cfg, "n_head", 0)
            hidden = getattr(cfg, "hidden_size", 0) or getattr(cfg, "n_embd", 0)
            opt = optimizer.optimize_model(str(base), model_type=ORTOPT_TYPE.get(arch, "bert"), num_heads=heads,
                                           hidden_size=hidden, opt_level=0)
            opt.save_model_to_file(str(path))
            outs = _ort_outputs(path, feeds)
        elif form == "encdec":
            feeds, outs, cfg = _encdec(arch, path)
            ref_by = "pytorch"
        else:
            raise ValueError(f"unknown deployed form {form!r}")
    m = onnx.load(str(path))
    onnx.checker.check_model(m)
    np.savez_compressed(OUT / f"{arch}.{form}.npz", **feeds, **{f"out:{k}": v for k, v in outs.items()})
    kb = path.stat().st_size / 1e3
    ops = sorted({n.op_type for n in m.graph.node if n.domain == "com.microsoft"} |
                 {n.op_type for n in m.graph.node if "Quant" in n.op_type or "Integer" in n.op_type})
    print(f"{arch}.{form}: {kb:.0f} kB, {len(m.graph.node)} nodes {ops}", flush=True)
    return {"file": path.name, "kB": round(kb), "nodes": len(m.graph.node), "config": cfg.to_diff_dict(),
            "reference": ref_by, "ops": ops}


def main(argv: list[str]) -> None:
    forms = ["dynamo-eager", "dynamo-sdpa", "ts-eager"]
    if "--forms" in argv:
        i = argv.index("--forms")
        forms, argv = argv[i + 1].split(","), argv[:i] + argv[i + 2:]
    zoo = _zoo()
    archs = argv or list(zoo)
    OUT.mkdir(parents=True, exist_ok=True)
    record_path = OUT / "zoo.json"
    record = json.loads(record_path.read_text()) if record_path.is_file() else {"files": {}, "refused": {}}
    record["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                          "onnx": onnx.__version__, "python": platform.python_version()}
    for arch in archs:
        for form in forms:
            if form.startswith("ts-") and arch not in TS_ARCHS:
                continue
            if form in DEPLOY_FORMS and arch not in DEPLOY_FORMS[form] or form not in DEPLOY_FORMS and arch not in zoo:
                continue
            key = f"{arch}.{form}"
            try:
                record["files"][key] = (_deploy if form in DEPLOY_FORMS else _export)(arch, form, zoo.get(arch))
                record["refused"].pop(key, None)
            except Exception as e:  # noqa: BLE001 - an exporter's refusal is a row of the record, not a stop
                root = e
                while root.__cause__ is not None:  # the exporter wraps the op it could not convert
                    root = root.__cause__
                msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
                if root is not e:
                    msg += f" (cause: {type(root).__name__}: {str(root).strip()[:300]})"
                print(f"{key}: exporter refused: {msg}", flush=True)
                record["refused"][key] = msg
                for suffix in (".onnx", ".npz"):
                    (OUT / f"{key}{suffix}").unlink(missing_ok=True)
    record["files"] = dict(sorted(record["files"].items()))
    record_path.write_text(json.dumps(record, indent=1, sort_keys=False) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
