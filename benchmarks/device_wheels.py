"""The wheels the GPU machine's image lacks for a rehearsal, at the versions of `constraints.txt`:

    python benchmarks/device_wheels.py            # makes .whl/ (git-ignored), cp312 manylinux wheels
    python benchmarks/device_wheels.py --list     # prints NAME==VERSION, one a line, and fetches nothing

The rehearsal on the device (`benchmarks/rehearsal_device.sh`) needs MLflow's client and its SQLite
store, and the tiny profile's data package: ROOTS. Their requirements are followed through the
installed packages' metadata, with the markers of the device's Python (3.12, Linux); each
package's version is the one `constraints.txt` pins. What the device's image already holds
(`device_image.txt`, its `pip list` as read on that machine) is left out, and so is torch: the
image's own build (CUDA) is the one the study runs on. On the device, the rehearsal script installs
them into /tmp/site with `pip install --no-index --no-deps`.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
# the rehearsal's needs beyond the image: MLflow's client and the tracing SDK that `mlflow` pins beside
# it, its SQLite store (sqlalchemy, alembic), and the tiny profile's conversations. The set the H100
# rehearsal ran with at 8f44cb7 was these and greenlet, a hand-written pin that constraints.txt does
# not hold: SQLAlchemy 2.1 needs it only for asyncio (its extra), which MLflow's store does not use.
ROOTS = ("mlflow-skinny", "mlflow-tracing", "sqlalchemy", "alembic", "chitchat-dataset")
NEVER = {"torch"}  # the image's CUDA build runs the study
DEVICE_ENV = default_environment() | {"python_version": "3.12", "python_full_version": "3.12.3",
                                      "sys_platform": "linux", "platform_system": "Linux",
                                      "platform_machine": "x86_64", "implementation_name": "cpython",
                                      "platform_python_implementation": "CPython", "extra": ""}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64")


def pins(path: Path = REPO / "constraints.txt") -> dict[str, str]:
    """NAME -> VERSION of every `name==version` line (names canonical)."""
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^\s*([A-Za-z0-9_.\-]+)(\[[^\]]*\])?==([^\s;#]+)", line)
        if m:
            out[canonicalize_name(m.group(1))] = m.group(3)
    return out


def image(path: Path = HERE / "device_image.txt") -> set[str]:
    """The packages the device's image holds (canonical names; lines after '#' are comments)."""
    return {canonicalize_name(x.split("#")[0].strip()) for x in path.read_text().splitlines()
            if x.split("#")[0].strip()}


def requires(name: str, extras: frozenset[str] = frozenset()) -> list[str]:
    """`name`'s requirements (with `extras`), as its installed metadata states them, that apply on
    the device."""
    try:
        reqs = metadata.requires(name) or []
    except metadata.PackageNotFoundError as exc:
        raise SystemExit(f"{name} is not installed here: install the project first "
                         "(pip install -e . -c constraints.txt), whose metadata this follows") from exc
    out = []
    for text in reqs:
        r = Requirement(text)
        if r.marker is None or any(r.marker.evaluate(DEVICE_ENV | {"extra": e}) for e in ("", *extras)):
            out.append(str(r.name) + (f"[{','.join(sorted(r.extras))}]" if r.extras else ""))
    return out


def wanted(roots=ROOTS, pinned: dict[str, str] | None = None, present: set[str] | None = None) -> dict[str, str]:
    """NAME -> VERSION of every package the rehearsal needs that the image lacks."""
    pinned = pins() if pinned is None else pinned
    present = image() if present is None else present
    seen, todo, out = set(), list(roots), {}
    while todo:
        req = Requirement(todo.pop())
        name, extras = canonicalize_name(req.name), frozenset(req.extras)
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        if name in NEVER or name in present:
            continue  # the image's own; what it needs is the image's too
        if name not in pinned:
            raise SystemExit(f"{name} (needed by the rehearsal) has no pin in constraints.txt: "
                             "run python scripts/constraints.py")
        out[name] = pinned[name]
        todo += requires(name, extras)
    return dict(sorted(out.items()))


def download(versions: dict[str, str], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):
        old.unlink()  # one version of each: two stop the device's install
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", *[a for p in PLATFORMS for a in ("--platform", p)], "-d", str(dest),
           *[f"{n}=={v}" for n, v in versions.items()]]
    subprocess.run(cmd, check=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="print NAME==VERSION and fetch nothing")
    ap.add_argument("--dest", default=str(REPO / ".whl"))
    args = ap.parse_args(argv)
    versions = wanted()
    if args.list:
        print("\n".join(f"{n}=={v}" for n, v in versions.items()))
        return
    exclude = REPO / ".git" / "info" / "exclude"  # .whl/ never committed
    if (REPO / ".git").is_dir():
        exclude.parent.mkdir(exist_ok=True)
        if "/.whl/" not in (exclude.read_text(errors="replace").split() if exclude.exists() else []):
            with open(exclude, "a") as fh:
                fh.write("/.whl/\n")
    download(versions, Path(args.dest))
    got = sorted(Path(args.dest).glob("*.whl"))
    size = sum(p.stat().st_size for p in got)
    print(f"{len(got)} wheels, {size / 2**20:.1f} MiB in {args.dest}: carry it (.whl) in the device call")


if __name__ == "__main__":
    main()
