"""Fold the results of ``scripts/gpu_check.sh`` into one report: DIR/report.json and report.md.

    python scripts/gpu_report.py bench_results/gpu_check

Reads what the check wrote in DIR: each step's outcome (STEP.status: ``state exit seconds
budget mode``), its log (STEP.log) and its JSON (STEP.json), and writes every figure once, as
JSON and as markdown tables ready for the docs (docs/benchmarks.md, docs/gpu.md):

* the steps: outcome, seconds, budget (and, on the emulated lane, the host syncs it made);
* the CUDA test lane: its summary line and the failed tests, by name (pytest ``-rfE``'s
  ``FAILED``/``ERROR`` lines in cuda_lane.log);
* cells on CUDA against the CPU (``compare_cells.json``, scripts/gpu_compare_cells.py):
  identical, or the first differing cell and gene;
* bf16 against fp32: cells/s, ms a forward and peak memory (``bench_*_shape.json``);
* the K562-shape throughput through the engine (``bench_k562_shape.json``);
* MFU and st3's pattern against our default (``bench_compare.json``);
* CUDA graphs on against off, per engine tick (``overhead_*.json``).

A run on the emulated lane (``gpu_check.sh --emulated``) says so in the report's first line:
its timings mean nothing. Exit status 1 if a step failed.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

FAILED_LINE = re.compile(r"^(FAILED|ERROR) (.+?)(?: - (.*))?$")
SUMMARY_LINE = re.compile(r"(\d+ (passed|failed|errors?|skipped|deselected)|no tests ran)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
EMULATED_SYNCS = re.compile(r"^emulated CUDA: host syncs (.*)$")


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _f(value: object, spec: str = ".2f") -> str:
    return format(value, spec) if isinstance(value, int | float) else "-"


def read_steps(folder: Path) -> dict[str, dict[str, object]]:
    """Each step's outcome from STEP.status, in the order the check ran them."""
    steps = {}
    for path in sorted(folder.glob("*.status"), key=lambda p: p.stat().st_mtime):
        parts = path.read_text().split()
        if len(parts) < 4:
            continue
        entry: dict[str, object] = {
            "status": parts[0],
            "exit": int(parts[1]),
            "seconds": int(parts[2]),
            "budget_s": int(parts[3]),
            "mode": parts[4] if len(parts) > 4 else "cuda",
        }
        log = folder / f"{path.stem}.log"
        if log.exists():
            for line in log.read_text(errors="replace").splitlines():
                if found := EMULATED_SYNCS.match(line):
                    entry["emulated_syncs"] = found.group(1)
        steps[path.stem] = entry
    return steps


def parse_lane_log(text: str) -> dict[str, object]:
    """pytest's summary line and its failed tests (``-rfE``: ``FAILED id - message`` and
    ``ERROR id - message`` lines), and whether the run was interrupted (its budget ran out)."""
    failed, summary = [], ""
    for raw in text.splitlines():
        line = ANSI.sub("", raw).strip()
        if found := FAILED_LINE.match(line):
            kind, test, message = found.groups()
            failed.append({"test": test, "kind": kind.lower(), "message": message or ""})
        elif SUMMARY_LINE.search(line) and re.search(r"\bin [\d.]+s\b", line):
            summary = line.strip("= ")
    if not summary:
        lines = [ANSI.sub("", line).strip() for line in text.splitlines() if line.strip()]
        summary = lines[-1] if lines else ""
    interrupted = "KeyboardInterrupt" in text or "Interrupted:" in text
    return {"summary": summary, "failed_tests": failed, "interrupted": interrupted}


def _lane_md(lane: dict[str, object]) -> list[str]:
    summary = f"`{lane['summary']}`" if lane["summary"] else "pytest printed no summary"
    md = ["## CUDA test lane", "", summary, ""]
    if lane["interrupted"]:
        md += [
            "**Stopped at its time budget**: the tests after those counted did not run.",
            "",
        ]
    failed = lane["failed_tests"]
    if not failed:
        among = " among those that ran" if lane["interrupted"] else ""
        return [*md, f"failed tests: none{among}", ""]
    md.append(f"failed tests ({len(failed)}):")  # type: ignore[arg-type]
    for f in failed:  # type: ignore[union-attr]
        message = f" ({f['message']})" if f["message"] else ""
        md.append(f"- `{f['test']}`{' [error]' if f['kind'] == 'error' else ''}{message}")
    return [*md, ""]


