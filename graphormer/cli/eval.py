"""``graphormer-eval`` (``python scripts/eval.py``): score a checkpoint.

graphormer-eval ckpt=PATH|RUN_FOLDER|[A.ckpt,B.ckpt] [split=valid|test|all] [dataset.root=DIR] [output=FILE.json] [overwrite=true]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from graphormer.cli.common import (
    checkpoint_inputs,
    console_command,
    plain,
)
from graphormer.outputs import check_outputs

__all__ = ["main", "run"]


def run(cfg: DictConfig) -> dict[str, Any]:
    from graphormer.training.evaluation import evaluate

    values = plain(cfg)
    dataset = values.get("dataset") or {}
    output = values.get("output") or Path(values["output_dir"]) / "eval_metrics.json"
    check_outputs(
        {"output": output},
        {**checkpoint_inputs(values["ckpt"]), "dataset.path": dataset.get("path")},
        overwrite=bool(values.get("overwrite")),
    )
    return evaluate(
        values["ckpt"],
        split=str(values["split"]),
        output=output,
        dataset_root=dataset.get("root"),
        dataset_path=dataset.get("path"),
        accelerator=values["accelerator"],
        precision=values.get("precision"),
        batch_size=values.get("batch_size"),
        max_tokens=values.get("max_tokens"),
        num_workers=values.get("num_workers"),
        allow_missing=bool((values.get("ensemble") or {}).get("allow_missing")),
    )


main = console_command("eval", run)


if __name__ == "__main__":
    main()
