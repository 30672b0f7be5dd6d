"""The CUDA test lane's test paths, derived: every entry of tests/ but those excluded below.

One list for every runner of the lane: ``scripts/gpu_check.sh`` (its ``cuda_lane`` step, on a
GPU and ``--emulated``), ``.ci/cuda_lane.sh`` and, through gpu_check, CI's
``.ci/gpu_check_emulated.sh``. Nothing is listed by hand: a test folder or top-level test module
added to tests/ joins the lane unless ``EXCLUDED`` names it, with the reason it stays out
(``tests/test_gpu_check.py`` fails on an exclusion without a reason, or on one that no longer
exists).

    python scripts/lane_tests.py            # the paths, relative to the repository, one a line
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"

# path under the repository -> why the lane does not run it
EXCLUDED: dict[str, str] = {
    "tests/bench": "sedd bench's CPU tables and the meta-backed roofline, which starts its own "
    "emulation; the lane times bench --overhead in tests/engine/test_overhead_timing.py",
    "tests/checkpoints": "checkpoint files read, converted and hashed on the host: no device",
    "tests/commands": "the CLI's arguments, files and st3 job scripts on the CPU; the lane runs "
    "the CLI on CUDA in tests/engine/test_cuda_lane.py",
    "tests/cuda_emulation": "the emulator's own tests start emulations of their own (CI's slow "
    "step runs them)",
    "tests/data": "test data, no tests",
    "tests/eval": "metrics and plots on host arrays (numpy, scipy): no device",
    "tests/helpers": "shared test helpers, no tests",
    "tests/io": "file formats read and written on the host: no device",
    "tests/train": "training stays on the CPU on the lane (no CUDA generators)",
    "tests/test_architecture.py": "the import layering, read from the source",
    "tests/test_docs_site.py": "the docs site's pages and links",
    "tests/test_docstring_paths.py": "paths named in docstrings exist",
    "tests/test_gpu_check.py": "the GPU check's scripts themselves (some need a machine without "
    "CUDA)",
    "tests/test_packaging.py": "the wheel's metadata and contents",
    "tests/test_readme.py": "the README's commands and claims, on the CPU",
}


def _entries() -> list[Path]:
    """The folders and top-level test modules of tests/, sorted."""
    return sorted(
        p
        for p in TESTS.iterdir()
        if (p.is_dir() and not p.name.startswith((".", "__")))
        or (p.is_file() and p.name.startswith("test_") and p.suffix == ".py")
    )


def lane_paths() -> list[str]:
    """The lane's test paths, relative to the repository: every entry of tests/ not excluded."""
    paths = [p.relative_to(ROOT).as_posix() for p in _entries()]
    return [p for p in paths if p not in EXCLUDED]


def problems() -> list[str]:
    """What is wrong with the lane's list: an exclusion without a reason or a path."""
    found = [f"{p}: excluded without a reason" for p, why in EXCLUDED.items() if not why.strip()]
    found += [f"{p}: excluded, but not in tests/" for p in EXCLUDED if not (ROOT / p).exists()]
    found += [
        f"{p}: in the lane, but does not exist" for p in lane_paths() if not (ROOT / p).exists()
    ]
    if not lane_paths():
        found.append("the lane has no test path")
    return found


def main() -> int:
    found = problems()
    if found:
        print("scripts/lane_tests.py:", *found, sep="\n  ", file=sys.stderr)
        return 1
    print("\n".join(lane_paths()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
