"""The CLI's run/time paths load no browser stack: a GPU or server machine without Bokeh/Panel still times a model
(the lent H200 had no Bokeh; `rlxviz time` failed there on the drawing palette's import)."""
import subprocess
import sys


def test_session_and_runtime_import_without_bokeh_or_panel():
    code = ("import sys, rlxviz.session, rlxviz.runtime, rlxviz.cli; "
            "loaded = sorted(m for m in ('bokeh', 'panel') if m in sys.modules); print(loaded)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_palette_still_reads_bokehs_ylorrd():
    from bokeh.palettes import YlOrRd

    from rlxviz.viz import heat

    assert heat.PALETTE == tuple(reversed(YlOrRd[7]))
    assert heat.legend("time")[0][0] == heat.PALETTE[0]
