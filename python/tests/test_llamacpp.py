"""The llama.cpp adapter on SmolLM2: its tree holds llama.cpp's own logits,
every stage at every layer, the run's facts, and bad input is refused.

Needs llama-cpp-python and the model (scripts/test.sh installs and fetches
both); without them the tests skip, unless TAPTREE_REQUIRE_LLAMACPP=1 makes
that a failure.
"""

import argparse
import os

import numpy as np
import pytest

from taptree import TreeError, open_tree, stages

REQUIRED = os.environ.get("TAPTREE_REQUIRE_LLAMACPP") == "1"
MODEL = os.path.join(
    os.environ.get("TAPTREE_CACHE") or os.path.expanduser("~/.cache/taptree"), "SmolLM2-135M-Instruct.Q4_1.gguf"
)
# "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
TOKENS = [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]


def _need(what, ok):
    if not ok:
        if REQUIRED:
            pytest.fail("%s, and TAPTREE_REQUIRE_LLAMACPP=1" % what)
        pytest.skip(what)


@pytest.fixture(scope="module")
def llama_cpp():
    try:
        import llama_cpp
    except ImportError:
        llama_cpp = None
    _need("llama-cpp-python is not installed (python3 -m pip install llama-cpp-python==0.3.36)", llama_cpp)
    _need("%s: no model (cargo run --release -p fetch --example fetch_model)" % MODEL, os.path.isfile(MODEL))
    return llama_cpp


@pytest.fixture(scope="module")
def captured(llama_cpp, tmp_path_factory):
    from taptree.llamacpp import capture_llamacpp

    out = tmp_path_factory.mktemp("lc") / "tree"
    summary = capture_llamacpp(MODEL, TOKENS, str(out), gen=3, threads=2)
    return summary, open_tree(out)


def _tree_logits(tree):
    return np.concatenate([tree.read(e) for e in tree.entries if e["key"]["stage"] == stages.LOGITS])


def test_tree_logits_are_llama_cpp_pythons_bit_for_bit(llama_cpp, captured):
    summary, tree = captured
    gen = summary["generated"]
    assert len(gen) == 3
    got = _tree_logits(tree)
    # Every fed position: the prompt, then each generated token but the last.
    assert got.shape == (len(TOKENS) + 2, 49152)
    assert np.array_equal(got, summary["logits"])

    # llama-cpp-python's own API, no callback: the prompt in one batch, then
    # one token per decode, as the adapter fed them.
    llm = llama_cpp.Llama(MODEL, n_ctx=256, n_threads=2, n_threads_batch=2, logits_all=True, verbose=False)
    llm.eval(TOKENS)
    for t in gen[:-1]:
        llm.eval([t])
    want = np.array(llm.scores[: len(TOKENS) + 2], dtype=np.float32)
    assert np.array_equal(got, want)
    assert int(np.argmax(want[len(TOKENS) - 1])) == gen[0]

    # The red case: another prompt (one token changed) is not equal from
    # that position on, and equal before it (causal attention).
    llm.reset()
    other = list(TOKENS)
    other[8] = 5356
    llm.eval(other)
    theirs = np.array(llm.scores[: len(other)], dtype=np.float32)
    assert np.array_equal(theirs[:8], got[:8])
    assert not np.array_equal(theirs[8], got[8])


