"""A second data source that needs no generation: text already on the machine, teacher-forced.

Generating the target's own answers costs minutes per shard on a CPU; one forward over existing
text costs a fraction of a second. The text here is the Python standard library installed with
the interpreter (source files, tests left out) and the language reference topics of
`pydoc_data`, so it contains no benchmark row. Each chunk becomes a chat turn: a short request
(chat template applied, as at serving time) answered by the chunk. Its labels are still the
target's own argmax after every token; training keeps only the labels that lie on the target's
greedy path (see `fit.greedy_path_length`), so the drafter never learns a token the target would
not choose.
"""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path
from typing import Iterator

from ..generate import encode

CORPUS_PREFIX = "shard-corpus-"
SKIPPED_DIRS = {"test", "tests", "idle_test", "site-packages", "lib2to3", "__pycache__"}


def stdlib_sources() -> list[Path]:
    """The standard library's own .py files (no tests, no installed packages), in a stable order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(f for f in root.rglob("*.py") if not SKIPPED_DIRS & set(f.relative_to(root).parts))
    if not files:
        raise FileNotFoundError(f"no Python standard library sources under {root}")
    return files


def documents() -> Iterator[tuple[str, str]]:
    """(request, text) pairs: one per stdlib module and one per language reference topic."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in stdlib_sources():
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        text = path.read_text(encoding="utf-8", errors="replace")
        yield f"Show me how the Python module `{module}` is implemented.", f"```python\n{text}\n```"
    from pydoc_data.topics import topics

    for name in sorted(topics):
        yield f"Explain `{name}` in the Python language reference.", topics[name]


def split_lines(text: str, tokenizer, max_tokens: int) -> Iterator[str]:
    """Consecutive runs of whole lines of at most about `max_tokens` tokens each."""
    chunk, size = [], 0
    for line in text.splitlines(keepends=True):
        cost = len(tokenizer(line, add_special_tokens=False)["input_ids"])
        if chunk and size + cost > max_tokens:
            yield "".join(chunk)
            chunk, size = [], 0
        chunk.append(line)
        size += cost
    if chunk:
        yield "".join(chunk)


def corpus_rows(tokenizer, count: int, max_tokens: int = 320, seed: int = 0) -> list[dict]:
    """`count` rows in the answer-shard format, from randomly chosen chunks of randomly ordered documents."""
    rng = random.Random(seed)
    docs = list(documents())
    rng.shuffle(docs)
    rows = []
    for request, text in docs:
        chunks = [c for c in split_lines(text, tokenizer, max_tokens) if c.strip()]
        # A few chunks per document, so that many documents are seen before `count` is reached.
        for chunk in rng.sample(chunks, min(3, len(chunks))):
            response_ids = tokenizer(chunk, add_special_tokens=False)["input_ids"][: max_tokens + 16]
            rows.append({"prompt": request, "prompt_ids": encode(tokenizer, request, chat=True),
                         "response_ids": response_ids})
            if len(rows) == count:
                return rows
    return rows
