"""The Python selection grammar agrees with capture/src/select.rs's tests."""

import pytest

from taptree.select import Selection, SelectionError, glob_match, parse_range


def test_all_selects_everything():
    for s in ["", "all", "*", "  "]:
        sel = Selection.parse(s)
        assert sel.is_all()
        assert sel.wants("anything", None, 0, 1)


def test_the_example_from_the_docs():
    sel = Selection.parse("stage=ffn_*;layer=20..30;pos=0")
    assert sel.wants("ffn_down", 20, 0, 1)
    assert sel.wants("ffn_up", 29, 0, 7)
    assert not sel.wants("ffn_up", 30, 0, 1), "30 is past the half-open end"
    assert not sel.wants("ffn_up", 19, 0, 1)
    assert not sel.wants("attn_norm", 25, 0, 1)
    assert not sel.wants("ffn_up", 25, 1, 7)
    assert not sel.wants("logits", None, 0, 1), "a layer filter drops global stages"


def test_none_keeps_global_stages_and_unbatched_taps():
    sel = Selection.parse("layer=none,3;slot=none")
    assert sel.wants("logits", None, 0, 1)
    assert sel.wants("q_proj", 3, 0, 1)
    assert not sel.wants("q_proj", 3, 0, 1, slot=0)
    assert not sel.wants("q_proj", 4, 0, 1)


def test_range_forms():
    assert parse_range("5") == (5, 6)
    assert parse_range("2..4") == (2, 4)
    assert parse_range("2..=4") == (2, 5)
    assert parse_range("..3") == (0, 3)
    assert parse_range("7..") == (7, 2**32 - 1)
    for bad in ["4..4", "5..2", "x", "4294967295..=4294967295", "-1"]:
        with pytest.raises(ValueError):
            parse_range(bad)


@pytest.mark.parametrize(
    "text,part",
    [
        ("stage=ffn_*;lyr=3", '"lyr"'),
        ("layer=3..x", '"3..x"'),
        ("stage=ffn_*;garbage", '"garbage"'),
        ("pos=", '"pos="'),
        ("layer=1;layer=2", '"layer=2"'),
        ("stage=ffn/down", '"ffn/down"'),
        ("pos=3..3", '"3..3"'),
    ],
)
def test_malformed_selections_quote_the_bad_part(text, part):
    with pytest.raises(SelectionError) as e:
        Selection.parse(text)
    assert part in str(e.value)
    assert str(e.value).startswith("selection ")


def test_globs():
    assert glob_match("ffn_*", "ffn_down")
    assert glob_match("*_proj", "q_proj")
    assert glob_match("?_proj", "k_proj")
    assert not glob_match("?_proj", "kk_proj")
    assert glob_match("*", "")
    assert glob_match("a*b*c", "axxbyyc")
    assert not glob_match("a*b*c", "axxbyy")
    assert not glob_match("ffn_*", "attn")


def test_position_runs_slice_a_batched_tap():
    sel = Selection.parse("pos=0,2..4,6")
    assert sel.selected_runs(0, 8) == [(0, 1), (2, 4), (6, 7)]
    assert sel.selected_runs(3, 6) == [(3, 4)]
    assert sel.selected_runs(4, 6) == []
    assert Selection.parse("").selected_runs(3, 9) == [(3, 9)]
    assert Selection.parse("").selected_runs(3, 3) == []
