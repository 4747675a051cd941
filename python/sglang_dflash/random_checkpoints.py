"""Tiny random checkpoints in the exact published formats, for tests and demos (no hub needed).

Targets are real transformers models (Llama, Qwen3, Gemma-3, Gemma-4 text) saved with
`save_pretrained`; drafters are `DFlashDrafter`s saved in the z-lab layout. Weights are drawn with
a wide initialisation so that logits are far apart: float32 runs then have no near-ties and
speculative output can be compared with target-only output token for token.

CLI: python -m sglang_dflash.random_checkpoints drafter --target smollm2 --out DIR
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from .config import FULL_ATTENTION, SLIDING_ATTENTION, DFlashConfig, default_target_layer_ids
from .drafter import DFlashDrafter

TARGET_FAMILIES = ("llama", "qwen3", "gemma3", "gemma4")


def tiny_target_config(family: str, vocab_size: int = 512, num_layers: int = 4, **overrides):
    """A small config of the given family; Gemma-4 gets its real layer pattern, MoE and K=V layers."""
    import transformers

    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        initializer_range=0.2,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    if family == "llama":
        kwargs = dict(common, tie_word_embeddings=False)
        return transformers.LlamaConfig(**{**kwargs, **overrides})
    if family == "qwen3":
        kwargs = dict(common, tie_word_embeddings=False)
        return transformers.Qwen3Config(**{**kwargs, **overrides})
    if family == "gemma3":
        kwargs = dict(common, sliding_window=8, final_logit_softcapping=30.0, query_pre_attn_scalar=16)
        return transformers.Gemma3TextConfig(**{**kwargs, **overrides})
    if family == "gemma4":
        kwargs = dict(
            common,
            sliding_window=8,
            final_logit_softcapping=30.0,
            global_head_dim=32,
            num_global_key_value_heads=1,
            attention_k_eq_v=True,
            hidden_size_per_layer_input=0,
            enable_moe_block=True,
            num_experts=4,
            top_k_experts=2,
            moe_intermediate_size=32,
        )
        return transformers.Gemma4TextConfig(**{**kwargs, **overrides})
    raise ValueError(f"unknown target family {family!r}; choose from {TARGET_FAMILIES}")


def make_random_target(
    family: str,
    out_dir: str | Path,
    seed: int = 0,
    tokenizer_from: str | Path | None = None,
    chat_template: str | None = None,
    **config_overrides,
) -> Path:
    """Write a random target of `family` to out_dir (config.json + model.safetensors).

    With `tokenizer_from` (a model directory) the target borrows that tokenizer and chat template
    (or `chat_template`, when given) and takes its vocabulary size, so a real server can serve it.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = None
    if tokenizer_from is not None:
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_from))
        config_overrides = {
            "vocab_size": len(tokenizer),
            "eos_token_id": tokenizer.eos_token_id,
            "bos_token_id": tokenizer.bos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
            **config_overrides,
        }
    config = tiny_target_config(family, **config_overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    if tokenizer is not None:
        if chat_template is not None:
            tokenizer.chat_template = chat_template
        tokenizer.save_pretrained(out_dir)
    return out_dir


# A Gemma-style chat template; like Gemma-4's, `enable_thinking` adds a thinking marker to the
# system turn (SGLang passes chat_template_kwargs through to it).
GEMMA_STYLE_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if enable_thinking %}<start_of_turn>system\n<|think|><end_of_turn>\n{% endif %}"
    "{% for message in messages %}"
    "<start_of_turn>{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{{ message['content'] }}<end_of_turn>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

# gemma-4-26B-A4B-it and z-lab/gemma-4-26B-A4B-it-DFlash, scaled down: the target keeps the
# 5-sliding-1-full layer pattern, K=V full layers with their own head dim and KV heads, MoE
# beside the dense MLP and the softcap; the drafter keeps the published format (4 sliding
# layers + 1 full, block 16, mask id 4, six target layers by the published formula, softcap 30).
GEMMA4_FLAGSHIP_TARGET = dict(
    num_layers=12, num_experts=8, top_k_experts=2, sliding_window=8, global_head_dim=32, num_global_key_value_heads=1
)
GEMMA4_FLAGSHIP_DRAFT_LAYERS = [SLIDING_ATTENTION] * 4 + [FULL_ATTENTION]


def make_gemma4_flagship_pair(root: str | Path, tokenizer_from: str | Path, seed: int = 0) -> tuple[Path, Path]:
    """(target directory, drafter directory) of the scaled-down flagship pairing."""
    from transformers import AutoTokenizer

    root = Path(root)
    target = make_random_target(
        "gemma4", root / "target", seed=seed, tokenizer_from=tokenizer_from,
        chat_template=GEMMA_STYLE_CHAT_TEMPLATE, **GEMMA4_FLAGSHIP_TARGET,
    )  # fmt: skip
    config = tiny_target_config("gemma4", **GEMMA4_FLAGSHIP_TARGET)
    vocab_size = len(AutoTokenizer.from_pretrained(str(tokenizer_from)))
    drafter = make_random_drafter(
        root / "drafter",
        hidden_size=config.hidden_size,
        num_target_layers=config.num_hidden_layers,
        vocab_size=vocab_size,
        num_layers=len(GEMMA4_FLAGSHIP_DRAFT_LAYERS),
        layer_types=GEMMA4_FLAGSHIP_DRAFT_LAYERS,
        sliding_window=32,
        block_size=16,
        mask_token_id=4,
        target_layer_ids=default_target_layer_ids(config.num_hidden_layers, 6),
        final_logit_softcapping=30.0,
        rope_theta=1e6,
        seed=seed,
    )
    return target, drafter


