"""Views read the facts their producers hand out, never words parsed back (a redesign that keeps behaviour).

Each site once cut a fact back out of words made elsewhere: the guard that fails next out of `caveat.fix_blocker`'s
words (split on `" ("`: `standing._term_refusal`, `standing.gap_followers`, `excused.held_lines`), the stage out of
the inspector's outcome (`removeprefix("rejected")`), what a fix's check found out of its `none in the model: ...`
line (`removeprefix(NO_MODEL_FIX)`). Each test words the producer's words otherwise and asserts the same facts: a
site that parsed the words again would lose them.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from clirun import case_trace
from test_encoder_decoder import encoder_decoder

from rlxviz.app.explain import decision_markdown, node_decisions
from rlxviz.cli import main
from rlxviz.passes import Pipeline
from rlxviz.passes.refusal_kinds import MODEL_TERM
from rlxviz.passes.why import caveat
from rlxviz.passes.why.caveat import caveat_words, next_blocker
from rlxviz.passes.why.standing import gap_followers, held_by, held_place
from rlxviz.passes.why.verdict import RunVerdict
from rlxviz.session import advice

HERE = Path(__file__).parent
GPTJ = HERE / "fixtures" / "onnx" / "zoo" / "gptj.dynamo-eager.onnx"
ESM_LIKE = HERE / "data" / "cases" / "esm-like-q-scaled-before-rope.rlx"


def _reworded(guard: str) -> str:
    """Words for what fails next that hold no `" ("` to cut the guard at."""
    return f"next comes {guard}, worded otherwise"


@pytest.fixture
def reworded_blocker(monkeypatch):
    """`caveat.next_blocker`'s words said otherwise (`_reworded`), its guard and the rest kept: every reader of the
    words (`fix_blocker`) and of the facts (`next_blocker`) gets them from the one record."""
    real = caveat._fix_blocker

    def fake(trace, rule, anchor, guard):
        nb = real(trace, rule, anchor, guard)
        return replace(nb, words=_reworded(nb.guard)) if nb.guard else nb

    monkeypatch.setattr(caveat, "_fix_blocker", fake)


def _t5_cross_heads(t):
    step = next(s for s in t.steps if s.pass_name == "fuse_attention_block")
    heads = [r for r in step.rejections if r.headline and "EncDecAttention" in r.path]
    assert heads, [r.path for r in step.rejections]
    return heads


def test_a_held_places_term_is_found_by_the_blockers_guard_not_its_words(reworded_blocker):
    """`standing.held_place` (through `held.term_refusal`) finds t5's cross-attention term `self_attention` by
    `next_blocker`'s guard: words with no `GUARD (KIND)` shape still give the term's refusal."""
    t = Pipeline.canonical().run(encoder_decoder("t5"))  # a fresh run: no blocker checked before the patch
    for r in _t5_cross_heads(t):
        assert next_blocker(t, r.rule, r.anchor, r.guard).words == _reworded("self_attention")
        term = held_by(t, r)
        assert term is not None and term.guard == "self_attention" and term.kind == MODEL_TERM, r
        held = held_place(t, r)
        assert held is not None and held.blocker == "" and held.why.startswith(f"self_attention ({MODEL_TERM}): ")


def test_the_model_terms_list_names_a_held_place_from_its_data(reworded_blocker):
    """`excused.held_lines` (the run's list of the model's own terms) finds the term's refusal by the blocker's guard
    and says the gap it also runs into as the place's `Held` does (`Held.also`)."""
    t = Pipeline.canonical().run(encoder_decoder("t5"))
    heads = _t5_cross_heads(t)
    held = [line for lv in RunVerdict.of(t).layers for _, line in lv.held]
    assert len(held) == len(heads), held
    also = {held_place(t, r).also for r in heads}
    assert len(also) == 1 and all(f"self_attention [{MODEL_TERM}]" in x for x in held), held
    assert all(x.endswith(f"; {next(iter(also))}") for x in held), (held, also)


def test_a_gap_follower_is_told_apart_by_the_blockers_guard_not_its_words(reworded_blocker):
    """gptj's attention place is a gap (`rope_full_rotary`) whose fix alone leaves `rope_halves` failing next: that
    follower carries the caveat, worded from the blocker's words, found by its guard."""
    t = case_trace(GPTJ)
    step = next(s for s in t.steps if s.pass_name == "fuse_attention_block")
    places: dict[tuple[str, int], list] = {}
    for r in step.rejections:
        places.setdefault((r.rule, r.anchor), []).append(r)
    followed = [gap_followers(t, rs) for rs in places.values() if any(r.guard == "rope_full_rotary" for r in rs)]
    assert followed and all(f == {"rope_halves": caveat_words(_reworded("rope_halves"))} for f in followed), followed


def test_the_inspector_says_a_refusals_stage_from_its_data_not_its_outcome_words():
    """`node_decisions` hands each refusal's `stage` out beside its outcome; the inspector's item says it the same
    whatever the outcome's words."""
    t = case_trace(GPTJ)
    step = next(s for s in t.steps if s.pass_name == "fuse_attention_block")
    nodes = {r.anchor for r in step.rejections}
    refused = [d for n in sorted(nodes) for d in node_decisions(t, n) if d["outcome"].startswith("rejected (")]
    assert refused and {d["stage"] for d in refused} <= {"guard", "structure"}, refused
    for d in refused:
        item = decision_markdown(d)
        assert f" ({d['stage']}): " in item, item
        assert decision_markdown({**d, "outcome": "refused"}) == item, d


def test_a_refuted_model_fix_is_reworded_from_what_its_check_found(monkeypatch, capsys):
    """Where the rule proposed a change to the model that its check refutes, the fix line says what the check found
    (`FixCheck.found`) after `no checked fix in the model: `, whatever words `_check_fix` printed it with."""
    real = advice._check_fix

    def fake(*args):
        c = real(*args)
        return replace(c, printed=f"[refuted, worded otherwise] {c.found}") if c.found else c

    monkeypatch.setattr(advice, "_check_fix", fake)
    code = main(["explain", str(ESM_LIKE)])
    out = capsys.readouterr().out
    assert code == 1
    assert "fix: no checked fix in the model: none offered, as rlxviz has no what-if that applies a change" in out
    assert "worded otherwise" not in out
