"""The overlap figure: one profiled update's device work per CUDA stream, from the
`streams_<config>.json` files that `benchmarks/gpu_path.py` writes beside its profiles.

    python benchmarks/overlap_figure.py DIR/streams_powersgd.json [DIR/streams_dense.json ...] \\
        --png benchmarks/results/overlap.png

Prints, for each file, how long the error's copies ran (host to device, device to host) and how
much of that time a kernel ran on another stream at once: copies hidden behind compute are
what the fast PowerSGD hook is for. Draws each file as one panel: a row per stream, kernels in
grey, copies up in blue, copies down in orange.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def _merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def _length(intervals: list[tuple[int, int]]) -> int:
    return sum(b - a for a, b in intervals)


def _intersection(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """Total length where two sets of merged intervals overlap."""
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlap(rows: list[list]) -> dict:
    """Copy seconds by direction, and the share of each that ran beside a kernel on another
    stream. `rows`: [stream, kind, start_us, duration_us, name]."""
    kernels: dict[int, list[tuple[int, int]]] = {}
    copies: dict[str, list[tuple[int, int, int]]] = {"h2d": [], "d2h": []}
    for stream, kind, start, dur, _ in rows:
        if kind == "kernel":
            kernels.setdefault(stream, []).append((start, start + dur))
        elif kind in copies:
            copies[kind].append((stream, start, start + dur))
    span = (min(r[2] for r in rows), max(r[2] + r[3] for r in rows)) if rows else (0, 0)
    out = {"update_s": (span[1] - span[0]) / 1e6,
           "kernel_s": _length(_merge([iv for ivs in kernels.values() for iv in ivs])) / 1e6}
    for kind, items in copies.items():
        merged = _merge([(a, b) for _, a, b in items])
        streams = {s for s, _, _ in items}
        others = _merge([iv for s, ivs in kernels.items() if s not in streams for iv in ivs])
        busy = _length(merged)
        out[f"{kind}_s"] = busy / 1e6
        out[f"{kind}_beside_compute"] = _intersection(merged, others) / busy if busy else None
    return out


def draw(files: list[Path], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(files), 1, figsize=(12, 2.2 * len(files)), squeeze=False)
    colours = {"kernel": "0.55", "h2d": "tab:blue", "d2h": "tab:orange", "copy": "tab:green"}
    for ax, f in zip(axes[:, 0], files):
        rows = json.loads(f.read_text())["rows"]
        t0 = min(r[2] for r in rows)
        streams = sorted({r[0] for r in rows})
        for y, s in enumerate(streams):
            for kind in ("kernel", "copy", "h2d", "d2h"):
                bars = [((r[2] - t0) / 1e3, r[3] / 1e3) for r in rows if r[0] == s and r[1] == kind]
                if bars:
                    ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=colours[kind])
        ax.set_yticks(range(len(streams)), [f"stream {s}" for s in streams])
        o = overlap(rows)
        ax.set_title(f"{f.stem.removeprefix('streams_')}: update {o['update_s'] * 1e3:.0f} ms; copies up "
                     f"{o['h2d_s'] * 1e3:.0f} ms ({(o['h2d_beside_compute'] or 0):.0%} beside compute), down "
                     f"{o['d2h_s'] * 1e3:.0f} ms ({(o['d2h_beside_compute'] or 0):.0%})", fontsize=9)
        ax.set_xlabel("ms from the first kernel of the profiled update")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    fig.legend(handles, ["kernel", "other copy", "error up (H2D)", "error down (D2H)"], loc="upper right", ncol=4,
               fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(png, dpi=110)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--png", type=Path)
    args = ap.parse_args(argv)
    print("| profile | update ms | kernels ms | up ms | up beside compute | down ms | down beside compute |")
    print("|---|---|---|---|---|---|---|")
    for f in args.files:
        o = overlap(json.loads(f.read_text())["rows"])
        share = lambda v: "-" if v is None else f"{v:.0%}"  # noqa: E731
        print(f"| {f.stem.removeprefix('streams_')} | {o['update_s'] * 1e3:.1f} | {o['kernel_s'] * 1e3:.1f} | "
              f"{o['h2d_s'] * 1e3:.1f} | {share(o['h2d_beside_compute'])} | {o['d2h_s'] * 1e3:.1f} | "
              f"{share(o['d2h_beside_compute'])} |")
    if args.png:
        draw(args.files, args.png)
        print(f"figure: {args.png}")


if __name__ == "__main__":
    main()
