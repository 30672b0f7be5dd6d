"""``sedd train``: train a model from a JSON config (``sedd.train.config.TrainConfig``).

    sedd train --config configs/pbmc_default.json --out models/pbmc_default
    sedd train --config configs/pbmc_default.json --out models/pbmc_default --resume

The native model (EMA weights) goes to ``--out``; the resumable state (``train_state.pt``) and
``metrics.jsonl`` go to the run directory (default ``<--out>/training``).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from sedd.commands.args import add_progress_argument, show_progress


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train", help="train a model on an .h5ad of counts",
        description="Train a masked-diffusion model of single-cell counts. Settings come from "
                    "--config (JSON; every field has a default); the options below override it.",
    )  # fmt: skip
    p.add_argument("--config", type=Path, metavar="FILE", help="training config (JSON)")
    p.add_argument("--out", metavar="DIR", help="native model directory (EMA weights)")
    p.add_argument(
        "--run-dir",
        metavar="DIR",
        help="train_state.pt + metrics.jsonl (default <--out>/training)",
    )
    p.add_argument("--data", metavar="FILE", help=".h5ad of integer counts")
    p.add_argument(
        "--init-from",
        metavar="MODEL",
        help="fine-tune: start from this model's weights (same genes, bins, labels and size)",
    )
    p.add_argument("--max-steps", type=int, metavar="N", help="optimizer steps in total")
    p.add_argument(
        "--until-step",
        type=int,
        metavar="N",
        help="stop (and save) at step N; the schedule still spans --max-steps",
    )
    p.add_argument("--batch-size", type=int, metavar="N", help="cells per micro-batch")
    p.add_argument("--accum-steps", type=int, metavar="N", help="micro-batches per step")
    p.add_argument("--lr", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument(
        "--amp",
        choices=["bf16", "fp16", "fp32"],
        help="autocast dtype of the forward (fp16: CUDA only)",
    )
    p.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    p.add_argument("--activation-checkpointing", action="store_true", default=None)
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from <run-dir>/train_state.pt at its step + 1",
    )
    add_progress_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sedd.train.config import load_train_config
    from sedd.train.trainer import Trainer

    config = load_train_config(
        args.config, out=args.out, run_dir=args.run_dir, data=args.data,
        init_from=args.init_from,
        max_steps=args.max_steps, batch_size=args.batch_size, accum_steps=args.accum_steps,
        lr=args.lr, seed=args.seed, amp=args.amp, device=args.device,
        activation_checkpointing=args.activation_checkpointing,
    )  # fmt: skip
    if args.out and not args.run_dir:  # a new --out gets its own run directory
        config = config.model_copy(update={"run_dir": None})
    command = shlex.join(["sedd", *sys.argv[1:]])  # the command line as typed, under any launcher
    trainer = Trainer(
        config, resume=args.resume, command=command, progress=show_progress(args.progress)
    )
    summary = trainer.fit(until=args.until_step)
    if summary.step == summary.start_step:
        print(f"nothing to do: {config.run_path} is already at step {summary.step}.")
        return 0
    unit = "nats/gene" if config.objective == "elbo" else "nats/masked gene"
    val = summary.val.get("val_elbo")
    val_text = f"; held-out ELBO {val:.4f} nats/gene (EMA)" if val is not None else ""
    print(
        f"trained steps {summary.start_step + 1}..{summary.step} in {summary.seconds:.0f} s: "
        f"loss {summary.first_loss:.4f} -> {summary.last_loss:.4f} {unit}{val_text}. "
        f"Model: {summary.out}; state: {summary.state_file}"
    )
    return 0
