"""``python -m sedd.cuda_emulation MODULE [ARGS...]``: run a module as ``python -m MODULE`` would,
on emulated CUDA (``sedd.cuda_emulation.emulate_cuda``), e.g.

    python -m sedd.cuda_emulation sedd.cli generate --device cuda --cuda-graphs --out c.h5ad

The emulated device computes on this CPU: timings mean nothing, cells and syncs do. At the end
it prints how many host syncs the run made, by kind, on stderr.
"""

from __future__ import annotations

import runpy
import sys
from collections import Counter

from sedd.cuda_emulation import emulate_cuda


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print("usage: python -m sedd.cuda_emulation MODULE [ARGS...]", file=sys.stderr)
        return 2
    module, sys.argv = argv[0], argv
    code: object = 0
    with emulate_cuda() as emulator:
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as stop:
            code = stop.code
        kinds = Counter(s.kind for s in emulator.syncs)
    summary = ", ".join(f"{k} {n}" for k, n in kinds.most_common()) or "none"
    print(f"emulated CUDA: host syncs {summary}", file=sys.stderr)
    return code if isinstance(code, int) else (0 if code is None else 1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
