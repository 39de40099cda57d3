"""The llama.cpp adapter on Gemma 3 270M: Gemma's vocabulary (q/k norms,
post-norms, GeGLU) at every layer, the scaled embedding, and llama.cpp's own
logits.

Needs llama-cpp-python and the model (scripts/test.sh installs and fetches
both); without them the tests skip, unless TAPTREE_REQUIRE_LLAMACPP=1 makes
that a failure.
"""

import os

import numpy as np
import pytest

from taptree import open_tree, stages

REQUIRED = os.environ.get("TAPTREE_REQUIRE_LLAMACPP") == "1"
MODEL = os.path.join(
    os.environ.get("TAPTREE_CACHE") or os.path.expanduser("~/.cache/taptree"), "gemma-3-270m-q4_k_m.gguf"
)
# "<bos>The capital of France is"
TOKENS = [2, 818, 5279, 529, 7001, 563]


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
    _need(
        "%s: no model (cargo run --release -p fetch --example fetch_model gemma3-270m)" % MODEL,
        os.path.isfile(MODEL),
    )
    return llama_cpp


@pytest.fixture(scope="module")
def captured(llama_cpp, tmp_path_factory):
    from taptree.llamacpp import capture_llamacpp

    out = tmp_path_factory.mktemp("lcg") / "tree"
    summary = capture_llamacpp(MODEL, TOKENS, str(out), gen=2, threads=2)
    return summary, open_tree(out)


def test_gemma_vocabulary_at_every_layer_in_forward_order(captured):
    _, tree = captured
    m = tree.manifest
    names = [s["name"] for s in m["stages"]]
    assert names == [s["name"] for s in stages.gemma3()]
    assert m["run"]["extra"]["architecture"] == "gemma3"
    n = len(TOKENS)
    prefill = [e for e in tree.entries if e["key"]["pos"]["start"] == 0]
    assert len(prefill) == 1 + 18 * 19 + 2
    shape = {(e["key"]["stage"], e["key"]["layer"]): e["shape"] for e in prefill}
    assert shape[("q_norm", 0)] == [n, 1024]  # 4 heads of 256, head-major
    assert shape[("k_norm", 17)] == [n, 256]
    assert shape[("ffn_geglu", 3)] == [n, 2048]
    assert shape[("post_attn_norm", 17)] == [n, 640]  # after the last layer's row pick
    first = [e["key"]["stage"] for e in prefill[:21]]
    assert first == names[:20] + ["attn_norm"]
    steps = sorted({e["key"]["pos"]["start"] for e in tree.entries} - {0})
    assert steps == [n]


def test_embedding_is_the_scaled_row(captured):
    import gguf

    _, tree = captured
    emb = next(tree.read(e) for e in tree.entries if e["key"]["stage"] == stages.EMBEDDING)
    t = next(t for t in gguf.GGUFReader(MODEL).tensors if t.name == "token_embd.weight")
    rows = gguf.quants.dequantize(t.data[TOKENS], t.tensor_type).astype(np.float32)
    # llama.cpp's inp_scaled: the Q8_0 row times sqrtf(640), in f32.
    assert np.array_equal(emb, rows * np.float32(np.sqrt(640.0)))
    # The red case: the unscaled GET_ROWS is not the stage.
    assert not np.allclose(emb, rows)


def test_tree_logits_are_llama_cpp_pythons_bit_for_bit(llama_cpp, captured):
    summary, tree = captured
    got = np.concatenate([tree.read(e) for e in tree.entries if e["key"]["stage"] == stages.LOGITS])
    assert got.shape == (len(TOKENS) + 1, 262144)
    assert np.array_equal(got, summary["logits"])
    llm = llama_cpp.Llama(MODEL, n_ctx=256, n_threads=2, n_threads_batch=2, logits_all=True, verbose=False,
                          flash_attn=False)
    llm.eval(TOKENS)
    llm.eval(summary["generated"][:1])
    want = np.array(llm.scores[: len(TOKENS) + 1], dtype=np.float32)
    assert np.array_equal(got, want)
    # The red case: another prompt differs from the changed position on.
    llm.reset()
    other = list(TOKENS)
    other[3] = 5356
    llm.eval(other)
    theirs = np.array(llm.scores[: len(other)], dtype=np.float32)
    assert np.array_equal(theirs[:3], got[:3])
    assert not np.array_equal(theirs[3], got[3])
