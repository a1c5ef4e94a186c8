"""Write constraints.txt: the exact versions installed here of what gradshare needs.

    python scripts/constraints.py            # rewrite constraints.txt from this environment
    python scripts/constraints.py --check    # exit 1 if this environment differs from it

The README's install commands pass `-c constraints.txt`, so a fresh machine gets the
versions the README's results were made with; `pyproject.toml` keeps ranges for users who
bring their own environment. What is pinned: gradshare's requirements with its `test`
extra, and everything they require in turn (their extras too, markers evaluated for this
Python and platform), each at the version installed here; not gradshare itself. torch is
pinned without its local label (`2.13.0`, not `2.13.0+cpu`): the CPU wheel and the PyPI
wheel are the same release, and `pip install torch==2.13.0` first picks the build.
"""
from __future__ import annotations

import argparse
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO / "constraints.txt"
PROJECT, EXTRAS = "gradshare", ("test",)
HEADER = ("# The exact versions the README's results were made with (Python {py}); written by\n"
          "# `python scripts/constraints.py` from the environment the results block names.\n"
          "# The README's commands install with `-c constraints.txt`; pyproject.toml keeps ranges.\n")


def requirements(name: str, extras: tuple[str, ...]) -> list[Requirement]:
    """What the installed distribution `name` requires with `extras`, for this interpreter."""
    out = []
    for text in distribution(name).requires or []:
        req = Requirement(text)
        wanted = [default_environment() | {"extra": e} for e in ("", *extras)]
        if req.marker is None or any(req.marker.evaluate(env) for env in wanted):
            out.append(req)
    return out


def closure() -> dict[str, str]:
    """Every distribution gradshare needs here, by canonical name, with its installed version."""
    pins: dict[str, str] = {}
    seen: set[tuple[str, tuple[str, ...]]] = set()
    todo = [(PROJECT, EXTRAS)]
    while todo:
        name, extras = todo.pop()
        if (canonicalize_name(name), extras) in seen:
            continue
        seen.add((canonicalize_name(name), extras))
        for req in requirements(name, extras):
            try:
                dist = distribution(req.name)
            except PackageNotFoundError:
                raise SystemExit(f"{req.name} (required as {req}) is not installed: install the project "
                                 f"with its test extra (`pip install -e \".[test]\"`) first") from None
            pins[canonicalize_name(req.name)] = pin_version(req.name, dist.version)
            todo.append((req.name, tuple(sorted(req.extras))))
    pins.pop(canonicalize_name(PROJECT), None)
    return pins


def pin_version(name: str, version: str) -> str:
    return Version(version).public if canonicalize_name(name) == "torch" else version


def text(pins: dict[str, str]) -> str:
    py = ".".join(map(str, sys.version_info[:2]))
    return HEADER.format(py=py) + "".join(f"{n}=={v}\n" for n, v in sorted(pins.items()))


def read(path: Path = CONSTRAINTS) -> dict[str, str]:
    """The pins of a constraints file, by canonical name."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            out[canonicalize_name(name)] = version.strip()
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare this environment with constraints.txt")
    args = ap.parse_args(argv)
    pins = closure()
    if args.check:
        want = read()
        diff = [f"{n}: installed {pins.get(n, 'none')}, constraints.txt {want.get(n, 'none')}"
                for n in sorted(pins.keys() | want.keys()) if pins.get(n) != want.get(n)]
        if diff:
            raise SystemExit("this environment differs from constraints.txt:\n  " + "\n  ".join(diff))
        print(f"this environment matches constraints.txt ({len(pins)} packages)")
        return
    CONSTRAINTS.write_text(text(pins))
    print(f"wrote {CONSTRAINTS.relative_to(REPO)}: {len(pins)} packages")


if __name__ == "__main__":
    main()
