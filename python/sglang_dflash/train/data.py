"""Training data: the target's own answers to our prompts, and their target features cached on disk.

A data directory holds numbered shards, each written atomically and skipped when present, so a
killed run resumes where it stopped:
  responses/shard-NNNNN.jsonl        one line per prompt: prompt text, prompt ids, response ids
  features/shard-NNNNN.safetensors   the same sequences concatenated:
      token_ids [N] int64, labels [N] int64 (the target's argmax after each token: its own next token),
      features [N, K*H] (outputs of the drafter's target layers), offsets [S+1], prompt_lens [S]
  soft_labels/shard-NNNNN.safetensors the target's top-k next-token log-probabilities at every token:
      top_ids [N, k] int32, top_logprobs [N, k] float16 (log-softmax over the whole vocabulary)
  responses/shard-corpus-NNNNN.jsonl, features/shard-corpus-NNNNN.safetensors
                                     the same for teacher-forced text already on the machine (corpus.py)
Features are computed once here so that training epochs never run the target again. Soft labels
have their own files so that a data directory made before them gains them by one more forward per
sequence, its features untouched.

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

RESPONSES, FEATURES, SOFT_LABELS = "responses", "features", "soft_labels"
DEFAULT_SOFT_LABEL_K = 0  # soft labels are opt-in: they did not raise acceptance (README, "soft labels")


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
def sequence_features(target: TargetModel, rows: list[dict], soft_label_k: int = 0) -> tuple[dict, dict | None]:
    """One target forward per sequence: its chosen-layer features and its own next-token argmax, and
    (with `soft_label_k` > 0) the k most likely next tokens with their log-probabilities."""
    token_ids, labels, features, offsets, prompt_lens, top_ids, top_logprobs = [], [], [], [0], [], [], []
    for row in rows:
        ids = torch.tensor(row["prompt_ids"] + row["response_ids"], device=target.device)
        logits, feats = target.forward(ids, torch.arange(len(ids), device=target.device), target.new_cache())
        token_ids.append(ids.cpu())
        labels.append(logits.argmax(-1).cpu())
        features.append(feats.to(torch.bfloat16).cpu())
        offsets.append(offsets[-1] + len(ids))
        prompt_lens.append(len(row["prompt_ids"]))
        if soft_label_k > 0:
            values, indices = torch.log_softmax(logits.float(), dim=-1).topk(soft_label_k, dim=-1)
            top_ids.append(indices.to(torch.int32).cpu())
            top_logprobs.append(values.to(torch.float16).cpu())
    tensors = {
        "token_ids": torch.cat(token_ids),
        "labels": torch.cat(labels),
        "features": torch.cat(features),
        "offsets": torch.tensor(offsets),
        "prompt_lens": torch.tensor(prompt_lens),
    }
    soft = {"top_ids": torch.cat(top_ids), "top_logprobs": torch.cat(top_logprobs)} if soft_label_k > 0 else None
    return tensors, soft


def _write_shard(data_dir: Path, name: str, target: TargetModel, rows: list[dict], soft_label_k: int) -> None:
    """Whichever of the shard's feature and soft-label files is missing (one target forward per sequence)."""
    feature_file = data_dir / FEATURES / f"{name}.safetensors"
    soft_file = data_dir / SOFT_LABELS / f"{name}.safetensors"
    wants_soft = soft_label_k > 0 and not soft_file.exists()
    tensors, soft = sequence_features(target, rows, soft_label_k if wants_soft else 0)
    if not feature_file.exists():
        write_features(feature_file, tensors)
    if soft is not None:
        write_features(soft_file, soft)


def _shard_complete(data_dir: Path, name: str, soft_label_k: int) -> bool:
    return (data_dir / FEATURES / f"{name}.safetensors").exists() and (
        soft_label_k <= 0 or (data_dir / SOFT_LABELS / f"{name}.safetensors").exists())


