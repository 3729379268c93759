"""Memory traffic a pass's fusions removed: intermediates that are no longer written and read back."""

from __future__ import annotations

from dataclasses import dataclass

from ..passes.trace import PassStep


@dataclass(frozen=True)
class Traffic:
    """Memory traffic a pass removed: intermediates that fused nodes no longer write or read.

    Attributes:
        intermediates: per removed intermediate, `(node id, op, bytes, users)`: its output tensor of
            `bytes` (node.nbytes) was written once and read by `users` nodes before the fusion.
        bytes_written / bytes_read: totals over the intermediates (bytes).
    """

    intermediates: tuple[tuple[int, str, int, int], ...]
    bytes_written: int
    bytes_read: int

    @property
    def total(self) -> int:
        return self.bytes_written + self.bytes_read

    def __str__(self) -> str:
        return (f"{len(self.intermediates)} intermediate tensor(s) no longer materialized: "
                f"{_kib(self.bytes_written)} not written + {_kib(self.bytes_read)} not read = {_kib(self.total)}")


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} B"


def traffic_saved(step: PassStep) -> Traffic:
    """Bytes of intermediates a pass's fusions no longer write to and read from memory.

    An intermediate is a compute node the pass absorbed whose every reader was absorbed too and
    which is not a graph output (the match's result is still written by the fused node, so it is
    not counted). Its tensor was written once (`node.nbytes`) and read once per user. A horizontal merge
    (`fuse_shared_input_matmul`: the result has the op of what it absorbed, a matmul/add) writes the
    same bytes as slices of one tensor, so it removes none (see `shared_input_saved` for what it does save).
    """
    before, after = step.before, step.after
    items = []
    for m in step.matches:
        if m.fused is None or m.fused not in after:
            continue
        if after[m.fused].op in {before[i].op for i in after[m.fused].absorbed if i in before}:
            continue  # a horizontal merge (n matmuls -> one matmul): same bytes, as slices (`shared_input_saved`)
        absorbed = set(after[m.fused].absorbed)
        for i in sorted(absorbed):
            if i not in before:
                continue
            n = before[i]
            users = before.users(i)
            if before.is_output(i) or any(u.id not in absorbed for u in users) or i in after:
                continue
            items.append((i, n.op.value, n.nbytes, len(users)))
    return Traffic(tuple(items), sum(b for _, _, b, _ in items), sum(b * u for _, _, b, u in items))


__all__ = ["SDPA_HEAD_DIMS", "ExecutedTraffic", "Traffic", "executed_traffic_saved", "runs_as", "sdpa_fused",
           "shared_input_saved", "traffic_saved"]


@dataclass(frozen=True)
class ExecutedTraffic:
    """The part of a pass's `Traffic` that MLX's own lowering on one device saves (a model).

    It models **MLX's own lowering only**: rlxviz's CPU kernels (`rlxviz.kernels`: attention, bias + GELU,
    residual + norm in one pass each, the CPU's default where they are built) are not modelled, so on a CPU
    that runs them the `cpu` figures are those of `LoweringOptions(kernels=False)`. What the program run
    here moves, kernels included, is read from MLX: `session.program.mlx_primitives(...).bytes`.

    A fused op runs on MLX as its decomposition (`ir.fused.expand`), op by op, except where the
    lowering merges steps into one kernel (`runtime.lowering`): `Emitter.linear` runs `x @ w + b` as one
    `mx.addmm` (on the GPU a GEMM epilogue reads the bias; on the CPU MLX 0.32 first fills the output
    with the broadcast bias and lets BLAS read and rewrite it, beta = 1, so it moves what matmul + add
    moves and saves 0 B: 12.008 ms matmul + add vs 11.981 ms addmm measured, issue 23), and an op in
    `OVERRIDES` whose override applies
    under the device's options (FusedTransformerLayer on the GPU, compiled ElementwiseRegions) is traced
    into one `mx.compile`d function, which fuses chains of elementwise ops (a matmul's output is still
    written). Every other intermediate is still written and read, fusion or not.

    Attributes:
        device: `cpu` or `gpu` (whose lowering options were read).
        lowering: what the figures model, said wherever they are printed.
        ideal: `traffic_saved(step)`: what one ideal kernel per fused op would save (bytes).
        saved / still_moved: per intermediate of `ideal.intermediates`, `(node id, op, bytes, users, why)`.
    """

    device: str
    ideal: Traffic
    saved: tuple[tuple[int, str, int, int, str], ...]
    still_moved: tuple[tuple[int, str, int, int, str], ...]
    lowering: str = "MLX's own lowering (rlxviz's CPU kernels not modelled)"

    @property
    def total(self) -> int:
        """Bytes written plus bytes read that the executed program no longer moves."""
        return sum(b * (1 + u) for _, _, b, u, _ in self.saved)

    @property
    def still_total(self) -> int:
        """Bytes of the ideal saving that the executed program still writes and reads."""
        return sum(b * (1 + u) for _, _, b, u, _ in self.still_moved)


