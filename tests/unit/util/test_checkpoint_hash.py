"""A checkpoint is identified by its weights' content (`hashing.checkpoint_sha256`): the
files that embed a library's version (config.json, the tokenizer's) do not move it, and
every change to a tensor's name, dtype, shape or bytes does."""
from __future__ import annotations

import hashlib
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from gradshare.tracking import connection, store, study_runs
from gradshare.util.hashing import CheckpointError, checkpoint_sha256
from gradshare.contract.errors import StudyError

WEIGHTS = {
    "model.embed_tokens.weight": torch.arange(24, dtype=torch.float32).reshape(6, 4) / 7,
    "model.layers.0.mlp.up_proj.weight": torch.linspace(-1, 1, 12, dtype=torch.float32).reshape(4, 3),
    "model.norm.weight": torch.ones(4, dtype=torch.bfloat16),
    "step": torch.tensor(128, dtype=torch.int64),
}


def checkpoint(root: Path, weights=None, transformers_version="5.25.0", shards=1) -> Path:
    """A checkpoint folder as `save_pretrained` leaves it: weights, config, tokenizer files."""
    root.mkdir(parents=True)
    weights = WEIGHTS if weights is None else weights
    names = sorted(weights)
    if shards == 1:
        save_file(weights, str(root / "model.safetensors"))
    else:
        weight_map = {}
        for i in range(shards):
            part = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            mine = names[i::shards]
            save_file({n: weights[n] for n in mine}, str(root / part))
            weight_map |= {n: part for n in mine}
        (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (root / "config.json").write_text(json.dumps({"model_type": "llama", "transformers_version": transformers_version}))
    (root / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                            "transformers_version": transformers_version}))
    return root


def by_hand(*files: Path) -> str:
    """The same hash computed from the safetensors format itself (8-byte header length, JSON
    header, data), without the safetensors library or torch."""
    tensors = {}
    for f in files:
        buf = f.read_bytes()
        (n,) = struct.unpack("<Q", buf[:8])
        header = json.loads(buf[8:8 + n])
        header.pop("__metadata__", None)
        for name, info in header.items():
            start, end = info["data_offsets"]
            tensors[name] = (info["dtype"], info["shape"], buf[8 + n + start:8 + n + end])
    h = hashlib.sha256()
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        h.update(f'["{name}","{dtype}",[{",".join(map(str, shape))}],{len(data)}]\n'.encode())
        h.update(data)
    return h.hexdigest()


def test_the_same_weights_saved_by_another_transformers_hash_the_same(tmp_path):
    a = checkpoint(tmp_path / "a", transformers_version="5.25.0")
    b = checkpoint(tmp_path / "b", transformers_version="5.17.0")
    (b / "tokenizer.json").write_text('{"version": "1.0", "added_tokens": []}')
    assert (a / "config.json").read_bytes() != (b / "config.json").read_bytes()
    assert checkpoint_sha256(a) == checkpoint_sha256(b)


def test_the_hash_is_the_weights_content_computed_from_the_file_format(tmp_path):
    one = checkpoint(tmp_path / "one")
    assert checkpoint_sha256(one) == by_hand(one / "model.safetensors")
    sharded = checkpoint(tmp_path / "sharded", shards=2)
    assert checkpoint_sha256(sharded) == by_hand(*sorted(sharded.glob("model-*.safetensors")))
    assert checkpoint_sha256(sharded) == checkpoint_sha256(one)  # identity is content, not layout


