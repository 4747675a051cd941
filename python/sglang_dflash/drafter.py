"""DFlashDrafter: the block-diffusion draft model in plain PyTorch, and its checkpoint loading.

Data flow of one draft pass:
  target features of committed tokens --fc--> hidden_norm --> per layer: K/V of the *context*
  (k_norm, RoPE at absolute positions), cached per request and only ever for committed tokens;
  block embeddings [anchor, MASK, ...] --> layers whose queries are the block and whose keys/values
  are [context ; block], non-causal inside the block --> final norm --> hidden states.
The target's embedding and LM head are shared (passed in by the caller); the drafter owns neither.
No SGLang imports here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .config import DFlashConfig

WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"


class DFlashCheckpointError(ValueError):
    """Drafter weights that are missing, unexpected or of the wrong shape."""


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, gemma_style: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        # Gemma stores weight-1 (so zeros mean identity); Qwen/Llama store the weight itself.
        self.weight_offset = 1.0 if gemma_style else 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight + self.weight_offset) * x32.to(x.dtype)


def rope_inverse_frequencies(config: DFlashConfig, rotary_dim: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and the attention scaling factor for the configured RoPE type."""
    if config.rope_scaling is None:
        exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim
        return (1.0 / (config.rope_theta**exponents)).float(), 1.0
    # Scaled variants (linear, llama3, yarn, ...) follow transformers' own definitions.
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = dict(config.rope_scaling)
    rope_type = scaling.get("rope_type", scaling.get("type"))
    hf_config = Qwen3Config(
        hidden_size=config.hidden_size,
        num_attention_heads=config.num_attention_heads,
        head_dim=rotary_dim,
        max_position_embeddings=config.max_position_embeddings,
        rope_parameters={"rope_theta": config.rope_theta, **scaling, "rope_type": rope_type},
    )
    inv_freq, attention_scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config, "cpu")
    return inv_freq.float(), float(attention_scaling)


