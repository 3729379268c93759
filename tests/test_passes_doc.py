"""docs/passes.md's rule section is generated from the rules (`rlxviz.passes.catalog`): it must equal what the code
generates now, and every pass must state a validity condition."""
from pathlib import Path

from rlxviz.passes import catalog
from rlxviz.passes.pipeline import PASSES

ROOT = Path(__file__).resolve().parent.parent


def test_docs_passes_section_is_what_the_rules_generate():
    page = (ROOT / "docs" / "passes.md").read_text()
    assert catalog.BEGIN in page and catalog.END in page
    section = catalog.BEGIN + page.split(catalog.BEGIN, 1)[1].split(catalog.END, 1)[0] + catalog.END + "\n"
    assert section == catalog.rules_markdown(), (
        "docs/passes.md is out of date: run `python -m rlxviz.passes.catalog --write docs/passes.md`")


def test_every_rule_and_guard_is_in_the_page():
    text = catalog.rules_markdown()
    for name, p in PASSES.items():
        assert f"### `{name}`" in text
        for r in p.rules:
            assert f"`{r.name}`" in text
            for g in r.guard_names:
                assert f"`{g}` (" in text, (r.name, g)


def test_every_pass_states_when_it_keeps_the_numbers():
    text = catalog.rules_markdown()
    sections = text.split("### `")[1:]
    missing = [s.split("`", 1)[0] for s in sections if "Validity" not in s]
    assert not missing, f"passes whose modules state no validity condition: {missing}"


def test_validity_paragraph_reading():
    doc = "Title.\n\n    Some text.\n    Validity (exact): a holds\n    and b.\n\n    Other text.\n"
    assert catalog.validity(doc) == "Validity (exact): a holds\nand b."
    listed = "T.\n\nValidity (each a guard):\n\n* `g1`: x.\n* `g2`: y.\n\nAfter.\n"
    assert catalog.validity(listed) == "Validity (each a guard):\n\n* `g1`: x.\n* `g2`: y."
    assert catalog.validity("No condition here.") == ""


def test_splice_replaces_only_the_section():
    page = f"# P\n\nprose\n\n{catalog.BEGIN}\nold\n{catalog.END}\n\ntail\n"
    out = catalog.splice(page, f"{catalog.BEGIN}\nnew\n{catalog.END}\n")
    assert out == f"# P\n\nprose\n\n{catalog.BEGIN}\nnew\n{catalog.END}\n\ntail\n"
