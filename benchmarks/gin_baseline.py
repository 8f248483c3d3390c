"""Graphormer side by side with a simple GIN (Xu et al., 2019, "How Powerful are Graph Neural
Networks?", https://arxiv.org/abs/1810.00826) on the same TU data and the same split.

    python benchmarks/gin_baseline.py [--epochs 30] [--model graphormer_slim] [--only NAME]
        [--overrides KEY=VALUE ...]

The data are TU datasets built offline: ``NCI1-like`` and ``NCI-3class`` from rdkit's NCI
molecules (as the tests build them: node labels = atom types, float node attributes, edge labels =
bond types; binary TPSA above its median, 1,000 molecules, and TPSA tertiles), and
``PROTEINS-like``, 1,113 non-molecular graphs of PROTEINS' shape from the documented generator
:func:`graphormer.testing.protein_like_graphs` (secondary-structure elements: a type label and a
continuous length, contacts of a folded chain, no edge features; the binary label is a density of
packed helix/strand triangles, 10% of labels flipped). Both models read the
same inputs (an embedding per categorical column, a standardised projection of the float
attributes), train with AdamW at lr 1e-3 and are scored on the test split at their best
validation epoch; the script prints test accuracy and the task's metric for each.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from sklearn.metrics import roc_auc_score
from torch import nn
from torch_geometric.loader import DataLoader
from torch_geometric.nn import GINConv, global_add_pool

sys.path.insert(0, str(Path(__file__).parent))
from graphormer.cli import CONFIGS  # noqa: E402
from graphormer.cli.train import settings_from  # noqa: E402
from graphormer.data import build_source  # noqa: E402
from graphormer.testing import nci_tu, protein_like_graphs, write_tu_layout  # noqa: E402
from graphormer.training import GraphormerModule, build_datamodule, train  # noqa: E402
from graphormer.training.evaluation import predict_split  # noqa: E402

from common import single_thread  # noqa: E402


class GIN(nn.Module):
    """GIN with sum aggregation, ``layers`` GINConv blocks (2-layer MLPs), sum pooling."""

    def __init__(self, vocab: list[int], continuous: int, outputs: int, hidden: int = 64,
                 layers: int = 3) -> None:  # fmt: skip
        super().__init__()
        self.embeddings = nn.ModuleList(nn.Embedding(v, hidden) for v in vocab)
        self.project = nn.Linear(continuous, hidden) if continuous else None
        self.convs = nn.ModuleList(
            GINConv(
                nn.Sequential(
                    nn.Linear(hidden, hidden),
                    nn.BatchNorm1d(hidden),
                    nn.ReLU(),
                    nn.Linear(hidden, hidden),
                    nn.ReLU(),
                )
            )  # fmt: skip
            for _ in range(layers)
        )
        self.head = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, outputs))

    def forward(self, data, mean, std):
        h = sum(emb(data.x[:, i]) for i, emb in enumerate(self.embeddings))
        if self.project is not None:
            h = h + self.project((data.x_continuous - mean) / std)
        for conv in self.convs:
            h = conv(h, data.edge_index)
        return self.head(global_add_pool(h, data.batch))


def scores(logits: torch.Tensor, y: torch.Tensor, multiclass: bool) -> dict[str, float]:
    y = y.view(-1)
    if multiclass:
        return {"acc": float((logits.argmax(-1) == y.long()).float().mean())}
    p = logits.view(-1)
    return {"acc": float(((p > 0).float() == y).float().mean()), "rocauc": roc_auc_score(y, p)}


def run_gin(source, epochs: int, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    loaded = source.load()
    dataset, split, task = loaded.dataset, loaded.split, loaded.task
    train_rows = torch.cat([dataset[int(i)].x_continuous for i in split["train"]])
    mean, std = train_rows.mean(0), train_rows.std(0).clamp(min=1e-6)
    vocab, _ = source.feature_dims()
    model = GIN(vocab, train_rows.size(1), task.num_outputs)
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loaders = {
        k: DataLoader([dataset[int(i)] for i in v], batch_size=32, shuffle=k == "train")
        for k, v in split.items()
    }

    def predict(name):
        model.eval()
        with torch.no_grad():
            out = [(model(b, mean, std), b.y) for b in loaders[name]]
        return torch.cat([o for o, _ in out]), torch.cat([y for _, y in out])

    best, result = -1.0, {}
    for _ in range(epochs):
        model.train()
        for batch in loaders["train"]:
            logits = model(batch, mean, std)
            if task.is_multiclass:
                loss = nn.functional.cross_entropy(logits, batch.y.view(-1).long())
            else:
                loss = nn.functional.binary_cross_entropy_with_logits(logits, batch.y.view(-1, 1))
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
        valid = scores(*predict("valid"), task.is_multiclass)[task.metric]
        if valid > best:
            best, result = valid, scores(*predict("test"), task.is_multiclass)
    return result


def run_graphormer(
    root: Path, name: str, epochs: int, model: str, overrides: list[str]
) -> dict[str, float]:
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(
            "train",
            [
                "dataset=tu", f"dataset.name={name}", f"dataset.root={root}", f"model={model}",
                "optim.lr=1e-3", "datamodule.batch_size=32", f"trainer.max_epochs={epochs}",
                "trainer.enable_progress_bar=false", f"output_dir={root / ('run_' + name)}",
                *overrides,
            ],
        )  # fmt: skip
    metrics = train(settings_from(cfg))
    module = GraphormerModule.from_checkpoint(metrics["best_checkpoint"])
    datamodule = build_datamodule(
        module.hparams["data"]["dataset"], module.hparams["data"]["datamodule"]
    )
    datamodule.prepare_data()
    datamodule.setup("validate")
    import lightning.pytorch as pl

    trainer = pl.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)
    logits = predict_split(trainer, module, datamodule, "test")
    y = datamodule.loaded.dataset.y.view(-1)[datamodule.loaded.split["test"]]
    return scores(logits, y, module.task.is_multiclass)


def proteins_like_tu(root: Path, name: str) -> None:
    graphs, labels = protein_like_graphs(1113, seed=0)
    write_tu_layout(root, name, graphs, labels)


DATASETS = {
    "NCI1-like": lambda root, name, limit: nci_tu(root, name, limit=limit, classes=2),
    "NCI-3class": lambda root, name, limit: nci_tu(root, name, limit=limit, classes=3),
    "PROTEINS-like": lambda root, name, limit: proteins_like_tu(root, name),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--model", default="graphormer_slim")
    parser.add_argument("--limit", type=int, default=1000, help="molecules per NCI dataset")
    parser.add_argument("--only", choices=sorted(DATASETS), action="append", help="dataset(s)")
    parser.add_argument(
        "--overrides",
        nargs="*",
        default=[],
        help="train.py settings of graphormer's runs, e.g. model.readout=token",
    )
    args = parser.parse_args()
    single_thread()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        for name in args.only or DATASETS:
            DATASETS[name](root, name, args.limit)
            source = build_source({"source": "tu", "name": name, "root": str(root)})
            task = source.task_info()
            classes = task.num_classes or 2
            sizes = {k: len(v) for k, v in source.load().split.items()}
            start = time.perf_counter()
            gin = run_gin(source, args.epochs)
            gin_s = time.perf_counter() - start
            start = time.perf_counter()
            ours = run_graphormer(root, name, args.epochs, args.model, args.overrides)
            ours_s = time.perf_counter() - start
            print(
                f"\n{name}: {classes} classes, split {sizes} (stratified, seed 0), {args.epochs} epochs"
            )
            for label, result, seconds in (
                ("GIN (3 x 64)", gin, gin_s),
                (args.model, ours, ours_s),
            ):
                text = "  ".join(f"test {k} {v:.3f}" for k, v in result.items())
                print(f"  {label:<18} {text}  ({seconds:.0f} s, shared machine)")


if __name__ == "__main__":
    main()
