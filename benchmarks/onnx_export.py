"""The ONNX export against the torch Predictor: parity on real molecules and throughput, in one run.

    python benchmarks/onnx_export.py                       # slim preset, 2 CPU threads
    python benchmarks/onnx_export.py --ckpt RUN --molecules 2000 --threads 1

Exports the model with ``graphormer-export``'s function, then predicts rdkit's NCI molecules
(the first ``--molecules``; a few no longer parse and keep an error row) with the torch
``Predictor`` and with ``OnnxPredictor`` (ONNX Runtime, numpy featurisation), and prints the
largest absolute difference and each one's molecules per second (featurisation included; the
fastest of ``--repeats``). Without ``--ckpt`` the model is the preset with random weights (speed
and parity do not depend on the weights).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="graphormer_slim", help="preset under configs/model/")
    parser.add_argument("--ckpt", default=None, help="a trained checkpoint or run folder")
    parser.add_argument("--molecules", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)

    import numpy as np
    import torch
    from predict_throughput import preset_checkpoint

    from graphormer.inference import Predictor
    from graphormer.inference.onnx_export import export_onnx
    from graphormer.portable.onnx_predictor import OnnxPredictor
    from graphormer.testing import nci_smiles

    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    work = Path(tempfile.mkdtemp(prefix="onnx_bench_"))
    ckpt = args.ckpt or preset_checkpoint(args.model, work / "model.ckpt")
    smiles = list(nci_smiles()[: args.molecules])
    torch_predictor = Predictor.from_checkpoint(
        ckpt, device="cpu", precision="32-true", batch_size=args.batch_size
    )
    start = time.perf_counter()
    [path, *_] = export_onnx(torch_predictor, work / "model.onnx")
    print(f"exported {path.name} ({path.stat().st_size / 1e6:.1f} MB) in "
          f"{time.perf_counter() - start:.1f} s")  # fmt: skip
    onnx_predictor = OnnxPredictor(path, batch_size=args.batch_size, threads=args.threads)

    expected = torch_predictor.run(smiles).values
    found = onnx_predictor.run(smiles).values
    valid = ~np.isnan(expected).any(1)
    assert (valid == ~np.isnan(found).any(1)).all(), "the two predictors fail different rows"
    difference = float(np.abs(found[valid] - expected[valid]).max())
    print(f"parity: {int(valid.sum())} molecules, largest absolute difference {difference:.2e} "
          f"({'within' if difference <= 1e-4 else 'BEYOND'} 1e-4)")  # fmt: skip

    for name, predictor in (
        ("torch Predictor", torch_predictor),
        ("OnnxPredictor", onnx_predictor),
    ):
        seconds = []
        for _ in range(args.repeats):
            begin = time.perf_counter()
            predictor.run(smiles)
            seconds.append(time.perf_counter() - begin)
        best = min(seconds)
        print(f"{name:16s} {len(smiles) / best:8.0f} molecules/s ({best:.2f} s for "
              f"{len(smiles)}, {args.threads} thread(s), batch {args.batch_size})")  # fmt: skip


if __name__ == "__main__":
    main()
