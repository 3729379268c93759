"""A misspelling in a rule, a guard, a pattern or a pipeline fails when its module is imported or its pipeline built.

Each case is a small rule module written twice: once with the right word (it must import) and once with a
misspelling of it (it must raise, naming the wrong word and, where one is close, the right one). Before issue 36,
9 of the review's 13 misspellings ran silently (`"bais" in c` a guard that always refuses, `c.data.get("fil")` an
attribute None, `{"fab_max_tokns": 1}` the attention gate switched off). Removing any one check makes its case's
"wrong" import pass, and the test fails.
"""

import importlib.util
import itertools
import textwrap

import pytest

from rlxviz.ir import Builder, Op
from rlxviz.passes.engine import find
from rlxviz.passes.guard import NOT_RECOGNIZED, RuleError
from rlxviz.passes.params import PARAM_NAMES, ParamError, PipelineParams
from rlxviz.passes.pattern import P
from rlxviz.passes.pipeline import DEFAULT_PARAMS, Pipeline
from rlxviz.passes.rule import QUIET, Fail, Rule, reports
from rlxviz.session.errors import PipelineError

HEADER = '''
from rlxviz.ir import Op
from rlxviz.passes.guard import ILLEGAL, NOT_PROFITABLE, NOT_RECOGNIZED, guard, single_user, size_le
from rlxviz.passes.pattern import P
from rlxviz.passes.pipeline import Pipeline
from rlxviz.passes.rule import QUIET, Fail, Rule, reports
from rlxviz.session.pipeline import build_pipeline

ANCHOR = P(Op.ADD, P(Op.MATMUL, P.var("x"), P.var("w"), name="mm"), P.var("bias"), name="add", commutative=True)
'''

