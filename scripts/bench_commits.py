"""Time one ``sedd`` command at two commits, alternating runs in one process tree.

    python scripts/bench_commits.py OLD NEW --rounds 5 -- generate --cells 2 --out {out}

Each commit is checked out in its own ``git worktree`` (under a temporary folder) and the command
runs there with this interpreter (``python -m sedd.cli ...``), old then new, ``--rounds`` times,
so drift in machine load hits both arms alike. ``{out}`` in the command becomes a fresh file path
per run. Prints every wall time, the medians and new / old. Set ``OMP_NUM_THREADS`` yourself and
state it with the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def worktree(commit: str, where: Path) -> Path:
    path = where / commit.replace("/", "_")
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), commit],
        check=True,
        capture_output=True,
    )
    shared = ROOT.parent / "shared"  # test fixtures some commands read, beside the checkout
    if shared.exists() and not (where / "shared").exists():
        (where / "shared").symlink_to(shared)
    return path


def timed(tree: Path, command: list[str], out: Path) -> float:
    args = [arg.replace("{out}", str(out)) for arg in command]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "sedd.cli", *args], cwd=tree, env=env, capture_output=True
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{tree.name}: exit {done.returncode}\n{done.stderr.decode()[-2000:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--rounds", type=int, default=5)
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, command = parser.parse_args(argv[:cut]), argv[cut + 1 :]
    if not command or args.rounds < 1:
        parser.error("give --rounds >= 1 and a command after --")
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        trees = {"old": worktree(args.old, where), "new": worktree(args.new, where)}
        try:
            times: dict[str, list[float]] = {"old": [], "new": []}
            for k in range(args.rounds):
                for arm, tree in trees.items():
                    seconds = timed(tree, command, where / f"{arm}-{k}.h5ad")
                    times[arm].append(seconds)
                    print(f"round {k + 1} {arm} ({args.old if arm == 'old' else args.new}): "
                          f"{seconds:.2f} s", flush=True)  # fmt: skip
            old, new = (statistics.median(times[a]) for a in ("old", "new"))
            print(f"median old {old:.2f} s, new {new:.2f} s, new / old {new / old:.3f}")
        finally:
            for tree in trees.values():
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                    capture_output=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
