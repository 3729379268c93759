"""Write an N-layer LLaMA-shaped decoder as torch.onnx's dynamo exporter writes it, every initializer as external data.

The op structure copies `tests/fixtures/onnx/zoo/llama.dynamo-eager.onnx` (torch 2.13, dynamo exporter, eager
attention): an embedding `Gather`, per layer RMSNorm (`Pow`, `ReduceMean`, `Add eps`, `Sqrt`, `Reciprocal`, two
`Mul`), q/k/v projections (`MatMul` by a `[in, out]` weight), `Reshape [B, S, -1, head_dim]` + `Transpose`, RoPE
(`cos`/`sin` of `positions x inv_freq`, rotate-half by `Slice`/`Neg`/`Concat`), GQA (K/V `Unsqueeze`/`Expand`/
`Reshape` to the query heads), scores `MatMul`, `Mul` by 1/sqrt(head_dim), `Add` of a causal + padding mask made
from `attention_mask` (`Where(keep, 0, float32 min)`), `Softmax`, `o_proj`, residual `Add`, SwiGLU MLP
(`Sigmoid`, `Mul`, `Mul`, `down_proj`), a final RMSNorm; output `last_hidden_state` [batch, seq, hidden]. Each node
carries the exporter's `pkg.torch.onnx.name_scopes` metadata, so layer paths are `model.layers.N...`.

Every initializer points into one external-data file (`<name>.onnx.data`). With `--sparse` (the default) the file
is made with `truncate`: its apparent size is the weights' bytes, nothing is on disk and every weight reads as
zeros; the small tensors the import reads (norm weights, `inv_freq`) are written for real. With `--real` every
weight is written with seeded random values (only for small shapes: it writes the bytes); with `--real-layers K`
the embedding and layers 0..K-1 are (what `rlxviz run --layers 0-<K-1>` reads), the rest left a hole.

Usage:
    python scripts/make_big_onnx.py OUT.onnx [--layers 32 --hidden 4096 --heads 32 --kv-heads 8
        --intermediate 14336 --vocab 128256] [--real | --real-layers K] [--seed 0]
    python scripts/make_big_onnx.py --shape 8b OUT.onnx      # LLaMA-3-8B shape (about 15 GB apparent, sparse)

Needs only `onnx` and `numpy` (no torch).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

SHAPES = {
    "tiny": dict(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=256),
    "mid": dict(layers=4, hidden=256, heads=8, kv_heads=2, intermediate=512, vocab=4096),
    "8b": dict(layers=32, hidden=4096, heads=32, kv_heads=8, intermediate=14336, vocab=128256),
}
"""Named shapes: `tiny` for tests, `mid` with weights over the lazy threshold, `8b` LLaMA-3-8B."""

REAL_ALWAYS = 1 << 16
"""Tensors of at most this many elements are written for real even in a sparse file (norm weights, inv_freq)."""


@dataclass(frozen=True)
class Shape:
    """The decoder's sizes: `layers` blocks of width `hidden`, `heads` query heads and `kv_heads` key/value heads
    (GQA: `heads % kv_heads == 0`), an MLP of width `intermediate`, `vocab` embedding rows."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    rope_theta: float = 500000.0
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class _Writer:
    """Collects nodes and initializers; external initializers are laid out in one data file."""

    def __init__(self, data_name: str, real: bool, seed: int) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.data_name = data_name
        self.real = real
        self.rng = np.random.default_rng(seed)
        self.offset = 0
        self.chunks: list[tuple[int, bytes]] = []  # (offset, bytes) written for real
        self.k = 0

    def name(self, base: str) -> str:
        self.k += 1
        return f"{base}_{self.k}"

    def node(self, op: str, ins: list[str], scope: list[str], out: str | None = None, **attrs: object) -> str:
        out = out or self.name(op.lower())
        n = helper.make_node(op, ins, [out], name=f"node_{out}", **attrs)
        p = n.metadata_props.add()
        p.key, p.value = "pkg.torch.onnx.name_scopes", repr(["", *scope, out])
        self.nodes.append(n)
        return out

    def const(self, name: str, value: np.ndarray) -> str:
        """A small constant (shape tensor, scalar): an ordinary initializer in the .onnx file."""
        self.inits.append(onnx.numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, name: str, shape: tuple[int, ...], fill: np.ndarray | None = None, scale: float = 0.05) -> str:
        """A float32 initializer in the external-data file at the next 64-byte aligned offset; its bytes are
        written when `real`, when `fill` is given, or when it is small (`REAL_ALWAYS`); else left a hole."""
        count = math.prod(shape)
        tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(shape))
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.data_name), ("offset", str(self.offset)), ("length", str(4 * count))):
            e = tensor.external_data.add()
            e.key, e.value = key, value
        if fill is not None or self.real or count <= REAL_ALWAYS:
            arr = fill if fill is not None else self.rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)
            self.chunks.append((self.offset, np.ascontiguousarray(arr, dtype=np.float32).tobytes()))
        self.inits.append(tensor)
        self.offset += -(-4 * count // 64) * 64
        return name


def build(s: Shape, out: Path, real: bool = False, seed: int = 0, real_layers: int = 0,
          torch_layout: bool = False) -> Path:
    """Write the model to `out` and its weights to `out` + `.data` (sparse unless `real`; with `real_layers` K the
    embedding and layers 0..K-1 written, the rest a hole; with `torch_layout` linear weights `[out, in]` read through
    a `Transpose` node). Returns `out`."""
    if s.hidden % s.heads or s.heads % s.kv_heads or s.head_dim % 2:
        raise ValueError(f"hidden {s.hidden} must split into {s.heads} heads of even size, heads into {s.kv_heads}")
    data = out.with_name(out.name + ".data")
    w = _Writer(data.name, real or real_layers > 0, seed)
    hd, rep = s.head_dim, s.heads // s.kv_heads
    f32min = np.float32(np.finfo(np.float32).min)
    # shape constants, as the exporter names them
    c = {k: w.const(k, np.array(v, dtype=np.int64)) for k, v in
         (("val_m1", [-1]), ("val_0i", [0]), ("val_1i", [1]), ("val_2i", [2]), ("val_3i", [3]),
          ("val_half", [hd // 2]), ("val_big", [2**63 - 1]), ("val_hd", [hd]), ("val_rep", [rep]),
          ("val_kv", [s.kv_heads]), ("val_h", [s.heads]), ("val_12", [1, 2]))}
    start = w.const("val_start", np.array(0, dtype=np.int64))
    step = w.const("val_step", np.array(1, dtype=np.int64))
    two = w.const("val_two", np.array(2.0, dtype=np.float32))
    eps = w.const("val_eps", np.array(s.eps, dtype=np.float32))
    zero = w.const("zeros", np.array(0.0, dtype=np.float32))
    fmin = w.const("val_fmin", np.array(f32min, dtype=np.float32))
    scale = w.const("val_scale", np.array(1 / math.sqrt(hd), dtype=np.float32))
    top = ["model"]

    b0 = w.node("Shape", ["input_ids"], top, "val_b", start=0, end=1)
    s0 = w.node("Shape", ["input_ids"], top, "val_s", start=1, end=2)
    seq = w.node("Squeeze", [s0], top, "sym_seq")
    emb = w.weight("model.embed_tokens.weight", (s.vocab, s.hidden))
    x = w.node("Gather", [emb, "input_ids"], [*top, "model.embed_tokens"], "embedding", axis=0)
    # causal + padding mask [B, 1, S, S]: keep = (j <= i) & mask[b, j]; additive 0 / float32 min
    ar = w.node("Range", [start, seq, step], top, "arange")
    rows = w.node("Unsqueeze", [ar, c["val_m1"]], top)            # [S, 1]
    causal = w.node("LessOrEqual", [ar, rows], top)                 # [S, S]: j <= i
    maskb = w.node("Cast", ["attention_mask"], top, to=TensorProto.BOOL)
    pad = w.node("Unsqueeze", [maskb, c["val_12"]], top)            # [B, 1, 1, S]
    keep = w.node("And", [causal, pad], top)                        # [B, 1, S, S]
    mask = w.node("Where", [keep, zero, fmin], top, "where")
    # RoPE tables [S, hd]
    inv = w.weight("model.rotary_emb.inv_freq", (hd // 2,),
                   fill=(1.0 / s.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)).astype(np.float32))
    pos = w.node("Cast", [w.node("Unsqueeze", [ar, c["val_m1"]], [*top, "model.rotary_emb"])],
                 [*top, "model.rotary_emb"], to=TensorProto.FLOAT)
    freqs = w.node("Mul", [pos, inv], [*top, "model.rotary_emb"])
    cat = w.node("Concat", [freqs, freqs], [*top, "model.rotary_emb"], axis=-1)
    cos = w.node("Cos", [cat], [*top, "model.rotary_emb"], "cos")
    sin = w.node("Sin", [cat], [*top, "model.rotary_emb"], "sin")

    def rms(v: str, weight: str, scope: list[str]) -> str:
        g = w.weight(weight, (s.hidden,), fill=np.ones(s.hidden, np.float32))
        p = w.node("Pow", [v, two], scope)
        m = w.node("ReduceMean", [p, c["val_m1"]], scope, keepdims=1, noop_with_empty_axes=0)
        r = w.node("Reciprocal", [w.node("Sqrt", [w.node("Add", [m, eps], scope)], scope)], scope)
        return w.node("Mul", [g, w.node("Mul", [v, r], scope)], scope)

    def linear(v: str, module: str, n_in: int, n_out: int, parent: list[str]) -> str:
        """`v @ W` for the module's `[in, out]` weight, under the module's scope; with `torch_layout` the weight is
        torch's `[out, in]` and a `Transpose` precedes the MatMul (the dynamo exporter without its optimizer)."""
        if torch_layout:
            weight = w.weight(f"{module}.weight", (n_out, n_in), scale=1 / math.sqrt(n_in))
            weight = w.node("Transpose", [weight], [*parent, module], perm=[1, 0])
        else:
            weight = w.weight(f"{module}.weight", (n_in, n_out), scale=1 / math.sqrt(n_in))
        return w.node("MatMul", [v, weight], [*parent, module])

    def heads(v: str, scope: list[str]) -> str:  # [B, S, n*hd] -> [B, n, S, hd]
        shape = w.node("Concat", [b0, s0, c["val_m1"], c["val_hd"]], scope, axis=0)
        return w.node("Transpose", [w.node("Reshape", [v, shape], scope, allowzero=1)], scope, perm=[0, 2, 1, 3])

    def rope(v: str, scope: list[str]) -> str:
        lo = w.node("Slice", [v, c["val_0i"], c["val_half"], c["val_3i"], c["val_1i"]], scope)
        hi = w.node("Slice", [v, c["val_half"], c["val_big"], c["val_3i"], c["val_1i"]], scope)
        rot = w.node("Concat", [w.node("Neg", [hi], scope), lo], scope, axis=-1)
        return w.node("Add", [w.node("Mul", [v, cos], scope), w.node("Mul", [rot, sin], scope)], scope)

    def repeat_kv(v: str, scope: list[str]) -> str:  # [B, kv, S, hd] -> [B, heads, S, hd]
        if rep == 1:
            return v
        u = w.node("Unsqueeze", [v, c["val_2i"]], scope)
        shape5 = w.node("Concat", [b0, c["val_kv"], c["val_rep"], s0, c["val_hd"]], scope, axis=0)
        shape4 = w.node("Concat", [b0, c["val_h"], s0, c["val_hd"]], scope, axis=0)
        return w.node("Reshape", [w.node("Expand", [u, shape5], scope), shape4], scope, allowzero=1)

    for i in range(s.layers):
        w.real = real or i < real_layers
        lay = [*top, f"model.layers.{i}"]
        att = [*lay, f"model.layers.{i}.self_attn"]
        mlp = [*lay, f"model.layers.{i}.mlp"]
        h = rms(x, f"model.layers.{i}.input_layernorm.weight", [*lay, f"model.layers.{i}.input_layernorm"])
        q = linear(h, f"{att[-1]}.q_proj", s.hidden, s.hidden, att)
        k = linear(h, f"{att[-1]}.k_proj", s.hidden, s.kv_heads * hd, att)
        v = linear(h, f"{att[-1]}.v_proj", s.hidden, s.kv_heads * hd, att)
        q, k, v = rope(heads(q, att), att), rope(heads(k, att), att), heads(v, att)
        k, v = repeat_kv(k, att), repeat_kv(v, att)
        kt = w.node("Transpose", [k], att, perm=[0, 1, 3, 2])
        scores = w.node("Add", [w.node("Mul", [w.node("MatMul", [q, kt], att), scale], att), mask], att)
        ctx = w.node("MatMul", [w.node("Softmax", [scores], att, axis=-1), v], att)
        flat = w.node("Concat", [b0, s0, c["val_m1"]], att, axis=0)
        ctx = w.node("Reshape", [w.node("Transpose", [ctx], att, perm=[0, 2, 1, 3]), flat], att, allowzero=1)
        x = w.node("Add", [x, linear(ctx, f"{att[-1]}.o_proj", s.hidden, s.hidden, att)], lay)
        h = rms(x, f"model.layers.{i}.post_attention_layernorm.weight",
                [*lay, f"model.layers.{i}.post_attention_layernorm"])
        gate = linear(h, f"{mlp[-1]}.gate_proj", s.hidden, s.intermediate, mlp)
        up = linear(h, f"{mlp[-1]}.up_proj", s.hidden, s.intermediate, mlp)
        act = w.node("Mul", [gate, w.node("Sigmoid", [gate], mlp)], mlp)
        x = w.node("Add", [x, linear(w.node("Mul", [act, up], mlp), f"{mlp[-1]}.down_proj", s.intermediate, s.hidden,
                                     mlp)], lay)
    out_name = "last_hidden_state"
    rms(x, "model.norm.weight", [*top, "model.norm"])
    w.nodes[-1].output[0] = out_name  # the final norm's last Mul writes the graph output
    graph = helper.make_graph(
        w.nodes, f"llama_{s.layers}x{s.hidden}",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, ["batch", "seq", s.hidden])],
        w.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="make_big_onnx",
                              ir_version=9)
    onnx.save(model, str(out))
    with open(data, "wb") as f:  # a hole wherever nothing is written: truncate first, then the real chunks
        f.truncate(w.offset)
        for off, raw in w.chunks:
            f.seek(off)
            f.write(raw)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="the .onnx file to write (weights in OUT.data)")
    p.add_argument("--shape", choices=sorted(SHAPES), default=None, help="a named shape (the flags below override it)")
    for k in ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab"):
        p.add_argument(f"--{k.replace('_', '-')}", type=int, default=None)
    p.add_argument("--real", action="store_true", help="write every weight (seeded random), not a sparse file")
    p.add_argument("--real-layers", type=int, default=0, metavar="K",
                   help="write the embedding and layers 0..K-1 for real, the rest a hole")
    p.add_argument("--torch-layout", action="store_true",
                   help="linear weights as torch stores them ([out, in]) behind a Transpose node, as the dynamo "
                        "exporter writes them without its optimizer")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    sizes = dict(SHAPES[a.shape or "tiny"])
    sizes.update({k: getattr(a, k) for k in sizes if getattr(a, k) is not None})
    out = build(Shape(**sizes), a.out, real=a.real, seed=a.seed, real_layers=a.real_layers,
                torch_layout=a.torch_layout)
    data = out.with_name(out.name + ".data")
    st = data.stat()
    print(f"wrote {out} ({out.stat().st_size} bytes) and {data.name}: {st.st_size / 2**30:.2f} GiB apparent, "
          f"{st.st_blocks * 512 / 2**20:.1f} MiB on disk")


if __name__ == "__main__":
    main()
