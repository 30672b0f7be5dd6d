"""Training x0 (clean-token) models of single-cell counts with the masked-diffusion objective.

Objective. Per cell draw t ~ U(t_eps, 1), sigma = sigma(t), and mask each gene independently with
probability 1 - e^{-sigma} (= (1 - eps) t for the log-linear schedule) through the absorbing
graph. The model sees the masked tokens, sigma and the label, and predicts the clean token at
every position; the mask class is excluded from its softmax, as in the sampler.

* ``"elbo"``: the continuous-time ELBO of masked diffusion (Sahoo et al. 2024, Shi et al. 2024),
  -log p(x) <= E_t [ w(t) sum_{masked l} -log p(x0_l | x_t) ], w(t) = sigma'(t) / (e^sigma - 1),
  which is exactly 1/t for the log-linear schedule. Divided by the number of genes, so the loss
  reads in nats per gene.
* ``"masked_ce"``: st3's objective, the unweighted mean cross-entropy over masked positions.

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

import copy
import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from tqdm import tqdm

from sedd.checkpoints import CONFIG_FILE, WEIGHTS_FILE, LoadedModel, build_model, save_native
from sedd.graph import AbsorbingGraph
from sedd.model import SEDDPerturbationTransformer, SEDDTransformer, check_inputs
from sedd.noise import LogLinearNoise, Noise
from sedd.precision import PrecisionPolicy
from sedd.train.config import (
    TrainConfig,
    TrainingData,
    check_resumable,
    load_training_data,
    lr_factor,
    model_config,
    training_precision,
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

STATE_FILE = "train_state.pt"
METRICS_FILE = "metrics.jsonl"
_STATE_FORMAT = "sedd_train_state"


def elbo_weight(noise: Noise, t: torch.Tensor) -> torch.Tensor:
    """w(t) = sigma'(t) / (e^sigma(t) - 1), in fp64 then cast to t's dtype; log-linear: 1/t."""
    t64 = t.double()
    return (noise.rate_noise(t64) / torch.expm1(noise.total_noise(t64))).to(t.dtype)


def noise_batch(
    x0: torch.Tensor,
    noise: Noise,
    graph: AbsorbingGraph,
    generator: torch.Generator,
    t_eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x0 (B, L) -> (x_t (B, L), t (B,), sigma (B,)) with t ~ U(t_eps, 1) per cell."""
    u = torch.rand(x0.shape[0], generator=generator, device=x0.device)
    t = t_eps + (1 - t_eps) * u  # (B,)
    sigma = noise.total_noise(t)
    return graph.sample_transition(x0, sigma[:, None], generator), t, sigma


def forward_logits(
    model: nn.Module,
    x: torch.Tensor,
    sigma: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    checkpoint_blocks: bool = False,
) -> torch.Tensor:
    """``model(x, sigma, labels)`` for st3 models, optionally checkpointing each block.

    The same computation as ``_ST3Base.forward``, written out so that each block can run under
    ``torch.utils.checkpoint`` (recomputed in backward). Checkpointing applies only in training
    mode with grad enabled. Returns logits (B, L, V).
    """
    if not isinstance(model, SEDDTransformer | SEDDPerturbationTransformer):
        raise ValueError(f"training supports st3 models only, got {type(model).__name__}.")
    check_inputs(x, sigma, model.max_seq_len)
    c = model._condition(sigma, labels, None)  # (B, H)
    pos = torch.arange(x.shape[1], device=x.device)
    h = model.token_embed(x) + model.gene_embed(pos)[None]  # (B, L, H)
    recompute = checkpoint_blocks and model.training and torch.is_grad_enabled()
    for block in model.blocks:
        h = checkpoint(block, h, c, use_reentrant=False) if recompute else block(h, c)
    return model.out_proj(model.out_norm(h, c))  # (B, L, V)


@dataclass
class LossTerms:
    """Per-batch pieces of both objectives (fp32)."""

    elbo: torch.Tensor  # (B,) per cell: w(t) * sum_masked -log p / num_genes  (nats/gene)
    nll_sum: torch.Tensor  # () sum of -log p over masked positions
    n_masked: int

    def loss(self, objective: str) -> torch.Tensor:
        match objective:
            case "elbo":
                return self.elbo.mean()
            case "masked_ce":
                return self.nll_sum / max(self.n_masked, 1)
            case _:
                raise ValueError(f"objective must be 'elbo' or 'masked_ce', got {objective!r}.")


