"""What the sweeps over the fixtures share instead of redoing (CI's 20 minutes on 2 cores): `clirun.file_inputs`
decides once per file and process whether a plain load binds the file's dims, each caller getting its own dict."""

from __future__ import annotations

from pathlib import Path

import pytest
from clirun import file_inputs

from rlxviz import session

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"


@pytest.mark.parametrize("stem", ["llama.dynamo-eager", "qwen2.kv"])
def test_file_inputs_loads_a_file_once_and_hands_out_copies(monkeypatch, stem):
    """llama loads plainly ({}); qwen2.kv's cache length binds only from its npz (its shapes). Two asks, at most one
    default load (none when an earlier test of this process asked already), equal answers that share no dict."""
    loads = []
    real = session.load
    monkeypatch.setattr(session, "load", lambda *a, **k: loads.append(a) or real(*a, **k))
    path = ZOO / f"{stem}.onnx"
    first, again = file_inputs(path), file_inputs(path)
    assert len(loads) <= 1, loads
    assert first == again and first is not again
    assert bool(first) == stem.endswith(".kv")
    if first:
        assert first["npz"].name == f"{stem}.npz" and "past_key_values.0.key" in first["shapes"]
        assert not any(k.startswith("out:") for k in first["shapes"])
        first["shapes"].clear()
        assert file_inputs(path)["shapes"] == again["shapes"] != {}


def test_one_fixture_s_sweep_tests_are_one_work_unit():
    """`make test`'s scheduler keeps the tests of one fixture across the sweeps on one worker (`conftest.work_unit`),
    so its caches find the file loaded; other tests go out alone, a `ONE_WORKER_FILES` file whole."""
    from conftest import FIXTURE_SWEEPS, ONE_WORKER_FILES, work_unit

    ids = {"test_exact_claims.py": "llama.dynamo-eager.onnx", "test_fix_whatif.py": "llama.dynamo-eager.onnx",
           "test_verdict_parity.py": "llama.dynamo-eager", "test_onnx_zoo.py": "llama.dynamo-eager",
           "test_onnx_origin_remade.py": "llama.dynamo-eager"}
    units = {work_unit(f"tests/{k}[{ids[k.split('::')[0]]}]") for k in FIXTURE_SWEEPS}
    assert units == {"fixture:llama.dynamo-eager"}
    assert work_unit("tests/test_onnx_zoo.py::test_attention_packs_where_the_scores_are_plain_and_explain_names_the_"
                     "block_elsewhere[qwen2.kv]") == "fixture:qwen2.kv"
    assert work_unit("tests/test_onnx_zoo.py::test_the_zoo_covers_the_architectures_and_forms_the_issue_names") is None
    assert work_unit("tests/test_exact_claims.py::test_no_exact_claim_on_a_differing_version[n4-15.rlx]") is None
    name = sorted(ONE_WORKER_FILES)[0]
    assert work_unit(f"tests/{name}::test_x[1]") == name


def test_the_zoo_sample_keeps_every_architecture_and_every_form(monkeypatch):
    """`zoo_sample`: the sweeps' sample holds a file of each architecture and of each export form, fewer files than
    the zoo; `RLXVIZ_SWEEP=all` gives every file."""
    from zoo_sample import every_architecture_and_form, zoo_files

    every = sorted(ZOO.glob("*.onnx"))
    kinds = [{p.stem.split(".", 1)[i] for p in every} for i in (0, 1)]
    sample = every_architecture_and_form(every)
    assert [{p.stem.split(".", 1)[i] for p in sample} for i in (0, 1)] == kinds
    assert len(sample) < len(every) * 0.5
    fake = [Path(f"{a}.{f}.onnx") for a, f in (("x", "kv"), ("x", "eager"), ("y", "eager"), ("z", "fp16"))]
    assert [p.stem for p in every_architecture_and_form(fake)] == ["x.kv", "y.eager", "z.fp16"]
    monkeypatch.setenv("RLXVIZ_SWEEP", "all")
    assert zoo_files() == every
