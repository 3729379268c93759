"""Newcomer run 18's words: a T5 layer called LLaMA, a gap's model workaround printed as its fix, a search note that
named `layer 0` of both stacks, a stage's rule listed after its pass's refusal of the node it made, and a Timing tab
that kept the last run's figures up unmarked (and read "2.00x (over 2x)") while a new run measured."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from clirun import run

from rlxviz.models import load_model
from rlxviz.models.onnx.read import load_onnx
from rlxviz.passes import Pipeline
from rlxviz.passes.architecture import classify_layer
from rlxviz.passes.explain import explain
from rlxviz.passes.trace import layer_of
from rlxviz.session import VersionTiming, busy_warning

ROOT = Path(__file__).resolve().parents[1]
ORTOPT, ZOO, CASES = (ROOT / "tests/fixtures/onnx" / d for d in ("ortopt", "zoo", "cases"))


def _layers(path: Path) -> list:
    g = load_onnx(path, seq=16).graph
    return [classify_layer(g, k) for k in sorted({layer_of(n.path) for n in g} - {None})]


# --- 8: a layer is named by its traits; LLaMA only with RoPE and a gated MLP ---


@pytest.mark.parametrize("path", [ORTOPT / "t5-encoder.ortopt.onnx", ZOO / "t5-encoder.dynamo-eager.onnx"])
def test_a_t5_layer_is_named_t5_style_not_llama(path):
    for arch in _layers(path):
        assert arch.kind == "llama" and not arch.rope and not arch.swiglu, arch  # its kind: as before
        assert "LLaMA" not in arch.description, arch.description
        assert arch.description.startswith("T5-style: pre-norm RMSNorm, per-head position bias in the additive mask, "
                                           "no RoPE, no gated MLP;"), arch.description


@pytest.mark.parametrize("path", [ZOO / "olmo.dynamo-eager.onnx", ZOO / "stablelm.dynamo-eager.onnx"])
def test_a_layer_norm_llama_style_layer_is_not_called_rmsnorm(path):
    """OLMo and StableLM: RoPE and SwiGLU with LayerNorms, read "LLaMA: pre-norm RMSNorm; LayerNorm, ...": the head
    named a norm the layer does not have."""
    for arch in _layers(path):
        assert arch.norm == "LayerNorm" and "RMSNorm" not in arch.description, arch.description
        assert arch.description.startswith("LLaMA-style (RoPE, SwiGLU) with pre-norm LayerNorm;"), arch.description


def test_a_layer_without_recognized_rope_or_gate_is_not_named_llama():
    """GPT-OSS's layer (its rotary and its clamped gate are written in forms not recognized): named by what was found,
    never LLaMA and never "no RoPE" as a fact."""
    for arch in _layers(ZOO / "gpt-oss.dynamo-eager.onnx"):
        assert arch.kind == "llama" and not arch.rope
        assert arch.description.startswith("pre-norm RMSNorm (no RoPE or gated MLP recognized, so not named LLaMA);")


@pytest.mark.parametrize("traits, words", [
    (("RMSNorm", True, "SwiGLU", None), "LLaMA: pre-norm RMSNorm"),
    (("RMSNorm", False, "GeGLU", "relative position bias"),
     "T5-style: pre-norm RMSNorm, relative-position bias in the additive mask, no RoPE, GeGLU MLP"),
    (("RMSNorm", False, "SwiGLU", "ALiBi"), "pre-norm RMSNorm, ALiBi, SwiGLU MLP (no RoPE recognized, so not named "
                                            "LLaMA)"),
    (("RMSNorm", True, None, None), "pre-norm RMSNorm, RoPE (no gated MLP recognized, so not named LLaMA)"),
    (("none", False, "SwiGLU", None), "no norm, SwiGLU MLP (no RoPE recognized, so not named LLaMA)"),
])
def test_the_words_of_each_trait_combination(traits, words):
    from rlxviz.passes.architecture import _llama_words

    assert _llama_words(*traits) == words


@pytest.mark.parametrize("model, kind, head", [
    ("llama-block", "llama", "LLaMA: pre-norm RMSNorm; RMSNorm, RoPE, SwiGLU"),
    ("bert-tiny", "post_ln", "post-LN (BERT)"),
])
def test_presets_keep_their_names(model, kind, head):
    arch = classify_layer(load_model(model, seq=8).graph, 0)
    assert arch.kind == kind and arch.description.startswith(head), arch.description


@pytest.mark.parametrize("path, head", [
    (CASES / "granite.onnx", "LLaMA: pre-norm RMSNorm; RMSNorm, RoPE, SwiGLU"),
    (ORTOPT / "gemma.ortopt.onnx", "LLaMA: pre-norm RMSNorm; RMSNorm, RoPE, GeGLU"),
    (ORTOPT / "gpt2.ortopt.onnx", "pre-LN (GPT-2, ViT)"),
    (ROOT / "tests/fixtures/onnx/gpt2.onnx", "pre-LN (GPT-2, ViT)"),
    (ZOO / "esm.dynamo-eager.onnx", "pre-LN (GPT-2, ViT)"),
    (ZOO / "bart.encdec.onnx", "post-LN (BERT)"),
])
def test_other_models_keep_their_names(path, head):
    assert any(a.description.startswith(head) for a in _layers(path)), [a.description for a in _layers(path)]


def test_a_gaps_model_change_reads_as_a_workaround_after_the_compiler_fix(capsys):
    """T5's non-default attention scale: the headline says the fault is rlxviz's op (a compiler fix; a workaround in
    the model), and the rule's own lines said `fix: fold the scale into q ...` above the compiler fix."""
    code, out, _ = run(capsys, "explain", str(ORTOPT / "t5-encoder.ortopt.onnx"), "-v", "--layer", "0")
    lines = out.splitlines()
    at = next(i for i, ln in enumerate(lines) if "[rejected] fuse_attention_block.qkv_attention_out" in ln)
    assert "△ gap in rlxviz's ops" in lines[at]
    assert lines[at + 1].strip() == "compiler fix: give FusedAttentionBlock a scale attribute", lines[at:at + 3]
    assert lines[at + 2].strip().startswith("a workaround in the model: fold the scale into q"), lines[at:at + 3]
    assert not any(ln.strip().startswith("fix: fold the scale") for ln in lines)
    assert "LLaMA" not in out and "this layer is T5-style: pre-norm RMSNorm" in out


