"""Write the README's measured results from a real run of the README's first command.

    python scripts/readme_results.py            # run the first command here, rewrite the block
    python scripts/readme_results.py --check    # run it, exit 1 if the block's numbers differ
    python scripts/readme_results.py --from-log out.txt   # rewrite from a saved run's output

The block between `<!-- results:begin -->` and `<!-- results:end -->` in README.md holds
two parts. "Reproduces exactly" is what the command prints that depends only on the
inputs and the code (accuracies, paired changes, retention, the quality screen, each
arm's final loss and checkpoint hash, the inputs hash): `--check` compares exactly this
with a fresh run of the same commit. "Measured" (step seconds, throughput, the speed
ratio, dollars) moves with the machine and its load: it is given as measured, with the
machine, the commit and the date, and is never compared.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
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


def machine() -> str:
    cpu = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                   if l.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    from importlib.metadata import version
    return (f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, torch {version('torch')}, "
            f"transformers {version('transformers')}, accelerate {version('accelerate')}, mlflow {version('mlflow')}")


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
        "**Reproduces exactly** (same commit, same kind of machine: `python scripts/readme_results.py "
        "--check` runs the command and compares):",
        "",
        "```", *exact_part(r), "```",
        "",
        f"**Measured** on {machine()} — these move with the machine and its load:",
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


def exact_in_readme() -> list[str]:
    b = current_block()
    part = b[b.index("**Reproduces exactly**"):b.index("**Measured**")]
    return part.split("```")[1].strip("\n").splitlines()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare instead of rewriting")
    ap.add_argument("--from-log", help="a saved output of the first command instead of running it")
    args = ap.parse_args(argv)
    log = Path(args.from_log).read_text() if args.from_log else run_first_command()
    r = parse(log)
    if args.check:
        got, want = exact_part(r), exact_in_readme()
        if got != want:
            import difflib
            print("\n".join(difflib.unified_diff(want, got, "README.md", "this run", lineterm="")))
            raise SystemExit("README results differ from this run of the first command")
        print("README results block reproduces exactly")
        return
    text = README.read_text()
    README.write_text(text.replace(current_block(), block(r)))
    print("README results block rewritten")


if __name__ == "__main__":
    main()
