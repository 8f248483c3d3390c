"""Run by tests/test_nodes.py under torchrun, once per "node": trains through graphormer's own
train(), recording which graphs this rank trained on and the weights it ended with."""

import json
import os
import sys
from pathlib import Path

import lightning.pytorch as pl
from hydra import compose, initialize_config_dir

from graphormer.checkpoint import weights_digest
from graphormer.cli import CONFIGS
from graphormer.cli.train import build_loggers, settings_from
from graphormer.training import train


class Recorder(pl.Callback):
    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: dict[int, list[int]] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.seen.setdefault(trainer.current_epoch, []).extend(batch.index.tolist())

    def on_train_end(self, trainer, pl_module) -> None:
        record = {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "node_rank": trainer.node_rank,
            "seen": self.seen,
            "weights": weights_digest(pl_module.state_dict()),
        }
        self.path.with_name(f"{self.path.name}.rank{trainer.global_rank}.json").write_text(
            json.dumps(record)
        )


def main() -> None:
    record, *overrides = sys.argv[1:]
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    train(settings_from(cfg), callbacks=[Recorder(Path(record))], loggers=build_loggers(cfg))
    print(f"rank {os.environ.get('RANK')} done", flush=True)


if __name__ == "__main__":
    main()
