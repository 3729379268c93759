"""Traffic of the executed program (what the MLX lowering runs as one kernel) and timing read aloud."""

import numpy as np

from rlxviz import session
from rlxviz.ir import Builder
from rlxviz.models import random_weights
from rlxviz.passes import run_passes
from rlxviz.session.program import VIEWS
from rlxviz.session.timing import VersionTiming


def ffn():
    b = Builder("ffn")
    x = b.input("x", (2, 8, 16))
    h = b.gelu(b.linear(x, b.param("w1", (16, 32)), b.param("b1", (32,))))
    y = b.linear(h, b.param("w2", (32, 16)), b.param("b2", (16,)))
    b.output(b.layer_norm(b.add(y, x), b.param("g", (16,)), b.param("bt", (16,))))
    return b.build()


def test_executed_traffic_counts_only_what_one_kernel_computes():
    trace = run_passes(ffn(), ["fuse_matmul_bias_act", "fuse_residual_ln"])
    fmba, rln = trace.steps
    # ideal: fc1's matmul + add [2, 8, 32] and fc2's matmul [2, 8, 16], f32, each written once, read once
    ideal = 2 * (2 * 2 * 8 * 32 + 2 * 8 * 16) * 4
    gpu = session.executed_traffic_saved(fmba, "gpu")
    assert gpu.ideal.total == ideal
    assert {op for _, op, *_ in gpu.saved} == {"matmul"}  # a GEMM epilogue reads the bias: no matmul output
    assert gpu.total == 2 * (2 * 8 * 32 + 2 * 8 * 16) * 4
    assert [op for _, op, *_ in gpu.still_moved] == ["add"]  # the bias add feeds a separate gelu kernel
    cpu = session.executed_traffic_saved(fmba, "cpu")
    assert cpu.total == 0 and cpu.still_total == cpu.ideal.total == ideal  # CPU addmm: bias pre-filled, beta = 1
    assert all("beta = 1" in why for *_, op, why in [(r[0], r[1], r[4]) for r in cpu.still_moved] if op == "matmul")
    for device in ("cpu", "gpu"):
        run = session.executed_traffic_saved(fmba, device)
        assert run.total + run.still_total == run.ideal.total
        norm = session.executed_traffic_saved(rln, device)
        assert norm.total == 0 and norm.still_total == norm.ideal.total == 2 * 2 * 8 * 16 * 4


def test_compare_to_input_reads_the_quartiles():
    base = VersionTiming(0, "input", 7, median_ms=10.0, samples_ms=(9.0, 9.5, 10.0, 10.5, 11.0))
    near = VersionTiming(1, "a", 4, median_ms=10.4, samples_ms=(10.0, 10.2, 10.4, 10.6, 10.8))
    fast = VersionTiming(2, "b", 3, median_ms=5.0, samples_ms=(4.9, 5.0, 5.0, 5.0, 5.1))
    slow = VersionTiming(3, "c", 3, median_ms=20.0, samples_ms=(19.0, 20.0, 20.0, 20.0, 21.0))
    assert session.compare_to_input(near, base) == "within noise"
    assert session.compare_to_input(fast, base) == "2.00x faster"
    assert session.compare_to_input(slow, base) == "2.00x slower"


def test_horizontal_merge_removes_no_intermediate():
    b = Builder("qkv_bias")
    x = b.input("x", (2, 8, 16))
    outs = [b.linear(x, b.param(f"w{i}", (16, 16)), b.param(f"b{i}", (16,))) for i in range(3)]
    b.output(b.add(b.add(outs[0], outs[1]), outs[2]))
    step = run_passes(b.build(), ["fuse_shared_input_matmul"]).steps[0]
    assert len(step.matches) == 1
    assert session.traffic_saved(step).total == 0  # the per-projection matmul -> add pairs become one merged pair
    assert session.executed_traffic_saved(step, "cpu").total == 0
    assert session.shared_input_saved(step) == (2 * 2 * 8 * 16 * 4, 2)


def test_attention_saving_needs_a_head_dim_the_fused_kernel_takes():
    assert session.sdpa_fused(64) and session.sdpa_fused(128)
    assert not session.sdpa_fused(32) and not session.sdpa_fused(None)  # MiniLM: head_dim 32 falls back


def test_minilm_gpu_attention_is_not_credited_at_head_dim_32():
    from rlxviz.models import load_model
    from rlxviz.passes import Pipeline

    trace = Pipeline.canonical().run(load_model("minilm", batch=1, seq=8).graph)
    sdpa = session.executed_traffic_saved(trace.step("fuse_sdpa"), "gpu")
    assert sdpa.ideal.total > 0 and sdpa.total == 0
    assert all("falls back" in why for *_, why in sdpa.still_moved)


def test_program_primitives_are_read_from_mlx():
    from rlxviz.session.program import mlx_primitives, version_primitives

    g = ffn()
    feeds = {"x": np.ones((2, 8, 16), np.float32)}
    weights = random_weights(g, seed=0)
    p = mlx_primitives(g, feeds, weights, "cpu")
    counts = p.counts()
    assert counts.get("Matmul") == 2 and "AddMM" not in counts  # unfused: matmul, then a separate bias add
    assert p.compiled  # the CPU's fast-math GELU: compiled elementwise kernels
    assert p.kernels == p.count - sum(v for k, v in counts.items() if k in VIEWS) and p.kernels < p.count
    # mx.fast.layer_norm falls back on the CPU: its reductions are primitives of the program
    assert "LayerNorm" not in counts and counts.get("Sum", 0) >= 2 and "Rsqrt" in counts
    rows = version_primitives(run_passes(g, ["fuse_matmul_bias_act", "fuse_residual_ln"]), feeds, weights, "cpu")
    assert [r.index for r in rows] == [0, 1, 2] and rows[0].ops > rows[-1].ops
    fused = rows[1].program.counts()
    assert fused.get("AddMM") == 2 and "Matmul" not in fused  # FusedMatMulBiasAct: x @ w + b as one mx.addmm
    assert rows[2].program.counts() == fused  # FusedResidualLN: the same primitives as add + layer_norm


def test_dot_primitives_reads_rectangles_only():
    from rlxviz.session.program import dot_primitives

    dot = '{ 1 [label ="AddMM", shape=rectangle]; }\n{ "A"; }\n{ 2 [label ="CompiledExpAdd", shape=rectangle]; }'
    assert dot_primitives(dot) == ("AddMM", "CompiledExpAdd")