class RotaryEmbedding(nn.Module):
    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.rotary_dim = int(config.head_dim * config.partial_rotary_factor)
        inv_freq, self.attention_scaling = rope_inverse_frequencies(config, self.rotary_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin of shape positions.shape + [rotary_dim], in float32."""
        angles = positions.to(torch.float32)[..., None] * self.inv_freq.to(positions.device)
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos() * self.attention_scaling, angles.sin() * self.attention_scaling


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [..., n, heads, head_dim]; cos/sin: [..., n, rotary_dim] (neox half-rotation)."""
    rotary_dim = cos.shape[-1]
    rotated, passed = x[..., :rotary_dim].float(), x[..., rotary_dim:]
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    first, second = rotated.chunk(2, dim=-1)
    rotated = rotated * cos + torch.cat([-second, first], dim=-1) * sin
    return torch.cat([rotated.to(x.dtype), passed], dim=-1)


class DraftAttention(nn.Module):
    def __init__(self, config: DFlashConfig, layer_index: int):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.window = config.window_for_layer(layer_index)
        self.causal = config.causal_for_layer(layer_index)
        hidden, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, config.use_gemma_norm)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, config.use_gemma_norm)

    def keys_values(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """K (normed, rotated) and V for `hidden` [..., n, H] -> [..., n, kv_heads, head_dim] each."""
        shape = hidden.shape[:-1] + (self.num_kv_heads, self.head_dim)
        keys = apply_rotary(self.k_norm(self.k_proj(hidden).view(shape)), cos, sin)
        return keys, self.v_proj(hidden).view(shape)

    def forward(self, block, cos, sin, block_positions, context: "PaddedContext", layer_index: int):
        visible = draft_visibility(context.positions, context.valid, block_positions, self.window, self.causal)
        return self.attend(block, cos, sin, context.keys[layer_index], context.values[layer_index], visible)

    def block_queries_keys_values(self, block, cos, sin):
        """Queries [bs, Q, heads, D] and the block's own keys/values [bs, Q, kv_heads, D]."""
        batch, block_len, _ = block.shape
        queries = self.q_norm(self.q_proj(block).view(batch, block_len, self.num_heads, self.head_dim))
        queries = apply_rotary(queries, cos, sin)
        block_keys, block_values = self.keys_values(block, cos, sin)
        return queries, block_keys, block_values

    def attend(self, block, cos, sin, context_keys, context_values, visible):
        """Queries of `block` [bs, Q, H] over keys/values [context ; block] where `visible` [bs, Q, C+Q] allows."""
        batch, block_len, _ = block.shape
        queries, block_keys, block_values = self.block_queries_keys_values(block, cos, sin)
        keys = torch.cat([context_keys, block_keys], dim=1)
        values = torch.cat([context_values, block_values], dim=1)
        out = masked_attention(queries, keys, values, visible, self.head_dim**-0.5)
        return self.o_proj(out.reshape(batch, block_len, -1))


def draft_visibility(context_positions, context_valid, block_positions, window: int | None, causal: bool):
    """Which keys [context ; block] each block query sees: [bs, Q, C+Q] bool.

    The one definition of the draft mask: every valid context key and every block key (non-causal
    inside the block unless `causal`), limited to |q_pos - k_pos| < window on sliding layers.
    """
    batch, block_len = block_positions.shape
    key_positions = torch.cat([context_positions, block_positions], dim=1)
    visible = torch.cat([context_valid, torch.ones_like(block_positions, dtype=torch.bool)], dim=1)
    visible = visible[:, None, :].expand(batch, block_len, key_positions.shape[1])
    distance = block_positions[:, :, None] - key_positions[:, None, :]
    if window is not None:
        visible = visible & (distance.abs() < window)
    if causal:
        visible = visible & (distance >= 0)
    return visible


def masked_attention(queries, keys, values, visible, scale: float):
    """queries [bs, Q, H, D], keys/values [bs, N, KVH, D] (GQA), visible [bs, Q, N] -> [bs, Q, H, D]."""
    out = F.scaled_dot_product_attention(
        queries.transpose(1, 2),
        keys.transpose(1, 2),
        values.transpose(1, 2),
        attn_mask=visible[:, None],
        scale=scale,
        enable_gqa=queries.shape[2] != keys.shape[2],
    )
    return out.transpose(1, 2)


_ACTIVATIONS = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


class DraftMLP(nn.Module):
    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act = _ACTIVATIONS[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, config: DFlashConfig, layer_index: int):
        super().__init__()
        self.layer_index = layer_index
        self.self_attn = DraftAttention(config, layer_index)
        self.mlp = DraftMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.use_gemma_norm)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.use_gemma_norm)

    def forward(self, hidden, cos, sin, positions, context: "PaddedContext"):
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), cos, sin, positions, context, self.layer_index)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))

    def forward_with_attention(self, hidden, cos, sin, attention_core):
        """The same layer with the attention core supplied: attention_core(attn, q, block_k, block_v) -> [bs, Q, H, D]."""
        attn = self.self_attn
        queries, block_keys, block_values = attn.block_queries_keys_values(self.input_layernorm(hidden), cos, sin)
        out = attention_core(attn, queries, block_keys, block_values)
        hidden = hidden + attn.o_proj(out.reshape(hidden.shape[0], hidden.shape[1], -1))
        return hidden + self.mlp(self.post_attention_layernorm(hidden))

    def forward_masked(self, hidden, cos, sin, context_keys, context_values, visible):
        """The same layer with an explicit visibility mask (training packs many blocks per sequence)."""
        hidden = hidden + self.self_attn.attend(self.input_layernorm(hidden), cos, sin, context_keys, context_values, visible)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


