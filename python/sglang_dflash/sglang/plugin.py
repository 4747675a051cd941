"""Entry point (group `sglang.srt.plugins`): our worker serves `--speculative-algorithm DFLASH`.

Runs in every SGLang process (launcher, scheduler, detokenizer), so it only registers hooks;
heavy imports happen when a hook fires. Switches (environment):
  SGLANG_DFLASH_IMPL=ours|builtin     which worker serves DFLASH (default: ours)
  SGLANG_ENABLE_DFLASH_SPEC_V2=1|0    force the overlapped (1) or synchronous (0) schedule;
                                      unset follows --disable-overlap-schedule
  SGLANG_DFLASH_GEMMA4_COMPAT=0       turn off the Gemma-4 fixes in `gemma4_compat` (on by default)
On a CPU (SGLANG_USE_CPU_ENGINE=1) it also lifts SGLang's CUDA-only gate for DFLASH and gives the
torch_native backend the TARGET_VERIFY path; SGLang's builtin worker additionally needs the
patches in `builtin_cpu_compat`, which are loaded only for the builtin on a CPU.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

SUPPORTED_SGLANG = "0.5.23"
IMPL_VARIABLE = "SGLANG_DFLASH_IMPL"
SCHEDULE_VARIABLE = "SGLANG_ENABLE_DFLASH_SPEC_V2"
CPU_DRAFT_BACKENDS = ("torch_native", "intel_amx")


def implementation() -> str:
    impl = os.environ.get(IMPL_VARIABLE, "ours").strip().lower() or "ours"
    if impl not in ("ours", "builtin"):
        raise ValueError(f"{IMPL_VARIABLE} must be 'ours' or 'builtin', got {impl!r}")
    return impl


def on_cpu_engine() -> bool:
    return os.environ.get("SGLANG_USE_CPU_ENGINE", "").strip().lower() in ("1", "true", "yes")


def register() -> None:
    """Called by SGLang's plugin loader with no arguments in every process."""
    from sglang.version import __version__ as sglang_version

    if sglang_version != SUPPORTED_SGLANG:
        logger.warning("sglang-dflash supports sglang==%s only; found %s, plugin inactive", SUPPORTED_SGLANG, sglang_version)
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    impl = implementation()
    HookRegistry.register(
        "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.create_worker", _create_worker, HookType.AROUND
    )
    HookRegistry.register(
        "sglang.srt.arg_groups.speculative_hook.handle_speculative_decoding", _check_drafter_path, HookType.AROUND
    )
    HookRegistry.register("sglang.srt.arg_groups.speculative_hook._handle_dflash", _handle_dflash, HookType.AROUND)
    if impl == "ours":
        HookRegistry.register(
            "sglang.srt.speculative.dflash_utils.validate_dflash_request", _refuse_unsupported_request, HookType.AROUND
        )
    from . import gemma4_compat

    if gemma4_compat.enabled():
        gemma4_compat.register(HookRegistry, HookType, on_cpu=on_cpu_engine())
    if on_cpu_engine():
        from .cpu import verify_attention

        verify_attention.register(HookRegistry, HookType)
        if impl == "builtin":
            from . import builtin_cpu_compat

            builtin_cpu_compat.register(HookRegistry, HookType)


def _create_worker(original, algorithm, *args, **kwargs):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    if algorithm is SpeculativeAlgorithm.DFLASH and implementation() == "ours":
        from .worker import DFlashWorker

        return DFlashWorker
    return original(algorithm, *args, **kwargs)


class _DflashCapablePlatform:
    """The current platform, except that it declares DFLASH support (CPU runs only)."""

    def __init__(self, platform):
        self._platform = platform

    def is_out_of_tree(self) -> bool:
        return True

    def supports_speculative_algorithm(self, algorithm: str) -> bool:
        return algorithm == "DFLASH" or self._platform.supports_speculative_algorithm(algorithm)

    def supports_speculative_draft_attention_backend(self, algorithm: str, backend: str) -> bool:
        return algorithm == "DFLASH" and backend in CPU_DRAFT_BACKENDS

    def get_default_speculative_draft_attention_backend(self, algorithm: str) -> str:
        return CPU_DRAFT_BACKENDS[0]

    def __getattr__(self, name):
        return getattr(self._platform, name)


