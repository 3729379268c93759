"""No "(exact)" without numbers (issue 38): `explain`'s numeric check covers every version whose pass claims exactness,
with fully masked and left-padded rows in every mask form (an additive mask input also with -inf fills), and a graph
without a mask input whose passes claim exactness on its random inputs. A disagreement is a failed check, exit 1,
naming the pass.

Over the handed cases (tests/data/cases, copied from ../shared/cases, with n4-03's own inputs) and variants written
here: an additive float mask input before Llama 4's chunked `where` (the form the overflow of n4-03 came from), in f32
and f16, and the old overflowing operand put back to see the check fail."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from clirun import file_inputs
from test_mask_combinations import _old_operand, chunked_attention, weights_for
from zoo_sample import zoo_files

from rlxviz.cli import main
from rlxviz.ir import Builder, DType, Graph, format_graph
from rlxviz.passes import Pipeline
from rlxviz.passes.rules import where_mask
from rlxviz.runtime.battery import battery
from rlxviz.session import load
from rlxviz.session.exactness import (
    CLAIM,
    NO_MASK_NO_CLAIM,
    NOTHING_CHANGED,
    check_exactness,
    claims_exact,
    fill_sets,
    run_macs,
)

TESTS = Path(__file__).parent
CASES = TESTS / "data" / "cases"
B, S, H, NH = 2, 8, 16, 2
_chunk = np.tril(np.ones((S, S), bool)) & (np.arange(S)[:, None] // 4 == np.arange(S)[None, :] // 4)


def additive_input_chunked(dtype: str = "f32", cond: bool = True) -> Graph:
    """softmax(where(chunk, q k^T / sqrt(d) + attention_mask, finfo.min)) @ v with the padding mask an additive float
    input `[B, 1, 1, S]` (0 keep, the dtype's lowest value masked): n4-03's form with the mask given additive."""
    dt = DType(dtype)
    low = float(np.finfo(np.float16 if dtype == "f16" else np.float32).min)
    b = Builder(f"additive_chunked_{dtype}")
    x = b.input("x", (B, S, H), dt)
    m = b.input("attention_mask", (B, 1, 1, S), dt)

    def heads(name: str) -> int:
        return b.transpose(b.reshape(b.matmul(x, b.param(f"{name}.weight", (H, H), dt)), (B, S, NH, H // NH)),
                           (0, 2, 1, 3))

    q, k, v = heads("q"), heads("k"), heads("v")
    s = b.add(b.div(b.matmul(q, b.transpose(k, (0, 1, 3, 2))), b.const(float(np.sqrt(H // NH)), dt)), m)
    if cond:
        s = b.where(b.const(_chunk[None, None].tolist(), DType.bool), s, b.const(low, dt))
    ctx = b.reshape(b.transpose(b.matmul(b.softmax(s, -1), v), (0, 2, 1, 3)), (B, S, H))
    b.output(b.matmul(ctx, b.param("o.weight", (H, H), dt)))
    return b.build()


def _feeds(g: Graph, rng: np.random.Generator) -> dict[str, np.ndarray]:
    dt = g.inputs[0].dtype.numpy
    return {"x": rng.standard_normal((B, S, H)).astype(dt), "attention_mask": np.zeros((B, 1, 1, S), dt)}


def _handed() -> list[Path]:
    return sorted(p for d in ("cases", "diag", "epilogue") for p in (TESTS / "data" / d).glob("*.rlx"))


@pytest.mark.parametrize("path", _handed(), ids=lambda p: p.name)
def test_no_exact_claim_on_a_differing_version(path):
    """Every handed case: when a pass of the run says `(exact)`, explain's check ran (not skipped), covered that pass's
    version and found it equal to the unfused graph on every input set."""
    m = load(str(path), input_shapes=file_inputs(path).get("shapes"))
    trace = Pipeline.canonical().run(m.graph)
    c = check_exactness(trace, m.random_feeds(0), m.weights)
    claimed = claims_exact(trace)
    said = any(CLAIM in r.message for r in trace.rejections)
    assert bool(claimed) == said
    if c.skipped in (NO_MASK_NO_CLAIM, NOTHING_CHANGED):  # said why, never a silent null
        assert not claimed or not any(s.changed for s in trace.steps if not s.error)
        assert c.line() == f"numbers not checked by explain: {c.skipped}" and c.ok and not c.checked
        return
    assert not c.skipped, c.skipped
    assert c.ok, c.line()
    distinct = [f"after {s.pass_name}" for s in trace.steps if s.changed and not s.error]
    assert {f"after {p}" for p in claimed if f"after {p}" in distinct} <= set(c.checked)


@pytest.mark.parametrize("npz", ["n4-03-leftpad5.npz", "n4-03-masked.npz"])
def test_chunked_case_with_its_own_inputs(capsys, npz):
    """n4-03 with the inputs handed with it: explain exits 0 and its check covers fuse_sdpa's version, which says
    `(exact)` for the where it keeps as an additive operand."""
    code = main(["explain", str(CASES / "n4-03-chunked-attn-llama4.rlx"), "--inputs", str(CASES / npz), "--json"])
    doc = json.loads(capsys.readouterr().out)
    check = doc["numeric_check"]
    assert code == 0 and check["ok"] and check["claimed_exact"] == ["fuse_sdpa"]
    assert "after fuse_sdpa" in check["checked"] and check["inputs"] == ["fully_masked_row", "left_padding"]


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_additive_mask_input_runs_with_extreme_fills(dtype):
    """An additive float mask input: the check also runs each mask set with -inf in place of finfo.min, and every
    version equals the unfused graph there (fuse_sdpa's where operand does not add the two fills)."""
    g = additive_input_chunked(dtype)
    rng = np.random.default_rng(0)
    trace = Pipeline.canonical().run(g)
    c = check_exactness(trace, _feeds(g, rng), weights_for(g, rng))
    assert c is not None and c.ok and not c.skipped, c.line()
    assert c.fills == ("fully_masked_row (-inf fill)", "left_padding (-inf fill)")
    assert c.to_dict()["fills"] == list(c.fills)
    (s,) = fill_sets(g, battery(g, _feeds(g, rng), kinds=("fully_masked_row",)).sets)
    assert np.isneginf(s.feeds["attention_mask"][-1]).all() and (s.feeds["attention_mask"][0] == 0).all()


def test_keep_mask_graph_has_no_fill_sets():
    """A 0/1 keep mask (n4-03's integer mask) is not additive: no -inf fill to write."""
    g = chunked_attention()
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((B, S, H)).astype(np.float32), "attention_mask": np.ones((B, S), np.int64)}
    c = check_exactness(Pipeline.canonical().run(g), feeds, weights_for(g, rng))
    assert c is not None and c.ok and c.fills == ()


@pytest.mark.parametrize("make", [lambda: additive_input_chunked("f32"), lambda: chunked_attention()],
                         ids=["additive-input", "keep-mask"])
def test_the_old_overflowing_operand_fails_the_check_naming_the_pass(monkeypatch, tmp_path, capsys, make):
    """With the where-mask rewrite that added the two fills put back, the check fails and names fuse_sdpa; `explain`
    prints the disagreement and exits 1."""
    monkeypatch.setattr(where_mask, "biased_operand", _old_operand)
    g = make()
    rng = np.random.default_rng(0)
    feeds = _feeds(g, rng) if g.inputs[1].dtype.is_float else {
        "x": rng.standard_normal((B, S, H)).astype(np.float32), "attention_mask": np.ones((B, S), np.int64)}
    c = check_exactness(Pipeline.canonical().run(g), feeds, weights_for(g, rng))
    assert c is not None and not c.ok and c.bad[0].changed_by == "fuse_sdpa", c.line()
    path = tmp_path / "g.rlx"
    path.write_text(format_graph(g))
    assert main(["explain", str(path)]) == 1
    assert "fuse_sdpa changed the numbers although its rewrites are stated exact" in capsys.readouterr().out


def test_past_the_budget_the_claimed_versions_are_checked_with_the_final():
    """Between "every version" and "the final version alone", the versions of the passes that claim exactness are
    checked with the final one."""
    g = chunked_attention()
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((B, S, H)).astype(np.float32), "attention_mask": np.ones((B, S), np.int64)}
    trace = Pipeline.canonical().run(g)
    assert claims_exact(trace) == ("fuse_sdpa",)
    distinct = [f"after {s.pass_name}" for s in trace.steps if s.changed]
    assert len(distinct) > 2 and distinct[0] == "after fuse_sdpa" and distinct[-1] != "after fuse_sdpa"
    per = run_macs(trace.input) * 2
    c = check_exactness(trace, feeds, weights_for(g, rng), budget_macs=per * 3)
    assert c.ok and c.checked == ("after fuse_sdpa", distinct[-1])


