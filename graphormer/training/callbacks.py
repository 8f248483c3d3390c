"""Lightning callbacks of a training run: checkpoints that survive kills and resumes, and plain
per-epoch lines when the output is not a terminal."""

from __future__ import annotations

import os
import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from graphormer.console import report

__all__ = ["EpochSummary", "RunCheckpoint"]


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
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # One last.ckpt, always the newest: never last-v1.ckpt beside a stale last.ckpt (a run
        # folder moved or copied, then resumed, would otherwise keep both).
        kwargs.setdefault("enable_version_counter", False)
        super().__init__(*args, **kwargs)

    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        partial = f"{filepath}.partial"
        super()._save_checkpoint(trainer, partial)
        if trainer.is_global_zero:
            os.replace(partial, filepath)
        trainer.strategy.barrier("RunCheckpoint._save_checkpoint")
        self._last_checkpoint_saved = filepath

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._save_last_if_unsaved(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
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
