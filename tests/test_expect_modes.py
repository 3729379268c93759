"""Pipeline-independent expectations (issue 38): a layer is judged against what is legal for it (the products the
canonical pipeline makes of it), so `explain` with a pipeline that lacks a pass a layer needs names the products
that pipeline cannot make and exits 1 (a CI gate cannot pass with the product removed), unless asked to judge
against the pipeline only (`--expect pipeline`). The canonical pipeline's verdicts are unchanged."""

import json

import pytest
from clirun import run

from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState
from rlxviz.models import VARIANTS, load_model
from rlxviz.passes import Pipeline
from rlxviz.passes.pipeline import CANONICAL_ORDER
from rlxviz.session import SessionError
from rlxviz.session.status import PRODUCTS, check_fusion, layer_status, pipeline_cannot_make, reference_run

LAYER_PASSES = [("bert-tiny", "fuse_transformer_layer"), ("bert-tiny", "fuse_attention_block"),
                ("bert-tiny", "fuse_residual_ln"), ("bert-tiny", "fuse_matmul_bias_act"),
                ("llama-block", "fuse_swiglu"), ("llama-block", "fuse_shared_input_matmul"),
                ("minilm", "fuse_transformer_layer"), ("minilm", "fuse_sdpa")]
"""(preset, a pass its layers need): the canonical pipeline makes that pass's product in every layer."""


def named(line: str, lines: list[str]) -> bool:
    """`line` (`the pipeline has no PASS: PRODUCT cannot be made`) is among `lines`, naming its places after it
    (`facts.Unmade.line`: `@ %N (PATH)`, `at K places, ...`)."""
    return any(x.startswith((f"{line} @ %", f"{line} at ")) for x in lines)


def _without(name: str, missing: str):
    model = load_model(name, seq=8)
    return Pipeline.canonical().without(missing).run(model.graph)


@pytest.mark.parametrize("name, missing", LAYER_PASSES)
def test_a_pipeline_without_a_layer_pass_is_not_fused_against_the_model(name, missing):
    trace = _without(name, missing)
    line = f"the pipeline has no {missing}: {PRODUCTS[missing]} cannot be made"
    check = check_fusion(trace, name)
    assert not check.ok and check.to_dict()["ok"] is False
    for s in check.layers:
        assert not s.fused and named(line, s.cannot_make), (s.layer, s.cannot_make)
        assert PRODUCTS[missing] in s.render().splitlines()[0] and line in s.render()
    assert named(line, check.to_dict()["cannot_make"])


@pytest.mark.parametrize("name, missing", LAYER_PASSES)
def test_judged_against_the_pipeline_only_it_passes_and_still_names_the_product(name, missing):
    trace = _without(name, missing)
    check = check_fusion(trace, name, expect="pipeline")
    assert check.ok, check.render()
    assert all(f"judged against the pipeline only: the pipeline has no {missing}" in s.render()
               for s in check.layers)


@pytest.mark.parametrize("name", ["bert-tiny", "llama-block", "minilm"])
def test_canonical_runs_need_no_reference_and_are_unchanged(name):
    trace = Pipeline.canonical().run(load_model(name, seq=8).graph)
    assert reference_run(trace) is None and pipeline_cannot_make(trace, None) == []
    a, b = check_fusion(trace, name), check_fusion(trace, name, expect="pipeline")
    assert a.ok and b.ok and a.render() == b.render()


@pytest.mark.parametrize("spec", ["canonicalize_exported,canonicalize_norm,canonicalize_gelu,fuse_sdpa",
                                  ",".join(p for p in CANONICAL_ORDER if p != "fuse_transformer_layer")])
def test_cli_minilm_without_the_layer_pass_exits_1_and_names_it(capsys, spec):
    code, out, err = run(capsys, "explain", "minilm", "--pipeline", spec)
    assert code == 1 and "Traceback" not in err
    assert "6/6" not in out and "0/6 layer(s) fused as expected" in out
    assert out.count("the pipeline has no fuse_transformer_layer: FusedTransformerLayer cannot be made") == 6
    code, out, _ = run(capsys, "explain", "minilm", "--pipeline", spec, "--expect", "pipeline")
    assert code == 0 and "6/6 layer(s) fused as expected" in out
    code, out, _ = run(capsys, "explain", "minilm", "--pipeline", spec, "--json")
    d = json.loads(out)
    assert code == 1 and d["ok"] is False and d["expect"] == "model" and d["fused_layers"] == 0
    assert all(named("the pipeline has no fuse_transformer_layer: FusedTransformerLayer cannot be made",
                     s["cannot_make"]) for s in d["layers"])


