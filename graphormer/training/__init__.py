from graphormer.checkpoint import CheckpointError
from graphormer.training.evaluate import evaluate
from graphormer.training.module import GraphormerModule, masked_loss
from graphormer.training.schedule import warmup_linear_decay
from graphormer.training.train import build_datamodule, build_module, train

__all__ = [
    "CheckpointError",
    "GraphormerModule",
    "build_datamodule",
    "build_module",
    "evaluate",
    "masked_loss",
    "train",
    "warmup_linear_decay",
]
