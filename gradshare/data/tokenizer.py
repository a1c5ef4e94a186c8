"""The study's tokenizer.

Tiny profile: a byte-level BPE trained by `prepare` with the `tokenizers` library on
the training inputs only (never the test set), single-threaded so that two prepares
give byte-identical files. Full profile: the seed model's own tokenizer, read from
its local directory.
"""
from __future__ import annotations

import os
from pathlib import Path

from gradshare.data.replay import ASSISTANT, END, USER


PAD = "<|pad|>"
SPECIAL_TOKENS = [PAD, USER, ASSISTANT, END]


def train_bpe(texts: list[str], vocab_size: int, out_dir: str | Path) -> Path:
    """Train a byte-level BPE on `texts` (in order) and save a transformers-loadable tokenizer."""
    # Rayon threads can reorder merges with tied counts; one thread keeps it reproducible.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    return out_dir


def load_tokenizer(path: str | Path):
    """A `PreTrainedTokenizerFast` for a directory holding `tokenizer.json` (ours or a model's)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = Path(path)
    if not (path / "tokenizer.json").exists() and not (path / "tokenizer_config.json").exists():
        raise FileNotFoundError(f"no tokenizer in {path}: expected tokenizer.json (prepare writes it)")
    if (path / "tokenizer_config.json").exists():
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    else:
        tok = PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"))
    # Our special tokens exist in our BPE; a model's own tokenizer gets them added.
    missing = [t for t in SPECIAL_TOKENS if tok.convert_tokens_to_ids(t) in (None, tok.unk_token_id)]
    if missing:
        tok.add_special_tokens({"additional_special_tokens": missing})
    tok.pad_token = PAD if tok.pad_token is None else tok.pad_token
    tok.padding_side = "left"  # generation appends on the right
    return tok
