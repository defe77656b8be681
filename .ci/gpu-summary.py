#!/usr/bin/env python3
"""One table for `.ci/gpu-checks run`: check, figure, goal, pass/fail.

Reads the outputs the checks wrote (one `<step>-<name>.txt` each, and `<step>-<name>.status`
with the exit code) from the folder given as the only argument. A check whose output lacks the
figure, or that did not run, says so instead of passing.
"""
import pathlib
import re
import sys


def read(out, name):
    """A step's output; None when it did not run (or was skipped for lack of time)."""
    path = out / f"{name}.txt"
    text = path.read_text(errors="replace") if path.exists() else None
    return None if text is not None and text.startswith("skipped:") else text


def status(out, name):
    path = out / f"{name}.status"
    return path.read_text().strip() if path.exists() else None


def tests_row(out, name, what):
    """A test binary: how many passed, goal all of them and at least one."""
    text, code = read(out, name), status(out, name)
    if text is None:
        return (what, "not run", "all pass", "-")
    passed = sum(int(n) for n in re.findall(r"test result: \w+\. (\d+) passed", text))
    failed = sum(int(n) for n in re.findall(r"(\d+) failed", text))
    ok = code == "0" and passed > 0 and failed == 0
    return (what, f"{passed} passed, {failed} failed", "all pass", "pass" if ok else "FAIL")


def accuracy_row(out, name, what, pattern):
    """A training run: the accuracy `pattern` finds (its first group; a second, if any, is the
    training time), goal >= 95% and exit code 0."""
    text, code = read(out, name), status(out, name)
    if text is None:
        return (what, "not run", ">= 95%", "-")
    m = re.search(pattern, text)
    if not m:
        return (what, f"no accuracy (exit {code})", ">= 95%", "FAIL")
    acc = float(m.group(1))
    figure = f"{acc:.2f}%" + (f" in {m.group(2)} s" if m.lastindex and m.lastindex > 1 else "")
    return (what, figure, ">= 95%", "pass" if code == "0" and acc >= 95 else "FAIL")


def digits_row(out, name):
    return accuracy_row(out, name, "1 digits --backend cuda, NCCL", r"test accuracy ([\d.]+)%")


def transformer_rows(out, name):
    """Check 4: DDP(NCCL) / plain <= 1.03 and >= 70% of all-reduce time overlapped."""
    text = read(out, name)
    what = f"4 transformer step ({name})"
    if text is None:
        return [(what, "not run", "<= 1.03, >= 70% hidden", "-")]
    m = re.search(r"^\s+DDP \(world 1\)\s+([\d.]+)\s+([\d.]+)\s+(\d+)%", text, re.M)
    if not m:
        return [(what, "no DDP row", "<= 1.03, >= 70% hidden", "FAIL")]
    ms, ratio, hidden = float(m.group(1)), float(m.group(2)), int(m.group(3))
    return [
        (f"{what}: DDP / plain", f"{ratio:.3f} ({ms:.2f} ms)", "<= 1.03", "pass" if ratio <= 1.03 else "FAIL"),
        (f"{what}: all-reduce hidden", f"{hidden}%", ">= 70%", "pass" if hidden >= 70 else "FAIL"),
    ]


def ddp_ms(out, name):
    text = read(out, name) or ""
    m = re.search(r"^\s+DDP \(world 1\)\s+([\d.]+)", text, re.M)
    return float(m.group(1)) if m else None


def pytorch_row(out, ours_name, torch_name, what="5 ours / PyTorch DDP, same shape", limit=1.10):
    text = read(out, torch_name)
    ours = ddp_ms(out, ours_name)
    goal = f"<= {limit:.2f}"
    if text is None or ours is None:
        return (what, "not run", goal, "-")
    m = re.search(r"DDP \(NCCL, world 1\)\s+([\d.]+) ms/step", text)
    if not m:
        return (what, "no PyTorch DDP row", goal, "FAIL")
    theirs = float(m.group(1))
    ratio = ours / theirs
    return (what, f"{ours:.2f} / {theirs:.2f} ms = {ratio:.2f}", goal, "pass" if ratio <= limit else "FAIL")


def overhead_row(out, ours_name, torch_name, what):
    """Ours DDP / plain against PyTorch's DDP / plain on the same shape: no worse."""
    ours, theirs = read(out, ours_name), read(out, torch_name)
    m_ours = ours and re.search(r"^\s+DDP \(world 1\)\s+[\d.]+\s+([\d.]+)", ours, re.M)
    m_theirs = theirs and re.search(r"ratio DDP / plain: ([\d.]+)", theirs)
    if not (m_ours and m_theirs):
        return (what, "not run", "<= PyTorch's", "-")
    a, b = float(m_ours.group(1)), float(m_theirs.group(1))
    return (what, f"{a:.3f} vs PyTorch {b:.3f}", "<= PyTorch's", "pass" if a <= b else "FAIL")


