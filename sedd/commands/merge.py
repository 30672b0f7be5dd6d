"""``sedd merge DIR --out FILE.h5ad``: join the shards of a --out-dir run, after checking them."""

from __future__ import annotations

import argparse
from pathlib import Path

from sedd.commands.args import add_counts_dtype_argument, add_overwrite_argument


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "merge",
        help="merge the shards of a --out-dir run into one .h5ad",
        description="Check that every shard 0..n-1 of DIR is present, belongs to DIR's request, "
        "matches its sha256 and covers exactly its cells, then write FILE atomically (and "
        "FILE.metrics.json). An existing FILE is replaced only with --overwrite.",
    )
    p.add_argument("dir", type=Path, metavar="DIR", help="the --out-dir of generate/predict")
    p.add_argument("--out", type=Path, required=True, metavar="FILE", help="merged .h5ad")
    add_overwrite_argument(p)
    add_counts_dtype_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sedd.commands.output import claim_output
    from sedd.io.files import check_writable
    from sedd.shards.merge import merge_shards

    check_writable(claim_output(args.out, args.overwrite))
    summary = merge_shards(args.dir, args.out, count_dtype=args.counts_dtype)
    timings = summary["timings"]
    print(
        f"merged {summary['shards']} shard(s) of {args.dir} into {args.out}: "
        f"{summary['cells']} cells ({timings['forwards']} forwards, "
        f"{timings['shard_seconds_total']:.1f} s of sampling over all shards, fp32 fallbacks "
        f"{timings['fp32_fallbacks']})"
    )
    return 0
