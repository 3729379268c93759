"""The precision policy: which dtype a graph runs in, on which device, how float32 matmuls are computed
there, and how close is close enough. One table, one record, one way to get it (`precision_policy`).

One table (`TABLE`) gives two tolerances per float dtype and device kind:

* `oracle`: a version's output vs the oracle (`run_oracle`: the unfused graph in float64);
* `same_backend`: a version's output vs the unfused graph run on the same backend in the same dtype
  (fused vs unfused; a difference here is a pass's fault, not the dtype's).

An output is within a tolerance when every element satisfies `|got - want| <= atol + rtol * |want|`
(`numpy.allclose`). The values, and why:

| dtype | device kind | vs oracle (rtol, atol) | fused vs unfused (rtol, atol) |
|---|---|---|---|
| f64 | cpu | 1e-9, 1e-9 | 1e-9, 1e-9 |
| f32 | cpu, metal, cuda (TF32 off) | 1e-3, 1e-4 | 1e-4, 1e-4 |
| f32 | cuda+tf32 (MLX's CUDA default) | 2e-2, 2e-2 | 2e-2, 2e-2 |
| f16 | any | 1e-2, 1e-2 | 1e-2, 1e-2 |
| bf16 | any | 5e-2, 5e-2 | 5e-2, 5e-2 |

Why: f64 rounds at 2^-53 over a few hundred ops; f32 (2^-24) runs through 6+ layers and fast-math
kernels (<= ~1e-6 each); TF32 rounds matmul operands to a 10-bit mantissa (2^-11; 4.1e-3 measured on
minilm-shaped, issue 11, and ~1e-2 expected over six layers); f16 (2^-11) and bf16 (2^-8) round every intermediate.

A graph's dtype is its narrowest float dtype among inputs, params and outputs (a mixed graph is judged
by its weakest part). The device kind says how float32 matmuls run: MLX's CUDA backend computes them in
TF32 (inputs rounded to a 10-bit mantissa, float32 accumulation) unless `MLX_ENABLE_TF32=0` is set before
MLX starts (`cuda+tf32`, else `cuda`); Metal and the CPU compute them in float32. Every timing row records
the policy (`runtime.timing.TimingContext`), and equivalence checks use the tolerance of the policy in force.

**Who judges** (`judge_of`, the one choice every caller takes, through `precision_policy` and
`runtime.compare.baselines`): the float64 oracle, except for a graph whose numbers pass through a quantization step
(`rounding_steps`: a float -> u8/i8 cast of `round(x / scale) + zero_point`, what QuantizeLinear and
DynamicQuantizeLinear import as, and what feeds MatMulInteger). There a value on a rounding boundary (x / scale = k +
0.5 within float32's rounding) rounds to one integer in float32 and to its neighbour in float64, and everything
downstream moves by a whole quantization step: the oracle is no judge of the graph's float32 numbers. Such a graph's
versions are judged against version 0 (the unfused graph) run on the same backend in its own dtype, with the
`same_backend` tolerance (`Judge`); version 0 itself is checked against ONNX Runtime on the file as written
(`session.fidelity`). A version that changes what is quantized (a scale folded across the quantize step, a
quantizer dropped) still differs from version 0 and is flagged.

This module imports no MLX: `runtime.devices` (which does) is read only when a `cpu` / `gpu` device has to
be looked up on this machine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..ir import DType, Graph, Node, Op

TF32_ENV = "MLX_ENABLE_TF32"
KINDS = ("cpu", "metal", "cuda", "cuda+tf32")
"""The device kinds of `TABLE`: how float32 matmuls run (CPU, Metal, CUDA with TF32 off, CUDA with TF32)."""


@dataclass(frozen=True)
class Tolerance:
    """`|got - want| <= atol + rtol * |want|` element-wise (rtol relative, atol in the output's units)."""

    rtol: float
    atol: float

    def __str__(self) -> str:
        return f"rtol {self.rtol:g}, atol {self.atol:g}"


_F64, _F32, _TF32 = Tolerance(1e-9, 1e-9), Tolerance(1e-3, 1e-4), Tolerance(2e-2, 2e-2)
TABLE: dict[tuple[DType, str], tuple[Tolerance, Tolerance]] = {
    (DType.f64, "cpu"): (_F64, _F64),
    (DType.f32, "cpu"): (_F32, Tolerance(1e-4, 1e-4)),
    (DType.f32, "metal"): (_F32, Tolerance(1e-4, 1e-4)),
    (DType.f32, "cuda"): (_F32, Tolerance(1e-4, 1e-4)),
    (DType.f32, "cuda+tf32"): (_TF32, _TF32),
    **{(DType.f16, d): (Tolerance(1e-2, 1e-2), Tolerance(1e-2, 1e-2)) for d in KINDS},
    **{(DType.bf16, d): (Tolerance(5e-2, 5e-2), Tolerance(5e-2, 5e-2)) for d in KINDS},
}
"""(dtype, device kind) -> (vs oracle, fused vs unfused). Device kinds: `KINDS`."""


def quantizers(g: Graph) -> list[Node]:
    """The float -> u8/i8 casts of `g` (its quantization steps: the quantized tensors), in graph order."""
    return [n for n in g if n.op == Op.CAST and n.dtype in (DType.u8, DType.i8) and g[n.inputs[0]].dtype.is_float]


ROUNDING_WALK = 16
"""How far up a quantizer's chain (cast <- clamp <- add zero point <- round half even <- floor) its rounding is
looked for (`rounding_steps`)."""


def rounding_steps(g: Graph) -> list[Node]:
    """The quantizers of `g` (`quantizers`) that round: a `floor` within `ROUNDING_WALK` nodes up their chain (the
    importer's round-half-even of QuantizeLinear / DynamicQuantizeLinear). A cast of a 0/1 mask to u8 is no
    quantization step: nothing there lies on a rounding boundary."""
    out = []
    for n in quantizers(g):
        seen, todo = {n.id}, [n.id]
        for _ in range(ROUNDING_WALK):
            todo = list(dict.fromkeys(j for i in todo for j in g[i].inputs if j not in seen))
            seen.update(todo)
            if any(g[j].op == Op.FLOOR for j in todo):
                out.append(n)
                break
    return out


@dataclass(frozen=True)
class Judge:
    """What a graph's versions are judged against (`judge_of`).

    Attributes:
        steps: the graph's quantization steps (`rounding_steps`); 0: the float64 oracle judges (the unfused graph in
            float64, with the `oracle` tolerance), else version 0 (the unfused graph) on the backend under test in
            the graph's dtype, with the `same_backend` tolerance.
        first: the first quantization step, e.g. `%12 cast u8[2, 8, 32]`, '' when `steps` is 0.
    """

    steps: int = 0
    first: str = ""

    @property
    def oracle(self) -> bool:
        """The float64 oracle judges (no quantization step)."""
        return not self.steps

    def line(self, dtype: DType | str = DType.f32) -> str:
        """One clause for a quantized graph ('' when the oracle judges), e.g. `quantized graph: versions judged
        against version 0 in f32; the float64 oracle does not apply (rounding boundaries: 12 quantization
        step(s), first %5 cast u8[4])`."""
        if self.oracle:
            return ""
        return (f"quantized graph: versions judged against version 0 in {dtype}; the float64 oracle does not apply "
                f"(rounding boundaries: {self.steps} quantization step(s), first {self.first})")


def judge_of(graph: Graph) -> Judge:
    """Who judges `graph`'s versions: the float64 oracle, or, when the graph rounds a float to a quantized integer
    (`rounding_steps`, module doc), version 0 in the graph's own dtype. The one place the choice is made:
    `precision_policy` (what the CLI and the app print) and `runtime.compare.baselines` (what the verdicts compare
    with) both ask it."""
    q = rounding_steps(graph)
    return Judge(len(q), f"%{q[0].id} {q[0].op.value} {q[0].type}" if q else "")


_RANK = {DType.bf16: 0, DType.f16: 1, DType.f32: 2, DType.f64: 3}
_WHERE = {"cpu": "CPU", "metal": "Metal GPU", "cuda": "CUDA (TF32 off)", "cuda+tf32": "CUDA, float32 matmuls in TF32"}


@dataclass(frozen=True)
class PrecisionPolicy:
    """How a graph runs and is judged on one device.

    Attributes:
        dtype: the graph's float dtype (its narrowest among inputs, params and outputs; `f32` for a
            device-only policy such as `MlxExecutor.precision`).
        device: the device kind, a `KINDS` entry: `cpu`, `metal`, `cuda` (TF32 off) or `cuda+tf32`.
        oracle: the tolerance vs the float64 oracle, from `TABLE[dtype, device]`.
        same_backend: the tolerance vs the unfused graph on the same backend and dtype, from the same row.
        note: where the device kind comes from, e.g. `MLX_ENABLE_TF32 unset: MLX's CUDA default (TF32)`.
        judge: what the versions are judged against (`judge_of` the graph; the float64 oracle for a policy made
            from a dtype).
    """

    dtype: DType
    device: str
    oracle: Tolerance
    same_backend: Tolerance
    note: str = ""
    judge: Judge = Judge()

    @property
    def tf32(self) -> bool:
        """Float32 matmuls run in TF32 (CUDA without `MLX_ENABLE_TF32=0`)."""
        return self.device == "cuda+tf32"

    @property
    def matmuls(self) -> str:
        """How float32 matmuls run: `tf32` (10-bit mantissa inputs, float32 accumulation) or `f32`."""
        return "tf32" if self.tf32 else "f32"

    def ok_rule(self) -> str:
        """What a version's `ok` is judged against, one line for `rlxviz time` (text and `--json`) and the app's
        Timing tab: the tolerance in force as the element-wise bound (`Tolerance`: `|got - want| <= atol +
        rtol * |want|`, so an output of scale 10 passes an absolute error of 1e-2 with rtol 1e-3), and the judge
        (the float64 oracle, or version 0 for a quantized graph), e.g. `ok: every output element within 0.0001 +
        0.001 x |want| of the float64 oracle (the unfused graph), on every input set; "vs oracle" is the largest
        |error|, in the output's units`."""
        if self.judge.oracle:
            tol, judge, column = self.oracle, "the float64 oracle (the unfused graph)", "vs oracle"
        else:
            tol, judge, column = self.same_backend, f"version 0 in {self.dtype}", "vs input"
        return (f"ok: every output element within {tol.atol:g} + {tol.rtol:g} x |want| of {judge}, on every input "
                f"set; \"{column}\" is the largest |error|, in the output's units")

    def describe(self) -> str:
        """One line for the CLI and the page (a quantized graph's names its judge: `Judge.line`)."""
        if not self.judge.oracle:
            return (f"precision: {self.dtype} on MLX {_WHERE[self.device]}; {self.judge.line(self.dtype)}; fused vs "
                    f"version 0 on MLX in {self.dtype} ({self.same_backend})")
        return (f"precision: {self.dtype} on MLX {_WHERE[self.device]}; oracle: the unfused graph in float64 "
                f"({self.oracle}); fused vs unfused on MLX in {self.dtype} ({self.same_backend})")


def graph_dtype(graph: Graph) -> DType:
    """The narrowest float dtype among the graph's inputs, params and outputs (f32 if it has none)."""
    found = [n.dtype for n in graph if n.op in (Op.INPUT, Op.PARAM) and n.dtype in _RANK]
    found += [graph[o].dtype for o in graph.outputs if graph[o].dtype in _RANK]
    return min(found, key=_RANK.__getitem__) if found else DType.f32


def _device_kind(device: str | None, backend: str | None, env: Mapping[str, str]) -> tuple[str, str]:
    """(device kind, where it comes from) for an MLX device or a `KINDS` entry."""
    if device in KINDS[1:]:
        return device, f"{device}: as given"
    from .devices import DEVICES, DeviceError, gpu_backend, resolve_device  # MLX only when a device is looked up

    if device not in (None, "auto", *DEVICES):
        raise DeviceError(f"unknown device {device!r}: use one of {', '.join(DEVICES)} or auto, or a device "
                          f"kind: {', '.join(KINDS)}")
    name = device if device == "cpu" or (device == "gpu" and backend) else resolve_device(device)
    if name == "cpu":
        return "cpu", "CPU: float32 matmuls"
    if (backend or gpu_backend()) != "cuda":
        return "metal", "Metal: float32 matmuls"
    flag = env.get(TF32_ENV)
    if flag is not None and flag.strip() == "0":
        return "cuda", f"{TF32_ENV}=0: full float32 matmuls on CUDA"
    return "cuda+tf32", f"{TF32_ENV} {'=' + flag if flag is not None else 'unset'}: MLX's CUDA default (TF32)"


def precision_policy(dtype: DType | Graph = DType.f32, device: str | None = None, *, backend: str | None = None,
                     env: Mapping[str, str] | None = None) -> PrecisionPolicy:
    """The precision policy for a dtype (or a graph's dtype) on a device: the one way to get one.

    Args:
        dtype: the dtype judged, or a graph (judged by `graph_dtype(graph)`); default `f32`, the device's
            float32 matmul policy alone (what `MlxExecutor.precision` records).
        device: an MLX device, `cpu` or `gpu`, or None / `auto` for the one `runtime.devices` picks; or a
            device kind `metal`, `cuda`, `cuda+tf32` taken as given (nothing is asked of this machine).
        backend: the GPU backend (`metal`, `cuda`) when `device` is `gpu`; default: this machine's
            (`devices.gpu_backend()`).
        env: the environment `MLX_ENABLE_TF32` is read from (default `os.environ`).

    Returns:
        The `PrecisionPolicy`, its tolerances from `TABLE`; for a graph, its judge (`judge_of`).

    Raises:
        DeviceError: an unknown device, or `gpu` (without `backend`) where MLX has no GPU (a ValueError).
        KeyError: no `TABLE` row for the dtype on that device kind (names both and the known rows).

    Example:
        >>> precision_policy(DType.f16, "cpu").oracle.rtol
        0.01
        >>> precision_policy(device="gpu", backend="cuda", env={}).matmuls
        'tf32'
    """
    kind, note = _device_kind(device, backend, os.environ if env is None else env)
    dt = graph_dtype(dtype) if isinstance(dtype, Graph) else dtype
    if (dt, kind) not in TABLE:
        raise KeyError(f"no tolerance for {dt} on {kind}; known: " + ", ".join(f"{d}/{v}" for d, v in TABLE))
    oracle, same = TABLE[dt, kind]
    return PrecisionPolicy(dt, kind, oracle, same, note, judge_of(dtype) if isinstance(dtype, Graph) else Judge())


__all__ = ["KINDS", "TABLE", "TF32_ENV", "Judge", "PrecisionPolicy", "Tolerance", "graph_dtype", "judge_of",
           "precision_policy", "quantizers", "rounding_steps"]