def _cells_md(result: dict) -> list[str]:
    req = result.get("request", {})
    conditions = req.get("conditions") or []
    md = [
        "## Cells: CUDA against the CPU (fp32, one request, one seed)",
        "",
        f"request: {req.get('cells_per_condition')} cell(s) per condition x "
        f"{len(conditions)} condition(s), {req.get('steps')} steps, seed {req.get('seed')}, "
        f"{req.get('rows_per_forward')} row(s) a forward, model {req.get('model')}",
        "",
    ]
    rows = []
    for c in result.get("comparisons", []):
        if c.get("identical"):
            verdict = "identical"
        elif "first_cell" in c:
            verdict = (
                f"differ: first at cell {c['first_cell']} "
                f"({c.get('first_cell_condition', '?')}), gene {c['first_gene']} "
                f"(#{c['first_gene_index']}): {c['count_a']} vs {c['count_b']}; "
                f"{c['cells_differing']} of {c['cells']} cells, "
                f"{c['values_differing']} values"
            )
        else:
            verdict = f"differ in shape: {c.get('shape_a')} vs {c.get('shape_b')}"
        rows.append([c["a"], c["b"], verdict])
    md += [*_table(["reference", "arm", "cells"], rows), ""]
    arms = [
        [
            name,
            str(a.get("device")),
            "on" if a.get("cuda_graphs") else "off",
            str(a.get("cells")),
            _f(a.get("seconds")),
            str(a.get("graph_replays", "-")),
        ]
        for name, a in result.get("arms", {}).items()
    ]
    md += [*_table(["arm", "device", "graphs", "cells", "seconds", "graph replays"], arms), ""]
    for name in result.get("graphs_not_replayed", []):
        md += [f"**{name} replayed no CUDA graph** (its capture failed and it ran eager).", ""]
    return md


def _bench_rows(result: dict) -> list[dict[str, object]]:
    rows = []
    for case in result.get("cases", []):
        c = case["case"]
        for name, r in case["results"].items():
            ratio = case.get("ratios_vs_fp32", {}).get(name, {})
            parity = case.get("score_parity_vs_fp32", {}).get(name, {})
            rows.append(
                {
                    "shape": f"{c['hidden']}/{c['layers']}/{c['heads']}",
                    "genes": c["genes"],
                    "batch": c["batch"],
                    "steps": c["steps"],
                    "precision": name,
                    "cells_per_s": r["cells_per_s"],
                    "tokens_per_s": r["tokens_per_s"],
                    "ms_per_forward": r["ms_per_forward"],
                    "peak_mib": r["peak_mib"],
                    "cells_per_s_vs_fp32": ratio.get("speedup_cells_per_s", 1.0),
                    "memory_vs_fp32": ratio.get("peak_memory", 1.0),
                    "max_abs_dlogp": parity.get("max_abs"),
                }
            )
    return rows


def _bench_md(title: str, rows: list[dict[str, object]]) -> list[str]:
    head = [
        "H/L/heads",
        "genes",
        "batch",
        "precision",
        "cells/s",
        "ms/forward",
        "peak MiB",
        "cells/s vs fp32",
        "memory vs fp32",
        "max abs dlogp",
    ]
    body = [
        [
            str(r["shape"]),
            str(r["genes"]),
            str(r["batch"]),
            str(r["precision"]),
            _f(r["cells_per_s"], ".1f"),
            _f(r["ms_per_forward"]),
            _f(r["peak_mib"], ".0f"),
            f"{_f(r['cells_per_s_vs_fp32'])}x",
            f"{_f(r['memory_vs_fp32'])}x",
            _f(r["max_abs_dlogp"], ".3g"),
        ]
        for r in rows
    ]
    return [f"### {title}", "", *_table(head, body), ""]


