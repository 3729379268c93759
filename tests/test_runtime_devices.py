"""Devices, the per-device lowering choice and the precision policy, all checked on the CPU: the
choice functions are asked for each device, and the GPU's lowering runs (on the CPU) to the same numbers."""

import numpy as np
import pytest

from rlxviz.ir import DType
from rlxviz.models import load_model
from rlxviz.passes import Pipeline
from rlxviz.runtime import devices, run_reference
from rlxviz.runtime.devices import DeviceError, resolve_device
from rlxviz.runtime.executor import MlxExecutor
from rlxviz.runtime.lowering import DEVICE_LOWERING, LoweringOptions, lowering_table, options_for
from rlxviz.runtime.precision import TABLE, precision_policy
from rlxviz.runtime.timing import equivalence


def test_lowering_choice_per_device():
    cpu, gpu = options_for("cpu"), options_for("gpu")
    assert (cpu.fast_math, cpu.attention, cpu.compile_layers, cpu.regions) == (True, "composed", False, "compiled")
    assert cpu.cpu_streams == devices.cpu_cores()
    assert (gpu.fast_math, gpu.attention, gpu.compile_layers, gpu.regions, gpu.cpu_streams) == \
        (False, "sdpa", True, "inline", 1)
    # explicit choices win over the device's; "auto" means the device's
    assert options_for("gpu", fast_math=True).fast_math is True
    assert LoweringOptions(attention="auto").for_device("cpu").attention == "composed"
    with pytest.raises(ValueError, match="attention"):
        options_for("cpu", attention="flash")
    with pytest.raises(ValueError, match="regions"):
        options_for("cpu", regions="fused")
    with pytest.raises(ValueError, match="unknown device"):
        LoweringOptions().for_device("tpu")
    rows = lowering_table()
    assert {r["option"] for r in rows} == set(DEVICE_LOWERING["cpu"]) == set(DEVICE_LOWERING["gpu"])
    assert all(r["why cpu"] and r["why gpu"] for r in rows)


def test_available_devices_and_default(monkeypatch):
    monkeypatch.setattr(devices, "gpu_backend", lambda: None)
    assert [d.name for d in devices.available_devices()] == ["cpu"]
    assert devices.default_device() == "cpu" and resolve_device(None) == "cpu" and resolve_device("auto") == "cpu"
    with pytest.raises(DeviceError, match="--device cpu"):
        resolve_device("gpu")
    with pytest.raises(DeviceError, match="unknown device"):
        resolve_device("tpu")
    for backend, word in (("cuda", "CUDA"), ("metal", "Metal")):
        monkeypatch.setattr(devices, "gpu_backend", lambda b=backend: b)
        found = devices.available_devices()
        assert [d.name for d in found] == ["gpu", "cpu"] and word in found[0].label and found[0].backend == backend
        assert devices.default_device() == "gpu" and resolve_device("gpu") == "gpu"


def test_precision_policy_and_its_tolerance():
    assert precision_policy(device="cpu", env={}).matmuls == "f32"
    metal = precision_policy(device="gpu", backend="metal", env={})
    assert (metal.matmuls, metal.device) == ("f32", "metal")
    tf32 = precision_policy(device="gpu", backend="cuda", env={})
    assert (tf32.matmuls, tf32.device) == ("tf32", "cuda+tf32") and "unset" in tf32.note
    assert precision_policy(device="gpu", backend="cuda", env={"MLX_ENABLE_TF32": "1"}).matmuls == "tf32"
    strict = precision_policy(device="gpu", backend="cuda", env={"MLX_ENABLE_TF32": "0"})
    assert (strict.matmuls, strict.device) == ("f32", "cuda") and "=0" in strict.note
    assert (strict.oracle, strict.same_backend) == TABLE[DType.f32, "cuda"]
    assert tf32.oracle.rtol > strict.oracle.rtol and tf32.oracle.atol > strict.oracle.atol
    assert MlxExecutor(device="cpu").precision == precision_policy(DType.f32, "cpu")


def test_precision_policy_reads_this_machine_only_for_cpu_gpu(monkeypatch):
    """`gpu` is looked up (its backend, then the TF32 switch); a device kind is taken as given; a bad name
    is one DeviceError naming both vocabularies."""
    monkeypatch.setattr(devices, "gpu_backend", lambda: "cuda")
    assert precision_policy(device="gpu", env={}).device == "cuda+tf32"
    assert precision_policy(device="auto", env={"MLX_ENABLE_TF32": " 0 "}).device == "cuda"
    monkeypatch.setattr(devices, "gpu_backend", lambda: None)
    assert precision_policy(device="cuda+tf32").tf32 and precision_policy(DType.f16, "metal").dtype == DType.f16
    with pytest.raises(DeviceError, match="no GPU"):
        precision_policy(device="gpu")
    with pytest.raises(DeviceError, match="unknown device 'tpu'.*cuda\\+tf32"):
        precision_policy(device="tpu")


