"""Summarises a callgrind dump per check (used by benches/profile-callgrind.sh).

Owns the arithmetic of BENCHMARKS.md's profile: instructions per check, self cost per
function, and inclusive cost (self + calls made) of the functions matching a pattern.
Written because `callgrind_annotate` 3.19 shows only the thread-entry function for dumps
taken with `callgrind_control --dump` of this binary; the file format is simple enough
to sum directly (cost lines after a `calls=` line are the call's inclusive cost).

    python3 benches/callgrind_summary.py DUMP CHECKS [PATTERN ...]
"""

import collections
import re
import sys


def load(path):
    names = {}

    def resolve(v):
        m = re.match(r"\((\d+)\)(?: (.*))?$", v)
        if not m:
            return v
        i, name = m.groups()
        if name:
            names[i] = name
        return names.get(i, "?" + i)

    self_cost = collections.Counter()
    call_cost = collections.Counter()
    cur, after_calls = None, False
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("fn="):
                cur, after_calls = resolve(line[3:]), False
            elif line.startswith("cfn="):
                resolve(line[4:])
            elif line.startswith("calls="):
                after_calls = True
            elif line and (line[0].isdigit() or line[0] in "+-*"):
                parts = line.split()
                if len(parts) >= 2 and cur is not None:
                    (call_cost if after_calls else self_cost)[cur] += int(parts[1])
                after_calls = False
    return self_cost, call_cost


def main():
    path, checks = sys.argv[1], int(sys.argv[2])
    patterns = sys.argv[3:] or ["ratelimit::", "moka::", "metrics::"]
    self_cost, call_cost = load(path)
    total = sum(self_cost.values())
    print(f"instructions: {total:,} for {checks:,} checks = {total / checks:,.0f} per check")
    print("\n-- self cost per check (top 25)")
    for fn, c in self_cost.most_common(25):
        print(f"{c / checks:9,.0f} {100 * c / total:5.1f}%  {fn[:160]}")
    for pat in patterns:
        print(f"\n-- inclusive cost per check of functions matching {pat!r} (top 12)")
        fns = [f for f in set(self_cost) | set(call_cost) if pat in f]
        fns.sort(key=lambda f: -(self_cost[f] + call_cost[f]))
        for fn in fns[:12]:
            inc = self_cost[fn] + call_cost[fn]
            print(f"{inc / checks:9,.0f} {100 * inc / total:5.1f}%  {fn[:160]}")


if __name__ == "__main__":
    main()