def _k562_md(rows: list[dict[str, object]]) -> list[str]:
    if not rows:
        return []
    r0 = rows[0]
    if r0["genes"] != 8563:
        note = f" Not the K562 shape ({r0['genes']} genes): a reduced shape."
    else:
        note = ""
    md = [
        "## K562-shape throughput through the engine",
        "",
        f"`sedd bench`: a random-weight {r0['shape']} model of {r0['genes']} genes, one job of "
        f"{r0['batch']} cells through `sedd.engine` ({r0['steps']} steps and the final "
        f"denoise, one row block a step), median of the repeats.{note}",
        "",
    ]
    body = [
        [
            str(r["precision"]),
            _f(r["cells_per_s"]),
            _f(r["tokens_per_s"], ".0f"),
            _f(r["ms_per_forward"], ".1f"),
            _f(r["peak_mib"], ".0f"),
            _f(1e6 / float(r["cells_per_s"]) / 3600, ".1f") if r["cells_per_s"] else "-",
        ]
        for r in rows
    ]
    head = [
        "precision",
        "cells/s",
        "tokens/s",
        "ms/forward",
        "peak MiB",
        f"GPU-hours per million cells ({r0['steps']} steps)",
    ]
    return md + _table(head, body) + [""]


def _mfu(result: dict) -> dict[str, object]:
    figures = result.get("mfu", {})
    out: dict[str, object] = {
        "rows": figures.get("rows"),
        "gflop_per_forward": figures.get("flops_per_forward", 0) / 1e9,
        "fp32_matmul_gflop_per_s": figures.get("fp32_matmul", 0) / 1e9,
        "precision": result.get("environment", {}).get("precision"),
        "default_vs_st3_cells_per_s": result.get("speedup_cells_per_s"),
    }
    for name, entry in figures.items():
        if isinstance(entry, dict):
            out[name] = {
                "ms_per_forward": entry.get("ms_per_forward"),
                "gflop_per_s": entry.get("flops_per_s", 0) / 1e9,
                "mfu_vs_fp32_matmul": entry.get("mfu_vs_fp32_matmul"),
                f"mfu_vs_{name}_matmul": entry.get(f"mfu_vs_{name}_matmul"),
            }
    return out


def _mfu_md(result: dict, mfu: dict[str, object]) -> list[str]:
    md = ["## MFU and st3's pattern against our default (`sedd bench --compare`)", ""]
    if mfu["rows"] is not None:
        md += [
            f"one forward of the default's row block: {mfu['rows']} rows, "
            f"{_f(mfu['gflop_per_forward'], '.3f')} GFLOP (attention counted); fp32 "
            f"2048^2 matmul {_f(mfu['fp32_matmul_gflop_per_s'], '.1f')} GFLOP/s",
            "",
        ]
        body = []
        for name, entry in mfu.items():
            if isinstance(entry, dict):
                own = entry.get(f"mfu_vs_{name}_matmul")
                body.append(
                    [
                        name,
                        _f(entry["ms_per_forward"]),
                        _f(entry["gflop_per_s"], ".1f"),
                        _f(entry["mfu_vs_fp32_matmul"], ".3f"),
                        _f(own, ".3f"),
                    ]
                )
        head = ["precision", "ms/forward", "GFLOP/s", "MFU vs fp32 matmul", "MFU vs own matmul"]
        md += [*_table(head, body), ""]
    arms = [
        [
            name,
            str(result[name].get("steps")),
            str(result[name].get("batch_size")),
            _f(result[name].get("cells_per_s"), ".3f"),
            _f(result[name].get("quality", {}).get("corr_rms"), ".4f"),
        ]
        for name in ("st3", "default")
        if isinstance(result.get(name), dict)
    ]
    if arms:
        md += [*_table(["arm", "steps", "batch", "cells/s", "corr_rms"], arms), ""]
        md += [f"default / st3's pattern, cells/s: {_f(mfu['default_vs_st3_cells_per_s'])}x", ""]
    return md


