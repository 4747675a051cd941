import json
from pathlib import Path

import pytest
import torch

from sglang_dflash.config import DFlashConfig, DFlashConfigError, default_target_layer_ids
from sglang_dflash.drafter import DFlashDrafter

# The published z-lab/gemma-4-26B-A4B-it-DFlash drafter's config.json (reference notes, section 3.3).
GEMMA4_DRAFTER_DIR = Path(__file__).parent / "fixtures" / "gemma-4-26B-A4B-it-DFlash"
GEMMA4_DRAFTER = json.loads((GEMMA4_DRAFTER_DIR / "config.json").read_text())

# A Qwen3-style drafter written by transformers 5 (rope_parameters instead of rope_theta).
QWEN3_DRAFTER = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "hidden_size": 4096,
    "num_hidden_layers": 5,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 12288,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
    "num_target_layers": 36,
    "block_size": 16,
    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
}


def test_published_gemma4_drafter_config_parses():
    config = DFlashConfig.from_pretrained(GEMMA4_DRAFTER_DIR)
    assert config.target_layer_ids == [1, 6, 11, 17, 22, 27]
    assert config.num_context_features == 6 * 2816
    assert config.mask_token_id == 4 and config.block_size == 16
    assert [config.window_for_layer(i) for i in range(5)] == [2048] * 4 + [None]
    assert config.final_logit_softcapping == 30.0
    assert not config.causal_for_layer(0)


def test_published_gemma4_drafter_has_the_published_size():
    config = DFlashConfig.from_pretrained(GEMMA4_DRAFTER_DIR)
    with torch.device("meta"):
        drafter = DFlashDrafter(config)
    hidden, q, kv, head, ffn = 2816, 32 * 128, 8 * 128, 128, 5632
    per_layer = (
        hidden * q + 2 * hidden * kv + q * hidden  # q, k, v, o
        + 2 * head  # q_norm, k_norm
        + 3 * hidden * ffn  # gate, up, down
        + 2 * hidden  # input and post-attention norms
    )  # fmt: skip
    fc = 6 * hidden * hidden  # 16896 -> 2816
    expected = fc + 5 * per_layer + 2 * hidden  # + hidden_norm, final norm; no embedding, no LM head
    assert sum(p.numel() for p in drafter.parameters()) == expected == 429_689_088  # "about 0.4 B"
    assert tuple(drafter.fc.weight.shape) == (2816, 16896)
    assert not any("embed" in name or "lm_head" in name for name, _ in drafter.named_parameters())


def test_transformers5_rope_layout_and_round_trip(tmp_path):
    config = DFlashConfig.from_dict(QWEN3_DRAFTER)
    assert config.rope_theta == 1e6 and config.rope_scaling is None
    assert config.layer_types == ["full_attention"] * 5
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    again = DFlashConfig.from_pretrained(tmp_path)
    assert again.to_dict() == config.to_dict()


def test_default_layer_ids_follow_the_published_formula():
    assert default_target_layer_ids(30, 6) == [1, 6, 11, 17, 22, 27]
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(30, 1) == [15]
    without_ids = {**QWEN3_DRAFTER, "dflash_config": {"mask_token_id": 5}}
    assert DFlashConfig.from_dict(without_ids).target_layer_ids == [1, 9, 17, 25, 33]


def _broken(**changes):
    raw = json.loads(json.dumps(GEMMA4_DRAFTER))
    for key, value in changes.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    return raw


@pytest.mark.parametrize(
    "raw, field",
    [
        (_broken(hidden_size=None), "hidden_size"),
        (_broken(num_hidden_layers=0), "num_hidden_layers"),
        (_broken(num_key_value_heads=5), "num_key_value_heads"),
        (_broken(num_target_layers=None), "dflash_config.num_target_layers"),
        (_broken(dflash_config={"target_layer_ids": [1, 6]}), "dflash_config.mask_token_id"),
        (_broken(dflash_config={"mask_token_id": 4, "target_layer_ids": [1, 40]}), "dflash_config.target_layer_ids"),
        (_broken(dflash_config={"mask_token_id": 4, "target_layer_ids": [6, 1]}), "dflash_config.target_layer_ids"),
        (_broken(dflash_config={"mask_token_id": 4, "target_layer_ids": []}), "dflash_config.target_layer_ids"),
        (_broken(dflash_config={"mask_token_id": 300000, "target_layer_ids": [1]}), "dflash_config.mask_token_id"),
        (_broken(layer_types=["full_attention"] * 4), "layer_types"),
        (_broken(layer_types=["local"] * 5), "layer_types"),
        (_broken(sliding_window=None), "sliding_window"),
        (_broken(sliding_window=8), "sliding_window"),
        (_broken(dflash_config={"mask_token_id": 4, "block_size": 8}), "block_size"),
        (_broken(architectures=["LlamaForCausalLM"]), "architectures"),
        (_broken(hidden_act="relu6"), "hidden_act"),
        (_broken(hidden_size="2816"), "hidden_size"),
        (_broken(rope_theta=-1), "rope_theta"),
        (_broken(rope_scaling={"rope_type": "mystery"}), "rope_scaling"),
    ],
)
def test_bad_configs_name_the_field(raw, field):
    with pytest.raises(DFlashConfigError) as caught:
        DFlashConfig.from_dict(raw, source="x/config.json")
    assert caught.value.field == field
    assert f"'{field}'" in str(caught.value)


def test_unreadable_or_missing_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="no drafter config.json"):
        DFlashConfig.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(DFlashConfigError, match="not valid JSON"):
        DFlashConfig.from_pretrained(tmp_path)


def test_runtime_block_size_is_checked():
    config = DFlashConfig.from_dict(GEMMA4_DRAFTER)
    config.check_block_size(16)
    config.check_block_size(4)
    with pytest.raises(DFlashConfigError, match="trained block size 16"):
        config.check_block_size(17)
    small_window = DFlashConfig.from_dict(_broken(sliding_window=16))
    small_window.sliding_window = 8
    with pytest.raises(DFlashConfigError, match="smaller than the block size"):
        small_window.check_block_size(12)


def test_written_sliding_drafters_keep_their_window_in_transformers(tmp_path):
    """SGLang's builtin reads the drafter through transformers' Qwen3Config, which drops the window unless told."""
    from transformers import AutoConfig

    (tmp_path / "config.json").write_text(json.dumps(DFlashConfig.from_pretrained(GEMMA4_DRAFTER_DIR).to_dict()))
    assert AutoConfig.from_pretrained(tmp_path).sliding_window == 2048
