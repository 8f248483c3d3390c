"""Where a training epoch's time goes on the CPU: a profile table of one real run.

    python benchmarks/epoch_profile.py --csv data/set.csv --split data/set_split.json \
        [--epochs 5] [--chemprop chemprop] [KEY=VALUE ...]

Trains ``train.py``'s defaults in this process (``dataset=smiles_csv`` on ``--csv``'s ``smiles``
and ``y`` with the split file ``--split``, one thread) with a callback that times, per epoch:
waiting for the next training batch (the loader: sampling and collation), the forward pass (split
into the input encoders, the structural attention bias, the transformer layers, and the rest:
heads, loss and the step's bookkeeping), the backward pass, the optimiser (clipping, the update,
the weight average), validation, and the rest of the epoch (checkpoints, logging). The first
epoch is left out of the means (warm-up). With ``--chemprop``, chemprop's defaults on the same
rows: seconds per epoch from two runs of different lengths (their difference over the extra
epochs, so start-up and testing cancel). ``KEY=VALUE`` settings are added to graphormer's run;
``--compile`` compiles each transformer layer (``torch.compile``, dynamic shapes) first. The best
checkpoint's validation and test RMSE are printed too, so that a faster setting is judged at
equal accuracy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402

from common import REPO, run_chemprop  # noqa: E402

PARTS = ("loader", "forward", "backward", "optimiser", "validation", "rest")
FORWARD_PARTS = {"node_encoder": "encoders", "attn_bias": "attention bias", "layers": "layers"}


class EpochProfile(pl.Callback):
    """Wall seconds of each part of each training epoch (see the module's docstring)."""

    def __init__(self, compile_layers: bool = False) -> None:
        self.compile_layers = compile_layers
        self.epochs: list[dict[str, float]] = []
        self.batches: list[int] = []
        self._hooks = []

    def _add(self, part: str, seconds: float) -> None:
        self.epochs[-1][part] += seconds

    def setup(self, trainer, pl_module, stage: str) -> None:
        model = pl_module.model
        if self.compile_layers:
            # In place (nn.Module.compile), so the checkpoint's parameter names stay the same;
            # graphs differ in size from batch to batch, hence dynamic shapes.
            for layer in model.layers:
                layer.compile(dynamic=True)
        for name, label in FORWARD_PARTS.items():
            modules = getattr(model, name)
            for module in modules if isinstance(modules, torch.nn.ModuleList) else [modules]:
                self._hooks.append(module.register_forward_pre_hook(self._start(label)))
                self._hooks.append(module.register_forward_hook(self._stop(label)))

    def _start(self, label):
        def hook(module, args):
            module._profile_start = time.perf_counter()

        return hook

    def _stop(self, label):
        def hook(module, args, output):
            if module.training and self.epochs:
                self._add(label, time.perf_counter() - module._profile_start)

        return hook

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.epochs.append(defaultdict(float))
        self.batches.append(0)
        self._epoch_start = self._last = time.perf_counter()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        now = time.perf_counter()
        self._add("loader", now - self._last)
        self._mark = now
        self.batches[-1] += 1

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        now = time.perf_counter()
        self._add("forward", now - self._mark)
        self._mark = now

    def on_after_backward(self, trainer, pl_module) -> None:
        now = time.perf_counter()
        self._add("backward", now - self._mark)
        self._mark = now

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._last = time.perf_counter()
        self._add("optimiser", self._last - self._mark)

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self._validation_start = time.perf_counter()

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if self.epochs and not trainer.sanity_checking:
            self._add("validation", time.perf_counter() - self._validation_start)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        # Lightning validates before this hook: the epoch's wall time includes validation.
        self.epochs[-1]["epoch"] = time.perf_counter() - self._epoch_start

    def table(self) -> dict[str, float]:
        """Mean seconds per epoch of each part, the first epoch left out when there are more."""
        kept = self.epochs[1:] if len(self.epochs) > 1 else self.epochs
        mean = {k: sum(e[k] for e in kept) / len(kept) for k in kept[0]}
        # The forward parts are inside the forward pass; "forward, other" is what they leave.
        inner = sum(mean.get(label, 0.0) for label in FORWARD_PARTS.values())
        mean["forward, other"] = mean["forward"] - inner
        counted = sum(mean[k] for k in ("loader", "forward", "backward", "optimiser", "validation"))
        mean["rest"] = mean["epoch"] - counted
        mean["batches"] = sum(self.batches[1:] or self.batches) / len(kept)
        return mean


def graphormer_profile(args, work: Path) -> dict[str, float]:
    from hydra import compose, initialize_config_dir

    from graphormer.cli.train import settings_from
    from graphormer.training.run import train

    overrides = [
        f"output_dir={work / 'run'}",
        "dataset=smiles_csv",
        f"dataset.path={args.csv.resolve()}",
        "dataset.targets=[y]",
        "dataset.task_type=regression",
        f"dataset.split_file={args.split.resolve()}",
        f"dataset.root={work / 'cache'}",
        f"trainer.max_epochs={args.epochs}",
        "trainer.enable_progress_bar=false",
        *args.overrides,
    ]
    with initialize_config_dir(config_dir=str(REPO / "graphormer" / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    profile = EpochProfile(args.compile)
    start = time.perf_counter()
    metrics = train(settings_from(cfg), callbacks=[profile])
    result = profile.table()
    result["valid_rmse"], result["test_rmse"] = metrics["valid"]["rmse"], metrics["test"]["rmse"]
    result["run"] = time.perf_counter() - start
    return result


def chemprop_per_epoch(args, work: Path) -> float:
    """chemprop's seconds per epoch: two runs on the same rows, 3 and 3 + ``--epochs`` epochs
    (its warm-up is 2)."""
    split = json.loads(args.split.read_text())
    chemprop_split = work / "chemprop_split.json"
    chemprop_split.write_text(
        json.dumps([{"train": split["train"], "val": split["valid"], "test": split["test"]}])
    )
    walls = []
    for epochs in (3, 3 + args.epochs):
        run = argparse.Namespace(chemprop=args.chemprop, epochs=epochs)
        walls.append(run_chemprop(run, args.csv, chemprop_split, work / f"chemprop{epochs}", 0)[1])
    return (walls[1] - walls[0]) / args.epochs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, required=True, help="smiles and y columns")
    parser.add_argument("--split", type=Path, required=True, help="train/valid/test row indices")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument(
        "--compile", action="store_true", help="torch.compile each transformer layer in place"
    )
    parser.add_argument("--chemprop", default=None, help="the chemprop command, to time it too")
    parser.add_argument("overrides", nargs="*", help="graphormer settings KEY=VALUE")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        mean = graphormer_profile(args, work)
        chemprop = chemprop_per_epoch(args, work) if args.chemprop else None
    epoch = mean["epoch"]
    what = [*args.overrides, *(["--compile"] if args.compile else [])]
    print(f"\n{args.csv.name}: {mean['batches']:.0f} training batches per epoch, {what}")
    print("| part | s / epoch | share |\n|---|---|---|")
    for part in ("loader", "forward", *FORWARD_PARTS.values(), "forward, other", *PARTS[2:]):
        if part in mean:
            indent = "  " if part in FORWARD_PARTS.values() or part == "forward, other" else ""
            print(f"| {indent}{part} | {mean[part]:.2f} | {100 * mean[part] / epoch:.0f}% |")
    print(f"| **epoch** | **{epoch:.2f}** | 100% |")
    print(f"whole run ({args.epochs} epochs, with start-up and testing): {mean['run']:.1f} s")
    print(
        f"best checkpoint: valid RMSE {mean['valid_rmse']:.3f}, test RMSE {mean['test_rmse']:.3f}"
    )
    if chemprop is not None:
        print(f"chemprop: {chemprop:.2f} s / epoch on the same rows")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