def _handle_dflash(original, server_args, *args, **kwargs):
    import sglang.srt.arg_groups.speculative_hook as policy
    from sglang.srt.arg_groups.overrides import declare_resolution

    if str(server_args.device).startswith("cpu"):
        real_platform = policy.current_platform
        policy.current_platform = _DflashCapablePlatform(real_platform)
        try:
            original(server_args, *args, **kwargs)
        finally:
            policy.current_platform = real_platform
    else:
        original(server_args, *args, **kwargs)
    if implementation() == "ours":
        _check_drafter(server_args)
    schedule = os.environ.get(SCHEDULE_VARIABLE)
    if schedule is not None and schedule.strip() != "":
        overlapped = schedule.strip().lower() in ("1", "true", "yes")
        declare_resolution(server_args, "sglang_dflash", disable_overlap_schedule=not overlapped)
        logger.info("sglang-dflash: %s schedule forced by %s=%s", "overlapped" if overlapped else "synchronous",
                    SCHEDULE_VARIABLE, schedule)


def unsupported_request_features(req) -> list[str]:
    """What a request asks for that our verify step does not apply yet (so it would be silently wrong)."""
    params = req.sampling_params
    wanted = {
        "log-probabilities (return_logprob)": req.return_logprob,
        "min_p": (params.min_p or 0.0) > 0.0,
        "frequency/presence/repetition penalties": (params.frequency_penalty or 0.0) != 0.0
        or (params.presence_penalty or 0.0) != 0.0
        or (params.repetition_penalty or 1.0) != 1.0,
        "min_new_tokens": (params.min_new_tokens or 0) > 0,
        "logit_bias": bool(getattr(params, "logit_bias", None)),
        "constrained decoding (json_schema/regex/ebnf/structural_tag)": any(
            getattr(params, name, None) for name in ("json_schema", "regex", "ebnf", "structural_tag")
        ),
        "custom logit processors": getattr(req, "custom_logit_processor", None) is not None,
    }
    return [name for name, asked in wanted.items() if asked]


def _refuse_unsupported_request(original, req, *args, **kwargs):
    """A clean per-request error instead of an answer that ignores part of the request."""
    error = original(req, *args, **kwargs)
    if error is None and (missing := unsupported_request_features(req)):
        error = f"DFLASH with sglang-dflash's worker does not support {', '.join(missing)} yet"
    return error


def _check_drafter_path(original, server_args, *args, **kwargs):
    """Before SGLang reads it as a hub id: our worker loads drafters from local directories."""
    algorithm = str(getattr(server_args, "speculative_algorithm", None) or "").upper()
    path = getattr(server_args, "speculative_draft_model_path", None)
    if algorithm == "DFLASH" and implementation() == "ours" and path and not os.path.isdir(path):
        raise ValueError(
            f"--speculative-draft-model-path {path!r}: no drafter directory there (sglang-dflash loads the "
            "drafter from a local directory holding config.json and safetensors weights)"
        )
    return original(server_args, *args, **kwargs)


def _check_drafter(server_args) -> None:
    """Fail at start-up, in the launcher, on a block size or a drafter that cannot work.

    --speculative-num-draft-tokens is the block size; the drafter must fit the target's hidden
    size, layer count and vocabulary. The scheduler's worker checks again on the loaded models.
    """
    from transformers import AutoConfig

    from ..config import DFlashConfig

    config = DFlashConfig.from_pretrained(server_args.speculative_draft_model_path)
    config.check_block_size(int(server_args.speculative_num_draft_tokens))
    target = AutoConfig.from_pretrained(server_args.model_path, trust_remote_code=server_args.trust_remote_code)
    text = target.get_text_config()
    config.check_target(text.hidden_size, text.num_hidden_layers, text.vocab_size, server_args.model_path)
