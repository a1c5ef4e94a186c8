"""The model: a Qwen3-style causal LM, its seed weights, and token-level losses.

Tiny profile: built from `gradshare/model/configs/tiny_qwen3.json` with seeded init and
pre-trained briefly and deterministically on conversations (the retention probes
among them, so they are genuinely "already exposed"). Full profile: a local Hugging
Face model directory, or a randomly initialised Qwen3-1.7B shape for throughput work.
"""
from __future__ import annotations

import random
import warnings
from pathlib import Path

import torch

from gradshare.data.documents import encode
from gradshare.model.batching import PAD_SEGMENT
from gradshare.model.source import model_config

# transformers: inside the functions that build or load a model (seconds; `gradshare.model.source`
# holds what the light processes need of the model without torch).

def build_model(config, seed: int, device: str | torch.device = "cpu"):
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):  # a 1.7B init is minutes on a CPU, seconds on a GPU
        model = Qwen3ForCausalLM(config)
    model.to(torch.float32)
    return model


def _quiet_transformers() -> None:
    """No progress bars from transformers 5's loading and saving ("Loading weights", "Writing
    model shards"): a step's output is its own progress lines and one-line reasons."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def load_model(path: str | Path, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    _quiet_transformers()
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"no Hugging Face model in {path}: expected config.json and weights")
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True)


def seed_model(plan, inputs_dir: str | Path, device: str | torch.device = "cpu"):
    """The study's starting weights (FP32), wherever the plan says they live: the tiny seed
    model prepare made (`inputs_dir/seed_model`), a local HF directory, or a random init
    built on `device` — train and score call this alike, so both start from the same model."""
    src = plan.model.source
    if src.startswith("random-"):
        return build_model(model_config(plan.model.config), plan.study.seed, device)
    path = Path(src[3:]) if src.startswith("hf:") else Path(inputs_dir) / "seed_model"
    return load_model(path).to(device)


def save_model(model, tokenizer, out_dir: str | Path) -> Path:
    """Weights (safetensors), config and tokenizer: a checkpoint folder that describes itself."""
    out_dir = Path(out_dir)
    _quiet_transformers()
    model.save_pretrained(str(out_dir), safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out_dir))
    return out_dir


def collate(encoded: list[tuple[list[int], list[bool]]], pad_id: int, device="cpu", left: bool = False):
    """Pad a list of (ids, target mask) into tensors; padding is never a target."""
    width = max(len(ids) for ids, _ in encoded)
    ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)
    att = torch.zeros((len(encoded), width), dtype=torch.long)
    tgt = torch.zeros((len(encoded), width), dtype=torch.bool)
    for i, (row, mask) in enumerate(encoded):
        sl = slice(width - len(row), width) if left else slice(0, len(row))
        ids[i, sl] = torch.tensor(row)
        att[i, sl] = 1
        tgt[i, sl] = torch.tensor(mask)
    return ids.to(device), att.to(device), tgt.to(device)


def packed_attention_mask(seg: torch.Tensor) -> torch.Tensor:
    """The boolean [rows, 1, tokens, tokens] mask (True: may attend) of packed rows, from each
    token's document number within its row (`seg`): causal within each document, nothing across
    documents; a padding token attends to itself only, so that no query row is empty (an empty
    row gives NaN in attention, and 0 x NaN is NaN in the loss). Hugging Face models take a 4-D
    mask as it is."""
    t = seg.shape[1]
    same = seg.unsqueeze(2) == seg.unsqueeze(1)
    causal = torch.ones(t, t, dtype=torch.bool, device=seg.device).tril()
    real = (seg != PAD_SEGMENT).unsqueeze(1)  # keys that hold a document token
    eye = torch.eye(t, dtype=torch.bool, device=seg.device)
    return ((same & causal & real) | eye).unsqueeze(1)


def token_losses(model, ids, att, tgt, chunk_tokens: int = 0, pos=None) -> torch.Tensor:
    """Per-token negative log-likelihood (nats) of target tokens; zeros elsewhere. Shape [B, T-1].

    `att` is a 2-D padding mask, or a 4-D mask of packed rows with their positions `pos`.
    `chunk_tokens` > 0: the same losses with the logits made `chunk_tokens` rows at a time
    and recomputed in backward, so that no [tokens, vocabulary] FP32 tensor is kept (at
    Qwen3's 151,936 words and 4,096 tokens that is 2.5 GB per copy, and eager keeps several).
    """
    if chunk_tokens:
        return _chunked_token_losses(model, ids, att, tgt, chunk_tokens, pos=pos)
    # use_cache=False: a training forward needs no KV cache (HF builds one by default)
    logits = model(input_ids=ids, attention_mask=att, position_ids=pos, use_cache=False).logits[:, :-1].float()
    labels = ids[:, 1:]
    # Rows of a contiguous [B*T, V] view: cross-entropy over a transposed [B, V, T] view
    # reads the vocabulary with a stride and was measured 5.6x slower (CPU, V=32k).
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                            reduction="none").view(labels.shape)
    return nll * tgt[:, 1:]


def _logit_nll(lm_head, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    # The same ops as the plain path on a block of rows: head (under the caller's autocast),
    # FP32 upcast, row-wise cross-entropy.
    return torch.nn.functional.cross_entropy(lm_head(hidden).float(), labels, reduction="none")


def _chunked_token_losses(model, ids, att, tgt, chunk_tokens: int, nll_fn=_logit_nll, pos=None) -> torch.Tensor:
    from torch.utils.checkpoint import checkpoint

    hidden = model.model(input_ids=ids, attention_mask=att, position_ids=pos,
                         use_cache=False).last_hidden_state[:, :-1]
    labels = ids[:, 1:]
    rows = hidden.reshape(-1, hidden.shape[-1])
    flat = labels.reshape(-1)
    head = model.get_output_embeddings()
    # preserve_rng_state=False: the head and loss draw no random numbers, and reading the RNG
    # state is not allowed while a CUDA graph is being captured.
    nll = torch.cat([checkpoint(nll_fn, head, rows[i:i + chunk_tokens], flat[i:i + chunk_tokens],
                                use_reentrant=False, preserve_rng_state=False)
                     for i in range(0, rows.shape[0], chunk_tokens)])
    return nll.view(labels.shape) * tgt[:, 1:]


class _ZeroGradients(torch.autograd.Function):
    """A scalar 0 whose backward hands every parameter a zero gradient (an expanded zero: no
    memory): a backward pass that adds nothing to any gradient but runs every parameter's
    gradient accumulation, which is where DDP hands its buckets to the exchange."""

    @staticmethod
    def forward(ctx, *params):
        ctx.like = [(p.shape, p.dtype, p.device) for p in params]
        return params[0].new_zeros(())

    @staticmethod
    def backward(ctx, grad):
        return tuple(torch.zeros((), dtype=dt, device=dev).expand(shape) for shape, dt, dev in ctx.like)


class TokenLoss(torch.nn.Module):
    """The model with its loss as one module: what DDP wraps, so that the chunked loss (which
    calls the decoder and the head separately) still runs inside DDP's forward.

    Called with no inputs it is the exchange pass (`_ZeroGradients`): through DDP, a backward
    of it exchanges the gradients the micro-batches accumulated, adding nothing to them."""

    def __init__(self, lm, chunk_tokens: int = 0, compile_loss: bool = False, static_shapes: bool = False):
        super().__init__()
        self.lm = lm
        self.chunk_tokens = chunk_tokens
        # Compiled, head + upcast + cross-entropy (and its backward) fuse into a few kernels
        # instead of materialising FP32 logits, their log-softmax and a one-hot gradient.
        self._nll_fn = (torch.compile(_logit_nll, dynamic=False if static_shapes else None)
                        if (compile_loss and chunk_tokens) else None)

    def forward(self, ids=None, att=None, tgt=None, seg=None, pos=None):
        if ids is None:
            return _ZeroGradients.apply(*[p for p in self.parameters() if p.requires_grad])
        if seg is not None:  # packed rows: the mask is made here, on the device (inside a graph)
            att = packed_attention_mask(seg)
        if self._nll_fn is not None:
            try:
                return _chunked_token_losses(self.lm, ids, att, tgt, self.chunk_tokens, self._nll_fn, pos=pos)
            except torch.OutOfMemoryError:
                raise  # memory, not the compiler: the eager path would need more
            except Exception as exc:  # a compiler failure must not stop a run: the eager path is the same function
                warnings.warn(f"compiled loss failed, using the eager one: {type(exc).__name__}: {exc}")
                self._nll_fn = None
        return token_losses(self.lm, ids, att, tgt, self.chunk_tokens, pos=pos)


def compile_layers(lm, static_shapes: bool = False) -> None:
    """torch.compile each decoder layer in place: one graph shared by all identical layers
    (compile time of one layer, not of the model); embedding, head and loss stay eager.
    `static_shapes`: every shape is compiled as itself (packed micro-batches come in a few fixed
    shapes: static kernels, and no dynamic recompile when the second shape arrives)."""
    import torch._dynamo

    # Should a layer attribute ever be specialised per layer, 28 layers must not hit the
    # default limit of 8 graphs and fall back to eager silently.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    for layer in lm.model.layers:
        layer.compile(dynamic=False if static_shapes else None)


def pretrain_seed(model, tokenizer, docs: list[dict], steps: int, batch_docs: int, lr: float,
                  max_tokens: int, seed: int, log=print) -> list[float]:
    """Short deterministic pre-training: fixed order from the seed, target-token-normalised loss."""

    encoded = [encode(tokenizer, d, max_tokens) for d in docs]
    order = list(range(len(encoded)))
    random.Random(f"{seed}/pretrain").shuffle(order)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    model.train()
    losses = []
    for step in range(steps):
        idx = [order[(step * batch_docs + j) % len(order)] for j in range(batch_docs)]
        ids, att, tgt = collate([encoded[i] for i in idx], tokenizer.pad_token_id)
        nll = token_losses(model, ids, att, tgt)
        loss = nll.sum() / tgt[:, 1:].sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 20 == 0 or step == steps - 1:
            log(f"pretrain {step + 1}/{steps} loss {losses[-1]:.3f}")
    model.eval()
    return losses


@torch.no_grad()
def mean_nll(model, tokenizer, docs: list[dict], max_tokens: int, batch: int = 32, device="cpu") -> list[dict]:
    """Per document: mean NLL per target token (nats) and the number of target tokens."""

    model.eval()
    out = []
    for i in range(0, len(docs), batch):
        chunk = docs[i:i + batch]
        ids, att, tgt = collate([encode(tokenizer, d, max_tokens) for d in chunk], tokenizer.pad_token_id, device)
        nll = token_losses(model, ids, att, tgt).double()
        counts = tgt[:, 1:].sum(1)
        for d, s, n in zip(chunk, nll.sum(1).tolist(), counts.tolist()):
            out.append({"id": d["id"], "nll_nats": s / n, "tokens": int(n)})
    return out