# --- 7: the search's note names the stack, as the Why tab's layer picker does ---


def test_the_search_note_names_encoder_and_decoder_layers():
    from rlxviz.app.graphpane import absorbed_index

    trace = Pipeline.canonical().run(load_onnx(CASES / "bart-full.onnx", seq=16).graph)
    notes = [note for held in absorbed_index(trace.final, trace).values() for op, _, note in held if op == "softmax"]
    assert notes and not any(re.search(r"\(layer \d+\)", n) for n in notes), notes
    assert any("(encoder layer 0)" in n for n in notes) and any("(decoder layer 0)" in n for n in notes), notes


def test_the_search_note_of_a_one_stack_model_says_layer_n():
    from rlxviz.app.graphpane import absorbed_index

    trace = Pipeline.canonical().run(load_model("bert-tiny", seq=8).graph)
    notes = [note for held in absorbed_index(trace.final, trace).values() for _, _, note in held]
    assert any("(layer 0)" in n for n in notes) and not any("encoder layer" in n for n in notes), notes


# --- 10: a pass's stages are listed before its own rules ---


def test_a_stage_rule_is_listed_before_its_pass_rule():
    trace = Pipeline.canonical().run(load_onnx(CASES / "gpt-neox.legacy-sdpa.onnx", seq=16).graph)
    rules = [o.rule for o in explain(trace, 0).outcomes]
    assert rules.index("fuse_attention_block.qkv_columns") < rules.index("fuse_attention_block.qkv_attention_out")
    sdpa = [r for r in rules if r.startswith("fuse_sdpa.")]
    assert sdpa[-1] == "fuse_sdpa.hf_attention", sdpa  # the pass's own rule after its stages' (head_layout, ...)
    assert rules.index("fuse_sdpa.head_layout") < rules.index("fuse_sdpa.rope_heads"), sdpa  # stage order