# kind -> (module body with {w} for the word, the right word, a misspelling)
CASES = {
    "role in a factory guard": ('R = Rule("t.r", ANCHOR, steps=(single_user("{w}"),), result="add", '
                                'absorb=("mm", "add"))', "mm", "mn"),
    "role read in a guard body": ('G = guard("g", lambda c: c["{w}"].rank == 1, lambda c: "", requires=("mm",), '
                                  'reads=("bias",), kind=NOT_RECOGNIZED)', "bias", "bais"),
    "role asked for in a guard body": ('G = guard("g", lambda c: "{w}" not in c, lambda c: "", requires=("mm",), '
                                       'reads=("bias",), kind=NOT_RECOGNIZED)', "bias", "bais"),
    "role read in a step": ('''
        @reports("g", reads=("add",))
        def step(c):
            return None if c.d("{w}") else QUIET''', "add", "ad"),
    "role asked for in a step": ('''
        @reports(reads=("add",), binds=("act",))
        def step(c):
            return None if "{w}" in c else None''', "act", "actt"),
    "role a step binds": ('''
        @reports(reads=("add",), binds=("act",))
        def step(c):
            c.bindings["{w}"] = c.id("add")''', "act", "actv"),
    "guard a step fails with": ('''
        @reports("bias_shape", reads=("bias",))
        def step(c):
            return Fail("guard", "{w}", "the bias is not a vector") if c["bias"].rank > 1 else None''',
                                "bias_shape", "bias_shpe"),
    "guard named in kinds=": ('''
        @reports("merge_keeps_fusions", kinds={{"{w}": NOT_PROFITABLE}})
        def step(c):
            return None''', "merge_keeps_fusions", "merge_keep_fusions"),
    "kind of a guard": ('G = guard("g", lambda c: True, lambda c: "", kind="{w}")', "illegal", "ilegal"),
    "kind of a step": ('''
        @reports("g", kind="{w}")
        def step(c):
            return None''', "not profitable", "not profitible"),
    "op in a pattern": ("PAT = P({w}, name='s')", "Op.SOFTMAX", "'softmax'"),
    "attribute in a pattern": ('PAT = P(Op.SOFTMAX, attrs={{"{w}": -1}})', "axis", "axsi"),
    "attribute a build gives": ('R = Rule("t.b", ANCHOR, steps=(), result="add", absorb=("mm", "add"), '
                                'build=lambda c: (Op.FUSED_MATMUL_BIAS_ACT, [c.id("x"), c.id("w"), c.id("bias")], '
                                '{{"{w}": None}}))', "activation", "activaton"),
    "role a build reads": ('R = Rule("t.b", ANCHOR, steps=(), result="add", absorb=("mm", "add"), '
                           'build=lambda c: (Op.FUSED_MATMUL_BIAS_ACT, [c.id("x"), c.id("w"), c.id("{w}")], '
                           '{{"activation": None}}))', "bias", "bais"),
    "attribute a guard reads": ('R = Rule("t.a", P(Op.SOFTMAX, P.var("x"), name="sm"), steps=(guard("g", '
                                'lambda c: c["sm"].attrs.get("{w}") == -1, lambda c: "", requires=("sm",), '
                                'kind=NOT_RECOGNIZED),), result="sm", absorb=("sm",))', "axis", "axsi"),
    "role in labels": ('R = Rule("t.l", ANCHOR, steps=(), result="add", absorb=("mm", "add"), labels={{"{w}": "h"}})',
                       "mm", "mn"),
    "state field": ('''
        @reports(reads=("add",))
        def keep(c):
            c.data["fill"] = -1.0

        R = Rule("t.s", ANCHOR, steps=(keep,), result="add", absorb=("mm", "add"),
                 build=lambda c: (Op.FUSED_MATMUL_BIAS_ACT, [c.id("x"), c.id("w"), c.id("bias")],
                                  {{"activation": None if c.data.get("{w}") else None}}))''', "fill", "fil"),
    "pipeline parameter of a size gate": ('G = size_le("{w}", lambda c: (1, "1"), "batch*seq", "gate", "add")',
                                          "fab_max_tokens", "fab_max_tokns"),
    "pipeline parameter read in a guard": ('G = guard("g", lambda c: c.params.get("{w}", True), lambda c: "", '
                                           'kind=NOT_PROFITABLE)', "merge_cost_test", "merge_cost_tset"),
    "pipeline parameter given to build_pipeline": ('PIPE = build_pipeline("canonical", {{"{w}": 1}})',
                                                   "fab_max_tokens", "fab_max_tokns"),
    "pipeline parameter given to a Pipeline": ("PIPE = Pipeline.canonical({w}=3)", "max_region_steps",
                                               "max_region_step"),
    "pass in a pipeline": ('PIPE = build_pipeline("{w},dead_code_elimination")', "mark_elementwise_regions",
                           "mark_elementwise_region"),
    "pass enabled in a pipeline": ('PIPE = Pipeline.canonical().disable("{w}")', "fuse_sdpa", "fuse_sdap"),
    "step of a pass switched off": ('PIPE = Pipeline.canonical().disable("{w}")', "fuse_sdpa/rope_heads",
                                    "fuse_sdpa/rope_head"),
    "step of a pass off in a pass list": ('PIPE = build_pipeline("canonical,-{w}")', "fuse_sdpa/hoist_scales",
                                          "fuse_sdpa/hoist_scale"),
    "step of a pass off at construction": ('PIPE = Pipeline(disabled={{"{w}"}})', "fuse_sdpa/pack_cache",
                                           "fuse_sdpa/pack_cach"),
    "unrecognized family a pass recognizes": ('''
        from rlxviz.passes.engine import rule_pass
        PASS = rule_pass("t_pass", [], recognizes_families=("norm", "{w}"))''', "where_mask", "where_msk"),
    "layer trait a pass names its product for": ('''
        from rlxviz.passes.engine import rule_pass
        PASS = rule_pass("t_pass", [], product="FusedSwiGLU", listed_for=(("{w}", ""),))''', "swiglu", "swigul"),
    "quantization mode of a pass": ('''
        from rlxviz.passes.engine import rule_pass
        PASS = rule_pass("t_pass", [], quantization=("{w}", "a rounded GELU is no GELU"))''', "breaks", "braeks"),
}

_N = itertools.count()


def load(tmp_path, body: str) -> None:
    """Write HEADER + body as a fresh module and import it (each name new: no import cache)."""
    path = tmp_path / f"rules_{next(_N)}.py"
    path.write_text(HEADER + textwrap.dedent(body) + "\n")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


def test_there_are_at_least_13_kinds():
    assert len(CASES) >= 13


@pytest.mark.parametrize("kind", list(CASES))
def test_a_misspelling_fails_at_import_naming_the_right_word(kind, tmp_path):
    body, right, wrong = CASES[kind]
    load(tmp_path, body.format(w=right))  # the right word imports
    with pytest.raises((RuleError, ParamError, PipelineError, KeyError)) as e:
        load(tmp_path, body.format(w=wrong))
    msg = str(e.value)
    assert wrong.strip("'") in msg, msg
    if not kind.startswith("op in"):
        assert f"'{right}'" in msg, msg  # the close match (difflib) is named


def test_misspelt_gate_no_longer_switches_attention_off():
    from rlxviz.session.pipeline import build_pipeline
    with pytest.raises(PipelineError, match=r"'fab_max_tokns'.*did you mean 'fab_max_tokens'"):
        build_pipeline("canonical", {"fab_max_tokns": 1})
    assert build_pipeline("canonical", {"fab_max_tokens": 1}).effective_params["fab_max_tokens"] == 1


def test_params_added_after_construction_fail_when_read_or_run():
    pipe = Pipeline.canonical()
    pipe.params["merge_cost_tst"] = False  # a mutable mapping: checked where it is read
    with pytest.raises(ParamError, match="merge_cost_test"):
        pipe.effective_params  # noqa: B018
    b = Builder("g")
    b.output(b.relu(b.input("x", (2,))))
    with pytest.raises(ParamError, match="max_region_inputs"):
        Pipeline.canonical().run(b.build(), {"max_region_input": 3})