def _target_shape(target_dir: str | Path) -> tuple[int, int, int]:
    """(hidden size, layer count, vocabulary size) of a target directory, .gguf file or `smollm2`."""
    from .targets import TargetModel

    target = TargetModel.from_pretrained(target_dir)
    return target.hidden_size, target.num_layers, target.vocab_size


def make_random_drafter(
    out_dir: str | Path,
    hidden_size: int,
    num_target_layers: int,
    vocab_size: int,
    num_layers: int = 1,
    block_size: int = 16,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 16,
    intermediate_size: int | None = None,
    target_layer_ids: list[int] | None = None,
    layer_types: list[str] | None = None,
    sliding_window: int | None = None,
    mask_token_id: int | None = None,
    final_logit_softcapping: float | None = None,
    rope_theta: float = 10000.0,
    seed: int = 0,
    shards: int = 1,
    dtype: torch.dtype = torch.float32,
) -> Path:
    """Write a random drafter in the z-lab format (optionally sharded with an index file)."""
    layer_types = layer_types or [FULL_ATTENTION] * num_layers
    config = DFlashConfig(
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate_size or 2 * hidden_size,
        rms_norm_eps=1e-6,
        num_target_layers=num_target_layers,
        target_layer_ids=target_layer_ids or _spread_layer_ids(num_target_layers, num_layers),
        block_size=block_size,
        mask_token_id=vocab_size - 1 if mask_token_id is None else mask_token_id,
        layer_types=layer_types,
        sliding_window=sliding_window if SLIDING_ATTENTION in layer_types else None,
        vocab_size=vocab_size,
        final_logit_softcapping=final_logit_softcapping,
        rope_theta=rope_theta,
    )
    # Round-trip through the validator so a test can never write a config we would refuse.
    config = DFlashConfig.from_dict(config.to_dict())
    torch.manual_seed(seed)
    drafter = DFlashDrafter(config)
    out_dir = Path(out_dir)
    drafter.save_pretrained(out_dir, dtype=dtype)
    if shards > 1:
        _reshard(out_dir, shards)
    return out_dir


def _spread_layer_ids(num_target_layers: int, count: int) -> list[int]:
    """The published layer choice, or distinct layers spread over 1..L-2 where it collides (tiny targets).

    The last layer is avoided: SGLang's Qwen3 cannot capture it.
    """
    ids = default_target_layer_ids(num_target_layers, count)
    if len(set(ids)) == len(ids):
        return ids
    inner = list(range(1, max(2, num_target_layers - 1)))
    picked = sorted({inner[round(i * (len(inner) - 1) / max(1, count - 1))] for i in range(count)})
    if len(picked) < count:
        raise ValueError(f"cannot pick {count} distinct layers of a {num_target_layers}-layer target")
    return picked


def _reshard(out_dir: Path, shards: int) -> None:
    """Split model.safetensors into `shards` files plus model.safetensors.index.json."""
    import json

    from safetensors.torch import load_file, save_file

    single = out_dir / "model.safetensors"
    tensors = load_file(str(single))
    names = sorted(tensors)
    weight_map = {}
    for shard in range(shards):
        shard_name = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        part = {name: tensors[name] for name in names[shard::shards]}
        save_file(part, str(out_dir / shard_name), metadata={"format": "pt"})
        weight_map.update({name: shard_name for name in part})
    single.unlink()
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    kinds = parser.add_subparsers(dest="kind", required=True)
    target = kinds.add_parser("target", help="a tiny random target model")
    target.add_argument("--family", choices=TARGET_FAMILIES, required=True)
    target.add_argument("--out", required=True)
    target.add_argument("--seed", type=int, default=0)
    target.add_argument("--tokenizer-from", default=None, help="borrow this model's tokenizer (`smollm2` allowed)")
    drafter = kinds.add_parser("drafter", help="a random drafter shaped for a target")
    drafter.add_argument("--target", required=True, help="target directory, .gguf file or `smollm2`")
    drafter.add_argument("--out", required=True)
    drafter.add_argument("--layers", type=int, default=1)
    drafter.add_argument("--block-size", type=int, default=16)
    drafter.add_argument("--mask-token-id", type=int, default=None)
    drafter.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.kind == "target":
        tokenizer_from = args.tokenizer_from
        if tokenizer_from == "smollm2":
            from .targets import smollm2_hf_dir

            tokenizer_from = smollm2_hf_dir()
        print(make_random_target(args.family, args.out, seed=args.seed, tokenizer_from=tokenizer_from))
        return
    hidden, layers, vocab = _target_shape(args.target)
    heads = max(1, hidden // 64)
    print(
        make_random_drafter(
            args.out,
            hidden_size=hidden,
            num_target_layers=layers,
            vocab_size=vocab,
            num_layers=args.layers,
            block_size=args.block_size,
            num_heads=heads,
            num_kv_heads=1 if heads % 2 else 2,
            head_dim=64,
            mask_token_id=args.mask_token_id,
            seed=args.seed,
        )
    )


if __name__ == "__main__":
    main()
