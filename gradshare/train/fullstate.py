"""Full-state checkpoints: everything an arm needs to continue exactly where it stopped.

    path = save(root, update, arm, world, model_state, optim_state, ranks, loop)  # rank 0
    state = load(path, world)           # verified; FullStateError naming the file otherwise

One directory per update, `u00040/`:
  model.pt        the model's state_dict (DDP keeps every rank's weights equal: rank 0's)
  optimizer.pt    AdamW's state_dict (equal on every rank, as the weights)
  rank0.pt ...    one per rank: Python, NumPy and torch RNG states, and the rank's hook state
                  as its arm's kind saves it (`ExchangeHook.saved`; PowerSGD's: upstream's
                  slots, iteration, P and Q memories, its RNG, the error dict, and `host_error`,
                  the FP32 error feedback), or None
  loop.pt         the schedule position (updates done) and the loop's running totals
                  (losses, active seconds, tokens, logical and wire bytes), so that the
                  summary of a resumed arm is that of an uninterrupted one
  manifest.json   written last: arm, update, world, and every file's bytes and SHA-256

Atomic: everything is written under `.u00040.partial/`, each file fsynced, the manifest
last, then the directory renamed to `u00040/` and its parent fsynced. A directory without
its manifest, a file whose bytes or SHA-256 differ, or a missing rank's file is refused
with a message naming the file; nothing is ever loaded from it.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
from pathlib import Path

import numpy as np

# torch: inside the functions that save, load and set states; the driver, which loads no torch,
# verifies a full state's manifest with this module.

MANIFEST = "manifest.json"


class FullStateError(RuntimeError):
    """A full-state checkpoint that cannot be trusted (partial, corrupted, incomplete)."""


def dirname(update: int) -> str:
    return f"u{update:05d}"


def rng_state() -> dict:
    import torch
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    import torch
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def _sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def _write(path: Path, obj) -> dict:
    """Serialize straight to the file (a 1.7B AdamW state is 13.8 GB: never a second copy in
    memory), fsync it, then hash what is on disk."""
    import torch
    with open(path, "wb") as fh:
        torch.save(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())
    return {"bytes": path.stat().st_size, "sha256": _sha256_of(path)}


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(root: Path, update: int, arm: str, world: int, model_state: dict, optim_state: dict,
         ranks: list[dict], loop: dict) -> tuple[Path, dict]:
    """Write one full state atomically; returns its directory and its manifest."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / dirname(update)
    tmp = root / f".{dirname(update)}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    t0 = time.perf_counter()
    files = {"model.pt": _write(tmp / "model.pt", model_state),
             "optimizer.pt": _write(tmp / "optimizer.pt", optim_state),
             "loop.pt": _write(tmp / "loop.pt", loop)}
    for r, rank in enumerate(ranks):
        files[f"rank{r}.pt"] = _write(tmp / f"rank{r}.pt", rank)
    manifest = {"arm": arm, "update": update, "world": world, "files": files,
                "bytes": sum(f["bytes"] for f in files.values()), "save_s": time.perf_counter() - t0}
    with open(tmp / MANIFEST, "w") as fh:
        json.dump(manifest, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    _fsync_dir(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    _fsync_dir(root)
    return final, manifest


def verify(path: Path, world: int | None = None) -> dict:
    """The manifest of a complete, intact full state, or FullStateError naming what is wrong."""
    path = Path(path)
    mf = path / MANIFEST
    if not mf.exists():
        raise FullStateError(f"{mf}: missing: the full state at {path} is partial (never completed); not loaded")
    try:
        manifest = json.loads(mf.read_text())
    except ValueError as exc:
        raise FullStateError(f"{mf}: not valid JSON ({exc}); not loaded") from None
    want_world = manifest["world"] if world is None else world
    if manifest["world"] != want_world:
        raise FullStateError(f"{mf}: saved by {manifest['world']} ranks, this arm has {want_world}; not loaded")
    needed = ["model.pt", "optimizer.pt", "loop.pt"] + [f"rank{r}.pt" for r in range(want_world)]
    for name in needed:
        entry = manifest["files"].get(name)
        f = path / name
        if entry is None or not f.exists():
            raise FullStateError(f"{f}: missing from the full state of update {manifest['update']}; not loaded")
        if f.stat().st_size != entry["bytes"] or _sha256_of(f) != entry["sha256"]:
            raise FullStateError(f"{f}: its bytes do not match the manifest's SHA-256 (corrupted or "
                                 f"changed); not loaded")
    return manifest


def load(path: Path, world: int) -> dict:
    """Every part of a verified full state, read onto the CPU."""
    import torch
    path = Path(path)
    t0 = time.perf_counter()
    manifest = verify(path, world)

    def read(name):
        return torch.load(path / name, map_location="cpu", weights_only=False)

    out = {"manifest": manifest, "model": read("model.pt"), "optimizer": read("optimizer.pt"),
           "loop": read("loop.pt"), "ranks": [read(f"rank{r}.pt") for r in range(world)]}
    out["load_s"] = time.perf_counter() - t0
    return out


def latest(root: Path) -> Path | None:
    """The newest complete full state under `root` (partial ones are ignored)."""
    done = sorted(p for p in Path(root).glob("u[0-9]*") if (p / MANIFEST).exists())
    return done[-1] if done else None