@dataclass
class DraftContext:
    """One request's draft context: per-layer K/V of its committed tokens, nothing else."""

    keys: list[torch.Tensor] = field(default_factory=list)  # per layer [n, kv_heads, head_dim]
    values: list[torch.Tensor] = field(default_factory=list)
    positions: torch.Tensor | None = None  # [n]

    def __len__(self) -> int:
        return 0 if self.positions is None else int(self.positions.shape[0])

    def append(self, keys_values: list[tuple[torch.Tensor, torch.Tensor]], positions: torch.Tensor) -> None:
        if self.positions is None:
            self.keys = [k for k, _ in keys_values]
            self.values = [v for _, v in keys_values]
            self.positions = positions
            return
        self.keys = [torch.cat([old, k]) for old, (k, _) in zip(self.keys, keys_values)]
        self.values = [torch.cat([old, v]) for old, (_, v) in zip(self.values, keys_values)]
        self.positions = torch.cat([self.positions, positions])

    def crop(self, length: int) -> None:
        """Keep only the first `length` tokens (a rolled-back context)."""
        self.keys = [k[:length] for k in self.keys]
        self.values = [v[:length] for v in self.values]
        self.positions = None if self.positions is None else self.positions[:length]


@dataclass
class PaddedContext:
    """A batch of DraftContexts right-padded to one length, with a validity mask."""

    keys: list[torch.Tensor]  # per layer [bs, C, kv_heads, head_dim]
    values: list[torch.Tensor]
    positions: torch.Tensor  # [bs, C]
    valid: torch.Tensor  # [bs, C] bool

    @classmethod
    def from_contexts(cls, contexts: list[DraftContext], num_layers, kv_heads, head_dim, dtype, device):
        batch, longest = len(contexts), max((len(c) for c in contexts), default=0)
        keys = [torch.zeros(batch, longest, kv_heads, head_dim, dtype=dtype, device=device) for _ in range(num_layers)]
        values = [torch.zeros_like(k) for k in keys]
        positions = torch.zeros(batch, longest, dtype=torch.long, device=device)
        valid = torch.zeros(batch, longest, dtype=torch.bool, device=device)
        for row, context in enumerate(contexts):
            n = len(context)
            if n == 0:
                continue
            for layer in range(num_layers):
                keys[layer][row, :n] = context.keys[layer]
                values[layer][row, :n] = context.values[layer]
            positions[row, :n] = context.positions
            valid[row, :n] = True
        return cls(keys, values, positions, valid)


