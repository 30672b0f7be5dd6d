"""Peak memory of `sedd generate` as the cell count grows: streaming output vs holding the cells.

Each run is a fresh process (peak RSS is per process), measured with the kernel's own maxrss of
the finished child. Streaming is the CLI (`sedd generate ... --out F`: each finished batch goes
into the h5ad on disk); the baseline, measured in the same run, is the same request through the
Python API (`sedd.load(...).generate(...)` holds every cell, then writes the AnnData). Then a
projection for 1 M cells x 8,563 genes from the measured per-cell figures.

    OMP_NUM_THREADS=1 python scripts/bench_memory.py --cells 10000 100000 1000000
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "data" / "st3" / "experiments" / "tiny_mlm"
_MIB = 2**20

_API_RUN = """
import sys, sedd
model = sedd.load(sys.argv[1], device="cpu")
cells = model.generate(int(sys.argv[2]), steps=int(sys.argv[3]), seed=0)
cells.write_h5ad(sys.argv[4])
"""


def _child_peak_mib(command: list[str]) -> tuple[float, float]:
    """Run ``command`` to completion; (its own peak RSS in MiB, seconds)."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as log:  # a file, not a pipe: a long progress bar never blocks
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
        _, status, usage = os.wait4(child.pid, 0)  # this child's rusage (Linux reports KiB)
        seconds = time.perf_counter() - start
        if status != 0:
            log.seek(0)
            last = log.read().decode(errors="replace").strip().splitlines()[-1:]
            raise RuntimeError(f"{command[:3]} failed: {last}")
    return usage.ru_maxrss * 1024 / _MIB, seconds


def measure(model: Path, cells: int, steps: int, work: Path, baseline: bool) -> dict[str, float]:
    out = work / f"stream_{cells}.h5ad"
    sedd = str(Path(sys.executable).with_name("sedd"))
    stream_mib, stream_s = _child_peak_mib(
        [sedd, "generate", "--model", str(model), "--cells", str(cells), "--steps", str(steps),
         "--seed", "0", "--device", "cpu", "--out", str(out)]
    )  # fmt: skip
    row = {"cells": cells, "stream_mib": stream_mib, "stream_s": stream_s}
    row["disk_mib"] = out.stat().st_size / _MIB
    if baseline:
        held = work / f"held_{cells}.h5ad"
        code = [sys.executable, "-c", _API_RUN, str(model), str(cells), str(steps), str(held)]
        row["held_mib"], row["held_s"] = _child_peak_mib(code)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=TINY, help="default: the st3 tiny_mlm fixture")
    p.add_argument("--cells", type=int, nargs="+", default=[10_000, 100_000])
    p.add_argument("--steps", type=int, default=1)
    p.add_argument(
        "--baseline-up-to", type=int, default=100_000, help="largest count run in memory too"
    )
    args = p.parse_args()
    print(f"threads: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; model "
          f"{args.model}; {args.steps} step(s)")  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for cells in sorted(args.cells):
            row = measure(args.model, cells, args.steps, Path(tmp), cells <= args.baseline_up_to)
            rows.append(row)
            held = (
                f" | held in memory {row['held_mib']:.0f} MiB ({row['held_s']:.0f} s), "
                f"streaming / held {row['stream_mib'] / row['held_mib']:.2f}x"
                if "held_mib" in row
                else ""
            )
            print(f"{cells:>9} cells: streaming peak RSS {row['stream_mib']:.0f} MiB "
                  f"({row['stream_s']:.0f} s, file {row['disk_mib']:.1f} MiB){held}",
                  flush=True)  # fmt: skip
    first, last = rows[0], rows[-1]
    growth = (last["stream_mib"] - first["stream_mib"]) / (last["cells"] - first["cells"]) * 1e6
    print(f"streaming RSS growth: {growth:.1f} MiB per million cells "
          f"({first['cells']} -> {last['cells']} cells: "
          f"{last['stream_mib'] - first['stream_mib']:+.0f} MiB)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
