"""Prints criterion results (benches/micro.rs) as the Markdown table in BENCHMARKS.md.

Owns the step from criterion's saved estimates to the document, so the numbers there
are copied by a program, not by hand:

    python3 benches/criterion_table.py TARGET_DIR/criterion BASELINE [BASELINE_AFTER]

With two baselines it prints both medians and the change.
"""

import json
import os
import sys


def estimates(root, baseline):
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        if os.path.basename(dirpath) == baseline and "estimates.json" in files:
            with open(os.path.join(dirpath, "estimates.json")) as f:
                est = json.load(f)
            with open(os.path.join(dirpath, "benchmark.json")) as f:
                name = json.load(f)["full_id"]
            out[name] = est
    return out


def fmt(ns):
    if ns < 1e3:
        return f"{ns:.1f} ns"
    if ns < 1e6:
        return f"{ns / 1e3:.2f} µs"
    return f"{ns / 1e6:.2f} ms"


def main():
    root, before = sys.argv[1], sys.argv[2]
    after = sys.argv[3] if len(sys.argv) > 3 else None
    a = estimates(root, before)
    b = estimates(root, after) if after else {}
    if after:
        print(f"| benchmark | median ({before}) | median ({after}) | change |")
        print("|---|--:|--:|--:|")
    else:
        print("| benchmark | median | 95 % CI of the mean |")
        print("|---|--:|---|")
    for name in sorted(a):
        med = a[name]["median"]["point_estimate"]
        if after and name in b:
            med2 = b[name]["median"]["point_estimate"]
            print(f"| {name} | {fmt(med)} | {fmt(med2)} | {100 * (med2 - med) / med:+.1f} % |")
        else:
            ci = a[name]["mean"]["confidence_interval"]
            print(f"| {name} | {fmt(med)} | {fmt(ci['lower_bound'])} – {fmt(ci['upper_bound'])} |")


if __name__ == "__main__":
    main()