class DFlashDrafter(nn.Module):
    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(config.num_context_features, config.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.use_gemma_norm)
        self.layers = nn.ModuleList(DraftLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.use_gemma_norm)
        self.rotary = RotaryEmbedding(config)

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def mask_token_id(self) -> int:
        return self.config.mask_token_id

    def context_keys_values(self, target_features: torch.Tensor, positions: torch.Tensor):
        """Per-layer context K/V for committed tokens.

        target_features: [n, K*hidden] (the chosen target layers, concatenated in layer order);
        positions: [n] absolute positions. Returns [(keys, values)] per layer, each [n, kv_heads, head_dim].
        """
        context = self.hidden_norm(self.fc(target_features.to(self.fc.weight.dtype)))
        cos, sin = self.rotary(positions)
        return [layer.self_attn.keys_values(context, cos, sin) for layer in self.layers]

    def forward(self, block_embeddings: torch.Tensor, positions: torch.Tensor, contexts: list[DraftContext]):
        """block_embeddings: [bs, B, hidden] (the target's embedding of the block); positions: [bs, B].

        Returns the final-normed hidden states [bs, B, hidden]. Padding in `contexts` is masked out.
        """
        weight = self.fc.weight
        padded = PaddedContext.from_contexts(
            contexts, len(self.layers), self.config.num_key_value_heads, self.config.head_dim, weight.dtype, weight.device
        )
        return self.forward_padded(block_embeddings, positions, padded)

    def forward_padded(self, block_embeddings: torch.Tensor, positions: torch.Tensor, context: "PaddedContext"):
        """The same pass over an already gathered context (e.g. read from a paged KV pool)."""
        cos, sin = self.rotary(positions)
        hidden = block_embeddings.to(self.fc.weight.dtype)
        for layer in self.layers:
            hidden = layer(hidden, cos, sin, positions, context)
        return self.norm(hidden)

    def forward_with_attention(self, block_embeddings: torch.Tensor, positions: torch.Tensor, attention_core):
        """The pass with the attention core supplied per layer (a kernel reading a paged context pool).

        attention_core(layer_index, attn, queries, block_keys, block_values) -> [bs, B, heads, head_dim].
        """
        cos, sin = self.rotary(positions)
        hidden = block_embeddings.to(self.fc.weight.dtype)
        for index, layer in enumerate(self.layers):
            hidden = layer.forward_with_attention(
                hidden, cos, sin, lambda attn, q, k, v, index=index: attention_core(index, attn, q, k, v)
            )
        return self.norm(hidden)

    def logits(self, hidden: torch.Tensor, lm_head: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Draft logits through the target's LM head, softcapped when the drafter is configured so.

        `hidden` [..., H] goes to the head as one contiguous [N, H] matrix: a strided 3-D input
        (e.g. a block's positions 1..B-1) makes torch take a batched path, 1.6x slower on a CPU.
        """
        flat = hidden.reshape(-1, hidden.shape[-1])
        logits = lm_head(flat).float()
        logits = logits.view(*hidden.shape[:-1], logits.shape[-1])
        cap = self.config.final_logit_softcapping
        return torch.tanh(logits / cap) * cap if cap else logits

    # ------------------------------------------------------------------ checkpoints
    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"):
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"drafter directory {path} does not exist")
        config = DFlashConfig.from_pretrained(path)
        drafter = cls(config)
        tensors = read_safetensors_checkpoint(path)
        check_state_dict(drafter.state_dict(), tensors, path)
        drafter.load_state_dict(tensors, strict=True)
        drafter = drafter.to(device=device, dtype=dtype or _checkpoint_dtype(tensors))
        return drafter.eval()

    def save_pretrained(self, path: str | Path, dtype: torch.dtype | None = None) -> None:
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        raw = self.config.to_dict()
        tensors = {name: t.detach().to(dtype or t.dtype).contiguous().cpu() for name, t in self.state_dict().items()}
        raw["torch_dtype"] = str(next(iter(tensors.values())).dtype).removeprefix("torch.")
        (path / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
        save_file(tensors, str(path / WEIGHTS_FILE), metadata={"format": "pt"})


def read_safetensors_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a single-file or sharded (index.json) checkpoint, `model.` prefix removed."""
    from safetensors.torch import load_file

    index_file, single_file = path / WEIGHTS_INDEX_FILE, path / WEIGHTS_FILE
    if index_file.exists():
        weight_map = json.loads(index_file.read_text()).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise DFlashCheckpointError(f"{index_file} has no weight_map")
        shards = sorted(set(weight_map.values()))
        missing_shards = [name for name in shards if not (path / name).exists()]
        if missing_shards:
            raise DFlashCheckpointError(f"{path}: shard files listed in the index are missing: {missing_shards}")
        tensors = {}
        for shard in shards:
            tensors.update(load_file(str(path / shard)))
    elif single_file.exists():
        tensors = load_file(str(single_file))
    else:
        raise DFlashCheckpointError(f"{path}: neither {WEIGHTS_FILE} nor {WEIGHTS_INDEX_FILE} found")
    return {name.removeprefix("model."): tensor for name, tensor in tensors.items()}


def check_state_dict(expected: dict[str, torch.Tensor], found: dict[str, torch.Tensor], path: Path) -> None:
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    misshaped = sorted(
        f"{name}: expected {tuple(expected[name].shape)}, found {tuple(found[name].shape)}"
        for name in set(expected) & set(found)
        if tuple(expected[name].shape) != tuple(found[name].shape)
    )
    problems = []
    if missing:
        problems.append(f"missing tensors: {missing}")
    if unexpected:
        problems.append(f"unexpected tensors: {unexpected}")
    if misshaped:
        problems.append(f"tensors with the wrong shape: {misshaped}")
    if problems:
        raise DFlashCheckpointError(f"drafter checkpoint {path} does not match its config.json; " + "; ".join(problems))


def _checkpoint_dtype(tensors: dict[str, torch.Tensor]) -> torch.dtype:
    floating = [t.dtype for t in tensors.values() if t.is_floating_point()]
    return floating[0] if floating else torch.float32
