"""Public conversations for conversation-replay documents, retention probes and pre-training.

The study needs three disjoint sets of real human conversations: replay
documents mixed into fine-tuning, retention probes held out to measure
forgetting, and a pre-training set. They all come from the same sources and
are rendered to text in ONE chat format so that the sets are comparable.

Chat format
-----------
A conversation is a list of ``(speaker, text)`` messages.

* Text is whitespace-normalised: stripped, and every run of whitespace inside
  a message collapsed into one space.
* Empty messages (after normalisation) are dropped.
* Consecutive messages of the same original speaker are joined with a single
  space into one turn (chitchat has such runs).
* Turns alternate speakers and are rendered as roles user/assistant, starting
  with user: turn 0 is user, turn 1 assistant, turn 2 user, ...
* Each turn becomes ``<|user|>\\n{text}\\n`` or ``<|assistant|>\\n{text}\\n``.
* The conversation ends with ``<|end|>`` (no trailing newline).

Example: ``[("a", " hi "), ("a", "there"), ("b", "hello\\n  you")]`` renders as
``"<|user|>\\nhi there\\n<|assistant|>\\nhello you\\n<|end|>"``.

Sources (``load_conversations``)
--------------------------------
* ``"chitchat"``: every conversation of the installed ``chitchat-dataset``
  package (its bundled ``dataset.json``), sorted by conversation key (a UUID)
  so the order does not depend on JSON/dict ordering.
* ``"file:/path/x.jsonl"``: one JSON object per line with key ``"messages"``,
  a list of ``{"speaker"|"role": str, "text"|"content": str}``.
* ``"file:/path/x.parquet"``: the same ``"messages"`` column (list of structs),
  read with pyarrow.
* ``"datasets:NAME[:SPLIT]"``: ``datasets.load_dataset(NAME, split=SPLIT or
  "train")`` of an installed/local dataset with the same ``"messages"`` column;
  loaded with ``HF_DATASETS_OFFLINE=1`` so nothing is fetched.

File and ``datasets`` rows are keyed by their 0-based row index.

Nothing here downloads anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


USER = "<|user|>"
ASSISTANT = "<|assistant|>"
END = "<|end|>"

Message = tuple[str, str]  # (speaker, text)
Conversation = list[Message]

_SOURCE_FORMS = (
    '"chitchat", "file:/path/x.jsonl", "file:/path/x.parquet" or "datasets:NAME[:SPLIT]"'
)


# --------------------------------------------------------------------------- rendering


def _turns(messages: Sequence[Message]) -> list[Message]:
    """Normalise whitespace, drop empty messages and join same-speaker runs.

    Empty messages are dropped *before* joining, so ``A, "", A`` is one turn.
    """
    turns: list[Message] = []
    for speaker, text in messages:
        text = " ".join((text or "").split())  # strip + collapse whitespace runs
        if not text:
            continue
        if turns and turns[-1][0] == speaker:
            turns[-1] = (speaker, f"{turns[-1][1]} {text}")
        else:
            turns.append((speaker, text))
    return turns


def _render_turns(turns: Sequence[Message]) -> str:
    parts = []
    for i, (_speaker, text) in enumerate(turns):
        # Roles come from turn position, not speaker identity: the first
        # speaker is always "user", whoever it is.
        role = USER if i % 2 == 0 else ASSISTANT
        parts.append(f"{role}\n{text}\n")
    parts.append(END)
    return "".join(parts)


def render_conversation(messages: Sequence[tuple[str, str]]) -> str:
    """Render ``(speaker, text)`` pairs in the chat format of the module docstring."""
    return _render_turns(_turns(messages))


# --------------------------------------------------------------------------- loading


def _keyed_chitchat() -> dict[str, Conversation]:
    import chitchat_dataset

    # ``Dataset`` is the package's raw JSON ({key: {"messages": ...}}).
    # ``ConversationDataset`` would lose who said what, so it is not used.
    data = chitchat_dataset.Dataset()
    out: dict[str, Conversation] = {}
    for key in sorted(data):
        # "messages" is a list of groups; each group is consecutive utterances
        # by one sender. Keep them as separate messages; rendering joins them.
        out[key] = [(u["sender"], u["text"]) for group in data[key]["messages"] for u in group]
    return out


def _row_to_conversation(row: Mapping[str, Any], where: str) -> Conversation:
    msgs = row.get("messages")
    if not isinstance(msgs, (list, tuple)):
        raise ValueError(f'{where}: expected a "messages" list, got {type(msgs).__name__}')
    conv: Conversation = []
    for j, m in enumerate(msgs):
        # Parquet/Arrow structs carry every field of the union schema, so a
        # missing alias shows up as None rather than as an absent key.
        speaker = m.get("speaker") if m.get("speaker") is not None else m.get("role")
        text = m.get("text") if m.get("text") is not None else m.get("content")
        if speaker is None:
            raise ValueError(f'{where}, message {j}: needs "speaker" or "role"')
        conv.append((str(speaker), "" if text is None else str(text)))
    return conv


def _keyed_file(path_str: str) -> dict[int, Conversation]:
    path = Path(path_str)
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".parquet"):
        raise ValueError(f"unsupported file {path_str!r}; accepted sources: {_SOURCE_FORMS}")
    if not path.is_file():
        raise FileNotFoundError(f"conversation file not found: {path}")
    if suffix == ".jsonl":
        rows = []
        with path.open(encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                if line.strip():  # tolerate blank lines, e.g. a trailing one
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path}:{line_no}: invalid JSON: {e}") from None
    else:
        import pyarrow.parquet as pq

        rows = pq.read_table(path, columns=["messages"]).to_pylist()
    return {i: _row_to_conversation(r, f"{path} row {i}") for i, r in enumerate(rows)}


def _keyed_datasets(spec: str) -> dict[int, Conversation]:
    name, _, split = spec.partition(":")
    if not name:
        raise ValueError(f"missing dataset name in 'datasets:{spec}'; accepted: {_SOURCE_FORMS}")
    # Set before import: ``datasets`` reads these at import time. The hub flag
    # also stops huggingface_hub from resolving anything over the network.
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        import datasets
    except ImportError:
        raise ImportError(
            f"source 'datasets:{spec}' needs the Hugging Face `datasets` package: "
            "pip install datasets"
        ) from None
    config = getattr(datasets, "config", None)
    if config is not None and hasattr(config, "HF_DATASETS_OFFLINE"):
        config.HF_DATASETS_OFFLINE = True  # in case it was imported before we set the env
    ds = datasets.load_dataset(name, split=split or "train")
    return {
        i: _row_to_conversation(r, f"datasets:{spec} row {i}")
        for i, r in enumerate(ds.select_columns(["messages"]))
    }


def load_keyed_conversations(source: str) -> dict[Any, Conversation]:
    """Like ``load_conversations`` but keyed by the source's conversation key.

    Keys are chitchat's conversation ids, or the row index for files and
    ``datasets``. Pass the result to ``select_documents`` to keep original keys
    in ``source_key``.
    """
    if not isinstance(source, str):
        raise ValueError(f"source must be a string: {_SOURCE_FORMS}")
    if source == "chitchat":
        return _keyed_chitchat()
    if source.startswith("file:") and len(source) > len("file:"):
        return _keyed_file(source[len("file:") :])
    if source.startswith("datasets:"):
        return _keyed_datasets(source[len("datasets:") :])
    raise ValueError(f"unknown conversation source {source!r}; accepted: {_SOURCE_FORMS}")


def load_conversations(source: str) -> list[list[tuple[str, str]]]:
    """Load conversations as lists of ``(speaker, text)`` in a stable order.

    See the module docstring for the accepted ``source`` forms. A bad source
    raises ValueError; a missing file raises FileNotFoundError.
    """
    return list(load_keyed_conversations(source).values())


# --------------------------------------------------------------------------- selection


def select_documents(
    conversations: Sequence[Sequence[Message]] | Mapping[Any, Sequence[Message]],
    seed: int,
    replay: int,
    probes: int,
    pretrain: int,
    min_turns: int = 2,
) -> dict[str, list[dict]]:
    """Pick disjoint replay / probe / pre-training documents, deterministically.

    ``conversations`` is a list (``source_key`` = index) or a mapping
    (``source_key`` = key, e.g. from ``load_keyed_conversations``).
    Conversations with fewer than ``min_turns`` turns after normalisation are
    skipped, the rest are shuffled with ``random.Random(f"{seed}/replay")`` and
    dealt out in order replay, probes, pretrain. Texts already taken are
    skipped, so the sets are disjoint by id *and* by text hash.

    Returns ``{"replay": [...], "probes": [...], "pretrain": [...]}``, each item
    ``{"id", "source_key", "text", "text_sha256"}``.
    """
    wanted = {"replay": replay, "probes": probes, "pretrain": pretrain}
    if any(n < 0 for n in wanted.values()):
        raise ValueError(f"counts must be >= 0, got {wanted}")
    items = conversations.items() if isinstance(conversations, Mapping) else enumerate(conversations)

    # Filter first, in source order, so that the shuffle sees a fixed list.
    # Turns are kept so each conversation is normalised only once.
    eligible = [(key, turns) for key, conv in items if len(turns := _turns(conv)) >= min_turns]
    random.Random(f"{seed}/replay").shuffle(eligible)

    prefixes = {"replay": "replay", "probes": "probe", "pretrain": "pretrain"}
    out: dict[str, list[dict]] = {name: [] for name in wanted}
    seen: set[str] = set()
    order = [name for name in wanted for _ in range(wanted[name])]  # one slot per document
    pos = 0
    for key, turns in eligible:
        if pos == len(order):
            break
        text = _render_turns(turns)
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        if digest in seen:
            continue
        seen.add(digest)
        name = order[pos]
        pos += 1
        out[name].append(
            {
                "id": f"{prefixes[name]}/{len(out[name]):05d}",
                "source_key": key,
                "text": text,
                "text_sha256": digest,
            }
        )
    if pos < len(order):
        total = len(conversations)
        raise ValueError(
            f"not enough conversations: need {len(order)} distinct "
            f"(replay={replay} + probes={probes} + pretrain={pretrain}) with >= {min_turns} "
            f"turns; {len(eligible)} of {total} have >= {min_turns} turns and "
            f"{len(seen)} of those have distinct texts"
        )
    return out
