"""The term added to the scores before a where-mask is named by what it is (`sdpa_mask._added_term`): a mask built
from a mask input is "the additive padding mask" (n4-03's `(1 - attention_mask) * finfo.min`), a learned term or a
position term is "the bias"."""

from pathlib import Path

from test_mask_combinations import chunked_attention

from rlxviz.cli import main
from rlxviz.ir import parse_ir
from rlxviz.passes import Pipeline
from rlxviz.passes.score_terms import mask_input

CASE = Path(__file__).parent / "data" / "cases" / "n4-03-chunked-attn-llama4.rlx"
SRC = CASE.read_text()
LINE7 = next(line for line in SRC.splitlines() if line.strip().startswith("%7 ="))
PATH = "@model.layers.0.self_attn"


def _notes(src: str) -> list[str]:
    trace = Pipeline.canonical().run(parse_ir(src))
    return [r.message for r in trace.rejections if r.guard == "where_mask_additive"]


def test_n4_03_names_the_padding_mask(capsys):
    """The app's chip and `explain -v` read the same note: the padding mask by its name and source input."""
    (note,) = _notes(SRC)
    assert "where(cond, the additive padding mask (node 7, model.layers.0.self_attn), fill)" in note
    assert "built from input attention_mask (node 1)" in note
    assert "bias" not in note and "a term of the model" not in note
    assert main(["explain", str(CASE), "-v"]) == 0
    out = capsys.readouterr().out
    assert "the additive padding mask (node 7" in out and "the bias (node 7" not in out


def test_a_learned_term_keeps_the_word_bias():
    """The control: a param in node 7's place is the model's learned bias, not a mask."""
    (note,) = _notes(SRC.replace(LINE7, f'  %7 = param {{name="attn_bias"}} : f32[2, 1, 1, 8] {PATH}'))
    assert "where(cond, the bias (node 7" in note and "a term of the model" in note
    assert "padding mask" not in note


def test_a_position_term_built_from_the_mask_keeps_the_word_bias():
    """BLOOM-like ALiBi: per-head slopes times the mask input reads `attention_mask` but is a position bias."""
    alibi = (f"  %70 = reshape(%2) {{shape=[2, 1, 1, 8]}} : f32[2, 1, 1, 8] {PATH}\n"
             f"  %71 = const {{value=[[[[0.5]], [[0.25]], [[0.125]], [[0.0625]]]]}} : f32[1, 4, 1, 1] {PATH}\n"
             f"  %7 = mul(%70, %71) : f32[2, 4, 1, 8] {PATH}")
    (note,) = _notes(SRC.replace(LINE7, alibi))
    assert "the bias (node 7" in note and "ALiBi" in note and "mask (node 7" not in note


def test_padding_and_band_is_an_additive_mask():
    """Padding plus a constant sliding-window band: a mask with one row per query, built from the mask input."""
    g = chunked_attention(band=True)
    trace = Pipeline.canonical().run(g)
    (note,) = [r.message for r in trace.rejections if r.guard == "where_mask_additive"]
    assert "where(cond, the additive mask (node" in note and "one row per query" in note
    assert "built from input attention_mask" in note and "the bias" not in note


def test_mask_input_needs_inputs_that_are_masks():
    g = parse_ir(SRC)
    assert mask_input(g, 7).name == "attention_mask"
    assert mask_input(g, 22) is None  # the scores: a matmul of params and hidden_states
    assert mask_input(g, 5) is None  # a constant alone reads no mask