def _make_dirs(data_dir: Path) -> None:
    for sub in (RESPONSES, FEATURES, SOFT_LABELS):
        (data_dir / sub).mkdir(parents=True, exist_ok=True)


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
    soft_label_k: int = DEFAULT_SOFT_LABEL_K,
) -> int:
    """Generate and featurize every missing shard (resumable). Returns the number of complete shards.

    With `generate=False` only shards whose answers are already there (archived ones) are featurized.
    A shard is complete with its features and (for `soft_label_k` > 0) its soft labels.
    """
    _make_dirs(data_dir)
    target.capture_layers(layer_ids)
    num_shards = (len(prompts) + shard_size - 1) // shard_size
    started, done = time.monotonic(), 0
    bar = tqdm(range(num_shards), desc="data shards", unit="shard")
    for index in bar:
        response_file = data_dir / RESPONSES / f"{shard_name(index)}.jsonl"
        if _shard_complete(data_dir, shard_name(index), soft_label_k):
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
        _write_shard(data_dir, shard_name(index), target, rows, soft_label_k)
        done += 1
    return done


def write_rows(path: Path, rows: list[dict]) -> None:
    lines = "".join(json.dumps(row) + "\n" for row in rows)
    _write_atomically(path, lambda p: p.write_text(lines))


def write_features(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    _write_atomically(path, lambda p: save_file(tensors, str(p)))


def prepare_corpus(data_dir: Path, target: TargetModel, rows: list[dict], layer_ids: Sequence[int], shard_size: int,
                   soft_label_k: int = DEFAULT_SOFT_LABEL_K) -> int:
    """Features of the corpus rows (see `corpus.py`) as shards `shard-corpus-NNNNN`, resumable like `prepare`."""
    from .corpus import CORPUS_PREFIX

    _make_dirs(data_dir)
    target.capture_layers(layer_ids)
    num_shards = (len(rows) + shard_size - 1) // shard_size
    for index in tqdm(range(num_shards), desc="corpus shards", unit="shard"):
        name = f"{CORPUS_PREFIX}{index:05d}"
        if not _shard_complete(data_dir, name, soft_label_k):
            shard_rows = rows[index * shard_size : (index + 1) * shard_size]
            write_rows(data_dir / RESPONSES / f"{name}.jsonl", shard_rows)
            _write_shard(data_dir, name, target, shard_rows, soft_label_k)
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
    soft_ids: torch.Tensor | None = None  # [N, k] the target's k most likely next tokens (None: no soft labels)
    soft_logprobs: torch.Tensor | None = None  # [N, k] their log-probabilities

    @classmethod
    def load(cls, data_dir: Path, soft_labels: bool = True) -> "FeatureSet":
        """Every shard; `soft_labels=False` leaves the soft labels on disk (hard-label training and replay
        need none, and then shards added without them are no error)."""
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
            **(_load_soft_labels(Path(data_dir), files) if soft_labels else {}),
        )

    def __len__(self) -> int:
        return int(self.starts.shape[0])

    @property
    def soft_label_k(self) -> int:
        return 0 if self.soft_ids is None else int(self.soft_ids.shape[1])

    def is_generated_answer(self, sequence: int) -> bool:
        """A target answer from `prepare` (shard-NNNNN), not a teacher-forced corpus chunk."""
        return self.sources is None or self.sources[sequence].removeprefix("shard-").isdigit()

    @property
    def num_response_tokens(self) -> int:
        return int((self.lengths - self.prompt_lens).sum())


def _load_soft_labels(data_dir: Path, feature_files: list[Path]) -> dict:
    """Every shard's soft labels, or none when no shard has them; a partial set is an error."""
    from safetensors.torch import load_file

    soft_files = [data_dir / SOFT_LABELS / f.name for f in feature_files]
    present = [f.exists() for f in soft_files]
    if not any(present):
        return {}
    if not all(present):
        missing = [f.name for f, there in zip(soft_files, present) if not there]
        raise FileNotFoundError(f"soft labels missing for {len(missing)} shards under {data_dir / SOFT_LABELS} "
                                f"({', '.join(missing[:3])}...); run the prepare stage again to add them")
    parts = [load_file(str(f)) for f in soft_files]
    widths = {int(p["top_ids"].shape[1]) for p in parts}
    if len(widths) != 1:
        raise ValueError(f"soft-label shards under {data_dir / SOFT_LABELS} disagree on k: {sorted(widths)}")
    return {"soft_ids": torch.cat([p["top_ids"] for p in parts]),
            "soft_logprobs": torch.cat([p["top_logprobs"] for p in parts])}