@pytest.mark.parametrize("name,style", [("bert-tiny", "hf"), ("llama-block", None)])
def test_gpu_lowering_computes_the_same_numbers_on_the_cpu(name, style):
    """The GPU's lowering choices (plain math, SDPA, compiled layers, inline regions), run on the CPU:
    every canonical pipeline version matches the NumPy reference of the unfused graph."""
    model = load_model(name, batch=2, seq=16, style=style)
    feeds = model.random_feeds(seed=4)
    ref = run_reference(model.graph, feeds, model.weights)
    ex = MlxExecutor(options_for("gpu"), device="cpu")
    assert ex.options.attention == "sdpa" and ex.options.compile_layers and ex.device == "cpu"
    for name, g in Pipeline.canonical().run(model.graph).versions():
        for d in equivalence(g, feeds, model.weights, executor=ex, reference_outputs=ref):
            assert d.ok, f"{name}: max_abs={d.max_abs:.3g}"


def test_executor_runs_on_its_own_device_without_touching_the_default():
    from rlxviz.kernels.mlx_backend import mx

    before = mx.default_device()
    ex = MlxExecutor(device="cpu")
    b = __import__("rlxviz.ir", fromlist=["Builder"]).Builder("t")
    x = b.input("x", (2, 3))
    b.output(b.gelu(x))
    g = b.build()
    out = ex.run(g, {"x": np.ones((2, 3), np.float32)})[0]
    assert out.shape == (2, 3) and ex.program(g).device == "cpu"
    assert mx.default_device() == before


def _tiny_versions():
    from rlxviz.ir import Builder

    graphs = []
    for act in ("gelu", "relu"):
        b = Builder(act)
        x = b.input("x", (4, 8))
        b.output(b.unary(act, b.linear(x, b.param("w", (8, 8)), b.param("b", (8,)))))
        graphs.append(b.build())
    return graphs, {"x": np.ones((4, 8), np.float32)}, {"w": np.eye(8, dtype=np.float32),
                                                           "b": np.zeros(8, np.float32)}


def test_interleaved_timing_records_rounds_context_and_speedups():
    from rlxviz.runtime.timing import time_versions_interleaved

    graphs, feeds, weights = _tiny_versions()
    run = time_versions_interleaved(graphs, feeds, weights, rounds=4, warmup=0, device="cpu")
    assert run.rounds == 4 and len(run.timings) == 2
    for t in run.timings:
        assert len(t.samples_ms) == 4 and t.min_ms <= t.median_ms and t.iqr_ms >= 0 and t.first_call_ms > 0
        assert t.context == run.context
    assert (run.context.device, run.context.precision) == ("cpu", "f32") and run.context.blas
    assert run.speedup(1) == pytest.approx(run.timings[0].median_ms / run.timings[1].median_ms)
    assert run.speedup(0) == 1.0
    assert "f32" in str(run.context) and "cpu" in str(run.context)
    with pytest.raises(ValueError, match="rounds"):
        time_versions_interleaved(graphs, feeds, weights, rounds=0)


def test_interleaved_rounds_rotate_the_order(monkeypatch):
    """Round k starts with version k mod n, so no version is always first (or always after another)."""
    import dataclasses

    from rlxviz.runtime import timing

    graphs, feeds, weights = _tiny_versions()
    order: list[int] = []
    real_fresh = timing._fresh

    def fresh(ex, g, f, w):
        prog, args, first = real_fresh(ex, g, f, w)
        idx = graphs.index(g)

        def fn(*a, _fn=prog.fn):
            order.append(idx)
            return _fn(*a)
        return dataclasses.replace(prog, fn=fn), args, first

    monkeypatch.setattr(timing, "_fresh", fresh)
    timing.time_versions_interleaved(graphs, feeds, weights, rounds=3, warmup=1, device="cpu")
    assert order == [0, 1] + [0, 1, 1, 0, 0, 1]  # warmup round, then rounds rotated by k


def test_pyproject_installs_exactly_one_mlx_backend():
    """`mlx-cpu` and `mlx-cuda-13` both install `mlx/lib/libmlx.so`: the base dependencies name no
    backend, and each extra names exactly one."""
    import re
    import tomllib
    from pathlib import Path

    meta = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]

    def backends(reqs):
        return {m.group(1) for r in reqs if (m := re.match(r"\s*mlx\[(\w+)\]", r))}

    assert backends(meta["dependencies"]) == set()
    assert any(re.match(r"\s*mlx[>=\s;]", r) for r in meta["dependencies"])
    extras = meta["optional-dependencies"]
    assert backends(extras["cpu"]) == {"cpu"} and backends(extras["cuda"]) == {"cuda13"}
    assert not backends(extras.get("dev", []))
