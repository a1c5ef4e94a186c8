"""Documents: what the model trains and is scored on, as (prompt, target) text pairs.

A task document is `<|user|>\\n{question}\\n<|assistant|>\\n` (prompt) followed by
`{answer}\\n<|end|>` (target). A conversation document has an empty prompt and its
rendered conversation as target. Loss and NLL count target tokens only; a target
token is one whose id the model predicts from what comes before it, so the first
token of a document is never a target.
"""
from __future__ import annotations

from gradshare.data.replay import ASSISTANT, END, USER


def task_prompt(question: str) -> str:
    return f"{USER}\n{question}\n{ASSISTANT}\n"


def task_document(case: dict) -> dict:
    return {"id": case["id"], "kind": "task", "family": case["family"],
            "prompt": task_prompt(case["question"]), "target": f"{case['answer']}\n{END}"}


def conversation_document(item: dict, kind: str) -> dict:
    return {"id": item["id"], "kind": kind, "family": None, "prompt": "", "target": item["text"]}


def encode(tokenizer, doc: dict, max_tokens: int) -> tuple[list[int], list[bool]]:
    """Token ids and a target mask (True where the token is predicted and counted)."""
    p = tokenizer(doc["prompt"], add_special_tokens=False)["input_ids"] if doc["prompt"] else []
    t = tokenizer(doc["target"], add_special_tokens=False)["input_ids"]
    ids = (p + t)[:max_tokens]
    mask = ([False] * len(p) + [True] * len(t))[:max_tokens]
    mask[0] = False  # nothing predicts the first token
    return ids, mask


def target_tokens(tokenizer, doc: dict, max_tokens: int) -> int:
    return sum(encode(tokenizer, doc, max_tokens)[1])
