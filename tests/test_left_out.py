"""Every neighbour a fusion leaves outside is a line of `explain` and of `explain --json` (issue 21): an
ElementwiseRegion split at its step or input limit, and (over every handed case, preset and ONNX fixture)
`explain` never exits 0 while a recognized structure was left unfused without a line saying why."""

import json

import pytest
from clirun import run as cli_run


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
