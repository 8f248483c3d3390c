"""model.layerdrop: training leaves whole layers out of a batch; evaluation runs them all."""

import pytest
import torch

from graphormer.cli.train import settings_from
from graphormer.data import GraphormerCollator, StructuralFeatures
from graphormer.errors import ConfigError
from graphormer.models import Graphormer, GraphormerConfig
from graphormer.training.settings import RunSettings

from helpers import TINY, compose_train, nci_graphs, nci_tpsa_run, to_data, train_config

SIZE = {"hidden_dim": 32, "ffn_dim": 48, "num_heads": 4, "num_tasks": 2}
# Dropout off, so that training mode differs from evaluation by the skipped layers alone.
NO_DROPOUT = {"dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0}


def molecules(count: int):
    graphs = [to_data(g, 0.0) for g in nci_graphs(count)]
    return GraphormerCollator(max_hops=5, pad_to_multiple=8)(
        [StructuralFeatures(5)(g) for g in graphs]
    )


def network(num_layers: int, layerdrop: float) -> Graphormer:
    config = GraphormerConfig(num_layers=num_layers, layerdrop=layerdrop, **SIZE, **NO_DROPOUT)
    torch.manual_seed(0)
    return Graphormer(config)


def test_a_skipped_layer_is_a_network_without_it(monkeypatch):
    """Training with the middle of three layers drawn out is, to the bit, the same weights
    without that layer; the skipped layer gets no gradient."""
    dropping = network(3, 0.5).train()
    without = network(2, 0.0).train()
    state = {
        k.replace("layers.2.", "layers.1."): v
        for k, v in dropping.state_dict().items()
        if not k.startswith("layers.1.")
    }
    without.load_state_dict(state)
    # The draw: the first and last layers' chances are above the rate, the middle one's below.
    drawn = torch.tensor([[0.9, 0.1, 0.7]])
    monkeypatch.setattr(torch, "rand", lambda shape: drawn.reshape(shape))
    batch = molecules(6)
    out = dropping(batch)
    torch.testing.assert_close(out, without(batch), rtol=0, atol=0)
    out.sum().backward()
    assert all(p.grad is None for p in dropping.layers[1].parameters())
    assert all(p.grad is not None for p in dropping.layers[0].parameters())
    assert all(p.grad is not None for p in dropping.layers[2].parameters())


def test_evaluation_runs_every_layer():
    dropping, plain = network(4, 0.5).eval(), network(4, 0.0).eval()
    batch = molecules(6)
    with torch.no_grad():
        torch.testing.assert_close(dropping(batch), plain(batch), rtol=0, atol=0)


def test_training_leaves_out_about_the_rate_of_layers():
    model = network(6, 0.3).train()
    torch.manual_seed(1)
    drawn = [model._skipped_layers() for _ in range(2000)]
    share = sum(sum(row) for d in drawn for row in d) / (2000 * 6)
    assert abs(share - 0.3) < 0.02
    assert network(6, 0.0).train()._skipped_layers() is None
    assert model.eval()._skipped_layers() is None


@pytest.mark.parametrize("value", [1, 1.5, -0.1, True, "half"])
def test_the_rate_is_checked(value):
    with pytest.raises(
        ValueError, match=r"model.layerdrop=.* is not allowed: the chance in \[0, 1\)"
    ):
        GraphormerConfig(layerdrop=value)


def settings(tmp_path, *overrides: str) -> RunSettings:
    return settings_from(compose_train([f"output_dir={tmp_path}", *overrides]))


def test_distributed_training_needs_the_strategy_that_allows_unused_layers(tmp_path):
    with pytest.raises(ConfigError, match="ddp_find_unused_parameters_true"):
        settings(tmp_path, "model.layerdrop=0.2", "trainer.devices=2")
    with pytest.raises(ConfigError, match="model.layerdrop=0.2"):
        settings(tmp_path, "model.layerdrop=0.2", "trainer=ddp")
    settings(
        tmp_path,
        "model.layerdrop=0.2",
        "trainer.devices=2",
        "trainer.strategy=ddp_find_unused_parameters_true",
    )
    settings(tmp_path, "model.layerdrop=0.2")
    settings(tmp_path, "trainer.devices=2")


def test_a_run_with_layerdrop_trains_and_evaluates(tmp_path, nci_csv):
    cfg = compose_train(
        [
            *nci_tpsa_run(nci_csv, tmp_path / "run"),
            "trainer.max_epochs=2",
            *TINY,
            "model.num_layers=4",
            "model.layerdrop=0.5",
        ]
    )
    with pytest.warns(UserWarning, match="skipped 3 row"):
        metrics = train_config(cfg)
    # TPSA's standard deviation on these molecules is about 40: the model learned something.
    assert metrics["valid"]["rmse"] < 35
