"""Model text reaching the terminal is escaped in one place (the CLI's print path, `ir.text`): a graph,
input or param name or a node path holding ANSI/OSC escapes, BEL, NUL, CR/LF or bidi controls can neither
retitle the terminal, clear the screen nor forge a report line. `--json` stays JSON."""

import json
import re

import pytest

from rlxviz import cli
from rlxviz.ir.text import ModelText, shown

RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")

HOSTILE = ('graph "g\\u001b]0;PWNED\\u0007\\nrlxviz time: error: FORGED" {\n'
           '  %0 = input {name="x\\u001b[2J\\u001b[31mRED\\u0000\\r\\nFAKE\\u009b"} : f32[2, 4] '
           '@"encoder.layer.0.q\\u202eevil\\r\\nFAKE LINE"\n'
           '  %1 = param {name="w\\nFAKE PARAM"} : f32[4]\n'
           '  %2 = mul(%0, %1) : f32[2, 4] @"encoder.layer.0.k\\u001b[1A\\u001b[2Kfused OK"\n'
           '  %3 = relu(%2) : f32[2, 4] @"encoder.layer.0.v\\nFAKE.x"\n'
           "  return %3\n}\n")
CLEAN = ('graph "g" {\n  %0 = input {name="x"} : f32[2, 4] @"encoder.layer.0.q"\n'
         '  %1 = param {name="w"} : f32[4]\n  %2 = mul(%0, %1) : f32[2, 4] @"encoder.layer.0.k"\n'
         '  %3 = relu(%2) : f32[2, 4] @"encoder.layer.0.v"\n  return %3\n}\n')


def test_shown_escapes_every_control_character():
    assert shown("a\x1b]0;T\x07b\x00\r\n\t\x7f\x9b\u202e") == "a\\x1b]0;T\\x07b\\x00\\r\\n\\t\\x7f\\x9b\\u202e"
    assert shown("line 1\nline\x1b[2J 2", keep_newlines=True) == "line 1\nline\\x1b[2J 2"
    assert shown("plain é ü → 中") == "plain é ü → 中"
    text = ModelText()
    text.remember(["enc.layer\nFAKE.q", "ok", "\n"])
    assert text.shown("report\nlayer enc.layer\nFAKE here\n") == "report\nlayer enc.layer\\nFAKE here\n"


@pytest.mark.parametrize("args", [("explain",), ("explain", "-v"), ("time", "--repeat", "1"), ("ir",),
                                  ("explain", "--layer", "7"), ("render", "-o", "OUT.svg")])
def test_model_text_is_escaped_in_every_human_readable_output(tmp_path, capsys, args):
    outputs = []
    for name, text in (("hostile", HOSTILE), ("clean", CLEAN)):
        (tmp_path / f"{name}.ir").write_text(text)
        argv = [a.replace("OUT", str(tmp_path / name)) for a in args]
        code = cli.main([argv[0], str(tmp_path / f"{name}.ir"), *argv[1:]])
        out, err = capsys.readouterr()
        outputs.append((code, out, err))
        if name == "hostile":
            assert not RAW.search(out + err), repr(RAW.search(out + err))
            assert "Traceback" not in err
    (hc, hout, herr), (cc, cout, cerr) = outputs
    assert hc == cc, (hout, herr)
    assert len(hout.splitlines()) == len(cout.splitlines()), hout  # no forged line
    assert len(herr.splitlines()) == len(cerr.splitlines()), herr


def test_json_output_stays_json_with_the_names_exact(tmp_path, capsys):
    (tmp_path / "h.ir").write_text(HOSTILE)
    assert cli.main(["explain", str(tmp_path / "h.ir"), "--json"]) == 0
    out = capsys.readouterr().out
    assert not RAW.search(out)
    assert json.loads(out)["model"] == "g\x1b]0;PWNED\x07\nrlxviz time: error: FORGED"


def test_file_names_in_messages_are_escaped(tmp_path, capsys):
    bad = tmp_path / "m\x1b[2J\nrlxviz explain: error: FORGED.ir"
    assert cli.main(["explain", str(bad)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and not RAW.search(err), err
    assert "m\\x1b[2J\\nrlxviz explain: error: FORGED.ir" in err
