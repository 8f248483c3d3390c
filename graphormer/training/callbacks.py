"""Lightning callbacks of a training run: checkpoints that survive kills and resumes, an
exponential moving average of the weights, and plain per-epoch lines when the output is not a
terminal."""

from __future__ import annotations

import math
import os
import shutil
import time
from typing import Any
from weakref import proxy

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor

from graphormer import checkpoint as checkpoints
from graphormer.console import report
from graphormer.errors import ConfigError

__all__ = ["EpochSummary", "RunCheckpoint", "WeightAverage"]


def first_validation_step(trainer: pl.Trainer) -> int | None:
    """The optimiser step after which a fresh run first validates, for validation at the end
    of every ``check_val_every_n_epoch``-th epoch or at a fraction of it; None when it is
    counted otherwise (every N batches across epochs)."""
    every, batches = trainer.check_val_every_n_epoch, trainer.num_training_batches
    interval = trainer.val_check_interval
    if every is None or not isinstance(interval, float) or math.isinf(batches):
        return None
    accumulate = trainer.accumulate_grad_batches
    per_epoch = math.ceil(batches / accumulate)
    return (every - 1) * per_epoch + math.ceil(max(int(batches * interval), 1) / accumulate)


class RunCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` with two guarantees a resumed run needs.

    - Every file is written under a temporary name and renamed into place, so a run killed while
      saving leaves the previous ``last.ckpt`` whole rather than truncated.
    - A run resumed into a new folder keeps the best score (and best checkpoint) of the run it
      continues; Lightning forgets them when the folder changes, so "best" would count only the
      later epochs. Files outside this run's folder are never deleted (Lightning's own rule).
    - One ``last.ckpt``, replaced in place, also in a run folder that was moved or copied.
    - ``last.ckpt`` is rewritten at every validation (every epoch), not only when the monitored
      metric improves: Lightning 2.6 saves it only beside a new best checkpoint, so a run
      stopped after epochs without improvement resumed from an older epoch, and the run's final
      weights were not in ``last.ckpt`` at all (found by tests/test_graph_runs.py, issue #17).
    - A new best checkpoint and ``last.ckpt`` beside it hold the same bytes: the second is a
      copy of the first file, not a second dump (dumps took a seventh of a FreeSolv run).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # One last.ckpt, always the newest: never last-v1.ckpt beside a stale last.ckpt (a run
        # folder moved or copied, then resumed, would otherwise keep both).
        kwargs.setdefault("enable_version_counter", False)
        super().__init__(*args, **kwargs)
        # (step, epoch, file, digest of this callback's state) of the last file this hook wrote.
        self._written: tuple[int, int, str, Any] | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        first = first_validation_step(trainer)
        if self.best_model_path or first is None or not 0 <= trainer.max_steps < first:
            return
        # Known once the data is batched, and before the first step: validation selects the
        # best checkpoint, and a run it never reaches would end with nothing to keep.
        raise ConfigError(
            f"trainer.max_steps={trainer.max_steps} ends training before validation first runs "
            f"(after optimiser step {first}: {trainer.num_training_batches} training batches "
            f"an epoch, trainer.check_val_every_n_epoch={trainer.check_val_every_n_epoch}), so "
            f"no checkpoint could be selected; raise trainer.max_steps to at least {first}, or "
            "validate every N batches with trainer.val_check_interval=N and "
            "trainer.check_val_every_n_epoch=null"
        )

    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        partial = f"{filepath}.partial"
        twin = self._twin_of(trainer)
        if twin is None:
            super()._save_checkpoint(trainer, partial)
        else:
            # The same step's state, already written (a new best, then last.ckpt beside it):
            # copying the file gives the same bytes at a tenth of the time of a second dump.
            if trainer.is_global_zero:
                shutil.copyfile(twin, partial)
            self._last_global_step_saved = trainer.global_step
            if trainer.is_global_zero:
                for logger in trainer.loggers:
                    logger.after_save_checkpoint(proxy(self))
        if trainer.is_global_zero:
            os.replace(partial, filepath)
        trainer.strategy.barrier("RunCheckpoint._save_checkpoint")
        self._last_checkpoint_saved = filepath
        self._written = (trainer.global_step, trainer.current_epoch, filepath, self._state_digest())

    def _twin_of(self, trainer: pl.Trainer) -> str | None:
        """The file this hook wrote at this step, when a new dump would repeat its bytes: this
        callback's own state (the only part that changes between two saves of one hook) is
        unchanged. Else None."""
        written = self._written
        if written is None or self.save_weights_only:
            return None
        step, epoch, path, state = written
        if (step, epoch) != (trainer.global_step, trainer.current_epoch):
            return None
        # The same answer on every rank (no file test): a rank that dumped while another copied
        # would wait at the dump's barrier for ever.
        return path if self._state_digest() == state else None

    def _state_digest(self) -> str:
        """This callback's state as a checkpoint holds it, digested (graphormer.checkpoint)."""
        return checkpoints.checkpoint_digest({"callback": self.state_dict()})

    # Two files of one step share their bytes only within one hook's saves (a new best, then
    # last.ckpt): each hook that saves starts with no file to copy.
    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        self._written = None
        super().on_train_batch_end(trainer, *args, **kwargs)

    def on_exception(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        self._written = None
        super().on_exception(trainer, *args, **kwargs)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._written = None
        super().on_train_end(trainer, pl_module)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._written = None
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._save_last_if_unsaved(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._written = None
        super().on_train_epoch_end(trainer, pl_module)
        if self._should_save_on_train_epoch_end(trainer):
            self._save_last_if_unsaved(trainer)

    def _save_last_if_unsaved(self, trainer: pl.Trainer) -> None:
        # Skipped when this step was saved already (a new best, and last.ckpt beside it).
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        if state_dict.get("dirpath", self.dirpath) != self.dirpath:
            here = self._here
            self.best_model_score = state_dict["best_model_score"]
            self.best_model_path = here(state_dict.get("best_model_path", ""))
            self.best_k_models = {
                here(k): v for k, v in state_dict.get("best_k_models", {}).items()
            }
            self.kth_best_model_path = here(state_dict.get("kth_best_model_path", ""))
            self.kth_value = state_dict.get("kth_value", self.kth_value)
            self.last_model_path = here(state_dict.get("last_model_path", ""))

    def _here(self, path: str) -> str:
        """A file of the run's old folder as found in this one (a run folder moved or copied,
        then resumed), so that the best checkpoint is replaced in place; else unchanged (a
        resume into a new folder never deletes the old folder's files)."""
        if not path or self.dirpath is None:
            return path
        moved = os.path.join(self.dirpath, os.path.basename(path))
        return moved if os.path.isfile(moved) else path


class EpochSummary(Callback):
    """One plain line per epoch (for logs and pipes, where a progress bar is noise)."""

    def __init__(self) -> None:
        self._start = time.perf_counter()
        self._loss_sum, self._steps = 0.0, 0

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = time.perf_counter()
        self._loss_sum, self._steps = 0.0, 0

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch, batch_idx
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            self._loss_sum += float(loss.detach())
            self._steps += 1

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        metrics = trainer.callback_metrics
        total = trainer.max_epochs
        epoch = trainer.current_epoch + 1
        parts = [f"epoch {epoch}/{total}" if total and total > 0 else f"epoch {epoch}"]
        if self._steps:  # this rank's mean over the epoch, not the last step's loss
            parts.append(f"train/loss {self._loss_sum / self._steps:.4f}")
        for key in sorted(metrics):
            if key.startswith("val/"):
                parts.append(f"{key} {float(metrics[key]):.4f}")
        parts.append(f"({time.perf_counter() - self._start:.1f} s)")
        report("  ".join(parts))


class WeightAverage(Callback):
    """An exponential moving average (EMA) of the trained weights (``optim.ema_decay``, issue
    #22): after every optimiser update ``avg <- d * avg + (1 - d) * w``, with
    ``d = min(decay, t / (t + 1))`` at the ``t``-th update (from 0): the plain mean of the
    weights of every update so far until that reaches the horizon ``1 / (1 - decay)``, then
    the exponential average, so that the average never holds the initialisation. (A warm-up
    of ``(1 + t) / (10 + t)`` reaches 0.99 only after ~900 updates, more than a small set's
    whole run, and averaged too little to help on issue #22's built sets.) Training updates
    the weights as usual; validation, and so the choice of the best checkpoint, sees the
    average; every checkpoint's ``state_dict`` holds the average (what ``eval.py``,
    ``predict.py`` and ``pretrained=`` read), and the training weights travel in the
    callback's state, so that a resume continues exactly.

    The average is kept in float32 whatever the weights' dtype (``bf16-true`` included), one
    copy of the trainable parameters; buffers (target statistics, lookup offsets) are not
    trained and are not averaged.

    Args:
        decay (float): the average's decay per update, in (0, 1); its horizon is about
            ``1 / (1 - decay)`` updates.
    """

    def __init__(self, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"optim.ema_decay must be in (0, 1), got {decay!r}")
        self.decay = float(decay)
        self.updates = 0
        self._average: dict[str, Tensor] | None = None
        self._held: dict[str, Tensor] | None = None  # training weights while the average is in
        self._restored: dict[str, Any] | None = None
        self._last_step = -1

    @property
    def state_key(self) -> str:
        return "WeightAverage"

    @staticmethod
    def _trained(pl_module: pl.LightningModule) -> dict[str, torch.nn.Parameter]:
        return {
            name: p
            for name, p in pl_module.named_parameters()
            if p.requires_grad and p.is_floating_point()
        }

    def _ensure(self, pl_module: pl.LightningModule) -> None:
        """Starts the average from the current weights, or from a resumed checkpoint's state
        (whose ``state_dict``, now the module's weights, is the average: the training weights
        come back from the state)."""
        if self._average is not None:
            return
        params = self._trained(pl_module)
        if self._restored is not None:
            state, self._restored = self._restored, None
            self._average = {
                name: state["average"][name].to(p.device, torch.float32)
                for name, p in params.items()
            }
            with torch.no_grad():
                for name, p in params.items():
                    p.copy_(state["weights"][name])
            return
        self._average = {
            name: p.detach().to(torch.float32, copy=True) for name, p in params.items()
        }

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._ensure(pl_module)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        # Once per optimiser update (gradient accumulation and skipped updates do not count).
        if trainer.global_step == self._last_step or trainer.global_step == 0:
            return
        self._last_step = trainer.global_step
        self._ensure(pl_module)
        decay = min(self.decay, self.updates / (self.updates + 1.0))
        self.updates += 1
        with torch.no_grad():
            params = self._trained(pl_module)
            # One foreach call rather than a lerp per tensor (~200 of them in a small model).
            if params:
                torch._foreach_lerp_(
                    [self._average[name] for name in params],
                    [p.detach().float() for p in params.values()],
                    1.0 - decay,
                )

    def _swap_in(self, pl_module: pl.LightningModule) -> None:
        self._ensure(pl_module)
        params = self._trained(pl_module)
        self._held = {name: p.detach().clone() for name, p in params.items()}
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(self._average[name])

    def _swap_out(self, pl_module: pl.LightningModule) -> None:
        if self._held is None:
            return
        with torch.no_grad():
            for name, p in self._trained(pl_module).items():
                p.copy_(self._held[name])
        self._held = None

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # During fit only: a validate() or test() after training runs the checkpoint it loaded.
        if trainer.state.fn == TrainerFn.FITTING:
            self._swap_in(pl_module)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._swap_out(pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # The module left in memory after fit is the average, as its checkpoints are.
        if self._average is not None:
            self._swap_in(pl_module)
            self._held = None
            self._average = None

    def state_dict(self) -> dict[str, Any]:
        if self._average is None:
            return {}
        return {
            "decay": self.decay,
            "updates": self.updates,
            "last_step": self._last_step,
            "average": {name: t.detach().cpu().clone() for name, t in self._average.items()},
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        self.updates = int(state_dict["updates"])
        self._last_step = int(state_dict["last_step"])
        # The training weights are put back over the restored average when training starts.
        self._restored = {"average": state_dict["average"], "weights": state_dict["weights"]}

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self._average is None or trainer.state.fn != TrainerFn.FITTING:
            return
        # The training weights (in the module now) go to the state, the average to state_dict.
        average = {name: self._average[name] for name in self._trained(pl_module)}
        checkpoints.store_averaged_weights(checkpoint, self.state_key, average)