def transformer_example_row(out, name, what):
    """Check 7: the transformer example on the GPU reaches the accuracy it reaches on CPU."""
    return accuracy_row(out, name, what, r"token accuracy ([\d.]+)% .*?\(([\d.]+)s of training")


def bench_row(out, name):
    text, code = read(out, name), status(out, name)
    what = "3 nccl_all_reduce (device and host-staged)"
    if text is None:
        return (what, "not run", "a table", "-")
    lines = [l for l in text.splitlines() if re.match(r"^\s*\d", l)]
    return (what, f"{len(lines)} rows (see {name}.txt)", "a table", "pass" if code == "0" and lines else "FAIL")


def overlap_rows(out, name):
    """Check 8 (issue 30), on the machine's CPUs: per model, DDP's default hides >= 50% of
    all-reduce time at world 2 and is not measurably slower than overlap off (the 95% confidence
    interval of the median per-round ratio reaches 1.00 or below); at world 1 its median ratio
    is <= 1.03."""
    text, code = read(out, name), status(out, name)
    what = "8 CPU overlap table"
    if text is None:
        return [(what, "not run", ">= 50% hidden, 95% CI reaches <= 1.00 x off, world 1 <= 1.03", "-")]
    rows = []
    world1 = re.findall(
        r"^\s+(\S.*?)\s{2,}[\d.]+\s+[\d.]+\s+([\d.]+)\s+([\d.]+-[\d.]+)\s*$", text, re.M
    )
    for model, ratio, ci in world1:
        r = float(ratio)
        rows.append((f"{what}: {model}, world 1 default / off", f"{r:.3f} (CI {ci})", "<= 1.03",
                     "pass" if code == "0" and r <= 1.03 else "FAIL"))
    world2 = re.findall(
        r"^\s+(\S.*?)\s{2,}default\s+[\d.]+\s+([\d.]+)\s+([\d.]+-[\d.]+)\s+(\d+)%", text, re.M
    )
    for model, ratio, ci, hidden in world2:
        r, h, ci_low = float(ratio), int(hidden), float(ci.split("-")[0])
        rows.append((f"{what}: {model}, world 2 hidden", f"{h}%", ">= 50%",
                     "pass" if code == "0" and h >= 50 else "FAIL"))
        rows.append((f"{what}: {model}, world 2 default / off", f"{r:.3f} (CI {ci})", "CI reaches <= 1.00",
                     "pass" if code == "0" and ci_low <= 1.00 else "FAIL"))
    m = re.search(r"PyTorch DDP \(gloo\)\s+([\d.]+)\s+-\s+(?:-\s+)?(\d+)%", text)
    if m:
        rows.append((f"{what}: PyTorch DDP (gloo), transformer", f"{m.group(1)} ms, {m.group(2)}% hidden",
                     "side by side", "-"))
    if not world1 or not world2:
        rows.append((what, f"no table (exit {code})", "a table", "FAIL"))
    return rows


def step_table(out, name):
    """A transformer_step output: (plain ms, first plain step ms, DDP ms, DDP / plain, hidden %)."""
    text = read(out, name)
    if not text:
        return None
    plain = re.search(r"^\s+plain burn\s+([\d.]+)\s+([\d.]+)\s*$", text, re.M)
    ddp = re.search(r"^\s+DDP \(world 1\)\s+([\d.]+)\s+([\d.]+)\s+(\d+)%", text, re.M)
    if not (plain and ddp):
        return None
    return (float(plain.group(1)), float(plain.group(2)), float(ddp.group(1)), float(ddp.group(2)),
            int(ddp.group(3)))


def pytorch_table(out, name):
    """A transformer_ddp.py output: (plain ms, DDP ms, DDP / plain)."""
    text = read(out, name) or ""
    p = re.search(r"plain PyTorch\s+([\d.]+) ms/step", text)
    d = re.search(r"DDP \(NCCL, world 1\)\s+([\d.]+) ms/step", text)
    if not (p and d):
        return None
    return float(p.group(1)), float(d.group(1)), float(d.group(1)) / float(p.group(1))


