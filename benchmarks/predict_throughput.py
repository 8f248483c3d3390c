"""Prediction throughput from SMILES to CSV, real drug-like molecules, split by stage.

    python benchmarks/predict_throughput.py                      # slim, 2 CPU threads
    python benchmarks/predict_throughput.py --ckpt outputs/.../best-epoch042.ckpt --threads 4
    python benchmarks/predict_throughput.py --model graphormer_base --device cuda

Reads rdkit's ``NCI/first_5K.smi`` (4,999 molecules; 8 no longer parse and get an error row) as a
CSV, then does what ``scripts/predict.py input=... output=...`` does: featurise (rdkit parsing,
OGB's ``smiles2graph``, structural features, padding), run the model in size-sorted batches,
and write the CSV. Without ``--ckpt`` the model is the preset with random weights (speed does not
depend on the weights), saved as a checkpoint and loaded as a user's would be.
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
    parser.add_argument("--ckpt", default=None, help="a trained checkpoint instead of a preset")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="report the fastest run")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)

    import pandas as pd
    import torch

    from graphormer.cli.predict import read_input
    from graphormer.inference import Predictor, UnpredictableMoleculeWarning
    from graphormer.testing import NCI_SMILES

    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="predict_bench_"))
    lines = [line.split() for line in NCI_SMILES.read_text().splitlines() if line.strip()]
    table = pd.DataFrame({"smiles": [p[0] for p in lines], "nci_id": [p[-1] for p in lines]})
    table.to_csv(work / "molecules.csv", index=False)
    ckpt = Path(args.ckpt) if args.ckpt else preset_checkpoint(args.model, work / "model.ckpt")

    start = time.perf_counter()
    predictor = Predictor.from_checkpoint(ckpt, device=args.device, batch_size=args.batch_size)
    load_s = time.perf_counter() - start
    print(
        f"{ckpt.name}: {sum(p.numel() for p in predictor.module.parameters()) / 1e6:.2f}M "
        f"parameters, precision {predictor.precision}, device {predictor.device}, "
        f"{args.threads} thread(s), batch size {args.batch_size}; checkpoint loaded in "
        f"{load_s:.2f} s"
    )
    runs = []
    for repeat in range(args.repeats):
        predictor.timings.update(featurize_s=0.0, model_s=0.0, molecules=0)
        begin = time.perf_counter()
        inputs, column = read_input(str(work / "molecules.csv"), None, "smiles")
        read_done = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnpredictableMoleculeWarning)  # counted below
            result = predictor.run(inputs[column].tolist())
        run_done = time.perf_counter()
        predictor.table(inputs, result).to_csv(work / "predictions.csv", index=False)
        end = time.perf_counter()
        stats = {
            "molecules": len(inputs),
            "failed": sum(bool(e) for e in result.errors),
            "total_s": end - begin,
            "io_s": (read_done - begin) + (end - run_done),
            "featurize_s": predictor.timings["featurize_s"],
            "model_s": predictor.timings["model_s"],
        }
        runs.append(stats)
        print(f"run {repeat + 1}: " + describe(stats))
    print("best:  " + describe(min(runs, key=lambda s: s["total_s"])))


def describe(stats: dict) -> str:
    n, total = stats["molecules"], stats["total_s"]
    return (
        f"{n / total:,.0f} molecules/s from SMILES to CSV ({n} molecules, {stats['failed']} "
        f"without a prediction, {total:.2f} s): featurisation {stats['featurize_s']:.2f} s "
        f"({n / stats['featurize_s']:,.0f}/s), model {stats['model_s']:.2f} s "
        f"({n / stats['model_s']:,.0f}/s), CSV reading and writing {stats['io_s']:.2f} s, "
        f"other {total - stats['featurize_s'] - stats['model_s'] - stats['io_s']:.2f} s"
    )


def preset_checkpoint(model: str, path: Path) -> Path:
    """A checkpoint of ``model`` (random weights) for ogbg-molhiv, as train.py would save it."""
    from graphormer import checkpoint
    from graphormer.testing import model_preset
    from graphormer.training import GraphormerModule

    module = GraphormerModule(
        model=model_preset(model),
        task={
            "name": "ogbg-molhiv",
            "task_type": "binary classification",
            "num_tasks": 1,
            "metric": "rocauc",
        },
        data={
            "dataset": {"source": "ogb", "name": "ogbg-molhiv", "root": str(path.parent)},
            "datamodule": {"max_hops": 5, "pad_to_multiple": 8},
        },
    )
    return checkpoint.save(path, module.state_dict(), dict(module.hparams), precision="32-true")


if __name__ == "__main__":
    main()
