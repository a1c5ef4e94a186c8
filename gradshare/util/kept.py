"""Results that take seconds to compute and depend only on what their key names, kept on disk.

`analyze` and `gradshare project` of a study of another profile project the full profile: its
workload (building its inputs, about 14 CPU-seconds: `gradshare.inputs.build.workload_of`) and
its model's parameter shapes (torch and transformers loaded to build the 1.7B model on the meta
device, about 6: `gradshare.model.source.parameter_shapes`). Each is kept after its first
computation, under a key that moves with everything that shapes it: what the caller names (the
plan's sha256, the model config's bytes), the sha256 of every source file of the gradshare
package, and the versions of the libraries the caller names. Any edit to the code or another
library version computes it afresh.

    shapes = kept("shapes", {"config_sha256": ...}, compute, libraries=("torch", "transformers"))

Where: `$GRADSHARE_CACHE`, else `$XDG_CACHE_HOME/gradshare`, else `~/.cache/gradshare`;
`GRADSHARE_CACHE=off` keeps nothing. A cache that cannot be written, or a file in it that
cannot be read, is computed past (the result is the same), never an error.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from gradshare.util.sources import package_version

ENV = "GRADSHARE_CACHE"
PACKAGE = Path(__file__).resolve().parents[1]  # gradshare/


def cache_dir() -> Path | None:
    """The cache's folder, or None where it is turned off."""
    chosen = os.environ.get(ENV, "")
    if chosen.lower() == "off":
        return None
    if chosen:
        return Path(chosen)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gradshare"


def code_sha256() -> str:
    """One hash over the path and bytes of every .py file of the gradshare package."""
    h = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        h.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def full_key(key: dict, libraries: tuple[str, ...] = ()) -> dict:
    """The caller's key, with the code's hash and the libraries' versions."""
    return {**key, "code_sha256": code_sha256(), "libraries": {pkg: package_version(pkg) for pkg in libraries}}


def read(path: Path, key: dict) -> Any | None:
    """The value kept in `path` under exactly `key`, else None (no file, a part of one, another key)."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found["value"] if isinstance(found, dict) and found.get("key") == key and "value" in found else None


def keep(path: Path, key: dict, value: Any) -> None:
    """Written beside and renamed: a reader never sees half a file, and two writers at once leave
    one whole file (the same value). A folder that cannot be written keeps nothing."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=path.name, suffix=".part",
                                         delete=False) as fh:
            json.dump({"key": key, "value": value}, fh)
        os.replace(fh.name, path)
    except OSError:
        return


def kept(name: str, key: dict, compute: Callable[[], Any], libraries: tuple[str, ...] = (), log=print) -> Any:
    """`compute()` (a JSON value), or the value kept from an earlier call with the same key, code
    and library versions."""
    where = cache_dir()
    if where is None:
        return compute()
    key = full_key(key, libraries)
    path = where / f"{name}-{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]}.json"
    value = read(path, key)
    if value is not None:
        log(f"[gradshare] {name}: kept from an earlier computation by this code ({path})")
        return value
    value = compute()
    keep(path, key, value)
    return value