def loss_terms(
    logits: torch.Tensor,
    x0: torch.Tensor,
    xt: torch.Tensor,
    t: torch.Tensor,
    noise: Noise,
    mask_index: int,
) -> LossTerms:
    """Both objectives from logits (B, L, V) of the clean tokens x0 (B, L) given x_t (B, L)."""
    logits = logits.float()  # precision: the loss runs in fp32, whatever autocast produced
    masked = xt == mask_index  # (B, L)
    rows = masked.nonzero()[:, 0]  # (M,) cell of each masked position
    log_p = F.log_softmax(logits[masked][:, :mask_index], dim=-1)  # (M, num_bins), no mask class
    nll = -log_p.gather(-1, x0[masked][:, None]).squeeze(-1)  # (M,)
    per_cell = torch.zeros(x0.shape[0], device=nll.device).index_add_(0, rows, nll)  # (B,)
    elbo = elbo_weight(noise, t.float()) * per_cell / x0.shape[1]
    return LossTerms(elbo=elbo, nll_sum=nll.sum(), n_masked=int(rows.numel()))


class EMA:
    """fp32 exponential moving average of a model's weights (a frozen eval-mode copy).

    Update k (1-based) uses decay min(decay, (1 + k) / (10 + k)) when ``warmup`` is on, so
    short runs are not dominated by the random initialisation.
    """

    def __init__(self, model: nn.Module, decay: float, warmup: bool = True) -> None:
        self.decay, self.warmup = decay, warmup
        self.model = copy.deepcopy(model).float().eval().requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module, update: int) -> None:
        decay = min(self.decay, (1 + update) / (10 + update)) if self.warmup else self.decay
        for shadow, param in zip(self.model.parameters(), model.parameters(), strict=True):
            shadow.lerp_(param.detach().float(), 1.0 - decay)
        for shadow, buffer in zip(self.model.buffers(), model.buffers(), strict=True):
            shadow.copy_(buffer)