# --- 11: the busy words never contradict, and the last run's figures are marked while a new run measures ---


def _timed(i: int, samples: list[float]) -> VersionTiming:
    q1, q3 = np.percentile(samples, [25, 75])
    return VersionTiming(i, f"v{i}", 10, median_ms=float(np.median(samples)), min_ms=min(samples), first_call_ms=5.0,
                         max_abs=1e-7, iqr_ms=float(q3 - q1), samples_ms=tuple(samples))


@pytest.mark.parametrize("median, low", [(1.8801, 0.94), (1.884, 0.9402), (2.0001, 1.0), (0.9, 0.3)])
def test_the_busy_words_show_the_median_over_twice_the_minimum(median, low):
    """"median 1.88 ms is 2.00x (over 2x) the minimum 0.94 ms": every number printed must be over the limit too."""
    w = busy_warning(_timed(0, [low, median, median, median, 3.0]))
    m = re.search(r"median ([\d.]+) ms is ([\d.]+)x \(over 2x\) the minimum ([\d.]+) ms", w)
    assert m, w
    shown_median, shown_ratio, shown_min = (float(x) for x in m.groups())
    assert shown_ratio > 2 and shown_median > 2 * shown_min, w


def test_the_iqr_words_show_the_iqr_over_half_the_median():
    w = busy_warning(_timed(0, [0.5, 0.5, 1.0, 1.5, 1.5]))  # IQR 1.0 ms, median 1.0 ms
    m = re.search(r"IQR ([\d.]+) ms is ([\d.]+)x \(over 0.5x\) the median ([\d.]+) ms", w)
    assert m, w
    iqr, ratio, med = (float(x) for x in m.groups())
    assert ratio > 0.5 and iqr > 0.5 * med


def test_the_timing_tab_marks_the_last_runs_figures_while_a_new_run_measures():
    from rlxviz.app.jobs import Runner
    from rlxviz.app.state import AppState
    from rlxviz.app.timingview import PREVIOUS_MARK, TimingView
    from rlxviz.session import timing_table

    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8, repeat=100)
    view = TimingView(state=s)
    s.param.update(blas="MLX; 3 interleaved round(s) per version",
                   timings=timing_table([_timed(0, [1.0] * 21), _timed(1, [0.5] * 21)]))
    assert not view.previous.visible and not view.machine.object.startswith(f"**{PREVIOUS_MARK.strip()}**")
    s.timing_running = True
    assert view.previous.visible and "100 interleaved round(s)" in view.previous.object
    assert "previous run's" in view.previous.object
    for pane in (view.machine, view.blas):
        assert pane.object.startswith(f"**{PREVIOUS_MARK.strip()}**"), pane.object
    assert all(p.styles.get("opacity") == "0.45" for p in (view.machine, view.blas, view.chart, view.table))
    order = list(view.__panel__().objects)
    assert order.index(view.previous) < order.index(view.machine) < order.index(view.chart)
    s.timing_running = False
    assert not view.previous.visible and view.machine.object.startswith("**Quiet enough")
    assert all(p.styles.get("opacity") == "1" for p in (view.machine, view.blas, view.chart, view.table))


def test_a_timing_job_sets_and_clears_timing_running(monkeypatch):
    """The job marks the run under way on the page, and clears it whether it ends well or fails."""
    from rlxviz.app.jobs import Runner
    from rlxviz.app.state import AppState

    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    seen: list[bool] = []
    s.param.watch(lambda e: seen.append(e.new), "timing_running")
    from rlxviz.app import measure

    def boom(*a, **k):
        raise RuntimeError("no timing process here")

    monkeypatch.setattr(measure.timeproc, "time_in_worker", boom)
    s.time_all(fresh=True)
    assert seen == [True, False] and not s.timing_running and "Timing failed" in s.message
