"""Write the README's measured results from a real run of the README's first command.

    python scripts/readme_results.py            # run the first command here, rewrite the block
    python scripts/readme_results.py --check    # run it, exit 1 if the block's numbers differ
    python scripts/readme_results.py --from-log out.txt   # rewrite from a saved run's output
    python scripts/readme_results.py --versions # the versions a block written here records

The block between `<!-- results:begin -->` and `<!-- results:end -->` in README.md holds
two parts. "Reproduces exactly" is what the command prints that depends only on the
inputs, the code and the versions of the packages that compute them (accuracies, paired
changes, retention, the quality screen, each arm's final loss and the hash of its weights'
content, the inputs hash): `--check` compares exactly this with a fresh run of the same
commit. Its `Versions:` line records those versions (the ones prepare's manifest records,
`gradshare.util.sources`) as installed where the block was written; `constraints.txt` installs
them. When a line differs, `--check` names every version that differs, installed vs
recorded, and the CPU when it is another kind than the block's (the seed model is pre-trained
on the CPU, and its rounding follows the CPU's kernels), and exits 1. "Measured" (step
seconds, throughput, the speed ratio, dollars) moves with the machine and its load: it is
given as measured, with the machine, the commit and the date, and is never compared.

`--from-log` writes the versions installed where the script runs: give it a log made there.
"""
from __future__ import annotations

import argparse
import datetime as dt
import difflib
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from any directory, installed or not
    sys.path.insert(0, str(REPO))

from gradshare.util.sources import numerical_sources  # noqa: E402

README = REPO / "README.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
# Verdict-table lines that move with the machine's speed or price; all others reproduce.
MEASURED_PREFIXES = ("speed screen:", "cost:", "budget:", "projection only:")


def first_command() -> str:
    """The README's first fenced command, exactly as a new user copies it."""
    text = README.read_text()
    return re.search(r"```bash\n(.+?)\n```", text, re.S).group(1).strip()


def run_first_command() -> str:
    cmd = first_command()
    print(f"[readme_results] running: {cmd}", flush=True)
    proc = subprocess.Popen(cmd, shell=True, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = []
    for line in proc.stdout:  # shown as it comes: the study takes minutes
        sys.stdout.write(line)
        lines.append(line)
    if proc.wait() != 0:
        raise SystemExit(f"the README's first command exited {proc.returncode}")
    return "".join(lines)


def parse(log: str) -> dict:
    """The printed results: deterministic lines and measured lines, in the order printed."""
    lines = log.splitlines()
    start = max(i for i, l in enumerate(lines) if l.startswith("gradshare verdicts —"))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("budget:"))
    if end + 1 < len(lines) and lines[end + 1].startswith("projection only:"):
        end += 1
    table = lines[start + 1:end + 1]
    exact = [re.sub(r"\s+$", "", l) for l in table if not l.strip().startswith(MEASURED_PREFIXES)]
    measured = [l for l in table if l.strip().startswith(MEASURED_PREFIXES)]
    arms = re.findall(r"\[gradshare\] arm (\w+) FINISHED: final loss ([\d.]+), active ([\d.]+)s, ([\d,]+) tok/s, "
                      r"checkpoint (\w+)…", log)
    inputs = re.findall(r"inputs_sha256 (\w+)…", log)
    steps = re.findall(r"\[gradshare\] step seconds: (.+)", log)
    total = re.findall(r"\[gradshare\] study '.+' done in (\d+)s", log)
    return {"exact": exact, "measured": measured, "arms": arms, "inputs": inputs[-1] if inputs else "?",
            "steps": steps[-1] if steps else "?", "total_s": total[-1] if total else "?"}


def exact_part(r: dict) -> list[str]:
    out = [f"inputs_sha256 {r['inputs']}…", ""]
    out += [f"{'arm':<10}{'final loss':>11}  checkpoint sha256"]
    out += [f"{arm:<10}{loss:>11}  {sha}…" for arm, loss, _, _, sha in r["arms"]]
    return out + [""] + r["exact"]


def installed_versions() -> dict[str, str]:
    """Python's version and the packages' that shape the numbers, as installed here: the same
    list prepare's manifest records (`gradshare.util.sources`)."""
    sources = numerical_sources(0)
    return {"python": sources["python"], **{k: v or "none" for k, v in sources["packages"].items()}}


VERSIONS = "Versions: "


def versions_line(versions: dict[str, str]) -> str:
    return VERSIONS + ", ".join(f"{name} {v}" for name, v in versions.items())


def recorded_versions(block: str) -> dict[str, str] | None:
    """The versions the block's `Versions:` line records; from a block written before that
    line existed, the few its "Measured on" line named; None if it names none."""
    line = next((l for l in block.splitlines() if l.startswith(VERSIONS)), None)
    if line is not None:
        return dict(item.strip().split(" ", 1) for item in line[len(VERSIONS):].split(","))
    measured = next((l for l in block.splitlines() if l.startswith("**Measured** on")), "")
    old = dict(re.findall(r"\b(Python|torch|transformers|accelerate|mlflow) ([^\s,]+)", measured))
    return {k.lower(): v for k, v in old.items()} or None


