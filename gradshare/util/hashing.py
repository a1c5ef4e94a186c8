"""SHA-256 of files, directories, checkpoints' weights and canonical JSON: the study's
pre-registration currency."""
from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path


CHUNK = 1 << 20


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_text(text: str) -> str:
    return sha256_bytes(text.encode("utf-8"))


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def file_entries(root: str | Path) -> list[dict]:
    """`{path, bytes, sha256}` for every file under `root`, sorted by path (POSIX, relative)."""
    root = Path(root)
    return [{"path": p.relative_to(root).as_posix(), "bytes": p.stat().st_size, "sha256": sha256_file(p)}
            for p in sorted(root.rglob("*")) if p.is_file()]


def tree_sha256(entries: list[dict]) -> str:
    """One hash over a set of file entries: changes if any path, size or content changes."""
    return sha256_text(json.dumps([[e["path"], e["bytes"], e["sha256"]] for e in entries],
                                  separators=(",", ":")))


class CheckpointError(ValueError):
    """A checkpoint folder whose weights cannot be read as the study saves them."""


def checkpoint_weight_files(directory: str | Path) -> list[Path]:
    """The safetensors files that hold a checkpoint's weights: the shards its
    `model.safetensors.index.json` names, else `model.safetensors`."""
    directory = Path(directory)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [s for s in shards if not (directory / s).is_file()]
        if missing:
            raise CheckpointError(f"{index} names shards that are not in {directory}: {', '.join(missing)}; "
                                  f"copy the whole checkpoint folder")
        return [directory / s for s in shards]
    if (directory / "model.safetensors").is_file():
        return [directory / "model.safetensors"]
    raise CheckpointError(f"{directory} holds no model.safetensors and no model.safetensors.index.json: "
                          f"a checkpoint is hashed by its safetensors weights (save it with "
                          f"`save_pretrained(..., safe_serialization=True)`)")


def checkpoint_side_files(entries: list[dict]) -> list[dict]:
    """The entries (`file_entries`) of a checkpoint's files other than its weights: config,
    generation config, tokenizer, shard index. `checkpoint_sha256` leaves them out; the
    commitment seals their bytes, since the scored model is built from its config.json."""
    return [e for e in entries if not e["path"].endswith(".safetensors")]


def checkpoint_sha256(directory: str | Path) -> str:
    """A checkpoint's identity: SHA-256 over its weights' content, not over its files.

    For every tensor, in name order: the line `["name","DTYPE",[shape...],nbytes]` (compact
    JSON, the dtype as safetensors writes it: F32, BF16, ...) and a newline, then the tensor's
    raw bytes as stored (little-endian). config.json, generation_config.json and the tokenizer
    files embed the version of the library that wrote them, so they are not part of it: the
    same weights saved by another transformers hash the same.

    The safetensors library checks each file (its header, and that the tensors' byte ranges
    cover the data exactly); the bytes are then read from the file as stored, a chunk at a time,
    with no tensor made: torch is not imported (about 2 CPU-s in the train step's launcher,
    which hashes the weights it uploads) and no tensor is held in memory.
    """
    from safetensors import SafetensorError, safe_open

    where = {}  # tensor name -> (shard, first byte in the file, byte count, dtype, shape)
    for f in checkpoint_weight_files(directory):
        try:
            with safe_open(str(f), framework="numpy") as st:  # validates the header against the file
                names = list(st.keys())
        except SafetensorError as exc:
            raise CheckpointError(f"{f} is not a readable safetensors file ({exc})") from None
        with open(f, "rb") as fh:
            header_bytes = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(header_bytes))
        for name in names:
            if name in where:
                raise CheckpointError(f"tensor {name!r} is in more than one shard of {directory}: "
                                      f"the checkpoint's shards overlap")
            begin, end = header[name]["data_offsets"]
            where[name] = (f, 8 + header_bytes + begin, end - begin, header[name]["dtype"], header[name]["shape"])
    h = hashlib.sha256()
    with contextlib.ExitStack() as stack:
        opened = {}
        for name in sorted(where):
            f, first, nbytes, dtype, shape = where[name]
            if f not in opened:
                opened[f] = stack.enter_context(open(f, "rb"))
            fh = opened[f]
            h.update(json.dumps([name, dtype, list(shape), nbytes], separators=(",", ":")).encode("utf-8") + b"\n")
            fh.seek(first)
            left = nbytes
            while left:
                chunk = fh.read(min(CHUNK, left))
                if not chunk:
                    raise CheckpointError(f"tensor {name!r} of {f} cannot be read: the file ends "
                                          f"{left} bytes short of it")
                h.update(chunk)
                left -= len(chunk)
    return h.hexdigest()


