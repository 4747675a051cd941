"""Training data: the target's own answers to our prompts, and their target features cached on disk.

A data directory holds numbered shards, each written atomically and skipped when present, so a
killed run resumes where it stopped:
  responses/shard-NNNNN.jsonl        one line per prompt: prompt text, prompt ids, response ids
  features/shard-NNNNN.safetensors   the same sequences concatenated:
      token_ids [N] int64, labels [N] int64 (the target's argmax after each token: its own next token),
      features [N, K*H] (outputs of the drafter's target layers), offsets [S+1], prompt_lens [S]
  responses/shard-corpus-NNNNN.jsonl, features/shard-corpus-NNNNN.safetensors
                                     the same for teacher-forced text already on the machine (corpus.py)
Features are computed once here so that training epochs never run the target again.

Generating answers is the slow part on a CPU (tens of tokens/s); features are one forward each.
`archive_responses` keeps answer shards as small gzip files (token ids only) and
`import_responses` puts them back into a new data directory, so another machine recomputes only
the features.
"""

from __future__ import annotations

import gzip
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from tqdm import tqdm

from ..generate import encode
from ..targets import TargetModel

RESPONSES, FEATURES = "responses", "features"


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


def _write_atomically(path: Path, write) -> None:
    partial = path.with_name(path.name + ".partial")
    write(partial)
    partial.replace(path)


@torch.inference_mode()
def generate_responses(target: TargetModel, tokenizer, prompts: Sequence[str], max_new_tokens: int) -> list[dict]:
    """Greedy answers of the target to `prompts` (one left-padded batch), cut after the first stop token."""
    model = target.model
    prompt_ids = [encode(tokenizer, p, chat=True) for p in prompts]
    width = max(len(ids) for ids in prompt_ids)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in prompt_ids], device=target.device)
    attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompt_ids], device=target.device)
    out = model.generate(
        input_ids=input_ids, attention_mask=attention, max_new_tokens=max_new_tokens, do_sample=False,
        pad_token_id=pad, eos_token_id=tokenizer.eos_token_id, top_p=None, top_k=None, temperature=None,
    )
    rows = []
    for text, ids, generated in zip(prompts, prompt_ids, out[:, width:].tolist()):
        if tokenizer.eos_token_id in generated:
            generated = generated[: generated.index(tokenizer.eos_token_id) + 1]
        rows.append({"prompt": text, "prompt_ids": ids, "response_ids": generated})
    return rows


@torch.inference_mode()
def sequence_features(target: TargetModel, rows: list[dict]) -> dict[str, torch.Tensor]:
    """One target forward per sequence: its chosen-layer features and its own next-token argmax."""
    token_ids, labels, features, offsets, prompt_lens = [], [], [], [0], []
    for row in rows:
        ids = torch.tensor(row["prompt_ids"] + row["response_ids"], device=target.device)
        logits, feats = target.forward(ids, torch.arange(len(ids), device=target.device), target.new_cache())
        token_ids.append(ids.cpu())
        labels.append(logits.argmax(-1).cpu())
        features.append(feats.to(torch.bfloat16).cpu())
        offsets.append(offsets[-1] + len(ids))
        prompt_lens.append(len(row["prompt_ids"]))
    return {
        "token_ids": torch.cat(token_ids),
        "labels": torch.cat(labels),
        "features": torch.cat(features),
        "offsets": torch.tensor(offsets),
        "prompt_lens": torch.tensor(prompt_lens),
    }


def prepare(
    data_dir: Path,
    target: TargetModel,
    tokenizer,
    prompts: Sequence[str],
    layer_ids: Sequence[int],
    shard_size: int,
    max_new_tokens: int,
    time_budget_s: float | None = None,
    generate: bool = True,
) -> int:
    """Generate and featurize every missing shard (resumable). Returns the number of complete shards.

    With `generate=False` only shards whose answers are already there (archived ones) are featurized.
    """
    (data_dir / RESPONSES).mkdir(parents=True, exist_ok=True)
    (data_dir / FEATURES).mkdir(parents=True, exist_ok=True)
    target.capture_layers(layer_ids)
    num_shards = (len(prompts) + shard_size - 1) // shard_size
    started, done = time.monotonic(), 0
    bar = tqdm(range(num_shards), desc="data shards", unit="shard")
    for index in bar:
        response_file = data_dir / RESPONSES / f"{shard_name(index)}.jsonl"
        feature_file = data_dir / FEATURES / f"{shard_name(index)}.safetensors"
        if feature_file.exists():
            done += 1
            continue
        if time_budget_s is not None and time.monotonic() - started > time_budget_s:
            bar.write(f"time budget of {time_budget_s:.0f}s spent; {done} shards complete, run again to continue")
            break
        if response_file.exists():
            rows = [json.loads(line) for line in response_file.read_text().splitlines()]
        elif not generate:
            continue
        else:
            t0 = time.monotonic()
            rows = generate_responses(target, tokenizer, prompts[index * shard_size : (index + 1) * shard_size], max_new_tokens)
            write_rows(response_file, rows)
            new_tokens = sum(len(r["response_ids"]) for r in rows)
            bar.set_postfix(gen_tok_s=f"{new_tokens / (time.monotonic() - t0):.0f}")
        write_features(feature_file, sequence_features(target, rows))
        done += 1
    return done


