"""The Matches table's layer column for a row outside the layers: on deit.ortopt.onnx the first row read `- | 7 | fused
| fuse_matmul_bias_act | ... | fused into FusedMatMulBiasAct %138`, a blank layer, where `rlxviz explain` says
`outside the layers: embeddings: FusedMatMulBiasAct %138` (a newcomer comparing the two). The column now names
the place by the function that line uses (`placement.outside_box`), and still sorts (layer numbers in numeric order,
then the places) and filters by layer number."""

from __future__ import annotations

import re
from pathlib import Path

from clirun import run

from rlxviz.app.explain import decision_rows
from rlxviz.app.jobs import Runner
from rlxviz.app.sources import ALLOWED_DIRS_ENV
from rlxviz.app.state import AppState
from rlxviz.app.whyview import LAYER_SORTER, DecisionTable, layer_cells
from rlxviz.session import isolated

DEIT = Path(__file__).resolve().parent / "fixtures" / "onnx" / "cases" / "deit.ortopt.onnx"


def _inline(fn, *args, timeout_s=None, wall_s=None, max_bytes=None, what="", job=None, **kwargs):
    """`isolated.run_isolated` without its child process (the same call, here)."""
    return fn(*args, **kwargs)


def _outside_places(capsys, path: Path) -> dict[int, str]:
    """Fused node id -> its place, read off `rlxviz explain`'s `outside the layers:` line."""
    code, out, err = run(capsys, "explain", path)
    assert code in (0, 1), err
    (line,) = [ln for ln in out.splitlines() if ln.startswith("outside the layers: ")]
    places = {}
    for part in line.removeprefix("outside the layers: ").split("; "):
        place, items = part.split(": ", 1)
        places.update({int(i): place for i in re.findall(r" %(\d+) \(", items)})
    return places


def test_a_row_outside_the_layers_names_its_place_as_explain_does(capsys, monkeypatch):
    places = _outside_places(capsys, DEIT)
    assert places[138] == "embeddings" and set(places.values()) >= {"embeddings", "pooler", "final norm"}, places
    monkeypatch.setattr(isolated, "run_isolated", _inline)
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(DEIT.parent))
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    s.param.update(checkpoint_dir=str(DEIT), source="checkpoint")
    assert s.model is not None and s.model.meta.get("onnx_file"), s.message
    table = DecisionTable(state=s)
    frame, rows = table.table.value, table._rows
    first = frame.iloc[0]
    assert (first["layer"], first["anchor"]) == ("embeddings", 7)
    assert first["message"] == "fused into FusedMatMulBiasAct %138"
    said = 0
    for cell, r in zip(frame["layer"], rows, strict=True):
        if r["layer"] is not None:  # a layer's row: its number, as before
            assert cell == int(r["layer"]) and r["place"] == "", r
        elif (m := re.search(r"fused into \w+ %(\d+)", r["message"])) and int(m[1]) in places:
            assert cell == r["place"] == places[int(m[1])], r  # explain's place, word for word
            said += 1
        else:  # a refusal outside the layers (the pooler's tanh): the place its anchor sits, by the same function
            assert isinstance(cell, str) and cell == r["place"] and cell in places.values(), r
    assert said == len(places)
    assert [r["layer"] for r in rows if r["place"]] == [None] * sum(1 for r in rows if r["place"])
    # sorting: Tabulator's alphanum (numbers in numeric order, then the places by name), never a string sort
    t = table.table
    spec = {c["field"]: c for c in t._get_configuration(t._get_column_definitions(list(frame.columns),
                                                                                    frame))["columns"]}
    assert spec["layer"]["sorter"] == LAYER_SORTER == "alphanum", spec["layer"]
    assert spec["layer"]["width"] == t.widths["layer"]  # the column's own settings kept beside the sorter
    # filtering by layer number: the header filter's `=` (Panel's Python side mirrors the browser's)
    assert t.header_filters["layer"]["type"] == "number" and t.header_filters["layer"]["func"] == "="
    t.filters = [{"field": "layer", "type": "=", "value": 0}]
    view = t.current_view
    assert len(view) == sum(1 for r in rows if r["layer"] == 0) > 0 and set(view["layer"]) == {0}
    assert "outside the layers" in t.header_tooltips["layer"]


def test_a_graph_without_layers_or_a_table_of_layers_only_keeps_its_number_column():
    assert str(layer_cells([{"layer": 0, "place": ""}, {"layer": None, "place": ""}]).dtype) == "Int64"
    cells = layer_cells([{"layer": 1, "place": ""}, {"layer": None, "place": "pooler"}])
    assert list(cells) == [1, "pooler"] and cells.dtype == object
    no_layers = [r["place"] for r in decision_rows(_no_layer_trace())]
    assert no_layers and set(no_layers) == {""}  # "outside the layers" means nothing where no path names a layer


def _no_layer_trace():
    from rlxviz.session import build_pipeline, load_ir_file, run_pipeline

    case = Path(__file__).resolve().parent / "data" / "cases" / "03-prescaled-query.rlx"
    return run_pipeline(load_ir_file(case).graph, build_pipeline("canonical"))


def test_an_encoder_decoder_tables_layers_name_their_stack(monkeypatch):
    """bart.encdec: encoder layer 0 and decoder layer 0 both read `0` in the layer column (newcomer run 29), where
    `explain`, `--json` and the Why tab say `encoder layer 0` / `decoder layer 0`: the cell names the stack, and the
    header filter takes text then."""
    from rlxviz.app.whyview import LAYER_FILTERS

    path = Path(__file__).resolve().parent / "fixtures" / "onnx" / "zoo" / "bart.encdec.onnx"
    monkeypatch.setattr(isolated, "run_isolated", _inline)
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(path.parent))
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    s.param.update(checkpoint_dir=str(path), source="checkpoint")
    assert s.model is not None, s.message
    table = DecisionTable(state=s)
    cells = {c for c, r in zip(table.table.value["layer"], table._rows, strict=True) if r["layer"] is not None}
    assert {"encoder 0", "encoder 1", "decoder 0", "decoder 1"} <= cells and not any(isinstance(c, int) for c in cells)
    assert table.table.header_filters["layer"] == LAYER_FILTERS["text"]
    t = table.table
    t.filters = [{"field": "layer", "type": "like", "value": "decoder 1"}]
    assert set(t.current_view["layer"]) == {"decoder 1"}
