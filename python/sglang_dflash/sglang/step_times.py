"""SGLANG_DFLASH_STEP_TIMES=PATH: one JSON line per decode step with the time of each phase.

Fields: `batch_size`, `tokens` (committed this step), `draft_s`, `verify_s`, `accept_commit_s`,
and `start`/`end` (time.perf_counter() in the scheduler process), so the scheduler's own time
between steps is `start[i] - end[i-1]`. On a GPU each phase boundary synchronises the device,
which costs a little speed: use it for benchmarks, not for serving. Off (no cost) when unset.
"""

from __future__ import annotations

import contextlib
import json
import os
import time

import torch

STEP_TIMES_VARIABLE = "SGLANG_DFLASH_STEP_TIMES"


class StepTimes:
    def __init__(self, path: str, device):
        self._file = open(path, "a", buffering=1)  # line-buffered: every step is on disk at once
        self._cuda = torch.device(device).type == "cuda"
        self._phases: dict[str, float] = {}
        self._start = 0.0

    def _now(self) -> float:
        if self._cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def start_step(self) -> None:
        self._phases = {}
        self._start = self._now()

    @contextlib.contextmanager
    def phase(self, name: str):
        began = self._now()
        yield
        self._phases[name + "_s"] = self._now() - began

    def end_step(self, batch_size: int, accept_lens: torch.Tensor) -> None:
        record = {"batch_size": batch_size, "tokens": int(accept_lens.sum()), **self._phases}
        record.update(start=self._start, end=self._now())
        self._file.write(json.dumps(record) + "\n")


class NoStepTimes:
    """What the worker holds when timing is off: every call does nothing."""

    def start_step(self) -> None:
        pass

    def phase(self, name: str):
        return contextlib.nullcontext()

    def end_step(self, batch_size: int, accept_lens: torch.Tensor) -> None:
        pass


def step_times_from_env(device) -> StepTimes | NoStepTimes:
    path = os.environ.get(STEP_TIMES_VARIABLE, "").strip()
    return StepTimes(path, device) if path else NoStepTimes()
