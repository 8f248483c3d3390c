"""Several conformers per molecule (dataset.num_conformers > 1): evaluation, in training and in
eval.py, scores the mean over a molecule's conformers, as prediction does: the same numbers every
time."""

import numpy as np
import pandas as pd
import pytest
import torch

from graphormer.data.conformers import mean_over_repeats
from graphormer.data.sources import build_source

from helpers import TINY, compose_train, nci_table, tiny_3d, train_config


def test_rows_of_one_key_are_averaged_and_their_keys_sorted():
    keys = torch.tensor([3, 1, 3, 1, 2])
    values = torch.tensor([[1.0], [10.0], [3.0], [20.0], [5.0]])
    labels = torch.tensor([7.0, 8.0, 7.0, 8.0, 9.0])
    found, mean, first = mean_over_repeats(keys, values, labels)
    assert found.tolist() == [1, 2, 3]
    assert mean.view(-1).tolist() == [15.0, 5.0, 2.0]
    assert first.tolist() == [8.0, 9.0, 7.0]
    # a value repeated (a graph evaluated twice) is itself, to the bit; no labels: None
    value = torch.tensor([0.1, 0.1, 1 / 3])
    found, mean, first = mean_over_repeats(torch.tensor([5, 5, 6]), value)
    assert mean.tolist() == [value[0].item(), value[2].item()] and first is None


