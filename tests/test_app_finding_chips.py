"""The leftover scan's findings (`passes.unrecognized`: a family-shaped chain no rule made a candidate) on the app's
version chips and in its matches table, as `explain -v`, `--json` and the Why tab list them (newcomer run 32:
convbert.qdq's `unrecognized.gelu`, "not expected here" in all three, had no chip and no row, because the scan
recorded no refusal). One record: the finding as a `Rejection` (`Unrecognized.as_rejection`) filed under the step of
the pass that recognizes its family (`RunFacts.findings`), read by the chips and the table (`places.step_refusals`)."""

from __future__ import annotations

from pathlib import Path

from test_architecture import ln_e_x2_graph

from rlxviz import session
from rlxviz.app.derived import version_rows
from rlxviz.app.explain import decision_rows
from rlxviz.app.jobs import Runner
from rlxviz.app.sources import ALLOWED_DIRS_ENV
from rlxviz.app.state import AppState
from rlxviz.passes import Pipeline
from rlxviz.passes.unrecognized import FINDING, unrecognized
from rlxviz.passes.why.facts import RunFacts
from rlxviz.passes.why.places import REJECTED
from rlxviz.passes.why.policy import NOT_EXPECTED_HERE, recognizers

CONVBERT = Path(__file__).parent / "fixtures/onnx/zoo/convbert.qdq.onnx"


def _places(rows: list[dict], group: str) -> dict[str, list[int]]:
    """Chip label -> the anchors its mark of `group` counts (`rejected` for the ✗, else a ○ group)."""
    if group == REJECTED:
        return {r["version"]: r["rejected_at"] for r in rows if r["rejected_at"]}
    return {r["version"]: r["not_near_miss_at"][group] for r in rows if group in r["not_near_miss_at"]}


def test_a_not_expected_finding_has_its_chip_and_its_row_in_the_app(monkeypatch):
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(CONVBERT.parent))
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    s.param.update(checkpoint_dir=str(CONVBERT), source="checkpoint")
    assert s.model.name == "convbert.qdq" and s.trace is not None, s.message
    check = session.check_fusion(s.trace, s.model.name)
    said = [x for lv in check.layers for x in lv.not_expected if x.startswith(f"{FINDING}.gelu")]
    found = [u for u in unrecognized(s.trace) if u.family == "gelu"]
    assert len(said) == len(found) == 2, (said, found)  # one per layer: what `explain -v` and the Why tab list
    anchors = sorted(u.nodes[0] for u in found)
    gelu_pass = f"after {min(recognizers('gelu'))}"
    chips = _places(s.version_rows(), NOT_EXPECTED_HERE)
    assert sorted(chips.get(gelu_pass, [])) == anchors, chips  # the chip's ○, shown though the pass changed nothing
    assert gelu_pass in s.version_labels
    items = next(r for r in s.version_rows() if r["version"] == gelu_pass)["not_near_misses"][NOT_EXPECTED_HERE]
    assert all(f"{FINDING}.gelu (no_rule): " in x and "why it is not expected here: " in x for x in items), items
    rows = [r for r in decision_rows(s.trace) if r["rule"] == f"{FINDING}.gelu"]
    assert sorted(r["anchor"] for r in rows) == anchors, rows
    for r in rows:
        assert (r["kind"], r["guard"], f"after {r['pass']}") == (NOT_EXPECTED_HERE, "no_rule", gelu_pass), r
        assert r["hint"].startswith("nothing to change in the model"), r["hint"]  # no rewrite `explain` never said


def test_a_finding_that_counts_is_the_chips_near_miss_and_a_rejected_row():
    """A LayerNorm written `E[x^2] - E[x]^2` fails the check (`unrecognized.norm` in its misses): its chip counts it
    ✗ and its row says `rejected`, with the family's hint, as `explain` prints it after `fix:`."""
    trace = Pipeline.canonical().run(ln_e_x2_graph())
    check = session.check_fusion(trace, "ln")
    assert not check.ok and any(m.startswith(f"{FINDING}.norm") for m in check.misses), check.misses
    (u,) = unrecognized(trace)
    visible = [(k, label) for k, (label, _) in enumerate(trace.versions())]
    near = _places(version_rows(trace, visible), REJECTED)
    assert near == {f"after {min(recognizers('norm'))}": [u.nodes[0]]}, near
    (row,) = [r for r in decision_rows(trace) if r["rule"] == f"{FINDING}.norm"]
    assert (row["kind"], row["anchor"], row["hint"]) == (REJECTED, u.nodes[0], u.hint), row
    assert sorted(row["nodes"]) == sorted(u.nodes)


def test_the_finding_is_one_record():
    """The verdict's `MissedFusion` and the chips' `Rejection` of a finding say the same."""
    trace = Pipeline.canonical().run(ln_e_x2_graph())
    (u,) = unrecognized(trace)
    r, m = u.as_rejection(), u.as_missed()
    assert (m.pattern, m.node, m.path, m.guard, m.reason, m.hint, m.kind, m.fix, m.remedy) == (
        r.rule, r.anchor, r.path, r.guard, r.message, r.hint, r.kind, r.fix, r.remedy)
    (filed,) = RunFacts.of(trace).findings().values()
    assert filed == (r,)
