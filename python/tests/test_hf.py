"""taptree.torch and taptree.hf on a tiny seeded Qwen2 (q/k/v biases)."""

import os

import numpy as np
import pytest

if os.environ.get("CI") == "true":
    import torch  # noqa: F401  (under CI a missing torch is a failure, not a skip)
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from taptree import open_tree, stages  # noqa: E402
from taptree.hf import capture_hf  # noqa: E402
from taptree.torch import MappingError, TorchCapture  # noqa: E402
from taptree.tree import TreeWriter  # noqa: E402


def tiny_qwen2(dtype=torch.float32):
    torch.manual_seed(7)
    config = transformers.Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    model = transformers.Qwen2ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(torch.randn_like(p))
    return model.to(dtype).eval()


def keys(tree):
    return [(e["key"]["stage"], e["key"]["layer"], e["key"]["pos"]["start"], e["key"]["pos"]["end"]) for e in tree.entries]


def test_capture_hf_taps_every_stage_with_its_layout(tmp_path):
    model = tiny_qwen2()
    summary = capture_hf(model, [1, 5, 9], out=tmp_path / "t")
    t = open_tree(tmp_path / "t")
    assert summary["taps"] == 3 + 2 * 15 == len(t.entries)
    assert {k[0] for k in keys(t)} == set(stages.NAMES)
    by = {(k[0], k[1]): e for k, e in zip(keys(t), t.entries)}
    assert by[("q_rope", 1)]["shape"] == [3, 32]
    assert by[("k_rope", 0)]["shape"] == [3, 16]
    assert by[("logits", None)]["shape"] == [3, 64]
    layouts = {s["name"]: s.get("layout") for s in t.manifest["stages"]}
    assert layouts["q_proj"] == {"rotary": "half_split", "head_dim": 8}
    run = t.manifest["run"]
    assert run["prompt_tokens"] == [1, 5, 9] and run["precision"] == "f32"
    assert run["extra"]["engine"] == "hf" and run["extra"]["float32_islands"] == []
    # q_proj really holds the biased projection of attn_norm.
    x = t.read(by[("attn_norm", 0)])
    q = t.read(by[("q_proj", 0)])
    attn = model.model.layers[0].self_attn.q_proj
    want = x @ attn.weight.detach().numpy().T + attn.bias.detach().numpy()
    assert np.allclose(q, want, atol=1e-5)
    # The residual stream: post_ffn_residual = post_attn_residual + ffn_down.
    r = t.read(by[("post_attn_residual", 1)]) + t.read(by[("ffn_down", 1)])
    assert np.allclose(r, t.read(by[("post_ffn_residual", 1)]), atol=1e-6)


def test_generation_taps_each_decode_position(tmp_path):
    model = tiny_qwen2()
    summary = capture_hf(model, [1, 5, 9], out=tmp_path / "t", gen=3, select="stage=logits")
    t = open_tree(tmp_path / "t")
    assert len(summary["generated"]) == 3
    assert keys(t) == [("logits", None, 0, 3), ("logits", None, 3, 4), ("logits", None, 4, 5)]
    assert t.manifest["run"]["extra"]["generated_tokens"] == [summary["generated"]]
    assert int(t.read(t.entries[0])[-1].argmax()) == summary["generated"][0]


def test_f64_is_not_claimed_all_f64_and_bf16_is_written_as_bf16(tmp_path):
    capture_hf(tiny_qwen2(torch.float64), [1, 2], out=tmp_path / "f64")
    extra = open_tree(tmp_path / "f64").manifest["run"]["extra"]
    assert extra["all_ops_f64"] is False
    assert any("RMSNorm" in s for s in extra["float32_islands"]), extra
    capture_hf(tiny_qwen2(torch.bfloat16), [1, 2], out=tmp_path / "bf16")
    t = open_tree(tmp_path / "bf16")
    assert {e["dtype"] for e in t.entries} == {"BF16"}
    assert t.manifest["run"]["precision"] == "bf16"
    assert np.isfinite(t.read(t.entries[-1])).all()


def test_torch_capture_maps_module_names_and_refuses_unknown_ones(tmp_path):
    net = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
    x = torch.arange(12, dtype=torch.float32).reshape(1, 3, 4)
    with TreeWriter(tmp_path / "t") as w:
        with TorchCapture(net, w, {"0": "up", "2:input": "act", "2": "down"}):
            net(x)
    t = open_tree(tmp_path / "t")
    assert [k[0] for k in keys(t)] == ["up", "act", "down"]
    assert np.allclose(t.read(t.entries[1]), torch.relu(net[0](x))[0].detach().numpy())
    with TreeWriter(tmp_path / "u") as w:
        with pytest.raises(MappingError, match="matches 9"):
            TorchCapture(net, w, {"9": "nothing"}).attach()