def _overhead_md(name: str, result: dict) -> list[str]:
    rows = [
        [
            str(f["rows"]),
            f"{f['host_ms']:.2f}",
            f"{f['forward_ms']:.2f}",
            f"{f['aten_ops']:.0f}",
            f"{f['syncs']:.0f}",
        ]
        for f in result["figures"]
    ]
    graphs = "on" if result.get("cuda_graphs") else "off"
    return [
        f"### {name}",
        "",
        f"model: {result.get('model')}, CUDA graphs {graphs}",
        "",
        *_table(["rows in flight", "host ms", "forward ms", "aten ops", "syncs"], rows),
        "",
    ]


def graphs_on_off(results: dict[str, dict]) -> dict[str, list[dict[str, object]]]:
    """Per model (small, bundled), per rows in flight: a tick eager and with CUDA graphs."""
    out = {}
    for model in ("small", "bundled"):
        off = results.get(f"overhead_{model}_no-cuda-graphs")
        on = results.get(f"overhead_{model}_cuda-graphs")
        if not off or not on:
            continue
        by_rows = {f["rows"]: f for f in on["figures"]}
        rows = []
        for f in off["figures"]:
            g = by_rows.get(f["rows"])
            if g is None:
                continue
            # the tick's wall time (host and device overlap on CUDA; older files lack it)
            tick_off, tick_on = (x.get("tick_ms") or x["host_ms"] + x["forward_ms"] for x in (f, g))
            rows.append(
                {
                    "rows": f["rows"],
                    "tick_ms_off": tick_off,
                    "tick_ms_on": tick_on,
                    "host_ms_off": f["host_ms"],
                    "host_ms_on": g["host_ms"],
                    "syncs_off": f["syncs"],
                    "syncs_on": g["syncs"],
                    "speedup": tick_off / tick_on if tick_on > 0 else None,
                }
            )
        out[model] = rows
    return out


def _graphs_md(figures: dict[str, list[dict[str, object]]]) -> list[str]:
    md = ["## CUDA graphs on against off (`sedd bench --overhead`, per engine tick)", ""]
    head = [
        "model",
        "rows in flight",
        "tick ms off",
        "tick ms on",
        "host ms off",
        "host ms on",
        "syncs off",
        "syncs on",
        "speedup",
    ]
    body = [
        [
            model,
            str(r["rows"]),
            _f(r["tick_ms_off"]),
            _f(r["tick_ms_on"]),
            _f(r["host_ms_off"]),
            _f(r["host_ms_on"]),
            _f(r["syncs_off"], ".0f"),
            _f(r["syncs_on"], ".0f"),
            f"{_f(r['speedup'])}x",
        ]
        for model, rows in figures.items()
        for r in rows
    ]
    return md + _table(head, body) + [""]


def last_log_line(path: Path) -> str:
    """The last line a step printed (its error, mostly), the emulation's sync count left out."""
    if not path.exists():
        return ""
    lines = [ANSI.sub("", line).strip() for line in path.read_text(errors="replace").splitlines()]
    lines = [line for line in lines if line and not EMULATED_SYNCS.match(line)]
    return lines[-1] if lines else ""


def _failed_md(folder: Path, steps: dict[str, dict[str, object]], report: dict) -> list[str]:
    failed = report["failed_steps"]
    if not failed:
        return ["failed steps: none", ""]
    md = [f"## Failed steps: {', '.join(failed)}", ""]
    errors = {}
    for name in failed:
        s = steps.get(name, {})
        errors[name] = last_log_line(folder / f"{name}.log")
        state, code, took = s.get("status", "failed"), s.get("exit", "?"), s.get("seconds", "?")
        how = f"{state}, exit {code} after {took} s"
        said = f"`{errors[name]}`" if errors[name] else "(no output)"
        md.append(f"- {name} ({how}; {name}.log): {said}")
    report["failed_step_errors"] = errors
    return [*md, ""]


