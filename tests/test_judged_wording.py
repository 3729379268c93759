"""A layer judged as its siblings is not promised a fusion (a newcomer's run).

`explain minilm --variant pre_ln --variant-layer 1` said "its sibling layers are post-LN ..., so it is expected to
fuse like them (expected FusedTransformerLayer)", which a reader takes as a promise that the layer can fuse. The layer
is judged as its siblings to show what its change broke (`verdict.judged_kind`), and the words now say so
(`text.judged_words`): its own layout is the change that stops the siblings' product.
"""

from __future__ import annotations

from clirun import run as cli_run


def test_the_pre_ln_variant_says_its_layout_is_the_change(capsys):
    code, out, _ = cli_run(capsys, "explain", "minilm", "--variant", "pre_ln", "--variant-layer", 1)
    assert code == 1 and "layer 1: NOT fused (expected FusedTransformerLayer)" in out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("  layer kind: pre-LN")]
    assert "; judged as its post-LN siblings (post-LN (BERT): attention -> residual add -> LayerNorm; " in line
    assert line.endswith(") to show what its change broke: its pre-LN layout is the change that stops "
                         "FusedTransformerLayer"), line
    assert "expected to fuse like them" not in out