def variant_rows(out):
    """Check 11 (issue 44): each shape x backend variant against PyTorch on the same shape."""
    rows = []
    for shape in ("85m", "tiny"):
        torch = pytorch_table(out, f"11-{shape}-pytorch")
        if torch:
            rows.append((f"11 {shape} PyTorch: plain / DDP ms", f"{torch[0]:.2f} / {torch[1]:.2f} ({torch[2]:.3f})",
                         "reference", "-"))
        for backend in ("cuda-fused", "cuda"):
            for build in ("autotune", "plain"):
                name = f"11-{shape}-{backend}-{build}"
                what = f"11 {shape} {'fused' if backend == 'cuda-fused' else 'unfused'}, autotune {'on' if build == 'autotune' else 'off'}"
                if read(out, name) is None:
                    rows.append((what, "not run", "-", "-"))
                    continue
                t = step_table(out, name)
                if t is None:
                    rows.append((what, f"no table (exit {status(out, name)}; see {name}.txt)", "a table", "FAIL"))
                    continue
                plain, first, ddp, ratio, hidden = t
                rows.append((f"{what}: plain / DDP ms, first step", f"{plain:.2f} / {ddp:.2f} ms, first {first / 1e3:.1f} s", "-", "-"))
                if torch:
                    rows.append((f"{what}: DDP / plain", f"{ratio:.3f} vs PyTorch {torch[2]:.3f}", "<= PyTorch's",
                                 "pass" if ratio <= torch[2] else "FAIL"))
                rows.append((f"{what}: all-reduce hidden", f"{hidden}%", ">= 90%", "pass" if hidden >= 90 else "FAIL"))
                if shape == "85m" and backend == "cuda-fused" and build == "autotune" and torch:
                    r = ddp / torch[1]
                    rows.append((f"{what}: DDP / PyTorch DDP", f"{ddp:.2f} / {torch[1]:.2f} ms = {r:.2f}", "<= 1.25",
                                 "pass" if r <= 1.25 else "FAIL"))
    return rows


def cold_start_row(out):
    """Check 10: a second run with the kernel cache does not pay the first run's warm-up."""
    cold, warm = step_table(out, "10-cold-start-empty-cache"), step_table(out, "10b-cold-start-warm-cache")
    what = "10 first step, empty then warm kernel cache"
    if not (cold and warm):
        return (what, "not run", "warm <= 25% of cold", "-")
    r = warm[1] / cold[1]
    return (what, f"{cold[1] / 1e3:.2f} s then {warm[1] / 1e3:.2f} s ({r:.2f})", "warm <= 25% of cold",
            "pass" if r <= 0.25 else "FAIL")


def main():
    out = pathlib.Path(sys.argv[1])
    rows = [
        tests_row(out, "0-nccl-group-tests", "0 NCCL group tests"),
        digits_row(out, "1-digits-nccl-world1"),
        accuracy_row(out, "1b-digits-fused-nccl-world1", "1b digits --backend cuda-fused, NCCL", r"test accuracy ([\d.]+)%"),
        tests_row(out, "2-gpu-equivalence", "2 gpu_cuda tests (host staging = one process)"),
        bench_row(out, "3-nccl-all-reduce"),
        *transformer_rows(out, "4-transformer-step-nccl"),
        *transformer_rows(out, "4b-transformer-step-nccl-small-buckets"),
        pytorch_row(out, "4-transformer-step-nccl", "5-pytorch-ddp"),
        tests_row(out, "6-processes-sharing-one-gpu", "6 two processes share the GPU (host staging)"),
        transformer_example_row(out, "7-transformer-nccl-world1", "7 transformer example, NCCL, world 1"),
        transformer_example_row(out, "7b-transformer-host-world2", "7 transformer example, 2 ranks on 1 GPU"),
        transformer_example_row(out, "7c-transformer-bf16-world1", "7 transformer example, bf16, NCCL"),
        transformer_example_row(out, "7d-transformer-fsdp-world2", "7 transformer example, --shard full, 2 ranks"),
        transformer_example_row(out, "7e-transformer-zero2-nccl-world1", "7e transformer example, ZeRO-2, NCCL"),
        transformer_example_row(out, "7f-transformer-fsdp-nccl-world1", "7f transformer example, FSDP, NCCL"),
        transformer_example_row(out, "7g-transformer-fused-nccl-world1", "7g transformer example, fused, NCCL"),
        transformer_example_row(out, "7h-transformer-fused-zero2-nccl-world1", "7h transformer example, fused, ZeRO-2, NCCL"),
        *overlap_rows(out, "8-cpu-overlap-table"),
        cold_start_row(out),
        *variant_rows(out),
        # NCCL cannot put two ranks on one GPU: the world-2 failure check needs a machine with two.
        ("- rank 1 fails, rank 0 quotes it", "not automated here", "within seconds", "-"),
    ]
    widths = [max(len(str(r[i])) for r in rows + [("check", "figure", "goal", "verdict")]) for i in range(4)]
    fmt = "| " + " | ".join(f"{{:<{w}}}" for w in widths) + " |"
    print(fmt.format("check", "figure", "goal", "verdict"))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(fmt.format(*r))
    return 0 if all(r[3] in ("pass", "-") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
