"""An error in IR text says where in the app as the CLI does (issue 39: a one-line message, no place in sight): the
CLI's line (`ir.syntax_error_line`), then the line it points at and a caret under the column (`ir.quote_place`, one
formatter for every front end), then what to do. The banner opens it unfolded. The quoted line is data: markup in
it (`<b>`, `<script>`) is shown as text."""

import pytest
from test_app_views import tiny

from rlxviz.app.statusbar import StatusBar
from rlxviz.ir import IRSyntaxError, parse_ir, quote_place, syntax_error_line
from rlxviz.session import SessionError
from rlxviz.session.loading import load_ir_file

HEAD = 'graph g {\n  %0 = input {name="x"} : f32[2, 8]\n'
BAD = {  # text -> (line, the offending character at the caret)
    HEAD + "  %1 = tanh(%0 <b>bold</b>) : f32[2, 8]\n  return %1\n}": (3, "<"),
    HEAD + "  %1 = tanh(%0) : f32[2, 8] <script>alert(1)</script>\n  return %1\n}": (3, "<"),
    HEAD + "\t%1 = tanh(%0) :\tf99[2, 8]\n  return %1\n}": (3, "f"),  # tabs before the column
    HEAD + "  %1 = tanhh(%0) : f32[2, 8]\n  return %1\n}": (3, "t"),
    "hello <script>alert(1)</script>\n": (1, "h"),
    HEAD + "  %1 = tanh(%0) {note=\"" + "x" * 400 + "\"} : f32[2, 8] ]\n  return %1\n}": (3, "]"),  # a long line
}


def _caret_char(quoted: str) -> str:
    """The character the caret of `quote_place`'s two lines stands under (tabs as tabs in both lines)."""
    shown, caret = quoted.split("\n")
    return shown[caret.index("^")]


@pytest.mark.parametrize("text", list(BAD))
def test_the_app_says_the_clis_line_then_the_line_and_a_caret_as_text(text):
    line, char = BAD[text]
    with pytest.raises(IRSyntaxError) as e:
        parse_ir(text)
    assert e.value.line == line
    s = tiny()
    bar = StatusBar(state=s)
    s.param.update(ir_text=text, source="ir")
    said = s.message.split("\n")
    assert said[0] == syntax_error_line("IR text", e.value.line, e.value.col, e.value.reason), s.message
    assert "\n".join(said[1:3]) == e.value.quoted == quote_place(text.split("\n")[line - 1], e.value.col)
    assert _caret_char(e.value.quoted.replace("  ", "", 1).replace("\n  ", "\n", 1)) == char
    assert said[3].startswith(f"The IR text does not parse: fix line {line} at the caret")
    assert s.ir_error == (line, e.value.col, e.value.reason) and s.model.name == "bert-tiny"
    shown = bar.alert.object  # what the banner renders: whole (not folded to its first line), markup as text
    assert "rv-clamp" not in bar.alert.css_classes and bar.more.label == "less ▴"
    assert "<b>" not in shown and "<script" not in shown and "</pre>" in shown
    if "<b>" in text:
        assert "&lt;b&gt;bold&lt;/b&gt;" in shown
    bar.more.clicks += 1  # "less" folds it as any long message
    assert "rv-clamp" in bar.alert.css_classes


def test_the_cli_says_the_same_place_in_one_line(tmp_path):
    """`rlxviz explain g.ir` (one line, exit 2) and the app begin with the same words: one formatter."""
    for k, text in enumerate(BAD):
        f = tmp_path / f"g{k}.ir"
        f.write_text(text)
        with pytest.raises(SessionError) as cli:
            load_ir_file(f)
        with pytest.raises(IRSyntaxError) as e:
            parse_ir(text)
        assert str(cli.value) == syntax_error_line(str(f), e.value.line, e.value.col, e.value.reason)
        assert "\n" not in str(cli.value)


def test_a_lint_error_quotes_the_line_that_defines_the_node():
    """IR text that parses but is no valid graph: the line defining the node the problem names, with a caret."""
    s = tiny()
    bar = StatusBar(state=s)
    bad = '  %1 = tanh(%0) {note="<script>x</script>"} : f32[2, 9]'
    s.param.update(ir_text=HEAD + bad + "\n  return %1\n}", source="ir")
    said = s.message.split("\n")
    assert said[0].startswith("IR text: line 3: invalid graph: %1 (tanh): "), s.message
    assert "\n".join(said[1:3]) == quote_place(bad, 3) and said[2] == "    ^", s.message
    assert said[3].startswith("The IR text parses but is not a valid graph: fix line 3 at the caret"), s.message
    assert "rv-clamp" not in bar.alert.css_classes and "<script" not in bar.alert.object


def test_quote_place_windows_a_long_line_and_keeps_tabs():
    assert quote_place("ab\tcd", 4) == "  ab\tcd\n    \t^"  # the caret under "c", past the tab
    long = "y" * 1000 + "Z" + "y" * 1000
    shown, caret = quote_place(long, 1001).split("\n")
    assert len(shown) < 200 and shown[caret.index("^")] == "Z" and shown.startswith("  ...") and shown.endswith("...")
