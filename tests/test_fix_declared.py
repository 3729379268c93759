"""Every `not recognized` refusal names a fix: the change to the model (`hint`) or the compiler fix (`fix`).

The README promises that every rejection says *not recognized* with the compiler-side fix, a fix that keeps the model,
or that none exists. Guards built with `guard(...)` are read by the near-miss table, but structure steps (`Shape`,
`User`) carried no fix and nothing checked them: ConvBERT's `merge_reshape` refusal (its attention heads concatenated
with its convolution heads before the head merge) printed no `fix:` and no `compiler fix:` line, and stood as a
near-miss with nothing to do.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_guards import NEAR_MISSES

from rlxviz.cli import main
from rlxviz.passes.guard import COMPILER_ONLY, NOT_RECOGNIZED, Guard
from rlxviz.passes.pipeline import PASSES, Pipeline
from rlxviz.passes.rule import Shape, Soft, User

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"


def _undeclared() -> list[tuple[str, str]]:
    """`(rule, step)` of every structure step, and every guard of kind `not recognized`, of every registered pass and
    its stages that declares neither a hint nor a compiler fix."""
    out = []
    for p in PASSES.values():
        for rule in (r for q in (p, *p.stages) for r in q.rules):
            for st in rule.steps:
                s = st.step if isinstance(st, Soft) else st
                structure = isinstance(s, (Shape, User))
                if (structure or isinstance(s, Guard) and s.kind == NOT_RECOGNIZED) and not (s.hint or s.fix):
                    out.append((rule.name, s.name))
    return out


def test_every_structure_step_and_not_recognized_guard_declares_a_fix():
    assert _undeclared() == []


@pytest.mark.parametrize("rule,guard_name,make,subject,params",
                         [m for m in NEAR_MISSES if m[0].startswith("fuse_sdpa") or m[1].endswith("_static")],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_a_not_recognized_near_miss_says_a_fix(rule, guard_name, make, subject, params):
    """Each fuse_sdpa near miss of the guard table (and a static-dim one) that is `not recognized` has a fix line."""
    from rlxviz.passes.engine import find
    g, _ = make()
    pass_name = rule.split(".")[0]
    _, rejections = find(g, pass_name, PASSES[pass_name].rules,
                         {**Pipeline.canonical().effective_params, **params})
    hits = [r for r in rejections if r.rule == rule and r.guard == guard_name]
    assert hits
    assert all(r.hint or r.fix for r in hits if r.kind == NOT_RECOGNIZED), [(r.guard, r.message) for r in hits]


def test_convbert_head_merge_shared_with_its_conv_heads_is_a_gap_with_a_compiler_fix(capsys):
    """ConvBERT's attention heads are concatenated with its convolution heads, then all heads are merged at once:
    the model's own structure, so the refusal is a gap in rlxviz's ops (`△`), its one fix the compiler's."""
    f = ZOO / "convbert.ortopt.onnx"
    args = ["explain", str(f), "--inputs", str(f.with_suffix(".npz"))]
    rc = main([*args, "--json"])
    out = json.loads(capsys.readouterr().out)
    checks = [c for c in out["fix_checks"] if c["guard"] == "merge_reshape"]
    assert rc == 0 and len(checks) == 2
    for c in checks:
        assert "heads layout [B, S, heads, head_dim]" in c["compiler_fix"]
        assert "concat on the heads axis" in c["compiler_fix"] and c["compiler_fix_enough"]
    for layer in out["layers"]:
        assert layer["status"] == "fused as far as rlxviz's ops go"
        assert [g["by"] for g in layer["gaps"]] == ["merge_reshape"]
        assert all("concat" in r and "(compiler fix: " in r for r in layer["gap_refusals"])
    assert main([*args, "-v"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if "[rejected] fuse_sdpa.hf_attention" in x]
    assert len(lines) == 2 and all("merge_reshape (structure, not recognized; △ gap in rlxviz's ops)" in x
                                   for x in lines)


def test_merge_reshape_declares_its_remedy_compiler_only():
    from rlxviz.passes.rules.attention import SDPA
    step = next(s for s in SDPA.steps if getattr(s, "name", "") == "merge_reshape")
    assert step.remedy == COMPILER_ONLY and step.fix
