"""What one update of the study's model costs on this process's cores or device: the plan's model
shape (random weights: the time does not depend on them), micro-batches of the plan's documents at
their longest, a backward each, then the clip, AdamW's step and the zero, as an arm's update runs
(in FP32, micro-batches of `schedule.micro_batch_docs` documents: not the arms' packed rows or
mixed precision, which a GPU arm uses; the preflight times CPU ranks only).
The preflight's probe (`gradshare.hosts.probe`) times it alone, as `single` runs, and on every rank
at once with a rank's documents, as a two-process arm runs: their ratio is one rank's share of an
update on these hosts (`gradshare.cost.share`).
"""
from __future__ import annotations

import math
import time

import torch

from gradshare.model.lm import build_model
from gradshare.model.source import model_config


def _config(config: str, vocab_size: int | None):
    """A config file of gradshare/model/configs, or `hf:/local/dir` (that model's own config), with
    the prepared vocabulary where given (the tiny model's is its tokenizer's, not Qwen's 151,936)."""
    if config.startswith("hf:"):
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(config[3:], local_files_only=True)
    else:
        cfg = model_config(config)
    if vocab_size:
        cfg.vocab_size = vocab_size
    return cfg


class UpdateBench:
    """The plan's model and optimizer, and one micro-batch of random tokens to train on."""

    def __init__(self, config: str, micro_batch_docs: int, doc_tokens: int, device: str | torch.device = "cpu",
                 vocab_size: int | None = None):
        cfg = _config(config, vocab_size)
        self.device = torch.device(device)
        if config.startswith("hf:"):  # any causal LM a local directory holds, not only Qwen3
            from transformers import AutoModelForCausalLM

            torch.manual_seed(0)
            with self.device:
                self.model = AutoModelForCausalLM.from_config(cfg).to(torch.float32)
        else:
            self.model = build_model(cfg, seed=0, device=self.device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-6)
        rows = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, cfg.vocab_size, (micro_batch_docs, doc_tokens), generator=rows).to(self.device)
        self.micro_batch_docs = micro_batch_docs

    def update_s(self, docs: int) -> float:
        """Seconds of one update over `docs` documents, micro-batch by micro-batch."""
        t0 = time.perf_counter()
        for _ in range(math.ceil(docs / self.micro_batch_docs)):
            self.model(input_ids=self.ids, labels=self.ids).loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the update's kernels done, not only queued
        return time.perf_counter() - t0
