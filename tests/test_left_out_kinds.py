"""`explain`'s summary of what fusions did not take tells the kinds apart (issue 39): `rlxviz explain minilm` said
"1 fusion(s) left something out" for the embeddings' broadcast sum, a lookalike that was never a candidate
(`guard.NOT_A_CANDIDATE`). Each kind now has its own heading, decided once (`passes.why.verdict.left_out_groups`,
worded by `passes.why.text.left_out_heading`), the same in the text and in `--json`:

* a fusion that happened and left something out (a soft rejection: an ElementwiseRegion split at its limit);
* a place that keeps the model's own term (`guard.MODEL_TERM`: GPT-2's causal bias, kept as the attention's operand);
* a lookalike, not a candidate (BERT's embeddings.LayerNorm, and two IR variants of the broadcast sum).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirun import run as cli_run

from rlxviz.passes.guard import MODEL_TERM, NOT_A_CANDIDATE
from rlxviz.passes.why.verdict import LEFT_OUT, LEFT_OUT_GROUPS

ROOT = Path(__file__).parent
GPT2 = ROOT / "fixtures" / "onnx" / "gpt2.onnx"


def broadcast_sum(pos: str = "f32[1, 8]", steps: int = 40) -> str:
    """IR of an embeddings-like broadcast sum `x + pos` into a LayerNorm at `embeddings.LayerNorm` (a lookalike of
    a residual sum), then `steps` alternating neg/tanh (past 32 steps the ElementwiseRegion is split: left out)."""
    lines = ['  %0 = input {name="x"} : f32[1, 4, 8]', f'  %1 = input {{name="pos"}} : {pos}',
             "  %2 = add(%0, %1) : f32[1, 4, 8] @embeddings",
             '  %3 = param {name="embeddings.LayerNorm.weight"} : f32[8] @embeddings.LayerNorm',
             '  %4 = param {name="embeddings.LayerNorm.bias"} : f32[8] @embeddings.LayerNorm',
             "  %5 = layer_norm(%2, %3, %4) {eps=1e-12, axis=-1} : f32[1, 4, 8] @embeddings.LayerNorm"]
    prev = 5
    for i in range(6, 6 + steps):
        lines.append(f"  %{i} = {'neg' if i % 2 else 'tanh'}(%{prev}) : f32[1, 4, 8] @model.layers.0.mlp")
        prev = i
    return "graph lookalike {\n" + "\n".join(lines) + f"\n  return %{prev}\n}}\n"


def _args(tmp_path: Path, source: str) -> list[object]:
    if source.startswith("graph "):
        path = tmp_path / "g.ir"
        path.write_text(source)
        return [path]
    return [source] if source != "gpt2" else [GPT2, "--seq", 8]


CASES = {
    "minilm": ("minilm", {NOT_A_CANDIDATE: ["embeddings.LayerNorm"]}),
    "bert-tiny": ("bert-tiny", {NOT_A_CANDIDATE: ["embeddings.LayerNorm"]}),
    "gpt2": ("gpt2", {MODEL_TERM: ["h.0.attn", "h.1.attn"]}),
    "row-broadcast": (broadcast_sum("f32[1, 8]", 3), {NOT_A_CANDIDATE: ["embeddings.LayerNorm"]}),
    "table-broadcast+split": (broadcast_sum("f32[4, 8]", 40),
                              {LEFT_OUT: ["model.layers.0.mlp"], NOT_A_CANDIDATE: ["embeddings.LayerNorm"]}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_kind_has_its_heading_in_text_and_json_alike(capsys, tmp_path, name):
    source, want = CASES[name]
    args = _args(tmp_path, source)
    code, text, _ = cli_run(capsys, "explain", *args)
    assert code in (0, 1), text  # gpt2: 1 (its tanh-GELU is left out of the epilogue, a counted miss)
    jcode, out, _ = cli_run(capsys, "explain", *args, "--json")
    d = json.loads(out)
    assert jcode == code
    groups = d["left_out_groups"]
    assert [g["kind"] for g in groups] == [k for k in LEFT_OUT_GROUPS if k in want]
    for g in groups:
        # the item's node paths, in the run's order, and its kind in each line
        assert [x.split(" (", 1)[1].split(")", 1)[0] for x in g["items"]] == want[g["kind"]], g["items"]
        assert all(f"[{g['kind']}]" in x for x in g["items"]) or g["kind"] == LEFT_OUT
        # the text says the same: the heading, then each item, indented, right under it
        block = "\n".join([f"{g['heading']}:", *(f"  {x}" for x in g["items"])])
        assert block in text, (block, text)
        assert g["heading"].startswith(f"{len(g['items'])} ")
    assert d["left_out"] == [x for g in groups for x in g["items"]]
    # a lookalike or the model's own term is not something a fusion left out
    assert ("left something out" in text) == (LEFT_OUT in want), text
    assert ("lookalike" in text) == (NOT_A_CANDIDATE in want)
    heads = ("the model's own term or structure (nothing to fix", "the model's own terms or structure (nothing to fix")
    assert any(h in text for h in heads) == (MODEL_TERM in want)


def test_minilm_says_lookalike_and_nothing_left_out(capsys):
    """The newcomer's run, word for word where it matters."""
    code, text, _ = cli_run(capsys, "explain", "minilm")
    assert code == 0
    assert "left something out" not in text and "fusion(s)" not in text
    head = "1 lookalike, not a candidate (nothing to fix, not a near-miss):\n  fuse_residual_ln.residual @ %"
    assert head in text and "(embeddings.LayerNorm): residual_same_shape [not a candidate]" in text


def test_plural_headings():
    from rlxviz.passes.why.text import left_out_heading

    assert left_out_heading(LEFT_OUT, 1) == "1 fusion left something out"
    assert left_out_heading(LEFT_OUT, 3) == "3 fusions left something out"
    assert left_out_heading(NOT_A_CANDIDATE, 2).startswith("2 lookalikes, not candidates")
    assert left_out_heading(MODEL_TERM, 1).startswith("1 place keeps the model's own term or structure (")
    assert left_out_heading(MODEL_TERM, 2).startswith("2 places keep the model's own terms or structure (")
    with pytest.raises(KeyError):
        left_out_heading("illegal", 1)
