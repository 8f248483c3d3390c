"""What the molecule head reads (``model.readout``, issue #22): the graph token alone (the paper),
the token with the mean of the atoms' final states, or the token's head plus one learned additive
contribution per atom."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from graphormer import Predictor, checkpoint
from graphormer.data.collate import GraphormerCollator
from graphormer.data.featurize import featurize_smiles
from graphormer.models import Graphormer, GraphormerConfig
from graphormer.training import GraphormerModule
from graphormer.training.pretrained import load_pretrained

from helpers import TINY, compose_train, evaluate_run, nci_table, train_config

SMILES = ["CCO", "c1ccccc1O", "CCCCCCCCCC(=O)O", "[Na+]", "CC(=O)Nc1ccc(OCC)cc1"]


def _model(readout: str, num_tasks: int = 2) -> Graphormer:
    torch.manual_seed(0)
    config = GraphormerConfig(
        num_layers=2, hidden_dim=16, ffn_dim=16, num_heads=2, readout=readout, num_tasks=num_tasks
    )
    model = Graphormer(config).eval()
    with torch.no_grad():  # away from the initialisation's near-zero weights
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def _batch(smiles=SMILES):
    return GraphormerCollator(max_hops=5)(featurize_smiles(smiles).graphs)


def _token_head(model: Graphormer, h: torch.Tensor, extra: torch.Tensor | None = None):
    hidden = model.head_transform(h[:, 0])
    if extra is not None:
        hidden = hidden + extra
    return model.head(model.head_norm(F.gelu(hidden)))


@torch.no_grad()
def test_token_mean_reads_the_mean_of_the_atoms_final_states():
    model, batch = _model("token_mean"), _batch()
    h, _ = model.encode(batch)
    atoms = h[:, 1:]
    counts = torch.tensor([featurize_smiles([s]).graphs[0].num_nodes for s in SMILES])
    mean = torch.stack([atoms[i, : counts[i]].mean(0) for i in range(len(SMILES))])
    expected = _token_head(model, h, model.readout(mean))
    torch.testing.assert_close(model(batch), expected, rtol=1e-5, atol=1e-6)


@torch.no_grad()
def test_token_sum_adds_one_linear_contribution_per_atom():
    model, batch = _model("token_sum"), _batch()
    h, _ = model.encode(batch)
    counts = [featurize_smiles([s]).graphs[0].num_nodes for s in SMILES]
    per_atom = model.readout(h[:, 1:])  # [B, N, T]
    contributions = torch.stack([per_atom[i, : counts[i]].sum(0) for i in range(len(SMILES))])
    torch.testing.assert_close(
        model(batch), _token_head(model, h) + contributions, rtol=1e-5, atol=1e-5
    )
    # Without its contribution the model is the token readout with the same weights.
    token = Graphormer(GraphormerConfig(**{**model.config.to_dict(), "readout": "token"})).eval()
    token.load_state_dict({k: v for k, v in model.state_dict().items() if "readout" not in k})
    model.readout.weight.zero_()
    torch.testing.assert_close(model(batch), token(batch))


@pytest.mark.parametrize("readout", ["token", "token_mean", "token_sum"])
@torch.no_grad()
def test_a_molecule_predicts_the_same_alone_as_in_a_padded_batch(readout):
    model = _model(readout)
    together = model(_batch())
    alone = torch.cat([model(_batch([s])) for s in SMILES])
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("readout", ["token", "token_mean", "token_sum"])
def test_the_parameter_estimate_counts_the_readout(readout):
    model = _model(readout, num_tasks=3)
    actual = sum(p.numel() for p in model.parameters())
    assert model.config.estimated_parameters() == actual
    names = {n for n, _ in model.named_parameters() if n.startswith("readout.")}
    assert names == (set() if readout == "token" else {"readout.weight"})


def test_a_wrong_readout_is_one_error_naming_the_key_and_choices():
    with pytest.raises(ValueError, match=r"model\.readout must be one of token, token_mean"):
        GraphormerConfig(readout="sum")


def test_the_readout_trains_evaluates_predicts_and_fine_tunes_either_way(tmp_path):
    """token_sum trained, evaluated and predicted the same three ways; fine-tuned into the
    token readout and back: the encoder is copied, the readout's map is the new task's own."""
    table = nci_table().iloc[:80]
    csv = tmp_path / "tpsa.csv"
    table.to_csv(csv, index=False)
    common = [
        *TINY,
        "dataset=smiles_csv",
        f"dataset.path={csv}",
        "dataset.targets=[tpsa]",
        f"dataset.root={tmp_path / 'cache'}",
        "trainer.max_epochs=1",
    ]
    summed = train_config(
        compose_train([*common, "model.readout=token_sum", f"output_dir={tmp_path / 'sum'}"])
    )
    record = checkpoint.load(summed["best_checkpoint"])
    assert record.model["readout"] == "token_sum"
    assert record.state_dict["model.readout.weight"].shape == (1, 32)
    result, _ = evaluate_run(summed, tmp_path)
    assert math.isclose(result["test"]["rmse"], summed["test"]["rmse"], rel_tol=1e-5)
    predictor = Predictor.from_checkpoint(summed["best_checkpoint"], device="cpu")
    got = predictor.predict(table.smiles.iloc[:10].tolist())["tpsa"].to_numpy()
    module = GraphormerModule.from_checkpoint(record).eval()
    with torch.no_grad():
        direct = module(_batch(table.smiles.iloc[:10].tolist()))[:, 0].numpy()
    np.testing.assert_allclose(got, direct, rtol=1e-5, atol=1e-4)

    # Into the graph-token readout: the checkpoint's readout map has no place and is not an error.
    token = train_config(
        compose_train(
            [
                *common,
                "model.readout=token",
                f"pretrained={summed['best_checkpoint']}",
                f"output_dir={tmp_path / 'tok'}",
            ]
        )
    )
    assert checkpoint.load(token["best_checkpoint"]).model["readout"] == "token"
    # And back: the new map is initialised, the encoder copied.
    fresh = GraphormerModule(
        model={**record.model, "readout": "token_mean"}, task=dict(record.task)
    )
    report = load_pretrained(fresh, token["best_checkpoint"])
    assert report.fits and "model.readout.weight" in report.output_layer
    assert "model.layers.0.attn.q_proj.weight" in report.copied


def test_explain_draws_each_atoms_contribution_and_they_sum_to_the_prediction(tmp_path):
    """A token_sum model's per-atom terms, in the target's units: the prediction less their sum
    is what the same weights give without the readout's term (the graph token's part)."""
    from graphormer.inference.explain import write_explanation

    table = nci_table().iloc[:60]
    csv = tmp_path / "tpsa.csv"
    table.to_csv(csv, index=False)
    run = train_config(
        compose_train(
            [
                *TINY,
                "dataset=smiles_csv",
                f"dataset.path={csv}",
                "dataset.targets=[tpsa]",
                f"dataset.root={tmp_path / 'cache'}",
                "trainer.max_epochs=1",
                f"output_dir={tmp_path / 'run'}",
            ]
        )
    )
    predictor = Predictor.from_checkpoint(run["best_checkpoint"], device="cpu")
    assert predictor.module.model.config.readout == "token_sum"  # the tiny preset's default
    smiles = "CC(=O)Nc1ccc(OCC)cc1"
    maps = predictor.attention(smiles)
    terms = np.asarray(maps.atom_contributions["tpsa"])
    assert terms.shape == (13,) and np.ptp(terms) > 0
    module = predictor.module
    with torch.no_grad():
        module.model.readout.weight.zero_()
        token_part = module(_batch([smiles]))[0, 0].item()
    assert math.isclose(maps.predictions["tpsa"], token_part + terms.sum(), rel_tol=1e-4)
    written = {p.name for p in write_explanation(maps, tmp_path / "explain")}
    assert "contributions_tpsa.png" in written
    summary = (tmp_path / "explain" / "summary.json").read_text()
    assert '"atom_contributions"' in summary
