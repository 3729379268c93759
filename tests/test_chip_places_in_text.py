"""Every place the app's version chips count (`passes.why.places`: `✗` a near-miss, `○` a place that is no near-miss,
by `verdict.standing` group) is said by `rlxviz explain`'s text and by its `--json`, in a group that says what it is:

* a near-miss under its layer (first rejection, also rejected, also missed, also unrecognized: a leftover scan's
  finding, `why.places.step_refusals`), or among the run's misses;
* a refusal not expected of its layer, at a gap in rlxviz's ops, or illegal for it, under that layer (`not expected
  here`, `gap in rlxviz's ops`, `illegal here`);
* the model's own term, a lookalike, a merge the tool's own cost test declined: under that group's heading
  (`text.left_out_heading`), as `RULE @ %ANCHOR (PATH)`.

A newcomer found falcon's chip `○2` after fuse_shared_input_matmul (the QKV merge the cost test declines,
`merge_keeps_fusions`) that the text never listed: the listing dropped a place whose anchor a later fusion took (the
QKV matmul is inside the FusedAttentionBlock), while the chips count it. Checked over the handed cases (copies of
shared/cases and shared/cases/onnx), not only falcon.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from clirun import case_trace as trace_of
from clirun import run as cli_run

from rlxviz.passes import Trace
from rlxviz.passes.guard import DOES_NOT_PAY
from rlxviz.passes.trace import Rejection, layer_label
from rlxviz.passes.why.places import place_standings
from rlxviz.passes.why.policy import NOT_EXPECTED_HERE
from rlxviz.passes.why.text import left_out_heading
from rlxviz.passes.why.verdict import ILLEGAL_HERE_GROUP, OP_GAP_GROUP, RunVerdict

TESTS = Path(__file__).parent
ONNX = TESTS / "fixtures" / "onnx" / "cases"
CASES = sorted((TESTS / "data" / "cases").glob("*.rlx")) + sorted(ONNX.glob("*.onnx"))


def explain_args(source: Path) -> list[str]:
    io = source.with_name(source.stem + "_io.npz")
    return ["explain", str(source), *(["--inputs", str(io)] if io.exists() else [])]


def counted_places(trace: Trace) -> list[tuple[str, Rejection, str | None]]:
    """`(step name, headline refusal, standing group)` of each place a chip counts: every place of every step but a
    soft near-miss (a fusion made without it: `places.LEFT_OUT_STATUS`, no chip counts it); group None is `✗`."""
    out = []
    for k, step in enumerate(trace.steps):
        for head, st in place_standings(trace, k).values():
            if st is None and head.soft:
                continue
            out.append((step.pass_name, head, None if st is None else st[0]))
    return out


def layer_blocks(text: str) -> dict[str, str]:
    """Layer label -> its block of `explain`'s text (the line `LABEL: ...` and the indented lines under it)."""
    blocks: dict[str, list[str]] = {}
    cur: list[str] | None = None
    for line in text.splitlines():
        m = re.match(r"^((?:\w+ )?layer \d+): ", line)
        if m is not None:
            cur = blocks.setdefault(m.group(1), [])
        elif not line.startswith(" "):
            cur = None
        if cur is not None:
            cur.append(line)
    return {k: "\n".join(v) for k, v in blocks.items()}


def group_items(text: str) -> dict[str, list[str]]:
    """Heading (without its count) -> the items under it, of the run-level groups of `explain`'s text."""
    out: dict[str, list[str]] = {}
    cur: list[str] | None = None
    for line in text.splitlines():
        if not line.startswith(" "):
            m = re.match(r"^\d+ (.*):$", line)
            cur = out.setdefault(m.group(1), []) if m is not None else None
        elif cur is not None and line.startswith("  ") and not line.startswith("   "):
            cur.append(line[2:])
    return out


def label_of(trace: Trace, r: Rejection) -> str | None:
    """The label `explain` gives the layer of refusal `r` (`decoder layer 0` in an encoder-decoder model), None for a
    place outside every layer."""
    keys = [k for k in RunVerdict.of(trace).layers if k.layer == r.layer] if r.layer is not None else []
    return layer_label(keys[0].layer) if keys else None


