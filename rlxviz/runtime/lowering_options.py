"""How ops are lowered to MLX on each device: `LoweringOptions`, and the per-device choice with its evidence.

`LoweringOptions` is an immutable record held by one executor (one per session): nothing here is process-wide
mutable state. Fields left `None` take the device's choice from `DEVICE_LOWERING`. `runtime.lowering` re-exports
all of it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from .devices import cpu_cores
from .kernel_routing import GEMM_AUTO_MAX_ROWS


@dataclass(frozen=True)
class LoweringOptions:
    """How ops are lowered. Immutable and hashable: part of every program and compile-cache key.
    `None` means "the device's choice" (`DEVICE_LOWERING`, filled in by `for_device`).

    Attributes:
        fast_math: use `rlxviz.runtime.fast` (rational erf/tanh, polynomial exp) instead of
            `mx.erf`/`mx.exp`/`mx.tanh`/`mx.softmax` (errors <= ~1e-6, see `fast`).
        attention: `"sdpa"` (`mx.fast.scaled_dot_product_attention`) or `"composed"` (matmul +
            softmax + matmul); `"auto"` is the same as None.
        compile_fused: wrap each fast-math kernel (GELU, softmax, ...) and each compiled region or
            layer in `mx.compile`; False turns every compile off.
        compile_layers: trace each FusedTransformerLayer's decomposition into one `mx.compile`d function.
        regions: `"compiled"` (each ElementwiseRegion's decomposition in one `mx.compile`d function)
            or `"inline"` (its steps emitted as plain MLX ops, left to MLX).
        cpu_streams: on the CPU, run each fast-math kernel on this many CPU streams, split along
            axis 0 (MLX runs one elementwise kernel on one thread; separate streams run
            concurrently). 1 turns it off. CPU default: the cores this process may use.
        kernels: run attention, the bias + activation of fused linears and residual + norm with
            rlxviz's own CPU kernels (`rlxviz.kernels`, float32) when they are available; CPU only.
            Unfused ops keep MLX's.
        gemm: with `kernels`, run the dense layers of fused ops (`Emitter.linear` / `linear_act`: QKV, output
            projection, FFN, FusedMatMulBiasAct) as rlxviz's GEMM with the bias + activation in its epilogue
            and the weight packed once per weight array; False keeps `mx.addmm` / `mx.matmul` (OpenBLAS);
            `"auto"` (the CPU's default) runs it where the kernels target AVX-512 and `x` has at most
            `GEMM_AUTO_MAX_ROWS` rows, OpenBLAS elsewhere (the measurements: `DEVICE_LOWERING`).
    """

    fast_math: bool | None = None
    attention: str | None = None
    compile_fused: bool = True
    compile_layers: bool | None = None
    regions: str | None = None
    cpu_streams: int | None = None
    kernels: bool | None = None
    gemm: bool | str | None = None

    def for_device(self, device: str) -> LoweringOptions:
        """These options with every `None` (or `attention="auto"`) replaced by `device`'s choice.

        Raises:
            ValueError: an unknown device, attention kernel or region lowering.
        """
        if device not in DEVICE_LOWERING:
            raise ValueError(f"unknown device {device!r}: one of {', '.join(DEVICE_LOWERING)}")
        choice = DEVICE_LOWERING[device]
        filled = {f.name: choice[f.name].value if getattr(self, f.name) in (None, "auto") and f.name in choice
                  else getattr(self, f.name) for f in fields(self)}
        if filled["attention"] not in ("sdpa", "composed"):
            raise ValueError(f"attention must be 'sdpa', 'composed' or 'auto', got {filled['attention']!r}")
        if filled["regions"] not in ("compiled", "inline"):
            raise ValueError(f"regions must be 'compiled' or 'inline', got {filled['regions']!r}")
        if not (isinstance(filled["gemm"], bool) or filled["gemm"] == "auto"):
            raise ValueError(f"gemm must be True, False or 'auto', got {filled['gemm']!r}")
        return replace(self, **filled)


@dataclass(frozen=True)
class Choice:
    """One lowering choice on one device and why (the evidence, with where it was measured)."""

    value: Any
    why: str


DEVICE_LOWERING: dict[str, dict[str, Choice]] = {
    "cpu": {
        "fast_math": Choice(True, "MLX's CPU erf/exp/tanh are scalar code: erf-GELU [1024,1536] 42 -> 7 ms, "
                                  "softmax [8,12,128,128] 19 -> 10 ms (2 EPYC cores, `bench_runtime.py --micro`)"),
        "attention": Choice("composed", "MLX 0.32's CPU SDPA takes a slower unfused path: 66-110 vs ~20 ms at "
                                        "B=8, S=128, 12 heads (`bench_runtime.py --micro`)"),
        "compile_layers": Choice(False, "a compiled CPU graph runs its elementwise work serially on one thread: "
                                        "MiniLM batch 8, 272 ms compiled vs 230 ms not"),
        "regions": Choice("compiled", "compiling a chain fuses it into one pass over memory "
                                      "(fast softmax [8,12,128,128] 11.2 -> 7.4 ms)"),
        "cpu_streams": Choice(cpu_cores(), "one CPU stream per core this process may use; MLX runs one "
                                           "elementwise kernel on one thread (measurements: README, runtime)"),
        "kernels": Choice(True, "rlxviz's CPU kernels (attention in one pass over K/V per head, bias + GELU, "
                                "residual + LayerNorm; threaded): MiniLM fully fused, B=8, one thread, 301 vs "
                                "411 ms CPU time with MLX's lowering (`bench_kernels.py`, load 7, 2026-12-02)"),
        "gemm": Choice("auto", "AVX-512, at most 512 rows: rlxviz's GEMM (one thread pool, kept warm, instead "
                               "of OpenBLAS's beside it): MiniLM fused B=1 12.0-13.4 vs 12.7-15.5 ms, B=4 38.3 "
                               "vs 40.8; at B=8 (1024 rows) OpenBLAS 72.6-75.9 vs 80.4-81.9 (2 AMD EPYC Zen 5 "
                               "cores, own processes, `bench_processes.py`, 2026-12-03; docs/performance.md "
                               "0.4). AVX2: OpenBLAS, as rlxviz's GEMM did not win end to end on 2 Zen 1 cores "
                               "(B=1 mixed, 2026-12-03, section 0.3)"),
    },
    "gpu": {
        "fast_math": Choice(False, "MLX's own GPU kernels: the fast-math formulation ran 1.46x slower than "
                                   "mx.erf + mx.fast SDPA on an H200 (2.89 vs 1.98 ms, issue 12)"),
        "attention": Choice("sdpa", "mx.fast.scaled_dot_product_attention is a fused GPU kernel "
                                    "(the fastest rlxviz row on the H200 used it, issue 12)"),
        "compile_layers": Choice(True, "one compiled function per layer: 13-op fused graph 2.50 ms vs 3.54 ms "
                                       "for the 109-op input on the H200 (issue 12)"),
        "regions": Choice("inline", "compiled regions made the final version slower on the H200 (3.12 vs "
                                    "2.50 ms, issue 12); inline leaves the steps to MLX as in the faster version"),
        "cpu_streams": Choice(1, "row-parallel CPU streams do not apply on the GPU"),
        "kernels": Choice(False, "rlxviz's kernels are CPU code; the GPU keeps MLX's fused kernels"),
        "gemm": Choice(False, "rlxviz's GEMM is CPU code; the GPU keeps MLX's matmul"),
    },
}
"""The lowering chosen per device, with the measurement behind each choice. GPU rows come from the
H200 measurements in issue 12 (MLX 0.32.4 CUDA 13); they were not re-measured by the session that
wrote this table (no GPU available to it)."""


def options_for(device: str, **overrides: Any) -> LoweringOptions:
    """The lowering options for `device` (`cpu` / `gpu`), with `overrides` (field=value) taking precedence."""
    return LoweringOptions(**overrides).for_device(device)


def lowering_table() -> list[dict[str, str]]:
    """`DEVICE_LOWERING` as rows `{option, cpu, gpu, why cpu, why gpu}` (for the README and the app)."""
    cpu, gpu = DEVICE_LOWERING["cpu"], DEVICE_LOWERING["gpu"]
    return [{"option": k, "cpu": str(cpu[k].value), "gpu": str(gpu[k].value), "why cpu": cpu[k].why,
             "why gpu": gpu[k].why} for k in cpu]


__all__ = ["DEVICE_LOWERING", "GEMM_AUTO_MAX_ROWS", "Choice", "LoweringOptions", "lowering_table", "options_for"]
