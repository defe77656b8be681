#!/usr/bin/env python3
"""Draws the guide's charts from the data files in docs/charts/data/.

    python3 -m pip install matplotlib   # once
    python3 docs/charts/draw.py

Writes docs/charts/allreduce_bandwidth.svg, step_time.svg and overlap.svg, which
docs/guide/benchmarks.md shows. Each data file starts with '#' lines saying where its figures
come from (command, date, machine); the benches that write CSV (`collectives --csv PATH`) write
the same columns, so their output can replace a file as it is.
"""
import csv
import io
import sys
import textwrap
from pathlib import Path

try:
    import matplotlib

    matplotlib.use("svg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("draw.py needs matplotlib: python3 -m pip install matplotlib")

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
# Reproducible SVGs: the same data gives the same bytes.
plt.rcParams["svg.hashsalt"] = "ddp-burn"
plt.rcParams["svg.fonttype"] = "none"
SAVE = {"metadata": {"Date": None}}


def rows(name):
    """The rows of data/NAME as dicts, skipping the '#' header lines."""
    text = (DATA / name).read_text()
    body = "\n".join(l for l in text.splitlines() if not l.startswith("#"))
    return list(csv.DictReader(io.StringIO(body)))


def number(value):
    return float(value) if value not in (None, "") else None


def bandwidth():
    series = {}
    for r in rows("allreduce_bandwidth.csv"):
        if r["op"] not in ("all_reduce", "memcpy"):
            continue
        label = r["backend"] if r["op"] == "all_reduce" else "memcpy (one process)"
        if r["op"] == "all_reduce":
            label = f"{label}, world {r['world']}"
        series.setdefault(label, []).append((int(r["bytes"]), float(r["busbw"])))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, points in series.items():
        points.sort()
        ax.plot([b / 2**20 for b, _ in points], [g for _, g in points], marker="o", label=label)
    ax.set_xscale("log", base=2)
    sizes = sorted({b for points in series.values() for b, _ in points})
    ax.set_xticks([b / 2**20 for b in sizes])
    ax.set_xticklabels([f"{b / 2**20:g}" for b in sizes])
    ax.set_yscale("log")
    ax.set_xlabel("message size (MiB)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title("All-reduce bus bandwidth against message size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(HERE / "allreduce_bandwidth.svg", **SAVE)


def step_time():
    data = rows("step_time.csv")
    labels = [f"{r['model']}\n{r['setup']}" for r in data]
    ours = [float(r["ours_ms"]) for r in data]
    torch = [float(r["pytorch_ms"]) for r in data]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    x = range(len(data))
    ax.bar([i - 0.2 for i in x], ours, width=0.4, label="ddp-burn (burn-flex)")
    ax.bar([i + 0.2 for i in x], torch, width=0.4, label="PyTorch")
    for i, (a, b) in enumerate(zip(ours, torch)):
        ax.annotate(f"{a / b:.2f}x", (i, max(a, b)), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("ms per step (log)")
    ax.set_title("Step time, ours against PyTorch (CPU; label: ours / PyTorch)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(HERE / "step_time.svg", **SAVE)


def overlap():
    data = rows("overlap.csv")
    modes = [("default", "default (automatic overlap)"), ("off", "overlap off"),
             ("boundaries", "layer boundaries")]
    labels = [textwrap.fill(f"{r['model']}, run {r['run']}", 16) for r in data]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    width = 0.27
    for k, (key, name) in enumerate(modes):
        xs, ys = [], []
        for i, r in enumerate(data):
            v = number(r[key])
            if v is not None:
                xs.append(i + (k - 1) * width)
                ys.append(v)
        ax.bar(xs, ys, width=width, label=name)
    ax.set_xticks(list(range(len(data))))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylim(0, 105)
    ax.set_ylabel("all-reduce time hidden behind backward (%)")
    ax.set_title("Share of all-reduce hidden, per mode (world 2, shared memory)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(HERE / "overlap.svg", **SAVE)


if __name__ == "__main__":
    bandwidth()
    step_time()
    overlap()
    for name in ("allreduce_bandwidth.svg", "step_time.svg", "overlap.svg"):
        print(HERE / name)