def said_in_text(text: str, label: str | None, r: Rejection, group: str | None) -> bool:
    """Whether `explain`'s text says the place of refusal `r` (in the layer labelled `label`) in a group that says
    what it is."""
    block = layer_blocks(text).get(label, "") if label is not None else ""
    rule = re.escape(r.rule)
    if group is None:
        return (re.search(rf"^  (first rejection|also rejected|also missed|also unrecognized): {rule}\b", block, re.M)
                is not None
                or re.search(rf"^  {rule} @ %{r.anchor} ", text, re.M) is not None)  # a graph with no layer
    if group in (NOT_EXPECTED_HERE, OP_GAP_GROUP):  # a gap has its own heading, as the chips' △ (issue 39)
        where = block if label is not None else text  # a graph with no layer: the run's own lines
        # by anchor node: every place, not one line per rule and guard (granite's %187 was never named)
        at = rf"(@|at \d+ places,) [^:]*%{r.anchor} \("
        return re.search(rf"^  {re.escape(group)}: {rule} \({re.escape(r.guard)}\) {at}", where, re.M) is not None
    if group == ILLEGAL_HERE_GROUP:
        return re.search(rf"^  illegal here( \(not counted\))?: {rule}\b", block, re.M) is not None
    heading = left_out_heading(group, 1).split(" ", 1)[1]
    plural = left_out_heading(group, 2).split(" ", 1)[1]
    items = group_items(text)
    return any(x.startswith(f"{r.rule} @ %{r.anchor} (") for x in items.get(heading, []) + items.get(plural, []))


def said_in_json(d: dict, label: str | None, r: Rejection, group: str | None) -> bool:
    """Whether `explain --json` says the place of refusal `r` (in the layer labelled `label`) in a group that says
    what it is."""
    layers = [lv for lv in d["layers"] if lv["label"] == label]
    if group is None:
        return any((lv["first"] or {}).get("rule") == r.rule or any(o["rule"] == r.rule for o in lv["rejections"])
                   or any(m.startswith(f"{r.rule} @ ") for m in lv["misses"]) for lv in layers) or any(
            m.startswith(f"{r.rule} @ %{r.anchor} ") for m in d["misses"] + d["outside_misses"])
    if group in (NOT_EXPECTED_HERE, OP_GAP_GROUP):  # a gap's lines apart, as the text's heading (issue 39)
        key = "gap_refusals" if group == OP_GAP_GROUP else "not_expected"
        # a place in no layer of a layered graph: its own lines under `outside the layers:` (deit's pooler tanh)
        lines = [x for lv in layers for x in lv[key]] if label is not None else d[key] + (
            d["outside_gaps"] if group == OP_GAP_GROUP else [])
        return any(re.match(rf"{re.escape(r.rule)} \({re.escape(r.guard)}\) (@|at \d+ places,) [^:]*%{r.anchor} \(", x)
                   for x in lines)
    if group == ILLEGAL_HERE_GROUP:
        return any(o["rule"] == r.rule for lv in layers for o in lv["illegal"])
    return any(x.startswith(f"{r.rule} @ %{r.anchor} (") for g in d["left_out_groups"] if g["kind"] == group
               for x in g["items"])


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_every_place_a_chip_counts_is_in_explains_text_and_json(capsys, case):
    trace = trace_of(case)
    places = counted_places(trace)
    _, text, _ = cli_run(capsys, *explain_args(case))
    _, out, _ = cli_run(capsys, *explain_args(case), "--json")
    d = json.loads(out)
    unsaid = [f"{name}: {r.rule} @ %{r.anchor} ({r.path}) {r.guard} [{group or 'near-miss'}]"
              for name, r, group in places if not said_in_text(text, label_of(trace, r), r, group)]
    assert not unsaid, "\n".join(unsaid) + "\n" + text
    unsaid = [f"{name}: {r.rule} @ %{r.anchor} {r.guard} [{group or 'near-miss'}]"
              for name, r, group in places if not said_in_json(d, label_of(trace, r), r, group)]
    assert not unsaid, unsaid


def test_falcons_declined_qkv_merges_are_listed_where_the_chip_counts_them(capsys):
    """Falcon: the chip after fuse_shared_input_matmul counts 2 `○` (the QKV merge with FC1 the cost test declines,
    one per layer, anchored at the QKV matmul that the FusedAttentionBlock then took): both are under the cost
    test's heading."""
    case = ONNX / "falcon.onnx"
    trace = trace_of(case)
    declined = [r for name, r, group in counted_places(trace) if name == "fuse_shared_input_matmul"]
    assert len(declined) == 2 and all(r.guard == "merge_keeps_fusions" for r in declined)
    assert not any(r.anchor in trace.final for r in declined)  # what dropped them before
    _, text, _ = cli_run(capsys, *explain_args(case))
    assert f"\n{left_out_heading(DOES_NOT_PAY, 2)}:\n" in text, text
    for r in declined:
        assert f"  {r.rule} @ %{r.anchor} ({r.path}): merge_keeps_fusions " in text
