"""The fingerprint kernel: a Tanimoto kernel ridge regression on Morgan counts mixed with the
network's regression predictions."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from graphormer import Predictor, checkpoint
from graphormer.errors import ConfigError
from graphormer.training import GraphormerModule, build_datamodule
from graphormer.training.kernel import RIDGES, FingerprintKernel, tanimoto
from graphormer.training.settings import FingerprintKernelSettings

from helpers import TINY, compose_train, evaluate_run, series_csv, train_config


def _counts(rows: int, bits: int = 32, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 4, (rows, bits), generator=generator).float()
    counts[counts < 2] = 0  # sparse, as fingerprints are
    return counts


def test_tanimoto_is_the_jaccard_similarity_of_counts():
    a = torch.tensor([[1.0, 2.0, 0.0], [0.0, 0.0, 0.0], [3.0, 0.0, 1.0]])
    b = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    got = tanimoto(a, b)
    # <a, b> / (|a|^2 + |b|^2 - <a, b>): 3 / (5 + 2 - 3); empty against empty is 1, else 0.
    expected = torch.tensor([[3 / 4, 0.0], [0.0, 1.0], [3 / (10 + 2 - 3), 0.0]])
    torch.testing.assert_close(got, expected)
    same = tanimoto(a[[0, 2]], a[[0, 2]])
    torch.testing.assert_close(same.diagonal(), torch.ones(2))


def test_the_fit_is_kernel_ridge_regression_with_the_ridge_that_validates_best():
    from sklearn.kernel_ridge import KernelRidge

    counts, valid = _counts(40), _counts(15, seed=1)
    weights = torch.randn(32, generator=torch.Generator().manual_seed(2))
    targets = torch.stack([counts @ weights, -(counts @ weights) + 3], dim=1)
    valid_targets = torch.stack([valid @ weights, -(valid @ weights) + 3], dim=1)
    targets[[3, 7], 1] = float("nan")  # missing labels of the second target
    kernel = FingerprintKernel(40, 32, 2, weight=0.5)
    assert not kernel.fitted
    fits = kernel.fit(counts, targets, valid, valid_targets)
    assert kernel.fitted and [fit["ridge"] in RIDGES for fit in fits] == [True, True]
    gram = tanimoto(counts.double(), counts.double()).numpy()
    across = tanimoto(valid.double(), counts.double()).numpy()
    for task in range(2):
        y = targets[:, task].numpy().astype(float)
        keep = ~np.isnan(y)
        errors = {}
        for ridge in RIDGES:
            reference = KernelRidge(alpha=ridge, kernel="precomputed")
            reference.fit(gram[keep][:, keep], y[keep] - y[keep].mean())
            pred = y[keep].mean() + reference.predict(across[:, keep])
            errors[ridge] = float(np.sqrt(np.mean((pred - valid_targets[:, task].numpy()) ** 2)))
        best = min(errors, key=errors.get)
        assert fits[task]["ridge"] == best
        assert math.isclose(fits[task]["valid_rmse"], errors[best], rel_tol=1e-9)
        # The kernel's predictions are scikit-learn's for that ridge (float32 here).
        reference = KernelRidge(alpha=best, kernel="precomputed")
        reference.fit(gram[keep][:, keep], y[keep] - y[keep].mean())
        expected = y[keep].mean() + reference.predict(across[:, keep])
        np.testing.assert_allclose(kernel.predict(valid)[:, task].numpy(), expected, atol=1e-4)
    assert torch.all(kernel.dual[[3, 7], 1] == 0)  # a missing label weighs nothing
    # The mix: the network's share of its predictions, the kernel's of the rest.
    network = torch.randn(15, 2)
    mixed = kernel(network, valid)
    torch.testing.assert_close(mixed, 0.5 * network + 0.5 * kernel.predict(valid))


def test_without_validation_labels_the_default_ridge_is_used():
    kernel = FingerprintKernel(10, 32, 1, weight=0.25)
    fits = kernel.fit(_counts(10), torch.randn(10, 1), _counts(0), torch.zeros(0, 1))
    assert fits[0]["ridge"] == 0.1 and math.isnan(fits[0]["valid_rmse"])
    with pytest.raises(ValueError, match="no labelled training molecule"):
        FingerprintKernel(4, 32, 1, 0.5).fit(
            _counts(4), torch.full((4, 1), float("nan")), _counts(0), torch.zeros(0, 1)
        )


def test_settings_name_the_key_and_what_is_allowed():
    with pytest.raises(ConfigError, match="fingerprint_kernel.use='yes' is not allowed"):
        FingerprintKernelSettings(use="yes")
    with pytest.raises(ConfigError, match=r"fingerprint_kernel.weight=1.5 is not allowed"):
        FingerprintKernelSettings(weight=1.5)
    assert FingerprintKernelSettings().use == "auto"
    assert compose_train([]).fingerprint_kernel.weight == 0.5


@pytest.fixture(scope="module")
def series_run(tmp_path_factory):
    """A tiny model on an analogue series (a random split of NCI molecules and their
    homologues): auto gives it Morgan counts and the kernel."""
    work = tmp_path_factory.mktemp("kernel")
    path = series_csv(work)
    common = [
        *TINY,
        "dataset=smiles_csv",
        f"dataset.path={path}",
        "dataset.targets=[tpsa]",
        "dataset.split=random",
        f"dataset.root={work / 'cache'}",
        "trainer.max_epochs=2",
    ]
    return work, path, common


def test_an_analogue_series_gets_the_kernel_and_predicts_as_it_evaluates(series_run, capsys):
    work, path, common = series_run
    run = train_config(compose_train([*common, f"output_dir={work / 'auto'}"]))
    told = capsys.readouterr().out
    assert "fingerprint kernel: Tanimoto kernel ridge regression on the Morgan counts" in told
    record = checkpoint.load(run["best_checkpoint"])
    kept = record.run.trained("fingerprint_kernel")
    assert kept["weight"] == 0.5 and kept["columns"] == [0, 2048]
    references = record.state_dict["kernel.references"]
    assert references.shape == (kept["references"], 2048) and references.sum() > 0
    assert min(abs(float(record.state_dict["kernel.ridge"][0]) - r) for r in RIDGES) < 1e-8
    # Prediction from SMILES gives what evaluation scored: the mix, not the network alone.
    module = GraphormerModule.from_checkpoint(record)
    settings = module.hparams["data"]
    datamodule = build_datamodule(settings["dataset"], settings["datamodule"])
    datamodule.setup("test")
    mixed, network, index = [], [], []
    with torch.inference_mode():
        for batch in datamodule.test_dataloader():  # batched by size: not the file's order
            mixed.append(module(batch)[:, 0])
            network.append(module.to_units(module.model(batch))[:, 0])
            index.append(batch.index)
    mixed, network = torch.cat(mixed).numpy(), torch.cat(network).numpy()
    assert np.abs(mixed - network).max() > 1e-3  # the kernel moves the predictions
    rows = datamodule.loaded.dataset.row.view(-1)[torch.cat(index)].tolist()
    table = pd.read_csv(path)
    got = Predictor.from_checkpoint(run["best_checkpoint"], device="cpu").predict(
        table.smiles.iloc[rows].tolist()
    )
    np.testing.assert_allclose(got["tpsa"].to_numpy(), mixed, rtol=1e-5, atol=1e-4)
    truth = table.tpsa.iloc[rows].to_numpy()
    assert math.isclose(
        float(np.sqrt(np.mean((mixed - truth) ** 2))), run["test"]["rmse"], rel_tol=1e-4
    )
    result, _ = evaluate_run(run, work / "auto")
    assert math.isclose(result["test"]["rmse"], run["test"]["rmse"], rel_tol=1e-5)
    # Explained, each atom's term is the network's share of it; the prediction is the mix's.
    predictor = Predictor.from_checkpoint(run["best_checkpoint"], device="cpu")
    explained = predictor.attention_maps(table.smiles.iloc[rows[:1]].tolist())[0]
    kernel, predictor.module.kernel = predictor.module.kernel, None
    alone = predictor.attention_maps(table.smiles.iloc[rows[:1]].tolist())[0]
    np.testing.assert_allclose(
        explained.atom_contributions["tpsa"],
        0.5 * np.asarray(alone.atom_contributions["tpsa"]),
        rtol=1e-5,
        atol=1e-6,
    )
    assert math.isclose(explained.predictions["tpsa"], float(mixed[0]), rel_tol=1e-4)
    assert math.isclose(alone.predictions["tpsa"], float(network[0]), rel_tol=1e-4)
    predictor.module.kernel = kernel
    # Off: the same network, trained alike, predicts alone (a model without the kernel keeps
    # exactly the tensors it had before the kernel existed).
    alone = train_config(
        compose_train([*common, "fingerprint_kernel.use=false", f"output_dir={work / 'off'}"])
    )
    plain = checkpoint.load(alone["best_checkpoint"])
    assert not any(key.startswith("kernel.") for key in plain.state_dict)
    assert plain.run.trained("fingerprint_kernel") is None
    assert alone["test"]["rmse"] != run["test"]["rmse"]


def test_a_kernel_it_cannot_have_is_one_error_line(series_run):
    work, path, common = series_run
    no_counts = [*common, "dataset.molecule_features=null", "fingerprint_kernel.use=true"]
    with pytest.raises(ConfigError, match="fingerprint_kernel.use=true reads Morgan counts"):
        train_config(compose_train([*no_counts, f"output_dir={work / 'x'}"]))
    spread = [*common, "loss=mve", "fingerprint_kernel.use=true"]
    with pytest.raises(ConfigError, match="loss=mve predicts a spread too"):
        train_config(compose_train([*spread, f"output_dir={work / 'y'}"]))
    # auto leaves such runs as they were: a spread head on the series trains without it.
    fine = train_config(compose_train([*common, "loss=mve", f"output_dir={work / 'z'}"]))
    assert checkpoint.load(fine["best_checkpoint"]).run.trained("fingerprint_kernel") is None


def test_an_onnx_export_carries_the_kernel(series_run, tmp_path):
    pytest.importorskip("onnxruntime", reason="the onnx extra (onnxruntime) is absent")
    pytest.importorskip("onnx", reason="the onnx extra (onnx) is absent")
    from graphormer.inference.onnx_export import export_onnx
    from graphormer.portable.onnx_predictor import OnnxPredictor

    work, path, common = series_run
    run = train_config(compose_train([*common, f"output_dir={work / 'onnx'}"]))
    predictor = Predictor.from_checkpoint(run["best_checkpoint"], device="cpu")
    assert predictor.modules[0].kernel is not None
    export_onnx(predictor, tmp_path / "model.onnx")
    smiles = pd.read_csv(path).smiles.head(12).tolist()
    expected = predictor.predict(smiles)["tpsa"].to_numpy()
    got = OnnxPredictor(tmp_path / "model.onnx").predict(smiles)["tpsa"].to_numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-3)