def version_differences(installed: dict[str, str], recorded: dict[str, str]) -> list[str]:
    """`name: installed X, recorded Y` for every version that differs, in the recorded order."""
    names = list(recorded) + [n for n in installed if n not in recorded]
    return [f"{n}: installed {installed.get(n, 'none')}, recorded {recorded.get(n, 'nothing')}"
            for n in names if installed.get(n) != recorded.get(n)]


def cpu_model() -> str:
    try:
        return next(l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                    if l.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def machine() -> str:
    return f"{os.cpu_count()} cores ({cpu_model()})"


def recorded_cpu(block: str) -> str | None:
    """The CPU model the block's Measured line names, or None."""
    # Lazy up to the ")" that ends the name: "Intel(R) Xeon(R) Processor" holds brackets of its own.
    m = re.search(r"\*\*Measured\*\* on \d+ cores \((.*?)\)(?= with|,| —|$)", block, re.M)
    return m.group(1) if m else None


def commit() -> str:
    sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True,
                         text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           capture_output=True, text=True).stdout.strip()
    return sha + (" (with uncommitted changes)" if dirty else "")


def block(r: dict) -> str:
    measured = [f"| {arm} | {active} | {tps} |" for arm, _, active, tps, _ in r["arms"]]
    return "\n".join([
        BEGIN,
        f"Written by `scripts/readme_results.py` from a run of the first command above at commit "
        f"{commit()} on {dt.date.today().isoformat()}.",
        "",
        "**Reproduces exactly** (same commit, the versions below, which `constraints.txt` installs, and "
        "the same kind of CPU as the Measured line's: `python scripts/readme_results.py --check` runs the "
        "command, compares, and names any version or CPU that differs):",
        "",
        "```", *exact_part(r), "```",
        "",
        versions_line(installed_versions()),
        "",
        f"**Measured** on {machine()} with those versions — these move with the machine and its load:",
        "",
        f"- whole study {r['total_s']} s; step seconds: {r['steps']}",
        "",
        "| arm | active s | active tokens/s |", "|---|---|---|", *measured,
        "",
        "```", *r["measured"], "```",
        END])


def current_block() -> str:
    text = README.read_text()
    return text[text.index(BEGIN):text.index(END) + len(END)]


def exact_in_block(block: str) -> list[str]:
    part = block[block.index("**Reproduces exactly**"):block.index("**Measured**")]
    return part.split("```")[1].strip("\n").splitlines()


def check(got: list[str], block: str, installed: dict[str, str]) -> tuple[bool, list[str]]:
    """Whether this run's exact part equals the block's, and what to print: the lines that
    differ and, when any do, the versions that differ between here and the block."""
    want = exact_in_block(block)
    recorded = recorded_versions(block)
    versions = version_differences(installed, recorded) if recorded is not None else None
    if got == want:
        out = ["README results block reproduces exactly"]
        if versions:
            out += ["(with other versions than the block records: " + "; ".join(versions) + ")"]
        return True, out
    out = list(difflib.unified_diff(want, got, "README.md", "this run", lineterm=""))
    if versions is None:
        out += ["The README block records no versions: regenerate it with `python scripts/readme_results.py` "
                "to compare them."]
    elif versions:
        out += ["Versions that differ (installed here vs recorded in README.md):", *(f"  {v}" for v in versions),
                "Install the recorded ones with `pip install -e . -c constraints.txt` and run --check again."]
    else:
        out += ["Every recorded version is installed here: the difference is the code's or the machine's, "
                "not a package's."]
    here, there = cpu_model(), recorded_cpu(block)
    if there is not None and here != there:
        # Measured at 03bf50e: the same commit and versions gave inputs_sha256 2874… on an AMD EPYC
        # and 0411… on an Intel Xeon; prepare pre-trains the seed model in float arithmetic whose
        # rounding (BLAS kernels) follows the CPU, so its weights and everything after them move.
        out += [f"The CPU differs: here {here}, the block's {there}. prepare pre-trains the seed model on "
                "the CPU, and its rounding follows the CPU's kernels: on another kind of CPU the inputs "
                "hash and every number after it may differ with the same code and versions."]
    return False, out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare instead of rewriting")
    ap.add_argument("--from-log", help="a saved output of the first command instead of running it")
    ap.add_argument("--versions", action="store_true", help="print the versions installed here (JSON) and exit")
    args = ap.parse_args(argv)
    if args.versions:
        print(json.dumps(installed_versions()))
        return
    log = Path(args.from_log).read_text() if args.from_log else run_first_command()
    r = parse(log)
    if args.check:
        same, report = check(exact_part(r), current_block(), installed_versions())
        print("\n".join(report))
        if not same:
            raise SystemExit("README results differ from this run of the first command")
        return
    text = README.read_text()
    README.write_text(text.replace(current_block(), block(r)))
    print("README results block rewritten")


if __name__ == "__main__":
    main()
