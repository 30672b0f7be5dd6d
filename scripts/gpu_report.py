"""Fold the results of ``scripts/gpu_check.sh`` into one report: DIR/report.json and report.md.

    python scripts/gpu_report.py bench_results/gpu_check

Reads what the check wrote in DIR (the benchmarks' JSON, the step logs, failed.txt) and writes
every figure once, as JSON and as markdown tables ready for the README.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _bench(result: dict) -> list[str]:
    rows = []
    for case in result.get("cases", []):
        c = case["case"]
        for name, r in case["results"].items():
            ratio = case.get("ratios_vs_fp32", {}).get(name, {}).get("speedup_cells_per_s", 1.0)
            shape = f"{c['hidden']}/{c['layers']}/{c['heads']}"
            rows.append([shape, str(c["genes"]), str(c["batch"]), name,
                         f"{r['cells_per_s']:.1f}", f"{r['ms_per_forward']:.2f}",
                         f"{r['peak_mib']:.0f}", f"{ratio:.2f}x"])  # fmt: skip
    head = ["H/L/heads", "genes", "batch", "precision", "cells/s", "ms/forward", "peak MiB",
            "vs fp32"]  # fmt: skip
    return _table(head, rows)


def _overhead(result: dict) -> list[str]:
    rows = [[str(f["rows"]), f"{f['host_ms']:.2f}", f"{f['forward_ms']:.2f}",
             f"{f['aten_ops']:.0f}", f"{f['syncs']:.0f}"] for f in result["figures"]]  # fmt: skip
    return _table(["rows in flight", "host ms", "forward ms", "aten ops", "syncs"], rows)


def main(folder: Path) -> int:
    failed = (folder / "failed.txt").read_text().split() if (folder / "failed.txt").exists() else []
    report: dict[str, object] = {"failed_steps": failed}
    md = ["# GPU check", ""]
    for name in sorted(p.stem for p in folder.glob("*.json") if p.stem != "report"):
        result = _load(folder / f"{name}.json")
        if result is None:
            continue
        report[name] = result
        env = result.get("environment", {})
        md += [f"## {name}", "", f"device: {env.get('cuda_device', result.get('device', '?'))}, "
               f"torch {env.get('torch', '?')}", ""]  # fmt: skip
        if "cases" in result:
            md += _bench(result)
        elif "figures" in result:
            md += [f"model: {result.get('model')}", "", *_overhead(result)]
        elif "speedup_cells_per_s" in result:
            md.append(f"default / st3's pattern, cells/s: {result['speedup_cells_per_s']:.2f}x")
        md.append("")
    lane = folder / "cuda_lane.log"
    if lane.exists():
        tail = [line for line in lane.read_text().splitlines() if line.strip()][-1:]
        report["cuda_lane"] = tail[0] if tail else ""
        md += ["## CUDA test lane", "", f"`{report['cuda_lane']}`", ""]
    md += [f"failed steps: {', '.join(failed) if failed else 'none'}", ""]
    (folder / "report.json").write_text(json.dumps(report, indent=2))
    (folder / "report.md").write_text("\n".join(md))
    print(f"wrote {folder / 'report.json'} and {folder / 'report.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python scripts/gpu_report.py DIR")
    raise SystemExit(main(Path(sys.argv[1])))
