"""Every neighbour a fusion leaves outside is a line of `explain` and of `explain --json` (issue 21): an
ElementwiseRegion split at its step or input limit, and (over every handed case, preset and ONNX fixture)
`explain` never exits 0 while a recognized structure was left unfused without a line saying why."""

import json
import re
from pathlib import Path

import pytest
from clirun import run as cli_run

from rlxviz.ir import parse_ir
from rlxviz.models import PRESETS, load_model
from rlxviz.passes import Pipeline
from rlxviz.passes.unrecognized import _scanned, _signatures
from rlxviz.session.loading import load
from rlxviz.session.status import check_fusion


def _chain(steps: int, inputs: int = 0, path: str = " @model.layers.0.mlp") -> str:
    """`steps` alternating neg/tanh steps on x, then `inputs` adds of separate inputs."""
    lines = ['  %0 = input {name="x"} : f32[4, 8]']
    lines += [f'  %{100 + k} = input {{name="y{k}"}} : f32[4, 8]' for k in range(inputs)]
    prev = 0
    for i in range(1, steps + 1):
        lines.append(f"  %{i} = {'neg' if i % 2 else 'tanh'}(%{prev}) : f32[4, 8]{path}")
        prev = i
    for k in range(inputs):
        lines.append(f"  %{200 + k} = add(%{prev}, %{100 + k}) : f32[4, 8]{path}")
        prev = 200 + k
    return "graph chain {\n" + "\n".join(lines) + f"\n  return %{prev}\n}}\n"


@pytest.mark.parametrize("src, guard", [(_chain(40), "region_max_steps"), (_chain(2, inputs=20), "region_max_inputs"),
                                        (_chain(40, path=""), "region_max_steps")])
def test_a_region_split_at_its_limit_is_a_line_of_explain_and_json(capsys, tmp_path, src, guard):
    path = tmp_path / "g.ir"
    path.write_text(src)
    code, out, _ = cli_run(capsys, "explain", path)
    assert code == 0 and "left something out" in out and f"{guard} [not profitable]" in out and "split" in out
    code, out, _ = cli_run(capsys, "explain", path, "--json")
    assert [x for x in json.loads(out)["left_out"] if guard in x and "split" in x]


# -- explain never exits 0 while a recognized structure stays unfused without a line saying why ----------------

ROOT = Path(__file__).parent
HANDED = sorted((ROOT / "data" / "cases").glob("*.rlx")) + sorted((ROOT / "data" / "diag").glob("*.rlx"))
ONNX = [ROOT / "fixtures" / "onnx" / f"{n}.onnx" for n in ("bert", "gpt2", "llama", "vit")] + sorted(
    (ROOT / "fixtures" / "onnx" / "cases").glob("*.onnx"))  # minilm's weights are not next to its graph


def _silent(trace) -> list[str]:
    """Family signatures (norm statistics, GELU, GLU, where mask, attention, activation forms) still in the graph
    the pipeline left, on a run whose check passes, that no line of the report names (by node id)."""
    fc = check_fusion(trace)
    if not fc.ok:
        return []
    text = fc.render(verbose=True) + "\n" + json.dumps(fc.to_dict())
    named = {int(m) for m in re.findall(r"(?:%|node )(\d+)", text)}
    return [f"{family}: {what}" for family, nodes, what in _signatures(_scanned(trace)) if not named & set(nodes)]


@pytest.mark.parametrize("path", HANDED, ids=[p.stem for p in HANDED])
def test_no_handed_case_exits_0_leaving_a_structure_unsaid(path):
    assert _silent(Pipeline.canonical().run(parse_ir(path.read_text()))) == []


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_no_preset_exits_0_leaving_a_structure_unsaid(name):
    assert _silent(Pipeline.canonical().run(load_model(name, seq=8).graph)) == []


@pytest.mark.parametrize("path", ONNX, ids=[p.stem for p in ONNX])
def test_no_onnx_fixture_exits_0_leaving_a_structure_unsaid(path):
    assert _silent(Pipeline.canonical().run(load(str(path), seq=8).graph)) == []


def _written_here() -> dict[str, str]:
    """The variants this round's tests write (activation forms, RoPE on heads, Gemma norms, K-path scales)."""
    from test_activation_forms import BIASLESS, FORMS, clip_like
    from test_norm_terms import gemma_norm
    from test_rope_heads import rope_attention
    from test_scale_path import VARIANTS, _bert

    out = {f"clip-{f}-{'pre' if pre else 'post'}": clip_like(f, pre) for f in FORMS for pre in (True, False)}
    out["mlp-quick-gelu-biasless"] = BIASLESS
    out |= {f"rope-{k}": rope_attention(**kw) for k, kw in {
        "full": {}, "swapped": {"swapped": True}, "partial": {"n_rot": 8}, "k_only": {"k_only": True},
        "gathered": {"gathered": True}, "halves_differ": {"duplicated": False},
        "interleaved": {"interleaved": True}}.items()}
    out |= {f"gemma-{k}": gemma_norm(**kw) for k, kw in {
        "param": {}, "const": {"weight": "const"}, "ln": {"layer_norm": True},
        "f16-eps": {"eps": "const {value=1e-08} : f16[]"}}.items()}
    out |= {f"scale-{k}": f(_bert()) for k, f in VARIANTS.items()}
    from test_kv_cache import VARIANTS as DECODE
    from test_kv_cache import decode
    out |= {f"decode-{k}": decode(**kw) for k, kw in DECODE.items()}
    return out


WRITTEN = _written_here()


@pytest.mark.parametrize("name", list(WRITTEN))
def test_no_variant_written_here_exits_0_leaving_a_structure_unsaid(name):
    assert _silent(Pipeline.canonical().run(parse_ir(WRITTEN[name]))) == []


def test_the_check_finds_a_structure_left_unsaid(monkeypatch):
    """Without the activation recognizer (the state before this round: a CLIP layer 'fused as expected', exit 0,
    the QuickGELU left in a region unnamed) the check names the QuickGELU."""
    from rlxviz.passes import architecture
    from rlxviz.passes.rules import linear

    monkeypatch.setattr(linear, "activation_of", lambda g, x: None)
    monkeypatch.setattr(architecture, "activation_form", lambda g, n: None)
    architecture._PREPARED.clear()
    (left,) = _silent(Pipeline.canonical().run(parse_ir(WRITTEN["clip-quick_gelu-pre"])))
    assert left.startswith("activation: QuickGELU")
    architecture._PREPARED.clear()