def test_logits_average_as_probabilities_as_prediction_does():
    """Prediction averages a classifier's probabilities over conformers; evaluation's mean of
    logits would be another number (sigmoid(mean logit) != mean sigmoid)."""
    keys = torch.tensor([0, 0, 1, 1, 2, 2])
    logits = torch.tensor([[2.0], [-1.0], [3.0], [3.0], [40.0], [50.0]])
    found, mean, _ = mean_over_repeats(keys, logits, link="sigmoid")
    probabilities = torch.sigmoid(logits.double()).view(3, 2).mean(1)
    torch.testing.assert_close(torch.sigmoid(mean[0].double()), probabilities[0:1])
    assert mean[1].item() == 3.0  # equal reads (distributed padding) keep their value
    # no probability rounds to 1: the mean's logit stays finite and right
    expected = -np.log((np.exp(-40.0) + np.exp(-50.0)) / 2)
    assert mean[2].item() == pytest.approx(expected, rel=1e-6)
    assert mean_over_repeats(keys, logits)[1][0].item() == 0.5  # regression: the plain mean
    classes = torch.tensor([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    _, mean, _ = mean_over_repeats(torch.tensor([4, 4]), classes, link="softmax")
    torch.testing.assert_close(
        torch.softmax(mean, -1), torch.softmax(classes, -1).mean(0, keepdim=True)
    )


def test_eval_of_a_model_of_several_conformers_is_their_mean_as_predict_gives(tmp_path):
    from graphormer.inference import Predictor
    from graphormer.training.evaluation import evaluate

    table = nci_table().iloc[:40].copy()
    table["split"] = ["train"] * 28 + ["valid"] * 6 + ["test"] * 6
    path = tmp_path / "molecules.csv"
    table.to_csv(path, index=False)
    cfg = compose_train(
        [
            "dataset=smiles_csv",
            f"dataset.path={path}",
            "dataset.targets=[tpsa]",
            "dataset.split=column",
            "dataset.split_column=split",
            "dataset.conformers=rdkit",
            "dataset.num_conformers=3",
            *tiny_3d(tmp_path),
        ]
    )
    result = train_config(cfg)
    # the conformers differ enough to move the prediction: a random one would not reproduce
    source = build_source(
        {
            "source": "smiles_csv",
            "path": str(path),
            "targets": ["tpsa"],
            "conformers": "rdkit",
            "num_conformers": 3,
            "split": "column",
            "split_column": "split",
            "root": str(tmp_path / "data"),
        }
    )
    assert source.load().dataset._data.conformers.shape[1] == 3
    ckpt = result["best_checkpoint"]
    first, again = (
        evaluate(ckpt, split="all", output=tmp_path / f"eval{i}.json") for i in range(2)
    )
    assert first["valid"] == again["valid"] and first["test"] == again["test"]
    # training's validation scored the same mean
    assert first["valid"]["rmse"] == np.float32(result["valid"]["rmse"])
    predictor = Predictor.from_checkpoint(ckpt, device="cpu")
    for split in ("valid", "test"):
        rows = table[table.split == split]
        predicted = predictor.run(rows.smiles.tolist()).values[:, 0]
        rmse = float(np.sqrt(np.mean((predicted - rows.tpsa.to_numpy()) ** 2)))
        assert first[split]["rmse"] == pytest.approx(rmse, rel=1e-4)


def test_an_ogb_molecule_set_gets_conformers_of_its_smiles_in_its_graphs_atom_order(
    tmp_path, monkeypatch
):
    import warnings

    from graphormer.data.conformers import embed_conformers
    from graphormer.data.sources import ogb
    from graphormer.inference import Predictor
    from graphormer.testing import nci_ogb_dataset

    root = tmp_path / "ogb"
    folder = nci_ogb_dataset(root, "ogbg-molesol", limit=40)
    smiles = pd.read_csv(folder / "mapping" / "mol.csv.gz").smiles.tolist()
    real = ogb.embed_many

    def failing(molecules, num_conformers):
        out = real(molecules, num_conformers)
        out[4] = None  # as RDKit answers a molecule it cannot embed
        return out

    monkeypatch.setattr(ogb, "embed_many", failing)
    settings = {"source": "ogb", "name": "ogbg-molesol", "root": str(root)}
    settings.update(conformers="rdkit", num_conformers=2)

    def load():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loaded = build_source(settings).load()
        return loaded, [str(w.message) for w in caught if "conformers" in str(w.message)]

    loaded, messages = load()
    assert len(messages) == 1 and f"row 4 ({smiles[4]!r})" in messages[0]
    assert "left out" in messages[0]
    kept = torch.cat(list(loaded.split.values()))
    assert 4 not in kept.tolist() and len(kept) == len(smiles) - 1
    dataset = loaded.dataset
    for i in (0, 7, 25):
        graph = dataset.get(i)
        expected = embed_conformers(smiles[i], 2)  # [C, N, 3]: heavy atoms, RDKit's order
        np.testing.assert_allclose(graph.pos.numpy(), expected[0], atol=1e-5)
        np.testing.assert_allclose(graph.conformers.numpy(), expected.transpose(1, 0, 2))
        # the positions follow OGB's graph: every bond of it is a real bond length
        begin, end = graph.edge_index
        lengths = (graph.pos[begin] - graph.pos[end]).norm(dim=-1)
        assert ((lengths > 1.0) & (lengths < 2.3)).all()  # C-I is 2.14 A
    assert torch.isnan(dataset.get(4).pos).all()  # never zeros; and never read (left out)
    # the cache beside the processed graphs is read back, without embedding again
    monkeypatch.setattr(ogb, "embed_many", None)
    again, messages = load()
    assert len(messages) == 1
    torch.testing.assert_close(again.dataset._data.pos, dataset._data.pos, equal_nan=True)

    cfg = compose_train(
        [
            "dataset=ogbg-molesol",
            f"dataset.root={root}",
            "dataset.conformers=rdkit",
            "dataset.num_conformers=2",
            f"output_dir={tmp_path / 'run'}",
            "model.channels=3d",
            "model.num_kernels=16",
            "trainer.max_epochs=1",
            *TINY,
        ]
    )
    # from the cache: the molecule RDKit could not embed is named again and left out
    with pytest.warns(UserWarning, match=r"could not be given conformers .* row 4 "):
        result = train_config(cfg)
    assert np.isfinite(result["test"]["rmse"]) and np.isfinite(result["valid"]["rmse"])
    monkeypatch.undo()
    predictor = Predictor.from_checkpoint(result["best_checkpoint"], device="cpu")
    assert predictor.conformers == 2 and np.isfinite(predictor.run(["CCO"]).values).all()
