"""``graphormer-export`` (``python scripts/export.py``): a trained model as ONNX.

graphormer-export ckpt=RUN output=model.onnx [overwrite=true]

Writes the network of every member (an ensemble's other members beside ``output``), checks each
against the torch Predictor through ONNX Runtime on a few molecules, and reports the difference.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from graphormer.cli.common import (
    checkpoint_inputs,
    console_command,
    plain,
)
from graphormer.console import report
from graphormer.errors import ConfigError, DataError
from graphormer.outputs import check_outputs

__all__ = ["CHECK_SMILES", "PARITY_TOLERANCE", "main", "run"]

# Molecules every export is checked on: small to drug-sized, rings, charges, a salt (two parts).
CHECK_SMILES = (
    "CCO",
    "c1ccccc1O",
    "CC(=O)Oc1ccccc1C(=O)O",
    "CN1C=NC2=C1C(=O)N(C(=O)N2C)C",
    "CC(C)Cc1ccc(cc1)C(C)C(=O)O",
    "C[N+](C)(C)C.[Cl-]",
    "O=C(O)CC(O)(CC(=O)O)C(=O)O",
    "CC1=C(C(=O)Nc2ccccc2)C(c2ccccc2[N+](=O)[O-])C(C(=O)OC)=C(C)N1",
)
# The largest difference allowed between ONNX Runtime's and torch's predictions (float32).
PARITY_TOLERANCE = 1e-4


def run(cfg: DictConfig) -> list[Path]:
    """Exports ``ckpt`` to ``output``; returns the files written."""
    from graphormer.inference.onnx_export import (
        export_onnx,
        max_difference,
        member_paths,
        run_metrics,
    )
    from graphormer.inference.predictor import Predictor

    values = plain(cfg)
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as error:
        raise ConfigError(
            f"graphormer-export needs the onnx extra ({error.name} is missing): "
            "pip install 'graphormer[onnx]'"
        ) from error
    output = Path(str(values["output"])).expanduser()
    if output.suffix != ".onnx":
        raise ConfigError(f"output={values['output']} does not end in .onnx: give model.onnx")
    predictor = Predictor.from_checkpoint(values["ckpt"], device="cpu", precision="32-true")
    paths = member_paths(output, len(predictor.modules))
    check_outputs(
        {f"output[{i}]": str(p) for i, p in enumerate(paths)},
        checkpoint_inputs(values["ckpt"]),
        overwrite=bool(values.get("overwrite")),
    )
    written = export_onnx(predictor, output, run_metrics(values["ckpt"]))
    difference = max_difference(predictor, output, list(CHECK_SMILES))
    if not difference <= PARITY_TOLERANCE:
        raise DataError(
            f"ONNX Runtime's predictions differ from torch's by {difference:.3g} (more than "
            f"{PARITY_TOLERANCE:g}) on {len(CHECK_SMILES)} molecules: the export of this model "
            "is not faithful; serve it with graphormer.Predictor and report the model's settings"
        )
    members = f"{len(written)} members, " if len(written) > 1 else ""
    report(
        f"exported {members}{', '.join(predictor.task_names)} ({predictor.task.task_type}); "
        f"largest difference from torch on {len(CHECK_SMILES)} molecules {difference:.2g}"
    )
    for path in written:
        report(f"wrote {path.resolve()}")
    return written


main = console_command("export", run)


if __name__ == "__main__":
    main()