def write_rows(path: Path, rows: list[dict]) -> None:
    lines = "".join(json.dumps(row) + "\n" for row in rows)
    _write_atomically(path, lambda p: p.write_text(lines))


def write_features(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    _write_atomically(path, lambda p: save_file(tensors, str(p)))


def prepare_corpus(data_dir: Path, target: TargetModel, rows: list[dict], layer_ids: Sequence[int], shard_size: int) -> int:
    """Features of the corpus rows (see `corpus.py`) as shards `shard-corpus-NNNNN`, resumable like `prepare`."""
    from .corpus import CORPUS_PREFIX

    (data_dir / RESPONSES).mkdir(parents=True, exist_ok=True)
    (data_dir / FEATURES).mkdir(parents=True, exist_ok=True)
    target.capture_layers(layer_ids)
    num_shards = (len(rows) + shard_size - 1) // shard_size
    for index in tqdm(range(num_shards), desc="corpus shards", unit="shard"):
        name = f"{CORPUS_PREFIX}{index:05d}"
        feature_file = data_dir / FEATURES / f"{name}.safetensors"
        if not feature_file.exists():
            shard_rows = rows[index * shard_size : (index + 1) * shard_size]
            write_rows(data_dir / RESPONSES / f"{name}.jsonl", shard_rows)
            write_features(feature_file, sequence_features(target, shard_rows))
    return num_shards


def archive_responses(data_dir: Path, archive: Path) -> list[Path]:
    """gzip every generated answer shard of `data_dir` that `archive` lacks into `archive`; returns the new files.

    Corpus shards are left out: `prepare --corpus-sequences` rebuilds them from this machine's files.
    """
    archive.mkdir(parents=True, exist_ok=True)
    written = []
    for shard in sorted((Path(data_dir) / RESPONSES).glob("shard-[0-9]*.jsonl")):
        packed = archive / f"{shard.name}.gz"
        if not packed.exists():
            _write_atomically(packed, lambda p: p.write_bytes(gzip.compress(shard.read_bytes(), mtime=0)))
            written.append(packed)
    return written


def answered_prompts(data_dir: Path) -> frozenset[str]:
    """The prompts of every answer shard under `data_dir` (so that new shards do not answer them again)."""
    found = set()
    for path in sorted((Path(data_dir) / RESPONSES).glob("shard-[0-9]*.jsonl")):
        found.update(json.loads(line)["prompt"] for line in path.read_text().splitlines())
    return frozenset(found)


def import_responses(archive: Path, data_dir: Path) -> list[Path]:
    """Unpack the archived answer shards that `data_dir` lacks (their features are computed by `prepare`)."""
    packed_files = sorted(Path(archive).glob("shard-*.jsonl.gz"))
    if not packed_files:
        raise FileNotFoundError(f"no answer shards (shard-NNNNN.jsonl.gz) under {archive}")
    (Path(data_dir) / RESPONSES).mkdir(parents=True, exist_ok=True)
    imported = []
    for packed in packed_files:
        target = Path(data_dir) / RESPONSES / packed.name.removesuffix(".gz")
        if not target.exists():
            _write_atomically(target, lambda p: p.write_bytes(gzip.decompress(packed.read_bytes())))
            imported.append(target)
    return imported


@dataclass
class FeatureSet:
    """All cached shards of a data directory, concatenated in memory."""

    token_ids: torch.Tensor
    labels: torch.Tensor
    features: torch.Tensor
    starts: torch.Tensor  # [S] first token of each sequence
    lengths: torch.Tensor  # [S]
    prompt_lens: torch.Tensor  # [S]
    sources: list[str] | None = None  # [S] the shard each sequence came from; None: all generated answers

    @classmethod
    def load(cls, data_dir: Path) -> "FeatureSet":
        from safetensors.torch import load_file

        files = sorted((Path(data_dir) / FEATURES).glob("shard-*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no feature shards under {Path(data_dir) / FEATURES}; run the prepare stage first")
        parts = [load_file(str(f)) for f in files]
        base, starts, lengths, sources = 0, [], [], []
        for file, part in zip(files, parts):
            offsets = part["offsets"]
            sources += [file.name.removesuffix(".safetensors")] * (len(offsets) - 1)
            starts.append(offsets[:-1] + base)
            lengths.append(offsets[1:] - offsets[:-1])
            base += int(offsets[-1])
        return cls(
            token_ids=torch.cat([p["token_ids"] for p in parts]),
            labels=torch.cat([p["labels"] for p in parts]),
            features=torch.cat([p["features"] for p in parts]),
            starts=torch.cat(starts),
            lengths=torch.cat(lengths),
            prompt_lens=torch.cat([p["prompt_lens"] for p in parts]),
            sources=sources,
        )

    def __len__(self) -> int:
        return int(self.starts.shape[0])

    def is_generated_answer(self, sequence: int) -> bool:
        """A target answer from `prepare` (shard-NNNNN), not a teacher-forced corpus chunk."""
        return self.sources is None or self.sources[sequence].removeprefix("shard-").isdigit()

    @property
    def num_response_tokens(self) -> int:
        return int((self.lengths - self.prompt_lens).sum())
