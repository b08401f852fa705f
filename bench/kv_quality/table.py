#!/usr/bin/env python3
"""Merge kvpress.csv and flexh2o.csv (scoring.CSV_COLUMNS) into markdown tables.

Table 1: accuracy, rows = methods of both engines, columns = task x length at each kept
fraction; each cell "acc [lo, hi] (n)" with the 95% Wilson interval. The full cache is one row.
Table 2: long-text fidelity, KL(full || method) and top-1 agreement per length and kept.

usage: table.py CSV [CSV ...] [--kept 0.1,0.25] [--out table.md]
"""
import argparse
import csv
from collections import defaultdict


def read_rows(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            rows += list(csv.DictReader(f))
    return rows


def method_order(methods):
    # Full caches first, then each engine's methods in alphabetical order.
    return sorted(methods, key=lambda m: (not m.endswith("/full"), m.split("/")[0], m))


def accuracy_table(rows, kepts):
    acc = [r for r in rows if r["task"] != "fidelity"]
    cols = sorted({(r["task"], int(r["length"])) for r in acc})
    cells = {(r["method"], float(r["kept"]), r["task"], int(r["length"])): r for r in acc}
    header = ["method", "kept"] + [f"{t} {l}" for t, l in cols]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for m in method_order({r["method"] for r in acc}):
        for k in ([1.0] if m.endswith("/full") else kepts):
            out = [m, f"{k:g}"]
            for t, l in cols:
                r = cells.get((m, k, t, l))
                out.append(f"{float(r['accuracy']):.2f} [{float(r['wilson95_lo']):.2f}, "
                           f"{float(r['wilson95_hi']):.2f}] ({r['n']})" if r else "")
            lines.append("| " + " | ".join(out) + " |")
    return "\n".join(lines)


def fidelity_table(rows, kepts):
    fid = [r for r in rows if r["task"] == "fidelity"]
    if not fid:
        return ""
    lengths = sorted({int(r["length"]) for r in fid})
    cells = {(r["method"], float(r["kept"]), int(r["length"])): r for r in fid}
    header = ["method", "kept"] + [f"KL / top-1, {l} (n)" for l in lengths]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for m in method_order({r["method"] for r in fid}):
        for k in kepts:
            out = [m, f"{k:g}"]
            for l in lengths:
                r = cells.get((m, k, l))
                out.append(f"{float(r['kl']):.4f} / {float(r['top1']):.3f} ({r['n']})" if r else "")
            lines.append("| " + " | ".join(out) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--kept", default="0.1,0.25")
    ap.add_argument("--out", help="also write the tables here")
    args = ap.parse_args()
    rows = read_rows(args.csv)
    kepts = [float(k) for k in args.kept.split(",")]
    text = ("Accuracy [95% Wilson interval] (n prompts)\n\n" + accuracy_table(rows, kepts) + "\n")
    fid = fidelity_table(rows, kepts)
    if fid:
        text += "\nLong-text fidelity: mean KL(full || method) / top-1 agreement (n texts)\n\n" + fid + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
