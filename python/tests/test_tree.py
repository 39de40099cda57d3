"""The Python writer and reader: round trip, selection, refusals, vocabulary."""

import json
import os

import numpy as np
import pytest

from taptree import TreeError, TreeWriter, open_tree, stages
from taptree.tree import tree_hashes


def test_round_trip_and_root(tmp_path):
    x = np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5
    with TreeWriter(tmp_path / "t", stages=stages.llama(), run={"backend": "numpy"}) as w:
        w.tap(stages.ATTN_NORM, 0, (0, 3), x)
        w.tap(stages.LOGITS, None, 2, x[2:].astype(np.float64))
    t = open_tree(tmp_path / "t")
    assert t.verify() == 2
    assert np.array_equal(t.read(t.entries[0]), x)
    assert t.read(t.entries[1]).dtype == np.float64
    assert t.manifest["stages"][0]["name"] == "embedding"
    assert tree_hashes(t.entries, t.manifest)[1] == t.manifest["root"]


def test_selection_slices_rows_like_rust(tmp_path):
    x = np.arange(20, dtype=np.float32).reshape(5, 4)
    with TreeWriter(tmp_path / "t", select="pos=1..3;layer=none,0") as w:
        w.tap("attn_norm", 0, (0, 5), x)
        w.tap("attn_norm", 1, (0, 5), x)
        w.tap("logits", None, (4, 5), x[4:])
    t = open_tree(tmp_path / "t")
    keys = [(e["key"]["stage"], e["key"]["layer"], e["key"]["pos"]["start"], e["key"]["pos"]["end"]) for e in t.entries]
    assert keys == [("attn_norm", 0, 1, 3)]
    assert np.array_equal(t.read(t.entries[0]), x[1:3])
    assert t.manifest["selection"] == "pos=1..3;layer=none,0"


def test_existing_tree_is_kept_without_force(tmp_path):
    with TreeWriter(tmp_path / "t") as w:
        w.tap("embedding", None, 0, np.ones((1, 2), np.float32))
    before = open(tmp_path / "t" / "manifest.json").read()
    with pytest.raises(TreeError, match="already holds a tree"):
        TreeWriter(tmp_path / "t")
    assert open(tmp_path / "t" / "manifest.json").read() == before
    with TreeWriter(tmp_path / "t", force=True) as w:
        w.tap("embedding", None, 0, np.zeros((1, 2), np.float32))
    assert open_tree(tmp_path / "t").read(open_tree(tmp_path / "t").entries[0]).tolist() == [[0.0, 0.0]]


def test_bad_taps_are_refused(tmp_path):
    with TreeWriter(tmp_path / "t") as w:
        with pytest.raises(TreeError, match="axis 0 must be the 3 positions"):
            w.tap("attn", 0, (0, 3), np.ones((2, 4), np.float32))
        with pytest.raises(TreeError, match="unsupported dtype"):
            w.tap("attn", 0, 0, np.ones((1, 4), np.complex64))
        w.tap("attn", 0, 0, np.ones((1, 4), np.float32))
        with pytest.raises(TreeError, match="tapped twice"):
            w.tap("attn", 0, 0, np.ones((1, 4), np.float32))


def test_a_corrupt_tap_names_the_file(tmp_path):
    with TreeWriter(tmp_path / "t") as w:
        w.tap("attn", 0, 0, np.ones((1, 4), np.float32))
    path = tmp_path / "t" / "L000" / "attn.p0-1.safetensors"
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(TreeError, match="integrity failure") as e:
        open_tree(tmp_path / "t").verify()
    assert str(path) in str(e.value)


def test_vocabulary_matches_the_rust_forward():
    rust = open(os.path.join(os.path.dirname(__file__), "..", "..", "kernels", "src", "stages.rs")).read()
    for name in stages.NAMES:
        assert '"%s"' % name in rust, name
        assert name in stages.MEANING, name
    assert stages.NAMES[0] == "embedding" and stages.NAMES[-1] == "logits"
    declared = stages.llama(stages.HALF_SPLIT, 64)
    laid = {s["name"]: s.get("layout") for s in declared}
    assert laid["q_rope"] == {"rotary": "half_split", "head_dim": 64}
    assert laid["attn"] is None
    json.dumps(declared)
    with pytest.raises(ValueError):
        stages.layout(rotary="sideways")