def executed_traffic_saved(step: PassStep, device: str = "cpu") -> ExecutedTraffic:
    """Split `traffic_saved(step)` into what MLX on `device` saves and what it still moves.

    An intermediate counts as saved when the lowering computes it inside one kernel with its reader:
    on the GPU, a `matmul` whose only user is the bias `add` (a 1-D operand) of a linear (one `mx.addmm`
    whose epilogue reads the bias; on the CPU the same `mx.addmm` saves nothing, see `ExecutedTraffic`);
    inside a packed `attention` op when the device's attention lowering is `sdpa` and MLX's fused kernel
    takes that shape (`sdpa_fused`: head_dim 64, 80 or 128; others fall back to matmul, softmax, matmul,
    as MiniLM's head_dim 32 does on both GPU backends); or, inside a fused op whose compiled override
    applies on `device`, an elementwise op read only by elementwise ops.

    This is a **model** of the program MLX's own lowering executes (which kernels MLX's ops become; rlxviz's CPU
    kernels are not modelled, see `ExecutedTraffic`), not a reading of it:
    `session.program.mlx_primitives` reads the primitives MLX really runs, and is the check on this model.

    Raises:
        ValueError: unknown device.
    """
    from ..ir import Op
    from ..ir.ops import ELEMENTWISE
    from ..runtime.lowering import OVERRIDES, options_for

    options = options_for(device)
    ideal = traffic_saved(step)
    before, after = step.before, step.after
    compiled_nodes: set[int] = set()
    sdpa_nodes: set[int] = set()
    fused_of: dict[int, list[int]] = {}

    def after_ids(i: int) -> list[int]:
        return fused_of.get(i, [])

    for m in step.matches:
        if m.fused is None or m.fused not in after:
            continue
        over = OVERRIDES.get(after[m.fused].op)
        if over is not None and over.applies(options):
            compiled_nodes.update(after[m.fused].absorbed)
        if after[m.fused].op == Op.ATTENTION:
            sdpa_nodes.update(after[m.fused].absorbed)
        for a in after[m.fused].absorbed:
            fused_of.setdefault(a, []).append(m.fused)
    saved, still = [], []
    for i, op, nbytes, users in ideal.intermediates:
        readers = before.users(i)
        row = (i, op, nbytes, users)
        if i in sdpa_nodes:
            head_dim = next((after[a].attrs.get("head_dim") for a in after_ids(i)), None)
            if options.attention == "sdpa" and sdpa_fused(head_dim):
                saved.append((*row, "inside mx.fast.scaled_dot_product_attention (one kernel; model)"))
            elif options.attention == "sdpa":
                still.append((*row, f"mx.fast.scaled_dot_product_attention falls back to matmul, softmax, matmul "
                                    f"at head_dim {head_dim}"))
            else:
                still.append((*row, "attention composed on this device: matmul, softmax, matmul"))
        elif (before[i].op == Op.MATMUL and len(readers) == 1 and readers[0].op == Op.ADD
              and any(len(before[j].shape) == 1 for j in readers[0].inputs if j != i)):
            if device == "cpu":
                still.append((*row, "mx.addmm on the CPU pre-fills the output with the bias and BLAS reads and "
                                    "rewrites it (beta = 1): the bytes of matmul + add"))
            else:
                saved.append((*row, "matmul + bias add run as one mx.addmm (GEMM epilogue; model)"))
        elif i in compiled_nodes and before[i].op in ELEMENTWISE and all(u.op in ELEMENTWISE for u in readers):
            saved.append((*row, "elementwise chain inside one mx.compile'd function"))
        else:
            names = "/".join(sorted({u.op.value for u in readers}))
            still.append((*row, f"{op} and its reader ({names}) run as separate MLX kernels"))
    return ExecutedTraffic(device, ideal, tuple(saved), tuple(still))


