"""Traffic of the executed program (what the MLX lowering runs as one kernel) and timing read aloud."""

import numpy as np
import pytest
from cpu_default import default_gemm

from rlxviz import session
from rlxviz.ir import Builder
from rlxviz.models import random_weights
from rlxviz.passes import run_passes
from rlxviz.session.program import VIEWS
from rlxviz.session.timing import VersionTiming, paired_verdict


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


def timed(index, samples):
    s = tuple(float(v) for v in samples)
    return VersionTiming(index, f"v{index}", 3, median_ms=float(np.median(s)), min_ms=min(s), samples_ms=s)


def test_compare_to_input_reads_paired_rounds():
    rng = np.random.default_rng(1)
    drift = 10.0 + 3.0 * rng.random(31)  # a machine whose speed wanders from round to round
    base = timed(0, drift)
    same = timed(1, drift * (1 + 0.01 * rng.standard_normal(31)))  # paired: no difference beyond 1% jitter
    fast = timed(2, drift / 2)
    slow = timed(3, drift * 2)
    assert session.compare_to_input(same, base) == "within noise"
    assert session.compare_to_input(fast, base) == "2.00x faster"
    assert session.compare_to_input(slow, base) == "2.00x slower"
    v = paired_verdict(base, same)
    assert v.low <= 1.0 <= v.high and v.rounds == 31 and paired_verdict(base, same) == v  # seeded bootstrap


def test_paired_rounds_separate_what_quartiles_cannot():
    rng = np.random.default_rng(2)
    drift = 10.0 + 5.0 * rng.random(41)  # IQRs overlap widely: the machine's wander dominates
    base, faster = timed(0, drift), timed(1, drift * 0.95)  # 5% faster in every round
    (q1, q3), (r1, r3) = base.quartiles(), faster.quartiles()
    assert r1 <= q3 and q1 <= r3
    assert session.compare_to_input(faster, base) == "1.05x faster"
    tiny = timed(2, drift * 0.997)  # 0.3% faster in every round: significant, but under PRACTICAL
    v = paired_verdict(base, tiny)
    assert v.high < 1.0 or v.low > 1.0
    assert v.words == "within noise"
    rounds = np.r_[[1.003] * 21, [1.08] * 20]  # the median ratio 1.003, its interval 1.003..1.08: excludes 1
    skewed = timed(3, drift / rounds)
    v = paired_verdict(base, skewed)
    assert v.low > 1.0 and v.high > 1 + 0.01 and abs(v.ratio - 1.003) < 1e-9
    assert v.words == "within noise"  # was "1.00x faster": a 0.3% median gain read as a verdict


def test_too_few_rounds_and_busy_runs_are_said():
    base, row = timed(0, [10.0] * 7), timed(1, [5.0] * 7)
    assert session.compare_to_input(row, base).startswith("too few rounds (7 < 21)")
    busy = timed(2, [0.6] + [40.0] * 20)
    quiet = timed(3, [1.0] * 21)
    assert "unusable run" in paired_verdict(quiet, busy).warning and not paired_verdict(quiet, quiet).warning
    with pytest.raises(ValueError, match="time them together"):
        paired_verdict(base, quiet)


def test_compare_versions_pairs_each_version_with_the_previous():
    rows = [timed(0, [10.0] * 21), timed(1, [5.0] * 21), VersionTiming(2, "v2", 3, same_as=1), timed(3, [5.0] * 21)]
    pairs = session.compare_versions(rows)
    assert [(p.index, r.index) for p, r, _ in pairs] == [(0, 1), (1, 3)]
    assert [v.words for *_, v in pairs] == ["2.00x faster", "within noise"]