def test_every_stage_at_every_layer_in_forward_order_with_the_run_facts(captured):
    _, tree = captured
    m = tree.manifest
    names = [s["name"] for s in m["stages"]]
    assert names == [s["name"] for s in stages.llama()]
    n = len(TOKENS)
    prefill = [e for e in tree.entries if e["key"]["pos"]["start"] == 0]
    assert len(prefill) == 1 + 30 * 15 + 2
    shape = {(e["key"]["stage"], e["key"]["layer"]): e["shape"] for e in prefill}
    assert shape[("q_rope", 0)] == [n, 576]  # head-major [n_tokens, n_head * head_dim]
    assert shape[("k_rope", 29)] == [n, 192]
    assert shape[("attn", 7)] == [n, 576]
    assert shape[("post_attn_residual", 29)] == [n, 576]  # after the last layer's row pick
    # Forward order: embedding, layer 0's stages in vocabulary order, ...
    first = [e["key"]["stage"] for e in prefill[:17]]
    assert first == names[:16] + ["attn_norm"]
    # Decode steps: one position each, after the prefill.
    steps = sorted({e["key"]["pos"]["start"] for e in tree.entries} - {0})
    assert steps == [n, n + 1]
    extra = m["run"]["extra"]
    assert extra["engine"] == "llama.cpp"
    assert extra["engine_versions"]["llama_cpp_python"]
    assert extra["engine_versions"]["ggml_commit"]
    # The build's account of itself, and the AVX-512 flags it does not report.
    assert "AVX2" in extra["engine_versions"]["system_info"]
    if os.path.exists("/proc/cpuinfo"):
        flags = extra["engine_versions"]["cpu_avx512_flags"]
        assert flags == sorted(flags) and all(f.startswith("avx512") for f in flags)
    assert (extra["threads"], extra["kv_cache_type"], extra["flash_attn"], extra["n_batch"]) == (2, "f16", False, 512)
    assert m["run"]["prompt_tokens"] == TOKENS


def _args(tmp_path, **kw):
    a = dict(
        model_file=MODEL, tokens=TOKENS[:4], out=str(tmp_path / "t"), gen=0, stop=[], selection="", force=False,
        precision="f32", threads=2, run={},
    )
    a.update(kw)
    return argparse.Namespace(**a)


def test_bad_input_is_refused_naming_it(llama_cpp, tmp_path):
    from taptree.llamacpp import EngineError, capture

    with pytest.raises(EngineError, match="token id 60000 is outside the vocabulary"):
        capture(_args(tmp_path, tokens=[1, 60000]))
    with pytest.raises(EngineError, match="no such model file"):
        capture(_args(tmp_path, model_file=str(tmp_path / "missing.gguf")))
    with pytest.raises(EngineError, match="--precision f64"):
        capture(_args(tmp_path, precision="f64"))
    # A directory that is not a tree is never written into.
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(TreeError, match="not a taptree tree"):
        capture(_args(tmp_path, out=str(busy)))
    assert os.listdir(busy) == ["notes.txt"] and (busy / "notes.txt").read_text() == "mine"
    assert not os.path.exists(tmp_path / "t")


def test_force_replaces_a_tree_and_only_a_tree(llama_cpp, tmp_path):
    from taptree.llamacpp import capture

    first = capture(_args(tmp_path))
    with pytest.raises(TreeError, match="already holds a tree"):
        capture(_args(tmp_path, tokens=TOKENS[:3]))
    assert open_tree(first["path"]).manifest["root"] == first["root"]
    second = capture(_args(tmp_path, tokens=TOKENS[:3], force=True))
    assert open_tree(second["path"]).manifest["run"]["prompt_tokens"] == TOKENS[:3]
    assert sorted(os.listdir(tmp_path)) == ["t"]  # no staging or set-aside tree left


def test_selection_keeps_only_the_selected_taps(llama_cpp, tmp_path):
    from taptree.llamacpp import capture

    summary = capture(_args(tmp_path, selection="stage=attn,logits;layer=3,none;pos=1..3"))
    tree = open_tree(summary["path"])
    keys = [(e["key"]["stage"], e["key"]["layer"], e["key"]["pos"]["start"], e["key"]["pos"]["end"]) for e in tree.entries]
    assert keys == [("attn", 3, 1, 3), ("logits", None, 1, 3)]


def test_settings_come_from_the_environment_checked():
    from taptree.llamacpp import EngineError, settings

    assert settings({}) == {"flash_attn": False, "kv_type": "f16", "n_batch": 512}
    assert settings({"TAPTREE_LLAMACPP_FLASH_ATTN": "1", "TAPTREE_LLAMACPP_N_BATCH": "8"})["flash_attn"] is True
    for var, bad in [("TAPTREE_LLAMACPP_FLASH_ATTN", "yes"), ("TAPTREE_LLAMACPP_KV_TYPE", "q8_0"),
                     ("TAPTREE_LLAMACPP_N_BATCH", "0")]:
        with pytest.raises(EngineError, match="%s: bad value" % var):
            settings({var: bad})