SDPA_HEAD_DIMS = (64, 80, 128)
"""Head dims for which this model credits MLX's fused `scaled_dot_product_attention` on the GPU with a
full (not one-token) query: those of the Metal full-attention kernel. Other head dims run MLX's fallback
(matmul, softmax, matmul). MLX's CUDA backend, in the source read for issue 23
(`mlx/backend/cuda/scaled_dot_product_attention.cu`, `use_fallback`), takes only one-token queries (its
vector kernel, head dims 64/96/128/256) and falls back for every longer query, so on CUDA even these head
dims are credited too much. A model of MLX's dispatch; `session.program.mlx_primitives` on the device is
the reading that settles it."""


def sdpa_fused(head_dim: int | None) -> bool:
    """Whether MLX's fused SDPA kernel takes `head_dim` (`SDPA_HEAD_DIMS`; None: unknown, assumed not)."""
    return head_dim in SDPA_HEAD_DIMS


def runs_as(op: str, device: str = "cpu") -> str:
    """How the MLX lowering on `device` runs a fused op (by its IR name, e.g. `FusedTransformerLayer`), in words.

    Read from `runtime.lowering.OVERRIDES` under the device's options: `one mx.compile'd function` when
    an override applies there, else `its decomposition, op by op` (the fused op is a graph-level name; the
    kernels are those of `ir.fused.expand`, with `x @ w + b` as one `mx.addmm`).

    Raises:
        ValueError: unknown op name or device.
    """
    from ..ir import Op
    from ..runtime.lowering import OVERRIDES, options_for

    over = OVERRIDES.get(Op(op))
    if over is not None and over.applies(options_for(device)):
        return "one mx.compile'd function"
    return "its decomposition, op by op"


def shared_input_saved(step: PassStep) -> tuple[int, int]:
    """What a horizontal fusion (`fuse_shared_input_matmul`) saves: `(bytes, launches)`.

    n matmuls reading one `x` become one matmul over concatenated weights: `x` is read once instead
    of n times (n - 1 reads of `x.nbytes` saved); n - 1 matmul launches are saved, and n - 1 bias-add
    launches when their biases were merged too (roles `add0`, `add1`, ...; the weight and bias `concat`s
    are static, computed once per set of weights, and the `narrow`s are views). No intermediate
    disappears (the outputs are the same bytes, written as slices of one tensor). The launch count is
    checked against MLX's own program by `session.program.version_primitives` (MiniLM: 339 -> 315
    non-view primitives, 24 launches).
    """
    before = step.before
    nbytes = launches = 0
    for m in step.matches:
        group = [k for k in m.bindings if k.startswith("mm")]
        adds = [k for k in m.bindings if k.startswith("add")]
        x = m.bindings.get("x")
        if x is None or len(group) < 2:
            continue
        nbytes += (len(group) - 1) * before[x].nbytes
        launches += len(group) - 1 + max(len(adds) - 1, 0)
    return nbytes, launches
