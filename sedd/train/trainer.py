"""Training x0 (clean-token) models of single-cell counts with the masked-diffusion objective.

This module holds the loop: ``Trainer`` owns one run (data, model, EMA, optimizer, LR schedule,
scaler, RNG streams) and ``fit`` trains it, logs and saves. The objective itself (noising a batch,
the ELBO and masked cross-entropy, the held-out loss) is ``sedd.train.objective``; the EMA, the
resumable state file and the published native model are ``sedd.train.state``; the config, the
data and the LR schedule are ``sedd.train.config``. The names of those modules that callers used
to import from here are re-exported.

Precision (docs/precision.md, "Training"): autocast (``PrecisionPolicy.autocast``) covers the
forward that produces the loss input; logits are cast ``.float()`` and the loss runs in fp32.
GradScaler only for fp16 on CUDA, in the order scale(loss).backward -> unscale_ -> clip -> step ->
update. Accumulation divides the loss by ``accum_steps`` and clips once per optimizer step; the
step counter and the LR schedule count optimizer updates. Weights, optimizer state and EMA are
fp32. Activation checkpointing wraps each block, only while training.

Randomness is reproducible and resumable: weights and dropout use the global torch RNG seeded
from ``seed``; t and masks come from a ``torch.Generator``; epoch e visits the cells in a
permutation drawn from its own seed. All states go into ``train_state.pt``, so ``resume`` continues
at step + 1 exactly as an uninterrupted run would.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from sedd.checkpoints import build_model
from sedd.defaults import default_device
from sedd.diffusion.graph import AbsorbingGraph
from sedd.diffusion.noise import LogLinearNoise
from sedd.train.config import (
    TrainConfig,
    TrainingData,
    load_training_data,
    lr_factor,
    model_config,
    training_precision,
)
from sedd.train.objective import (
    LossTerms,
    elbo_weight,
    forward_logits,
    heldout_loss,
    loss_terms,
    noise_batch,
)
from sedd.train.state import (
    EMA,
    STATE_FILE,
    STATE_FORMAT,
    init_weights,
    read_state,
    restore_rng_states,
    rng_states,
    write_native_model,
    write_state,
)

__all__ = [
    "EMA",
    "STATE_FILE",
    "LossTerms",
    "TrainSummary",
    "Trainer",
    "elbo_weight",
    "forward_logits",
    "heldout_loss",
    "loss_terms",
    "noise_batch",
]

METRICS_FILE = "metrics.jsonl"


def _derived_seed(seed: int, stream: int) -> int:
    return (seed * 1_000_003 + stream) % (2**63)


@dataclass
class TrainSummary:
    start_step: int
    step: int
    micro_batches: int
    seconds: float
    first_loss: float | None
    last_loss: float | None
    val: dict[str, float] = field(default_factory=dict)
    out: Path | None = None
    state_file: Path | None = None


@dataclass
class _Window:
    """Losses and throughput of the optimizer steps since the last log line."""

    losses: list[float] = field(default_factory=list)
    cells: int = 0
    seconds: float = 0.0

    def add(self, loss: float, cells: int, seconds: float) -> None:
        self.seconds += seconds
        self.cells += cells
        self.losses.append(loss)

    def mean_loss(self) -> float:
        return sum(self.losses) / len(self.losses)

    def cells_per_second(self) -> float:
        return self.cells / max(self.seconds, 1e-9)


class Trainer:
    """One training run: data, model, EMA, optimizer, schedule, scaler and RNG streams.

    ``Trainer(config).fit()`` trains to ``config.max_steps``; ``resume=True`` first restores
    ``<run_dir>/train_state.pt``. ``command`` is recorded as the model's training command.
    ``progress`` draws a tqdm bar; the log lines (loss, validation) are printed either way.
    """

    def __init__(
        self,
        config: TrainConfig,
        *,
        resume: bool = False,
        command: str | None = None,
        progress: bool = True,
        data: TrainingData | None = None,
    ) -> None:
        self.config, self.command, self.progress = config, command, progress
        self.device = torch.device(config.device or default_device())
        self.policy = training_precision(config.amp, self.device)
        self.data = data or load_training_data(config)
        self.model_config = model_config(config, self.data)
        torch.manual_seed(config.seed)
        self.model = build_model(self.model_config).to(self.device).float().train()
        self.noise = LogLinearNoise(config.noise_eps)
        self.graph = AbsorbingGraph(self.data.num_bins)
        self.ema = EMA(self.model, config.ema_decay, config.ema_warmup)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=config.lr,
            betas=config.betas,
            weight_decay=config.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda update: self._lr_factor(update)
        )
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=config.amp == "fp16")
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(_derived_seed(config.seed, 1))
        self.step = 0  # optimizer updates done
        self.micro_batches = 0
        self.commands: list[str] = []
        self._epoch_order: tuple[int, torch.Tensor] | None = None
        self.last_val: dict[str, float] = {}
        self.init_record: dict[str, str] | None = None
        if resume:
            self._load_state()
        elif config.init_from is not None:
            self.init_record = init_weights(
                config.init_from, self.model_config, self.model, self.ema.model
            )
        if command:
            self.commands.append(command)

    # ---- pieces ---------------------------------------------------------------------------

    def _lr_factor(self, update: int) -> float:
        c = self.config
        return lr_factor(
            update,
            warmup=c.warmup_steps,
            max_steps=c.max_steps,
            schedule=c.schedule,
            min_ratio=c.min_lr_ratio,
        )

    def batch_indices(self, micro_batch: int) -> torch.Tensor:
        """Cells of micro-batch ``micro_batch``: epoch e walks a permutation seeded by (seed, e)."""
        n, size = self.data.tokens.shape[0], self.config.batch_size
        per_epoch = max(1, n // size)  # drop the incomplete last batch of each epoch
        epoch, k = divmod(micro_batch, per_epoch)
        if self._epoch_order is None or self._epoch_order[0] != epoch:
            gen = torch.Generator().manual_seed(_derived_seed(self.config.seed, 2 + epoch))
            self._epoch_order = (epoch, torch.randperm(n, generator=gen))
        return self._epoch_order[1][k * size : (k + 1) * size]

    def loss(self, x0: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor:
        """The training objective of one micro-batch (fp32 scalar); draws t and masks."""
        xt, t, sigma = noise_batch(x0, self.noise, self.graph, self.generator, self.config.t_eps)
        with self.policy.autocast():
            logits = forward_logits(
                self.model, xt, sigma, labels,
                checkpoint_blocks=self.config.activation_checkpointing,
            )  # fmt: skip
        terms = loss_terms(logits.float(), x0, xt, t, self.noise, self.graph.dim - 1)
        return terms.loss(self.config.objective)

    def train_step(self) -> tuple[float, float, int]:
        """One optimizer update over ``accum_steps`` micro-batches: (loss, grad norm, cells)."""
        accum = self.config.accum_steps
        params = list(self.model.parameters())
        self.optimizer.zero_grad(set_to_none=True)
        total, cells = 0.0, 0
        for _ in range(accum):
            rows = self.batch_indices(self.micro_batches)
            self.micro_batches += 1
            x0 = self.data.tokens[rows].to(self.device)
            labels = None if self.data.labels is None else self.data.labels[rows].to(self.device)
            loss = self.loss(x0, labels)
            if not torch.isfinite(loss) and not self.scaler.is_enabled():
                raise FloatingPointError(
                    f"training loss is {float(loss)} at step {self.step + 1}; lower `lr` or use "
                    "amp 'fp32'."
                )
            self.scaler.scale(loss / accum).backward()
            total += float(loss.detach())
            cells += int(rows.numel())
        self.scaler.unscale_(self.optimizer)
        max_norm = self.config.grad_clip if self.config.grad_clip is not None else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        self.scaler.step(self.optimizer)  # skipped by the scaler when fp16 grads are not finite
        self.scaler.update()
        self.scheduler.step()
        self.step += 1
        self.ema.update(self.model, self.step)
        return total / accum, grad_norm, cells

    def validate(self) -> dict[str, float]:
        """Held-out ELBO / masked CE of the raw and the EMA weights ({} without held-out cells)."""
        if self.data.val_tokens is None:
            return {}
        kwargs = {
            "t_eps": self.config.t_eps,
            "batch_size": self.config.batch_size,
            "repeats": self.config.val_repeats,
            "seed": _derived_seed(self.config.seed, 0),
        }
        args = (self.data.val_tokens, self.data.val_labels, self.noise, self.graph, self.policy)
        raw = heldout_loss(self.model, *args, **kwargs)
        ema = heldout_loss(self.ema.model, *args, **kwargs)
        self.last_val = {
            "val_elbo": ema["elbo"],
            "val_masked_ce": ema["masked_ce"],
            "val_elbo_raw": raw["elbo"],
            "val_masked_ce_raw": raw["masked_ce"],
        }
        return self.last_val

    # ---- the loop -------------------------------------------------------------------------

    def fit(self, until: int | None = None) -> TrainSummary:
        """Train to step ``until`` (default and limit: ``max_steps``), then save."""
        c = self.config
        stop = min(until or c.max_steps, c.max_steps)
        start_step, start = self.step, time.perf_counter()
        first = last = None
        window = _Window()
        with self._bar(stop) as bar:
            while self.step < stop:
                t0 = time.perf_counter()
                loss, grad_norm, cells = self.train_step()
                window.add(loss, cells, time.perf_counter() - t0)
                first = loss if first is None else first
                bar.update()
                if self.step % c.log_every == 0 or self.step == stop:
                    last = self._log_window(bar, window, grad_norm)
                    window = _Window()
                if c.val_every and self.step % c.val_every == 0 and self.step != stop:
                    self._log_val(bar)
                if self.step % c.checkpoint_every == 0 and self.step != stop:
                    self.save()
            if self.step > start_step:
                self._log_val(bar)
                self.save()
        return TrainSummary(
            start_step=start_step,
            step=self.step,
            micro_batches=self.micro_batches,
            seconds=time.perf_counter() - start,
            first_loss=first,
            last_loss=last,
            val=dict(self.last_val),
            out=Path(c.out),
            state_file=c.run_path / STATE_FILE,
        )

    def _bar(self, stop: int) -> tqdm:
        return tqdm(
            total=stop, initial=self.step, unit="step", desc="train",
            disable=not self.progress, mininterval=1.0, dynamic_ncols=True,
        )  # fmt: skip

    def _log(self, bar: tqdm, record: dict[str, Any], text: str) -> None:
        self.config.run_path.mkdir(parents=True, exist_ok=True)
        with (self.config.run_path / METRICS_FILE).open("a") as f:
            f.write(json.dumps(record) + "\n")
        bar.write(f"step {self.step}/{self.config.max_steps}: {text}")  # above a bar, if any
        sys.stdout.flush()  # a log file (SLURM's .out) sees each line when it happens

    def _log_window(self, bar: tqdm, window: _Window, grad_norm: float) -> float:
        """Log the mean loss and throughput since the last log line; returns that mean loss."""
        loss, rate = window.mean_loss(), window.cells_per_second()
        lr = self.scheduler.get_last_lr()[0]
        unit = "nats/gene" if self.config.objective == "elbo" else "nats/masked gene"
        bar.set_postfix(loss=f"{loss:.4f}", cells_s=f"{rate:.1f}")
        self._log(
            bar, {"step": self.step, "loss": loss, "lr": lr,
                  "grad_norm": grad_norm, "cells_per_s": rate},
            f"loss {loss:.4f} {unit}, lr {lr:.2e}, grad {grad_norm:.3f}, {rate:.2f} cells/s",
        )  # fmt: skip
        return loss

    def _log_val(self, bar: tqdm) -> None:
        val = self.validate()
        if val:
            text = ", ".join(f"{k} {v:.4f}" for k, v in val.items())
            self._log(bar, {"step": self.step, **val}, text)

    # ---- saving and resuming --------------------------------------------------------------

    def save(self) -> None:
        """Write ``<run_dir>/train_state.pt`` (atomically) and the native model (EMA) in ``out``."""
        write_state(self.config.run_path, self._state())
        self.write_model()

    def _state(self) -> dict[str, Any]:
        """Everything ``resume`` restores, as saved in ``train_state.pt``."""
        return {
            "format": STATE_FORMAT,
            "version": 1,
            "step": self.step,
            "micro_batches": self.micro_batches,
            "model": self.model.state_dict(),
            "ema": self.ema.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": rng_states(self.generator, self.device),
            "config": self.config.model_dump(mode="json"),
            "data_hash": self.data.data_hash,
            "commands": list(self.commands),
            "init_from": self.init_record,
        }

    def write_model(self) -> Path:
        """The EMA weights as a native model directory ``out`` (config.json + safetensors)."""
        out = Path(self.config.out)
        out.mkdir(parents=True, exist_ok=True)
        extra: dict[str, Any] = {"step": self.step, "metrics": dict(self.last_val)}
        if self.init_record is not None:
            extra["init_from"] = dict(self.init_record)
        if len(self.commands) > 1:
            extra["training_commands"] = list(self.commands)
        config = model_config(self.config, self.data, provenance=extra)
        return write_native_model(
            out, self.ema.model, config, self.noise, self.graph,
            run_path=self.config.run_path, command=self.command, data_hash=self.data.data_hash,
        )  # fmt: skip

    def _load_state(self) -> None:
        state = read_state(self.config, self.data.data_hash)
        self.model.load_state_dict(state["model"])
        self.ema.model.load_state_dict(state["ema"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        self.step, self.micro_batches = int(state["step"]), int(state["micro_batches"])
        self.commands = list(state.get("commands", []))
        self.init_record = state.get("init_from")
        restore_rng_states(state["rng"], self.generator, self.device)
