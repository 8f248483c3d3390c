from graphormer.checkpoint import CheckpointError
from graphormer.training.evaluation import evaluate
from graphormer.training.module import GraphormerModule, masked_loss
from graphormer.training.run import build_datamodule, build_module, train
from graphormer.training.schedule import warmup_linear_decay
from graphormer.training.settings import (
    DataModuleSettings,
    FlagSettings,
    OptimSettings,
    RunSettings,
    TrainerSettings,
)

__all__ = [
    "CheckpointError",
    "DataModuleSettings",
    "FlagSettings",
    "GraphormerModule",
    "OptimSettings",
    "RunSettings",
    "TrainerSettings",
    "build_datamodule",
    "build_module",
    "evaluate",
    "masked_loss",
    "train",
    "warmup_linear_decay",
]
