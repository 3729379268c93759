"""Traffic of the executed program (what the MLX lowering runs as one kernel) and timing read aloud."""

from rlxviz import session
from rlxviz.ir import Builder
from rlxviz.passes import run_passes
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
    for device in ("cpu", "gpu"):
        run = session.executed_traffic_saved(fmba, device)
        # ideal: fc1's matmul + add [2, 8, 32] and fc2's matmul [2, 8, 16], f32, each written once, read once
        assert run.ideal.total == 2 * (2 * 2 * 8 * 32 + 2 * 8 * 16) * 4
        assert {op for _, op, *_ in run.saved} == {"matmul"}  # addmm: the matmul's output never reaches memory
        assert run.total == 2 * (2 * 8 * 32 + 2 * 8 * 16) * 4
        assert [op for _, op, *_ in run.still_moved] == ["add"]  # the bias add feeds a separate gelu kernel
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