def _first_line(steps: dict[str, dict[str, object]], device: str) -> str:
    emulated = [name for name, s in steps.items() if s["mode"] == "emulated"]
    if emulated and len(emulated) == len(steps):
        return (
            "# GPU check: EMULATED RUN (sedd.cuda_emulation on a CPU, tiny shapes): its "
            "timings mean nothing; it shows that every step runs and the report is written"
        )
    if emulated:
        return (
            f"# GPU check on {device}: PARTLY EMULATED: {', '.join(emulated)} ran on the "
            "emulated CUDA device (tiny shapes; their timings mean nothing)"
        )
    return f"# GPU check on {device}"


def main(folder: Path) -> int:
    steps = read_steps(folder)
    failed = [name for name, s in steps.items() if s["status"] != "ok"]
    legacy = folder / "failed.txt"  # written by earlier versions of gpu_check.sh
    if legacy.exists():
        failed += [name for name in legacy.read_text().split() if name not in failed]
    skip = {"report", "compare"}  # compare: an earlier version's name of bench_compare
    results = {
        p.stem: r
        for p in sorted(folder.glob("*.json"))
        if p.stem not in skip and (r := _load(p)) is not None
    }
    device = "?"
    for result in results.values():
        env = result.get("environment", {})
        device = str(env.get("cuda_device", device)).replace("\n", " ")
    emulated = any(s["mode"] == "emulated" for s in steps.values())
    report: dict[str, object] = {
        "emulated": emulated,
        "device": device,
        "failed_steps": failed,
        "steps": steps,
    }
    md = [_first_line(steps, device), ""]
    if steps:
        rows = [
            [
                name,
                str(s["status"]),
                str(s["seconds"]),
                str(s["budget_s"]),
                str(s.get("emulated_syncs", "-")),
            ]
            for name, s in steps.items()
        ]
        head = ["step", "outcome", "seconds", "budget s", "host syncs (emulated)"]
        if not emulated:
            head, rows = head[:4], [row[:4] for row in rows]
        total = sum(int(s["seconds"]) for s in steps.values())  # type: ignore[call-overload]
        md += ["## Steps", "", *_table(head, rows), "", f"total: {total} s", ""]
    lane = folder / "cuda_lane.log"
    if lane.exists():
        report["cuda_lane"] = lane_figures = parse_lane_log(lane.read_text(errors="replace"))
        if steps.get("cuda_lane", {}).get("status") == "timeout":
            lane_figures["interrupted"] = True
        md += _lane_md(report["cuda_lane"])  # type: ignore[arg-type]
    if "compare_cells" in results:
        report["compare_cells"] = results["compare_cells"]
        md += _cells_md(results["compare_cells"])
    benches = {name: _bench_rows(results[name]) for name in results if "cases" in results[name]}
    if benches:
        report["bf16_vs_fp32"] = benches
        md += ["## bf16 against fp32 (`sedd bench`: cells/s and memory)", ""]
        for name, rows in benches.items():
            md += _bench_md(name, rows)
    if "bench_k562_shape" in benches:
        report["k562_engine"] = benches["bench_k562_shape"]
        md += _k562_md(benches["bench_k562_shape"])
    if "bench_compare" in results:
        report["mfu"] = _mfu(results["bench_compare"])
        md += _mfu_md(results["bench_compare"], report["mfu"])  # type: ignore[arg-type]
    graphs = graphs_on_off(results)
    if graphs:
        report["cuda_graphs_on_off"] = graphs
        md += _graphs_md(graphs)
    overheads = [name for name in results if "figures" in results[name]]
    if overheads:
        md += ["## Host overhead per engine tick (`sedd bench --overhead`)", ""]
        for name in overheads:
            md += _overhead_md(name, results[name])
    report["results"] = results
    md += _failed_md(folder, steps, report)
    (folder / "report.json").write_text(json.dumps(report, indent=2))
    (folder / "report.md").write_text("\n".join(md))
    print(f"wrote {folder / 'report.json'} and {folder / 'report.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python scripts/gpu_report.py DIR")
    raise SystemExit(main(Path(sys.argv[1])))