def test_pipeline_params_is_frozen_and_keeps_the_defaults():
    p = PipelineParams.of({"fab_max_tokens": 64})
    assert p.fab_max_tokens == 64 and p.max_region_steps == DEFAULT_PARAMS["max_region_steps"]
    with pytest.raises(AttributeError):
        p.fab_max_tokens = 1  # type: ignore[misc]
    with pytest.raises(ParamError):
        PipelineParams.of({"unfuse_op": ["gelu"]})
    assert set(DEFAULT_PARAMS) < set(PARAM_NAMES)
    assert Pipeline.rlx().effective_params == {**DEFAULT_PARAMS, "fab_max_tokens": 64}


def _matmul_bias():
    b = Builder("l")
    x = b.input("x", (2, 4))
    b.output(b.add(b.matmul(x, b.param("w", (4, 4))), b.param("b", (4,))))
    return b.build()


ANCHOR = P(Op.ADD, P(Op.MATMUL, P.var("x"), P.var("w"), name="mm"), P.var("bias"), name="add", commutative=True)


def test_a_step_reading_a_role_by_a_computed_name_raises_when_it_runs():
    """What the import-time scan cannot see (a role in a variable) the closed context catches when the step runs."""
    role = "mm"

    @reports(reads=("add",))
    def peek(c):
        return None if c[role] is not None else QUIET

    rule = Rule("t.peek", ANCHOR, steps=(peek,), result="add", absorb=("add",))
    with pytest.raises(RuleError, match=r"\[@reports step peek\] reads role 'mm'"):
        find(_matmul_bias(), "t", [rule], {})

    @reports(reads=("add",))
    def ask(c):
        return None if role in c else QUIET

    rule = Rule("t.ask", ANCHOR, steps=(ask,), result="add", absorb=("add",))
    with pytest.raises(RuleError, match=r"asks for role 'mm'"):
        find(_matmul_bias(), "t", [rule], {})


def test_a_step_failing_with_a_computed_guard_name_raises_when_it_runs():
    name = "bias_shpe"

    @reports("bias_shape", reads=("bias",))
    def shape(c):
        return Fail("guard", name, "no", kind=NOT_RECOGNIZED)

    rule = Rule("t.shape", ANCHOR, steps=(shape,), result="add", absorb=("add",))
    with pytest.raises(RuleError, match=r"'bias_shpe'.*did you mean 'bias_shape'"):
        find(_matmul_bias(), "t", [rule], {})


def test_an_optional_role_a_step_declares_may_be_asked_for_unbound():
    @reports(reads=("add",), optional=("act",))
    def maybe(c):
        return None if "act" in c else None

    rule = Rule("t.maybe", ANCHOR, steps=(maybe,), result="add", absorb=("mm", "add"))
    found, _ = find(_matmul_bias(), "t", [rule], {})
    assert len(found) == 1


def test_a_gate_of_the_authors_own_is_a_parameter_of_pipelines_holding_its_pass():
    """Notebook 04's exercise: a rule author's `size_le("epilogue_max_rows", ...)` declares a new parameter; a
    pipeline with that pass accepts it, one without refuses it, and a name close to a field is a misspelling."""
    from rlxviz.passes.engine import rule_pass
    from rlxviz.passes.guard import size_le

    gate = size_le("epilogue_max_rows", lambda c: (2, "2"), "rows", "epilogue_size_gate", "add")
    assert gate.params == ("epilogue_max_rows",)
    rule = Rule("mine.gate", ANCHOR, steps=(gate,), result="add", absorb=("mm", "add"),
                build=lambda c: (Op.FUSED_MATMUL_BIAS_ACT, [c.id("x"), c.id("w"), c.id("bias")], {"activation": None}))
    mine = rule_pass("mine", [rule])
    assert mine.params == ("epilogue_max_rows",)
    assert not Pipeline([mine], {"epilogue_max_rows": 1}).run(_matmul_bias()).steps[0].matches  # 2 rows > 1
    assert len(Pipeline([mine], {"epilogue_max_rows": 2}).run(_matmul_bias()).steps[0].matches) == 1
    with pytest.raises(ParamError, match="'epilogue_max_rows'"):
        Pipeline(["fuse_matmul_bias_act"], {"epilogue_max_rows": 1})
    from rlxviz.session.pipeline import build_pipeline
    with pytest.raises(PipelineError, match="'epilogue_max_rows'"):
        build_pipeline("canonical", {"epilogue_max_rows": 1})
    with pytest.raises(ParamError, match="did you mean 'max_region_steps'"):
        size_le("max_region_stps", lambda c: (2, "2"), "rows", "g", "add")
