"""The handed ONNX exports (tests/fixtures/onnx/cases, copied from shared/cases/onnx): each imports with the
exporter's own numbers (its outputs are stored in the npz as `out:NAME`), on the reference interpreter, for the
input version and the final version of the canonical pipeline. An import that changes the numbers can never
pass silently; and no cache in rlxviz is keyed by the `id()` of an object it does not hold (the Falcon bug:
a freed NumPy temporary's id reused, a later constant bound to an earlier node)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from rlxviz.ir.identity import IdentityMap
from rlxviz.models.onnx import load_onnx
from rlxviz.passes import Pipeline
from rlxviz.runtime import run_reference
from rlxviz.runtime.executor import MlxExecutor
from rlxviz.runtime.lowering import LoweringOptions
from rlxviz.session import check_fusion

CASES = Path(__file__).parent / "fixtures" / "onnx" / "cases"


def _io(name: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    d = dict(np.load(CASES / f"{name}_io.npz"))
    return ({k: v for k, v in d.items() if not k.startswith("out:")},
            {k[4:]: v for k, v in d.items() if k.startswith("out:")})


def _load(name: str):
    feeds, want = _io(name)
    return load_onnx(CASES / f"{name}.onnx", input_shapes={k: v.shape for k, v in feeds.items()}), feeds, want


@pytest.mark.parametrize("name", ["falcon", "roberta", "gpt-neox.legacy-sdpa"])
def test_export_imports_with_the_exporters_numbers(name):
    """Falcon (wrong numbers before), RoBERTa (CumSum position ids, GatherElements token types), GPT-NeoX's
    TorchScript sdpa export (IsNaN guard, partial rotary): input and final version, reference and MLX."""
    m, feeds, want = _load(name)
    (out,) = want.values()
    trace = Pipeline.canonical().run(m.graph)
    assert not [s.error for s in trace.steps if s.error]
    ex = MlxExecutor(LoweringOptions(fast_math=False))
    for g in (m.graph, trace.final):
        np.testing.assert_allclose(run_reference(g, feeds, m.weights)[0], out, atol=1e-5, rtol=0)
        np.testing.assert_allclose(np.asarray(ex.run(g, feeds, m.weights)[0]), out, atol=1e-5, rtol=0)


def test_roberta_layers_fuse_fully():
    m, _, _ = _load("roberta")
    check = check_fusion(Pipeline.canonical().run(m.graph), "roberta")
    assert [r.layer for r in check.layers] == [0, 1] and all(r.fused for r in check.layers)


def test_importing_twice_gives_the_same_graph():
    """The id() reuse made the bound constant depend on the allocator: the graph differed between imports."""
    a, _, _ = _load("falcon")
    b, _, _ = _load("falcon")
    assert a.graph.nodes == b.graph.nodes


def test_identity_map_holds_its_keys_so_an_id_is_never_reused():
    m: IdentityMap[np.ndarray, int] = IdentityMap()
    for i in range(200):  # each temporary would be freed at once without the map holding it
        m[np.zeros(3) + i] = i
    assert len(m) == 200 and sorted(m.get(k) for k in m) == list(range(200))
    other = np.zeros(3)
    assert other not in m and m.get(other) is None
    bounded: IdentityMap[object, int] = IdentityMap(limit=2)
    keys = [object() for _ in range(3)]
    for i, k in enumerate(keys):
        bounded[k] = i
    assert keys[0] not in bounded and bounded[keys[2]] == 2


def test_no_module_keys_a_cache_by_id_outside_identity_map():
    root = Path(__file__).parent.parent / "rlxviz"
    calls = []
    for p in root.rglob("*.py"):
        if p.name == "identity.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "id":
                calls.append(f"{p.relative_to(root)}:{node.lineno}")
    assert calls == []


def test_a_seq_past_a_computed_position_table_is_one_line(capsys):
    """RoBERTa's position ids are computed (cumsum of the mask), so no import-time check sees seq 128 run past its
    64-row table; the reference refuses the gather naming it (was: IndexError, exit 3)."""
    from clirun import one_line_error, run

    code, _, err = run(capsys, "explain", CASES / "roberta.onnx", "--batch", "1", "--seq", "128")
    assert code == 2
    one_line_error(err, "explain", "index values 1..128 lie outside the 64 rows of")


def test_torchscript_sdpa_guard_with_an_infinite_fill_packs_and_keeps_fully_masked_rows_zero():
    """TorchScript's sdpa export masks with `where(m, 0, -inf)` (as `[1]` tensors) and guards the softmax with
    `where(isnan(p), [0], p)`: a fully masked query row (left padding under the causal mask) is 0 there, not NaN.
    `canonicalize_exported.nan_guard_moved` moves the guard after the head merge, so the attention packs, and every
    version keeps those rows' numbers (checked against ONNX Runtime on the file, reference and MLX)."""
    import onnxruntime as ort

    m, feeds, _ = _load("gpt-neox.legacy-sdpa")
    trace = Pipeline.canonical().run(m.graph)
    assert [n.op.value for n in trace.final if n.op.value == "attention"] == ["attention"] * 2
    assert any(mt.rule == "canonicalize_exported.nan_guard_moved" for s in trace.steps for mt in s.matches)
    left = {**feeds, "attention_mask": np.array([[0, 0, 0, 1, 1, 1, 1, 1], [1] * 8], dtype=np.int64)}
    (want,) = ort.InferenceSession(str(CASES / "gpt-neox.legacy-sdpa.onnx"),
                                   providers=["CPUExecutionProvider"]).run(None, left)
    assert np.isfinite(want).all()
    exact, fast = MlxExecutor(LoweringOptions(fast_math=False)), MlxExecutor()  # fast: rlxviz's CPU kernels
    for _, g in trace.versions():
        np.testing.assert_allclose(run_reference(g, left, m.weights)[0], want, atol=1e-5, rtol=0)
        np.testing.assert_allclose(np.asarray(exact.run(g, left, m.weights)[0]), want, atol=1e-5, rtol=0)
        np.testing.assert_allclose(np.asarray(fast.run(g, left, m.weights)[0]), want, atol=1e-4, rtol=0)


def test_the_fused_list_names_only_nodes_a_version_holds():
    """`fuse_sdpa` rewrites a head split and then reads it into the rope op within one pass: the split's node is
    in no version, and the layer's "fused as expected" list named it `? %182`. It lists what a version holds."""
    m, _, _ = _load("gpt-neox.legacy-sdpa")
    trace = Pipeline.canonical().run(m.graph)
    held = {n.id: n.op.value for _, g in trace.versions() for n in g}
    for layer in check_fusion(trace, "gpt-neox").layers:
        assert layer.done
        for entry in layer.done:
            op, node = entry.split()[:2]
            assert held[int(node[1:])] == op, entry


def test_gpt_neox_export_layers_are_parallel_blocks_not_llama():
    """GPT-NeoX's layers (LayerNorm, RoPE, a GELU MLP, `use_parallel_residual`: ln1 feeds the attention, ln2 of the same
    stream the MLP) are parallel blocks; `rlxviz explain` called them "LLaMA: pre-norm RMSNorm; LayerNorm"."""
    m, _, _ = _load("gpt-neox.legacy-sdpa")
    layers = check_fusion(Pipeline.canonical().run(m.graph), "gpt-neox").layers
    assert layers
    for layer in layers:
        arch = layer.architecture
        assert (arch.kind, arch.norm, arch.rope) == ("parallel", "LayerNorm", True), arch
        assert "LLaMA" not in arch.description and any("of the same input" in e for e in arch.evidence), arch
