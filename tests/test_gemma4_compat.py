"""The Gemma-4 fixes of `sglang/gemma4_compat.py` against SGLang 0.5.23's own code, with and without them.

Each fix is installed the way HookRegistry installs an AROUND hook (the module attribute replaced
by a wrapper calling ours with the original) and removed again after the test.
"""

from __future__ import annotations

import pytest
import torch

import sglang.srt.layers.layernorm as layernorm
import sglang.srt.utils.hf_transformers.config as hf_config
from transformers.integrations.heterogeneity.configuration_utils import AmbiguousGlobalPerLayerAttributeError

from sglang_dflash.launch import attention_args
from sglang_dflash.random_checkpoints import GEMMA4_FLAGSHIP_TARGET, make_random_target
from sglang_dflash.sglang import gemma4_compat


def _install_around(monkeypatch, owner, name, hook):
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        return hook(original, *args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)


@pytest.fixture(scope="module")
def gemma4_text_target(tmp_path_factory):
    return make_random_target("gemma4", tmp_path_factory.mktemp("gemma4-text"), **GEMMA4_FLAGSHIP_TARGET)


def test_text_only_gemma4_config_fails_to_parse_without_the_fix(gemma4_text_target):
    with pytest.raises(AmbiguousGlobalPerLayerAttributeError):
        hf_config.HfModelConfigParser().parse(str(gemma4_text_target), trust_remote_code=False)


def test_text_only_gemma4_config_parses_with_both_attention_shapes(monkeypatch, gemma4_text_target):
    _install_around(monkeypatch, hf_config, "get_hf_text_config", gemma4_compat.text_config_with_gemma4_fixup)
    config = hf_config.HfModelConfigParser().parse(str(gemma4_text_target), trust_remote_code=False)
    # Full layers: 1 KV head of 32 (keys are the values); sliding layers: 2 KV heads of 16.
    assert (config.head_dim, config.num_key_value_heads) == (32, 1)
    assert (config.swa_head_dim, config.swa_num_key_value_heads) == (16, 2)
    assert config.layer_types.count("full_attention") == 2
    # A second lookup (ModelConfig asks again) leaves the flattened config as it is.
    assert hf_config.get_hf_text_config(config) is config and config.head_dim == 32


def test_config_fix_leaves_other_model_types_alone():
    class Llama:
        model_type = "llama"

    assert not gemma4_compat.needs_text_only_fixup(Llama())


def _router_norm(dim=8):
    # What Gemma4Router builds: no learned weight of its own; its scale is folded into `weight`.
    norm = layernorm.Gemma4RMSNorm(dim, eps=1e-6, with_scale=False)
    norm.weight.copy_(torch.linspace(0.1, 2.0, dim))
    return norm


def test_cpu_router_norm_drops_the_folded_scale_without_the_fix():
    norm, x = _router_norm(), torch.randn(3, 8)
    unweighted = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert torch.allclose(norm.forward_native(x), unweighted)
    assert not torch.allclose(norm.forward_native(x), unweighted * norm.weight)


def test_cpu_router_norm_applies_the_weight_like_the_cuda_path(monkeypatch):
    for method in ("forward_native", "forward_cpu"):
        _install_around(monkeypatch, layernorm.Gemma4RMSNorm, method, gemma4_compat.gemma4_norm_applying_weight)
    norm, x = _router_norm(), torch.randn(3, 8)
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    assert torch.allclose(norm.forward_native(x), expected, atol=1e-6)
    assert torch.allclose(norm.forward_cpu(x), expected, atol=1e-6)
    # A norm with its own learned weight is untouched (scale_shift included).
    scaled = layernorm.Gemma4RMSNorm(8, eps=1e-6, scale_shift=1.0)
    scaled.weight.data.fill_(0.5)
    assert torch.allclose(scaled.forward_native(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * 1.5)


class _RecordingRegistry:
    def __init__(self):
        self.targets = []

    def register(self, target, hook, hook_type):
        self.targets.append(target)


class _HookType:
    AROUND = "around"


@pytest.mark.parametrize("on_cpu", [True, False])
def test_norm_fix_is_registered_on_the_cpu_engine_only(on_cpu):
    registry = _RecordingRegistry()
    gemma4_compat.register(registry, _HookType, on_cpu=on_cpu)
    assert gemma4_compat.CONFIG_TARGET in registry.targets
    assert all((target in registry.targets) == on_cpu for target in gemma4_compat.NORM_TARGETS)


def test_switch_turns_the_fixes_off(monkeypatch):
    monkeypatch.setenv(gemma4_compat.SWITCH_VARIABLE, "0")
    assert not gemma4_compat.enabled()
    monkeypatch.delenv(gemma4_compat.SWITCH_VARIABLE)
    assert gemma4_compat.enabled()


def test_gemma4_targets_are_launched_without_the_refused_attention_flag(gemma4_text_target, tmp_path):
    assert attention_args(gemma4_text_target) == []
    (tmp_path / "config.json").write_text('{"model_type": "qwen3"}')
    assert attention_args(tmp_path) == ["--attention-backend", "torch_native"]
