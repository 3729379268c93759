"""Devices, the per-device lowering choice and the precision policy, all checked on the CPU: the
choice functions are asked for each device, and the GPU's lowering runs (on the CPU) to the same numbers."""

import numpy as np
import pytest

from rlxviz.models import load_model
from rlxviz.passes import Pipeline
from rlxviz.runtime import devices, run_reference
from rlxviz.runtime.devices import DeviceError, precision_policy, resolve_device
from rlxviz.runtime.executor import MlxExecutor
from rlxviz.runtime.lowering import DEVICE_LOWERING, LoweringOptions, lowering_table, options_for
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
    assert precision_policy("cpu", env={}).name == "f32"
    assert precision_policy("gpu", "metal", env={}).name == "f32"
    tf32 = precision_policy("gpu", "cuda", env={})
    assert tf32.name == "tf32" and "unset" in tf32.note
    assert precision_policy("gpu", "cuda", env={"MLX_ENABLE_TF32": "1"}).name == "tf32"
    strict = precision_policy("gpu", "cuda", env={"MLX_ENABLE_TF32": "0"})
    assert strict.name == "f32" and (strict.rtol, strict.atol) == devices.TOLERANCE["f32"]
    assert tf32.rtol > strict.rtol and tf32.atol > strict.atol
    assert MlxExecutor(device="cpu").precision.name == "f32"


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
    from rlxviz.runtime.mlx_backend import mx

    before = mx.default_device()
    ex = MlxExecutor(device="cpu")
    b = __import__("rlxviz.ir", fromlist=["Builder"]).Builder("t")
    x = b.input("x", (2, 3))
    b.output(b.gelu(x))
    g = b.build()
    out = ex.run(g, {"x": np.ones((2, 3), np.float32)})[0]
    assert out.shape == (2, 3) and ex.program(g).device == "cpu"
    assert mx.default_device() == before