def test_horizontal_merge_removes_no_intermediate():
    b = Builder("qkv_bias")
    x = b.input("x", (2, 8, 16))
    outs = [b.linear(x, b.param(f"w{i}", (16, 16)), b.param(f"b{i}", (16,))) for i in range(3)]
    b.output(b.add(b.add(outs[0], outs[1]), outs[2]))
    step = run_passes(b.build(), ["fuse_shared_input_matmul"]).steps[0]
    assert len(step.matches) == 1
    assert session.traffic_saved(step).total == 0  # the per-projection matmul -> add pairs become one merged pair
    assert session.executed_traffic_saved(step, "cpu").total == 0
    assert session.shared_input_saved(step) == (2 * 2 * 8 * 16 * 4, 4)  # 2 matmul + 2 bias-add launches


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
    if default_gemm(rows=2 * 8):  # the CPU's gemm="auto" picks rlxviz's GEMM here (an AVX-512 build)
        # FusedMatMulBiasAct: fc1 and fc2 each one RlxvizGemm (bias, GELU in its store); packing is once per
        # program, so no RlxvizPackWeights in a call's graph
        assert fused.get("RlxvizGemm") == 2 and not {"AddMM", "Matmul", "RlxvizPackWeights"} & set(fused)
    else:  # fc1 (GELU) as a matmul + rlxviz's bias+GELU kernel, fc2 as one mx.addmm
        assert fused.get("AddMM") == 1 and fused.get("Matmul") == 1 and fused.get("RlxvizBiasAct") == 1
    ln = rows[2].program.counts()  # FusedResidualLN: rlxviz's residual+LayerNorm kernel, no add or reductions
    assert ln.get("RlxvizResidualLayerNorm") == 1 and "Sum" not in ln
    assert rows[2].program.kernels < rows[1].program.kernels
    from rlxviz.runtime.executor import MlxExecutor
    from rlxviz.runtime.lowering import LoweringOptions

    mlx_only = MlxExecutor(LoweringOptions(kernels=False))  # MLX's own lowering: addmm twice, the same add + norm
    plain = [mlx_primitives(v, feeds, weights, executor=mlx_only).counts() for _, v in
             run_passes(g, ["fuse_matmul_bias_act", "fuse_residual_ln"]).versions()[1:]]
    assert plain[0].get("AddMM") == 2 and "Matmul" not in plain[0] and plain[1] == plain[0]


def test_dot_primitives_reads_rectangles_only():
    from rlxviz.session.program import dot_primitives

    dot = '{ 1 [label ="AddMM", shape=rectangle]; }\n{ "A"; }\n{ 2 [label ="CompiledExpAdd", shape=rectangle]; }'
    assert dot_primitives(dot) == ("AddMM", "CompiledExpAdd")


def test_short_primitive_counts_the_pieces_of_a_compiled_name():
    from rlxviz.session import short_primitive

    assert short_primitive("CompiledBroadcastMultiplyAddMultiplyBroadcastAddDivide") == \
        "Compiled(Multiply x2, Add x2, Divide)"  # Broadcast is a view inside the kernel: left out
    assert short_primitive("AddMM") == "AddMM" and short_primitive("RlxvizBiasAct") == "RlxvizBiasAct"
    assert short_primitive("Compiled") == "Compiled"


def test_interleaved_samples_stay_in_round_order():
    from rlxviz.runtime.timing import summarize

    t = summarize([0.003, 0.001, 0.002], 0.01)  # rounds 0, 1, 2: round 1 was fastest
    assert t.samples_ms == pytest.approx((3.0, 1.0, 2.0)) and t.min_ms == pytest.approx(1.0)
    assert t.median_ms == pytest.approx(2.0)
    # per-round ratios that vary from round to round survive only if each version's samples keep the round order
    rng = np.random.default_rng(3)
    drift, gain = 10.0 + 5.0 * rng.random(21), 1.0 + 0.2 * rng.random(21)
    a, b = summarize(list(drift / 1e3), 0.0), summarize(list(drift / gain / 1e3), 0.0)
    assert np.allclose(np.asarray(a.samples_ms) / np.asarray(b.samples_ms), gain)
    assert paired_verdict(timed(0, a.samples_ms), timed(1, b.samples_ms)).ratio == pytest.approx(np.median(gain))
