"""A compiler fix's blocker names who reads the value when rlxviz's own rewrite made the readers (a newcomer run).

gpt-neox (legacy sdpa export): the headline said "rlxviz lacks FusedAttentionBlock with partial rotary RoPE: a
compiler fix; alone it is not enough in 2 of them: attn_single_user (illegal) fails next". The two other readers of
the attention output are `isnan` and `where`, the exporter's SDPA NaN guard that rlxviz's
`canonicalize_exported.nan_guard_moved` moved past the head merge: nothing a user changes in the model, while
"(illegal)" alone reads as a fault of it. The blocker (`caveat.fix_blocker`, read by the headline, the gap's
not-expected line, `--json`'s `gaps[].blocker` and the app's △ tooltip) now says who reads it
(`caveat.made_readers`, from `report.user_origin` of `whatif.fix_alone_readers`), and keeps the plain words where a
reader is the user's own node.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_near_miss_rule import trace_of

from rlxviz.passes.trace import Trace
from rlxviz.passes.whatif import fix_alone_readers
from rlxviz.passes.why.caveat import MADE_READERS, made_readers
from rlxviz.passes.why.places import places

NEOX = Path(__file__).parent / "fixtures" / "onnx" / "cases" / "gpt-neox.legacy-sdpa.onnx"
RULE = "canonicalize_exported.nan_guard_moved"
WORDS = MADE_READERS.format(guard="attn_single_user", kind="illegal", rule=RULE,
                            what="sdpa NaN guard moved past the head merge", product="FusedAttentionBlock")


@pytest.fixture(scope="module")
def neox() -> Trace:
    return trace_of(NEOX)


def _gap_refusals(trace: Trace) -> list[tuple[int, object]]:
    return [(k, r) for k, s in enumerate(trace.steps) for r in s.rejections
            if r.rule == "fuse_attention_block.qkv_attention_out" and r.guard == "rope_full_rotary" and r.headline]


def test_the_readers_the_fix_leaves_are_the_moved_nan_guard(neox):
    hits = _gap_refusals(neox)
    assert len(hits) == 2, hits
    for k, r in hits:
        readers = fix_alone_readers(neox, k, r)
        ops = sorted(neox.steps[k].before[i].op.value for i in readers)
        assert ops == ["isnan", "where"], ops
        assert made_readers(neox, readers) == (RULE, "sdpa NaN guard moved past the head merge")


def test_a_users_own_reader_keeps_the_plain_words(neox):
    own = [n.id for n in neox.input if n.op.value == "add"][:2]
    assert own and made_readers(neox, tuple(own)) is None
    assert made_readers(neox, ()) is None


def test_the_apps_gap_tooltip_says_who_reads_it(neox):
    k = next(k for k, _ in _gap_refusals(neox))
    gaps = places(neox, k).gaps
    assert gaps and all(f"alone it is not enough: {WORDS} fails next" in x for x in gaps), gaps
    assert all("attn_single_user (illegal) fails" not in x for x in gaps), gaps