@pytest.mark.parametrize("name, missing", [("bert-tiny", "fuse_transformer_layer"), ("llama-block", "fuse_swiglu")])
def test_cli_bert_tiny_and_llama_block_exit_codes(capsys, name, missing):
    spec = ",".join(p for p in CANONICAL_ORDER if p != missing)
    code, out, _ = run(capsys, "explain", name, "--seq", 8, "--pipeline", spec)
    assert code == 1 and f"the pipeline has no {missing}: {PRODUCTS[missing]} cannot be made" in out
    assert f"NOT fused: the pipeline cannot make {PRODUCTS[missing]}" in out
    code, _, _ = run(capsys, "explain", name, "--seq", 8, "--pipeline", spec, "--expect", "pipeline")
    assert code == 0


def test_a_teaching_variant_keeps_its_own_rejection_beside_the_missing_pass():
    model = load_model("bert-tiny", seq=8, variant=VARIANTS["extra_h1_user"])
    trace = Pipeline.canonical().without("fuse_transformer_layer").run(model.graph)
    statuses = [layer_status(trace, i) for i in (0, 1)]
    # layer 1 fuses in the canonical run: the missing pass is named; layer 0 does not (its extra reader refuses
    # the layer op), so the missing pass is not blamed for it
    (line,) = statuses[1].cannot_make
    unmade = "the pipeline has no fuse_transformer_layer: FusedTransformerLayer cannot be made"
    assert not statuses[1].fused and named(unmade, [line])
    assert statuses[0].cannot_make == []


def test_rlx_profile_on_bert_tiny_is_unchanged(capsys):
    code, out, _ = run(capsys, "explain", "bert-tiny", "--seq", 8, "--pipeline", "rlx")
    assert code == 0 and "cannot be made" not in out


def test_the_app_why_tab_says_what_explain_says(capsys):
    s = AppState(runner=Runner(background=False), preset="llama-block", seq=8)
    s.disabled = [s.passes.index("fuse_swiglu")]
    s.load()
    spec = ",".join(p for i, p in enumerate(s.passes) if i not in s.disabled)
    code, out, _ = run(capsys, "explain", "llama-block", "--seq", 8, "--pipeline", spec, "--json")
    j = json.loads(out)["layers"][0]
    why = s.why_layer(0).replace("\\_", "_")  # the Why tab is markdown
    assert code == 1 and j["fused"] is False and "the pipeline has no fuse_swiglu: FusedSwiGLU cannot be made" in why
    assert j["cannot_make"] == layer_status(s.trace, 0).cannot_make


def test_an_unknown_expect_mode_is_one_clear_error(capsys):
    trace = Pipeline.canonical().run(load_model("llama-block", seq=4).graph)
    with pytest.raises(SessionError, match="expect 'modle'"):
        check_fusion(trace, "llama-block", expect="modle")
    with pytest.raises(SystemExit) as e:
        run(capsys, "explain", "llama-block", "--expect", "modle")
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err and "--expect" in err


def test_a_graph_without_layer_paths_names_what_the_pipeline_cannot_make(capsys):
    from pathlib import Path
    case = Path(__file__).parent / "data" / "cases" / "07-gqa-fused-qkv.rlx"
    spec = ",".join(p for p in CANONICAL_ORDER if p != "fuse_sdpa")
    code, out, _ = run(capsys, "explain", case, "--pipeline", spec)
    assert code == 1 and "NOT made: the pipeline has no fuse_sdpa: packed attention cannot be made" in out
    assert "unrecognized.attention" not in out  # the canonical pipeline recognizes it: a missing pass, not a form
    code, out, _ = run(capsys, "explain", case, "--pipeline", spec, "--expect", "pipeline")
    assert code == 0 and "judged against the pipeline only: the pipeline has no fuse_sdpa" in out