@torch.no_grad()
def heldout_loss(
    model: nn.Module,
    tokens: torch.Tensor,
    labels: torch.Tensor | None,
    noise: Noise,
    graph: AbsorbingGraph,
    policy: PrecisionPolicy,
    *,
    t_eps: float = 1e-3,
    batch_size: int = 64,
    repeats: int = 1,
    seed: int = 0,
) -> dict[str, float]:
    """ELBO (nats/gene) and masked cross-entropy of ``model`` (eval mode) on ``tokens`` (N, G).

    Draws t and masks from a generator seeded with ``seed``, so repeated calls are comparable.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    elbo_sum, nll_sum, n_masked, n_cells = 0.0, 0.0, 0, 0
    for _ in range(repeats):
        for lo in range(0, tokens.shape[0], batch_size):
            x0 = tokens[lo : lo + batch_size].to(device)
            y = None if labels is None else labels[lo : lo + batch_size].to(device)
            xt, t, sigma = noise_batch(x0, noise, graph, generator, t_eps)
            with policy.autocast():
                logits = forward_logits(model, xt, sigma, y)
            terms = loss_terms(logits.float(), x0, xt, t, noise, graph.dim - 1)
            elbo_sum += float(terms.elbo.sum())
            nll_sum += float(terms.nll_sum)
            n_masked += terms.n_masked
            n_cells += x0.shape[0]
    model.train(was_training)
    return {"elbo": elbo_sum / max(n_cells, 1), "masked_ce": nll_sum / max(n_masked, 1)}


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


class Trainer:
    """One training run: data, model, EMA, optimizer, schedule, scaler and RNG streams.

    ``Trainer(config).fit()`` trains to ``config.max_steps``; ``resume=True`` first restores
    ``<run_dir>/train_state.pt``. ``command`` is recorded as the model's training command.
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
        self.device = torch.device(
            config.device or ("cuda" if torch.cuda.is_available() else "cpu")
        )
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
        if resume:
            self._load_state()
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
        window: list[float] = []
        window_cells, window_seconds = 0, 0.0
        unit = "nats/gene" if c.objective == "elbo" else "nats/masked gene"
        with self._bar(stop) as bar:
            while self.step < stop:
                t0 = time.perf_counter()
                loss, grad_norm, cells = self.train_step()
                window_seconds += time.perf_counter() - t0
                window_cells += cells
                window.append(loss)
                first = loss if first is None else first
                bar.update()
                if self.step % c.log_every == 0 or self.step == stop:
                    last = sum(window) / len(window)
                    rate = window_cells / max(window_seconds, 1e-9)
                    lr = self.scheduler.get_last_lr()[0]
                    bar.set_postfix(loss=f"{last:.4f}", cells_s=f"{rate:.1f}")
                    self._log(
                        bar, {"step": self.step, "loss": last, "lr": lr,
                              "grad_norm": grad_norm, "cells_per_s": rate},
                        f"loss {last:.4f} {unit}, lr {lr:.2e}, grad {grad_norm:.3f}, "
                        f"{rate:.2f} cells/s",
                    )  # fmt: skip
                    window, window_cells, window_seconds = [], 0, 0.0
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
        if self.progress:
            bar.write(f"step {self.step}/{self.config.max_steps}: {text}")

    def _log_val(self, bar: tqdm) -> None:
        val = self.validate()
        if val:
            text = ", ".join(f"{k} {v:.4f}" for k, v in val.items())
            self._log(bar, {"step": self.step, **val}, text)

    # ---- saving and resuming --------------------------------------------------------------

    def save(self) -> None:
        """Write ``<run_dir>/train_state.pt`` (atomically) and the native model (EMA) in ``out``."""
        run = self.config.run_path
        run.mkdir(parents=True, exist_ok=True)
        state = {
            "format": _STATE_FORMAT,
            "version": 1,
            "step": self.step,
            "micro_batches": self.micro_batches,
            "model": self.model.state_dict(),
            "ema": self.ema.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": self._rng_states(),
            "config": self.config.model_dump(mode="json"),
            "data_hash": self.data.data_hash,
            "commands": list(self.commands),
        }
        tmp = run / f".{STATE_FILE}.{os.getpid()}.tmp"
        try:
            torch.save(state, tmp)
            os.replace(tmp, run / STATE_FILE)
        finally:
            tmp.unlink(missing_ok=True)
        self.write_model()

    def write_model(self) -> Path:
        """The EMA weights as a native model directory ``out`` (config.json + safetensors)."""
        out = Path(self.config.out)
        out.mkdir(parents=True, exist_ok=True)
        extra = {"step": self.step, "metrics": dict(self.last_val)}
        if len(self.commands) > 1:
            extra["training_commands"] = list(self.commands)
        config = model_config(self.config, self.data, provenance=extra)
        loaded = LoadedModel(
            model=self.ema.model, config=config, noise=self.noise, graph=self.graph,
            path=self.config.run_path, file_hash="", layout="native",
        )  # fmt: skip
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            save_native(loaded, tmp, training_command=self.command, data_hash=self.data.data_hash)
            for name in (WEIGHTS_FILE, CONFIG_FILE):  # each file appears whole
                os.replace(tmp / name, out / name)
            os.chmod(out / WEIGHTS_FILE, 0o644)  # safetensors writes 0600; the model is public
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return out

    def _rng_states(self) -> dict[str, Any]:
        states: dict[str, Any] = {
            "torch": torch.get_rng_state(),
            "noise": self.generator.get_state(),
        }
        if self.device.type == "cuda":
            states["cuda"] = torch.cuda.get_rng_state_all()
        return states

    def _load_state(self) -> None:
        path = self.config.run_path / STATE_FILE
        if not path.is_file():
            raise FileNotFoundError(
                f"cannot resume: {path} does not exist (set run_dir / --run-dir to the run's "
                "directory, or train without --resume)."
            )
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
            raise ValueError(f"{path} is not a sedd training state.")
        check_resumable(state["config"], self.config, path)
        if state["data_hash"] != self.data.data_hash:
            raise ValueError(
                f"cannot resume {path}: the data file {self.config.data} changed since the run "
                "started (sha256 differs)."
            )
        self.model.load_state_dict(state["model"])
        self.ema.model.load_state_dict(state["ema"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        self.step, self.micro_batches = int(state["step"]), int(state["micro_batches"])
        self.commands = list(state.get("commands", []))
        torch.set_rng_state(state["rng"]["torch"])
        self.generator.set_state(state["rng"]["noise"])
        if self.device.type == "cuda" and "cuda" in state["rng"]:
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