def test_a_graph_without_a_mask_input_is_checked_when_a_pass_claims_exactness():
    """n3-17b: the sliding window is a constant additive band (no mask input); fuse_sdpa says it keeps it `(exact)`,
    so its version is checked on the random inputs."""
    m = load(str(CASES / "n3-17b-sliding-window-additive.rlx"))
    trace = Pipeline.canonical().run(m.graph)
    c = check_exactness(trace, m.random_feeds(0), m.weights)
    assert claims_exact(trace) == ("fuse_sdpa",) and not c.skipped and c.inputs == ("random",)
    assert c.ok and "after fuse_sdpa" in c.checked


def _fixtures() -> list[Path]:
    onnx = TESTS / "fixtures" / "onnx"
    # of the zoo every architecture and form (`zoo_sample`; every file with RLXVIZ_SWEEP=all)
    return sorted(p for p in [*onnx.glob("*.onnx"), *(onnx / "cases").glob("*.onnx"), *zoo_files()]
                  if p.stem != "minilm")  # minilm.onnx keeps its weights in a file not in the fixtures


@pytest.mark.slow
@pytest.mark.sweep
@pytest.mark.parametrize("path", _fixtures(), ids=lambda p: p.name)
def test_no_exact_claim_on_a_differing_version_in_the_fixtures(path):
    """The ONNX fixtures (the zoo and the handed ONNX cases): the same as the handed IR cases."""
    test_no_exact_claim_on_a_differing_version(path)
