"""`score`: the seed model and every committed arm on the final test and the probes.

Test cases: greedy generation (left padding, KV cache), answer extracted per family
(`gradshare.data.tasks.extract_answer`) and compared exactly after normalising
whitespace. Retention probes: mean negative log-likelihood per target token, nats.
Checkpoints are re-hashed and must match the commitment before anything is scored.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from gradshare.contract import metrics as M
from gradshare.data.documents import task_prompt
from gradshare.data.replay import END
from gradshare.data.tasks import extract_answer, is_correct
from gradshare.model.lm import collate, load_model, mean_nll
from gradshare.util.devices import indexed


def device_for(plan) -> torch.device:
    """Where score runs: the current GPU, indexed (`gradshare.util.devices`), where the plan's
    hardware is one and this machine has one; else the CPU."""
    if plan.hardware.device == "cuda" and torch.cuda.is_available():
        return indexed("cuda")
    return torch.device("cpu")


@torch.no_grad()
def score_test(model, tokenizer, cases: list[dict], plan, device, log=print) -> list[dict]:
    """One row per case: case_id, family, correct, prediction, target, prompt_sha256."""
    model.eval()
    end_id = tokenizer.convert_tokens_to_ids(END)
    bs = plan.scoring.batch_size
    # Similar lengths together: less padding; results are per case, so order is free.
    order = sorted(range(len(cases)), key=lambda i: len(cases[i]["question"]))
    rows: dict[int, dict] = {}
    t0 = time.perf_counter()
    for b in range(0, len(order), bs):
        idx = order[b:b + bs]
        enc = [(tokenizer(task_prompt(cases[i]["question"]), add_special_tokens=False)["input_ids"], [])
               for i in idx]
        ids, att, _ = collate([(e, [False] * len(e)) for e, _ in enc], tokenizer.pad_token_id, device, left=True)
        out = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=plan.scoring.max_new_tokens,
                             do_sample=False, eos_token_id=end_id, pad_token_id=tokenizer.pad_token_id)
        texts = tokenizer.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=False)
        for i, text in zip(idx, texts):
            c = cases[i]
            text = text.replace(tokenizer.pad_token, "")
            rows[i] = {"case_id": c["id"], "family": c["family"],
                       "correct": int(is_correct(c["family"], text, c["answer"])),
                       "prediction": extract_answer(c["family"], text), "raw": text,
                       "target": c["answer"], "prompt_sha256": c["prompt_sha256"]}
        done = min(b + bs, len(order))
        log(f"  test {done}/{len(order)} cases ({done / (time.perf_counter() - t0):.0f} cases/s)")
    return [rows[i] for i in range(len(cases))]


def score_retention(model, tokenizer, probes: list[dict], plan, device) -> list[dict]:
    rows = mean_nll(model, tokenizer, probes, plan.data.max_doc_tokens, device=device)
    return [{"probe_id": r["id"], "nll_nats": r["nll_nats"], "tokens": r["tokens"]} for r in rows]


def summarise(test_rows: list[dict], retention_rows: list[dict]) -> dict[str, float]:
    """A model's score metrics: accuracy by family and overall, mean retention NLL."""
    return M.score_metrics(test_rows, retention_rows)


def scoring_dtype(plan) -> torch.dtype:
    """Every model, seed included, is scored in one dtype: bf16 where training autocast to it."""
    return torch.bfloat16 if plan.hardware.precision == "bf16-autocast" else torch.float32


def load_for_scoring(path: Path, plan, device):
    return load_model(path, dtype=scoring_dtype(plan)).to(device)