def through_torch(*files: Path) -> str:
    """The same hash from the tensors as torch reads them (safetensors' torch API): the bytes the
    hash reads from the file are the tensors' own."""
    from safetensors import safe_open

    tensors = {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                sl = st.get_slice(name)
                tensors[name] = (sl.get_dtype(), sl.get_shape(),
                                 st.get_tensor(name).contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    h = hashlib.sha256()
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        h.update(json.dumps([name, dtype, list(shape), len(data)], separators=(",", ":")).encode() + b"\n")
        h.update(data)
    return h.hexdigest()


def test_the_hash_equals_the_tensors_as_torch_reads_them_and_imports_no_torch(tmp_path):
    one, sharded = checkpoint(tmp_path / "one"), checkpoint(tmp_path / "sharded", shards=2)
    assert checkpoint_sha256(one) == through_torch(one / "model.safetensors")
    assert checkpoint_sha256(sharded) == through_torch(*sorted(sharded.glob("model-*.safetensors")))
    # a process that only hashes (the train step's launcher) does not pay for importing torch
    code = ("import sys; from gradshare.util.hashing import checkpoint_sha256; "
            f"print(checkpoint_sha256({str(sharded)!r}), 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [checkpoint_sha256(one), "False"]


def changed(what: str) -> dict:
    w = dict(WEIGHTS)
    if what == "one byte":
        t = w["model.layers.0.mlp.up_proj.weight"].clone()
        t.view(torch.uint8).reshape(-1)[5] ^= 1
        w["model.layers.0.mlp.up_proj.weight"] = t
    elif what == "dtype":  # bf16 -> fp16: same shape, same byte count, other dtype (1.0 differs in bits)
        w["model.norm.weight"] = w["model.norm.weight"].view(torch.float16)
    elif what == "shape":  # same bytes, other shape
        w["model.embed_tokens.weight"] = w["model.embed_tokens.weight"].reshape(4, 6).contiguous()
    elif what == "name":
        w["model.final_norm.weight"] = w.pop("model.norm.weight")
    elif what == "missing tensor":
        w.pop("step")
    return w


@pytest.mark.parametrize("what", ["one byte", "dtype", "shape", "name", "missing tensor"])
def test_any_change_to_the_weights_changes_the_hash(tmp_path, what):
    base = checkpoint_sha256(checkpoint(tmp_path / "base"))
    other = checkpoint(tmp_path / "other", weights=changed(what))
    assert checkpoint_sha256(other) != base
    assert checkpoint_sha256(other) == by_hand(other / "model.safetensors")


def test_a_folder_without_safetensors_weights_is_refused_naming_it(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "pytorch_model.bin").write_bytes(b"\0")
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        checkpoint_sha256(tmp_path / "ckpt")
    sharded = checkpoint(tmp_path / "sharded", shards=2)
    next(sharded.glob("model-00002-*.safetensors")).unlink()
    with pytest.raises(CheckpointError, match="names shards that are not in"):
        checkpoint_sha256(sharded)
    (tmp_path / "ckpt" / "model.safetensors").write_bytes(b"\x10\0\0\0\0\0\0\0{not json}")
    with pytest.raises(CheckpointError, match="is not a readable safetensors file"):
        checkpoint_sha256(tmp_path / "ckpt")


class LocalStore:
    """A run's artifacts in a local folder, read the way `gradshare.tracking.study_runs` reads them."""

    def __init__(self, root: Path):
        self.root = root

    def download(self, run_id, artifact_path, dst=None):
        dst = Path(dst)
        dst.mkdir(parents=True, exist_ok=True)
        src = self.root / run_id / artifact_path
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst / src.name)
        return dst / src.name

    def list_artifacts(self, run_id, path):
        return [SimpleNamespace(path=p.relative_to(self.root / run_id).as_posix(), is_dir=p.is_dir())
                for p in sorted((self.root / run_id / path).iterdir())]


@pytest.fixture
def trained(tmp_path, monkeypatch):
    """One FINISHED arm's checkpoint in a local artifact store, and its commitment entry as
    commit writes it (the weights' hash from train's tag, the other files' bytes)."""
    runs = LocalStore(tmp_path / "store")
    ckpt = checkpoint(runs.root / "run1" / "checkpoint")
    (ckpt / "tokenizer.json").write_text('{"version": "1.0"}')
    monkeypatch.setattr(study_runs, "download", runs.download)
    monkeypatch.setattr(connection, "client", lambda: runs)
    entry = {"arm": "single", "run_id": "run1", "status": "FINISHED", "checkpoint_sha256": checkpoint_sha256(ckpt),
             "checkpoint_files": store.checkpoint_files("run1", tmp_path / "commit")}
    return ckpt, {"arms": [entry]}


def test_the_commitment_seals_the_config_and_tokenizer_bytes_beside_the_weights(trained, tmp_path):
    ckpt, commitment = trained
    [entry] = commitment["arms"]
    assert [e["path"] for e in entry["checkpoint_files"]] == ["config.json", "tokenizer.json", "tokenizer_config.json"]
    assert store.verified_checkpoints(commitment, tmp_path / "score") == {"single": tmp_path / "score/single/checkpoint"}


@pytest.mark.parametrize("change", ["one weight byte", "config.json", "a new file"])
def test_a_checkpoint_changed_after_commit_is_refused_before_scoring(trained, tmp_path, change):
    ckpt, commitment = trained
    if change == "one weight byte":
        data = bytearray((ckpt / "model.safetensors").read_bytes())
        data[-1] ^= 1
        (ckpt / "model.safetensors").write_bytes(bytes(data))
    elif change == "config.json":  # same weights, another model: untie the embeddings
        (ckpt / "config.json").write_text(json.dumps({"model_type": "llama", "tie_word_embeddings": False}))
    else:
        (ckpt / "chat_template.jinja").write_text("{{ messages }}")
    with pytest.raises(StudyError, match="changed after commit; refusing to score") as err:
        store.verified_checkpoints(commitment, tmp_path / "score")
    assert "arm single (run run1)" in str(err.value)
