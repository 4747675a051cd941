"""DFlashConfig: the published z-lab drafter checkpoint format, read and validated.

The format is a transformers-style `config.json` (model_type `qwen3`, architecture
`DFlashDraftModel`) with a `dflash_config` block. Keys under `dflash_config` win over the
same keys at the top level. Every problem raises `DFlashConfigError` naming the field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
SUPPORTED_ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic", "longrope", "proportional")


class DFlashConfigError(ValueError):
    """A drafter config that is missing a field or whose fields contradict each other."""

    def __init__(self, field_name: str, message: str, source: str | None = None):
        self.field = field_name
        where = f" in {source}" if source else ""
        super().__init__(f"drafter config field '{field_name}'{where}: {message}")


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The layer choice used by the published drafters when a config gives no ids."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [int(round(start + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


@dataclass
class DFlashConfig:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    num_target_layers: int
    target_layer_ids: list[int]
    block_size: int
    mask_token_id: int
    layer_types: list[str]
    sliding_window: int | None = None
    is_causal: bool | None = None
    hidden_act: str = "silu"
    attention_bias: bool = False
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    partial_rotary_factor: float = 1.0
    max_position_embeddings: int = 32768
    vocab_size: int | None = None
    final_logit_softcapping: float | None = None
    use_gemma_norm: bool = False
    architectures: list[str] = field(default_factory=lambda: ["DFlashDraftModel"])
    model_type: str = "qwen3"
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(cls, path: str | Path) -> "DFlashConfig":
        path = Path(path)
        config_file = path / "config.json" if path.is_dir() else path
        if not config_file.exists():
            raise FileNotFoundError(f"no drafter config.json at {config_file}")
        try:
            raw = json.loads(config_file.read_text())
        except json.JSONDecodeError as error:
            raise DFlashConfigError("config.json", f"not valid JSON ({error})", str(config_file)) from error
        return cls.from_dict(raw, source=str(config_file))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str | None = None) -> "DFlashConfig":
        reader = _FieldReader(raw, source)
        architectures = reader.get("architectures", list, ["DFlashDraftModel"])
        if not any("DFlash" in name for name in architectures):
            raise DFlashConfigError(
                "architectures", f"expected a DFlash drafter architecture, got {architectures}", source
            )
        hidden_size = reader.positive_int("hidden_size")
        num_layers = reader.positive_int("num_hidden_layers")
        num_heads = reader.positive_int("num_attention_heads")
        num_kv_heads = reader.positive_int("num_key_value_heads", default=num_heads)
        if num_heads % num_kv_heads:
            raise DFlashConfigError(
                "num_key_value_heads",
                f"{num_kv_heads} does not divide num_attention_heads={num_heads}",
                source,
            )
        head_dim = reader.positive_int("head_dim", default=None)
        if head_dim is None:
            if hidden_size % num_heads:
                raise DFlashConfigError("head_dim", "absent and hidden_size is not divisible by the heads", source)
            head_dim = hidden_size // num_heads

        num_target_layers = reader.positive_int("num_target_layers", dflash=True)
        target_layer_ids = reader.get("target_layer_ids", list, None, dflash=True)
        if target_layer_ids is None:
            target_layer_ids = default_target_layer_ids(num_target_layers, num_layers)
        _check_layer_ids(target_layer_ids, num_target_layers, source)

        block_size = reader.positive_int("block_size", dflash=True, default=16)
        top_block, dflash_block = raw.get("block_size"), (raw.get("dflash_config") or {}).get("block_size")
        if top_block is not None and dflash_block is not None and top_block != dflash_block:
            raise DFlashConfigError(
                "block_size", f"top level says {top_block} but dflash_config says {dflash_block}", source
            )
        mask_token_id = reader.get("mask_token_id", int, None, dflash=True)
        if mask_token_id is None or isinstance(mask_token_id, bool) or mask_token_id < 0:
            raise DFlashConfigError("dflash_config.mask_token_id", "required, a non-negative token id", source)
        vocab_size = reader.positive_int("vocab_size", default=None)
        if vocab_size is not None and mask_token_id >= vocab_size:
            raise DFlashConfigError(
                "dflash_config.mask_token_id", f"{mask_token_id} is outside the vocabulary ({vocab_size})", source
            )

        layer_types = reader.get("layer_types", list, None) or [FULL_ATTENTION] * num_layers
        if len(layer_types) != num_layers:
            raise DFlashConfigError(
                "layer_types", f"has {len(layer_types)} entries for num_hidden_layers={num_layers}", source
            )
        for kind in layer_types:
            if kind not in (FULL_ATTENTION, SLIDING_ATTENTION):
                raise DFlashConfigError("layer_types", f"unknown layer type {kind!r}", source)
        sliding_window = reader.positive_int("sliding_window", default=None)
        if SLIDING_ATTENTION in layer_types:
            if sliding_window is None:
                raise DFlashConfigError("sliding_window", "required because layer_types has sliding layers", source)
            check_window_covers_block(sliding_window, block_size, source)

        hidden_act = reader.get("hidden_act", str, "silu")
        if hidden_act not in SUPPORTED_ACTIVATIONS:
            raise DFlashConfigError("hidden_act", f"{hidden_act!r} is not one of {SUPPORTED_ACTIVATIONS}", source)
        rope_theta, rope_scaling = _read_rope(raw, source)
        softcap = reader.get("final_logit_softcapping", (int, float), None, dflash=True)
        is_causal = reader.get("is_causal", bool, None)

        return cls(
            hidden_size=hidden_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            head_dim=head_dim,
            intermediate_size=reader.positive_int("intermediate_size"),
            rms_norm_eps=float(reader.get("rms_norm_eps", (int, float), 1e-6)),
            num_target_layers=num_target_layers,
            target_layer_ids=list(target_layer_ids),
            block_size=block_size,
            mask_token_id=mask_token_id,
            layer_types=list(layer_types),
            sliding_window=sliding_window,
            is_causal=is_causal,
            hidden_act=hidden_act,
            attention_bias=bool(reader.get("attention_bias", bool, False)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            partial_rotary_factor=float(reader.get("partial_rotary_factor", (int, float), 1.0)),
            max_position_embeddings=reader.positive_int("max_position_embeddings", default=32768),
            vocab_size=vocab_size,
            final_logit_softcapping=float(softcap) if softcap else None,
            use_gemma_norm=bool(reader.get("use_gemma_norm", bool, False)),
            architectures=list(architectures),
            model_type=reader.get("model_type", str, "qwen3"),
            raw=raw,
        )

    # ------------------------------------------------------------------ derived
    @property
    def num_context_features(self) -> int:
        """Width of the concatenated target hidden states that `fc` reads."""
        return len(self.target_layer_ids) * self.hidden_size

    def window_for_layer(self, layer_index: int) -> int | None:
        return self.sliding_window if self.layer_types[layer_index] == SLIDING_ATTENTION else None

    def causal_for_layer(self, layer_index: int) -> bool:
        """Draft attention inside the block is non-causal unless the config says `is_causal`."""
        return bool(self.is_causal)

    def check_block_size(self, block_size: int) -> None:
        """A runtime block size must fit what the drafter was trained for and its windows."""
        if block_size < 1 or block_size > self.block_size:
            raise DFlashConfigError(
                "block_size",
                f"requested block size {block_size} must be between 1 and the drafter's trained "
                f"block size {self.block_size}",
            )
        if SLIDING_ATTENTION in self.layer_types:
            check_window_covers_block(self.sliding_window, block_size)

    def check_target(self, hidden_size: int, num_layers: int, vocab_size: int, target_name: str = "the target") -> None:
        """Refuse a target this drafter cannot serve, naming every mismatch at once."""
        problems = []
        if self.hidden_size != hidden_size:
            problems.append(f"hidden size {self.hidden_size} != target {hidden_size}")
        if self.num_target_layers != num_layers:
            problems.append(f"trained on {self.num_target_layers} target layers, target has {num_layers}")
        if self.vocab_size is not None and self.vocab_size != vocab_size:
            problems.append(f"vocabulary {self.vocab_size} != target {vocab_size}")
        if self.mask_token_id >= vocab_size:
            problems.append(f"mask token {self.mask_token_id} is outside the target vocabulary ({vocab_size})")
        if problems:
            raise DFlashConfigError("drafter/target", f"the drafter does not fit {target_name}: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        """The z-lab `config.json` layout (what `from_dict` reads back)."""
        out = {
            "architectures": list(self.architectures),
            "model_type": self.model_type,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "hidden_act": self.hidden_act,
            "rms_norm_eps": self.rms_norm_eps,
            "attention_bias": self.attention_bias,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "layer_types": list(self.layer_types),
            "sliding_window": self.sliding_window,
            "num_target_layers": self.num_target_layers,
            "block_size": self.block_size,
            "tie_word_embeddings": False,
            "dflash_config": {
                "mask_token_id": self.mask_token_id,
                "target_layer_ids": list(self.target_layer_ids),
                "block_size": self.block_size,
            },
        }
        if self.vocab_size is not None:
            out["vocab_size"] = self.vocab_size
        if self.final_logit_softcapping is not None:
            out["final_logit_softcapping"] = self.final_logit_softcapping
        if self.partial_rotary_factor != 1.0:
            out["partial_rotary_factor"] = self.partial_rotary_factor
        if self.is_causal is not None:
            out["is_causal"] = self.is_causal
        if self.use_gemma_norm:
            out["use_gemma_norm"] = True
        if SLIDING_ATTENTION in self.layer_types:
            # transformers' Qwen3Config drops `sliding_window` unless this is set, and SGLang's
            # builtin DFLASH reads the window from that config (it refuses sliding layers without).
            out["use_sliding_window"] = True
        return out


def check_window_covers_block(sliding_window: int, block_size: int, source: str | None = None) -> None:
    if sliding_window < block_size:
        raise DFlashConfigError(
            "sliding_window",
            f"the draft sliding window ({sliding_window}) is smaller than the block size ({block_size}); "
            "a block's own tokens would not see each other",
            source,
        )


class _FieldReader:
    """Looks fields up in `dflash_config` first (where allowed), then at the top level."""

    def __init__(self, raw: dict[str, Any], source: str | None):
        if not isinstance(raw, dict):
            raise DFlashConfigError("config.json", "must be a JSON object", source)
        self.raw = raw
        self.source = source
        dflash = raw.get("dflash_config", {})
        if dflash is None:
            dflash = {}
        if not isinstance(dflash, dict):
            raise DFlashConfigError("dflash_config", "must be an object", source)
        self.dflash = dflash

    _MISSING = object()

    def get(self, name, kinds, default=_MISSING, dflash=False):
        value, where = None, name
        if dflash and self.dflash.get(name) is not None:
            value, where = self.dflash[name], f"dflash_config.{name}"
        elif self.raw.get(name) is not None:
            value = self.raw[name]
        if value is None:
            if default is self._MISSING:
                raise DFlashConfigError(f"dflash_config.{name}" if dflash else name, "required but missing", self.source)
            return default
        allowed = _as_tuple(kinds)
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise DFlashConfigError(where, f"expected {_kind_names(kinds)}, got {value!r}", self.source)
        return value

    def positive_int(self, name, default=_MISSING, dflash=False):
        value = self.get(name, int, default, dflash)
        if value is not None and value <= 0:
            raise DFlashConfigError(name, f"must be positive, got {value}", self.source)
        return value


def _as_tuple(kinds):
    return kinds if isinstance(kinds, tuple) else (kinds,)


def _kind_names(kinds) -> str:
    return " or ".join(kind.__name__ for kind in _as_tuple(kinds))


def _check_layer_ids(layer_ids: list, num_target_layers: int, source: str | None) -> None:
    name = "dflash_config.target_layer_ids"
    if not layer_ids:
        raise DFlashConfigError(name, "must list at least one target layer", source)
    for layer_id in layer_ids:
        if not isinstance(layer_id, int) or isinstance(layer_id, bool) or not 0 <= layer_id < num_target_layers:
            raise DFlashConfigError(name, f"{layer_id!r} is not a layer of a {num_target_layers}-layer target", source)
    if list(layer_ids) != sorted(set(layer_ids)):
        raise DFlashConfigError(name, f"must be strictly ascending, got {layer_ids}", source)


def _read_rope(raw: dict[str, Any], source: str | None) -> tuple[float, dict[str, Any] | None]:
    """RoPE settings in either layout: `rope_theta`/`rope_scaling` or transformers 5 `rope_parameters`."""
    params = raw.get("rope_parameters") or {}
    theta = raw.get("rope_theta", params.get("rope_theta", 10000.0))
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or not math.isfinite(theta) or theta <= 0:
        raise DFlashConfigError("rope_theta", f"must be a positive number, got {theta!r}", source)
    scaling = raw.get("rope_scaling")
    if scaling is None and params.get("rope_type", "default") != "default":
        scaling = {key: value for key, value in params.items() if key != "rope_theta"}
    if scaling is not None:
        if not isinstance(scaling, dict):
            raise DFlashConfigError("rope_scaling", f"must be an object, got {scaling!r}", source)
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise DFlashConfigError("rope_scaling", f"unsupported rope type {rope_type!r}", source)
        if rope_type == "default":
            scaling = None
    return float(theta), scaling
