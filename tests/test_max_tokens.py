"""datamodule.max_tokens: a hard bound on graphs x padded nodes per batch, for training and
evaluation, with a training epoch length that never changes (Lightning reads it once)."""

import logging
from collections import Counter
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch

from graphormer.data import GraphDataModule, OGBSource, SizeGroupedBatchSampler
from graphormer.errors import ConfigError

from helpers import TINY, compose_config, compose_train, train_config

BUDGET = 256  # binds: NCI molecules pad to 24-64 tokens, so 4-10 of them, never batch_size=32


def datamodule(ogb_root, world: int = 1, rank: int = 0, stage: str = "fit", **settings):
    settings = {"batch_size": 32, "max_tokens": BUDGET, "pad_to_multiple": 8, **settings}
    module = GraphDataModule(OGBSource("ogbg-molhiv", str(ogb_root)), **settings)
    if world > 1:  # a simulated rank of a distributed run: all the datamodule reads of it
        module.trainer = SimpleNamespace(
            world_size=world, global_rank=rank, is_global_zero=rank == 0
        )
    module.prepare_data()
    module.setup(stage)
    return module


def tokens(batch) -> int:
    """Measured on the collated tensors: graphs x (padded nodes + the graph token)."""
    graphs, nodes = batch.node_mask.shape  # [B, N]
    assert batch.x.shape[:2] == (graphs, nodes)
    assert batch.spatial_pos.shape == (graphs, nodes, nodes)
    return graphs * (nodes + 1)


def epoch_of(loader, max_tokens: int, batch_size: int) -> list[list[int]]:
    """The dataset indices of each batch of one pass, checking every batch's bounds."""
    batches = []
    for batch in loader:
        assert tokens(batch) <= max_tokens, (tokens(batch), max_tokens)
        assert batch.node_mask.size(0) <= batch_size
        batches.append(batch.index.tolist())
    return batches


@pytest.mark.parametrize("group_by_size", [True, False])
def test_training_batches_fit_the_budget_and_hold_every_graph_once(ogb_root, group_by_size):
    module = datamodule(ogb_root, group_by_size=group_by_size)
    train = sorted(module.train_index.tolist())
    loader = module.train_dataloader()
    epochs = [epoch_of(loader, BUDGET, 32) for _ in range(3)]
    for batches in epochs:
        assert sorted(i for b in batches for i in b) == train  # every graph once, none dropped
        # Exactly the count Lightning reads once for the epoch length and the LR schedule.
        assert len(batches) == len(loader) == len(loader.batch_sampler)
    assert len(loader) <= len(train) / 4  # batches are packed, not one graph each
    # The same number of batches, made of other graphs, every epoch.
    assert len({frozenset(map(tuple, batches)) for batches in epochs}) == 3


def test_two_ranks_together_hold_every_graph_each_epoch(ogb_root):
    single = datamodule(ogb_root).train_dataloader()
    ranks = [datamodule(ogb_root, world=2, rank=r).train_dataloader() for r in range(2)]
    num_batches = len(single)
    assert len(ranks[0]) == len(ranks[1]) == -(-num_batches // 2)
    train = set(single.dataset.indices.tolist())
    for _ in range(3):
        epoch = [epoch_of(loader, BUDGET, 32) for loader in ranks]
        assert len(epoch[0]) == len(epoch[1]) == len(ranks[0])
        seen = Counter(i for batches in epoch for b in batches for i in b)
        assert set(seen) == train
        # Evening out the ranks repeats whole batches, at most one, and nothing else.
        repeated = sorted(i for i, n in seen.items() if n > 1)
        assert all(n <= 2 for n in seen.values())
        if 2 * len(ranks[0]) == num_batches:
            assert not repeated
        else:
            assert repeated in [sorted(b) for batches in epoch for b in batches]


def test_a_resumed_sampler_continues_the_same_epochs(ogb_root):
    first = datamodule(ogb_root)
    loader = first.train_dataloader()
    passes = [list(loader.batch_sampler) for _ in range(3)]
    # What a checkpoint after the first epoch holds, loaded into a fresh datamodule.
    resumed = datamodule(ogb_root)
    resumed.load_state_dict({"next_train_epoch": 1})
    again = resumed.train_dataloader()
    assert [list(again.batch_sampler) for _ in range(2)] == passes[1:]
    # The sampler alone, from real sizes: a pass at epoch e is the e-th pass.
    sizes = first.sizes[first.train_index]
    later = SizeGroupedBatchSampler(
        sizes, 32, seed=0, epoch=2, max_tokens=BUDGET, pad_to_multiple=8
    )
    assert list(later) == passes[2]


def test_evaluation_batches_fit_the_budget_and_cover_each_split_once(ogb_root):
    module = datamodule(ogb_root, eval_batch_size=16)
    for split in ("valid", "test"):
        batches = epoch_of(module.eval_dataloader(split), BUDGET, 16)
        assert sorted(i for b in batches for i in b) == sorted(module.loaded.split[split].tolist())
        assert any(len(b) < 16 for b in batches[:-1])  # the budget, not only the count, cuts
    # Sharded over two simulated ranks: each graph on one rank, within the bounds there too.
    shards = [datamodule(ogb_root, world=2, rank=r, eval_batch_size=16) for r in range(2)]
    seen = [i for m in shards for b in epoch_of(m.val_dataloader(), BUDGET, 16) for i in b]
    assert sorted(seen) == sorted(module.loaded.split["valid"].tolist())


def test_evaluation_keeps_graphs_larger_than_the_budget_alone(ogb_root, caplog):
    # Too small to train with (a 128-node graph takes 129 tokens), fine for evaluation.
    module = datamodule(ogb_root, stage="validate", max_tokens=24, pad_to_multiple=1)
    valid = module.loaded.split["valid"]
    too_big = int((module.sizes[valid] + 1 > 24).sum())
    assert too_big > 0
    with caplog.at_level(logging.WARNING):
        batches = list(module.val_dataloader())
        module.val_dataloader()
    assert sorted(torch.cat([b.index for b in batches]).tolist()) == sorted(valid.tolist())
    alone = [b for b in batches if tokens(b) > 24]
    assert len(alone) == too_big and all(b.node_mask.size(0) == 1 for b in alone)
    assert any(b.node_mask.size(0) > 1 for b in batches)
    told = [r for r in caplog.records if "on their own" in r.getMessage()]
    assert len(told) == 1 and f"{too_big} valid graphs" in told[0].getMessage()
    with pytest.raises(ConfigError, match="raise datamodule.max_tokens to at least 129"):
        module.train_dataloader()


def test_bad_budgets_are_config_errors(ogb_root):
    source = OGBSource("ogbg-molhiv", str(ogb_root))
    for value in (0, -8, 2.5, "4096", True):
        with pytest.raises(ConfigError, match=r"datamodule.max_tokens must be an integer >= 1"):
            GraphDataModule(source, max_tokens=value)
    module = GraphDataModule(source, max_tokens=130, max_nodes=128, pad_to_multiple=8)
    with pytest.raises(ConfigError, match="max_nodes=128.*at least 136, or lower datamodule.max_n"):
        module.setup("fit")
    GraphDataModule(source, max_tokens=136, max_nodes=128, pad_to_multiple=8).setup("fit")


def test_the_data_line_tells_the_epoch_length(ogb_root):
    module = datamodule(ogb_root)
    count = len(module.train_dataloader())
    assert f"; max_tokens {BUDGET}: {count} training batches per epoch" in module.describe()
    ungrouped = datamodule(ogb_root, group_by_size=False)
    sampler = ungrouped.train_dataloader().batch_sampler
    assert f"per epoch of {sampler.batch_size} graphs" in ungrouped.describe()
    assert "max_tokens" not in datamodule(ogb_root, max_tokens=None).describe()


class Crash(Exception):
    """Stands in for a killed process."""


class CrashAfterFirstEpoch(pl.Callback):
    """Stops the run as the second epoch starts, with the first epoch's checkpoint on disk."""

    def on_train_epoch_start(self, trainer, module):
        if trainer.current_epoch == 1:
            raise Crash


def test_training_with_a_budget_runs_and_resumes_exactly(ogb_root, tmp_path, capsys, caplog):
    from graphormer import checkpoint
    from graphormer.cli.eval import run as run_eval

    def config(out, *extra):
        settings = [
            "dataset=ogbg-molhiv",
            f"dataset.root={ogb_root}",
            f"output_dir={out}",
            "trainer.max_epochs=2",
            "model.dropout=0.1",
            f"datamodule.max_tokens={BUDGET}",
            *TINY,
            *extra,
        ]
        return compose_train(settings)

    whole = train_config(config(tmp_path / "whole"))
    # train() resolves pad_to_multiple=null to 1 on the CPU.
    steps = len(datamodule(ogb_root, pad_to_multiple=1).train_dataloader())
    assert f"max_tokens {BUDGET}: {steps} training batches per epoch" in capsys.readouterr().out
    final = torch.load(whole["last_checkpoint"], weights_only=True)
    assert final["global_step"] == 2 * steps  # Lightning ran exactly len() batches an epoch

    with pytest.raises(Crash):
        train_config(config(tmp_path / "killed"), callbacks=[CrashAfterFirstEpoch()])
    last = tmp_path / "killed" / "checkpoints" / "last.ckpt"
    resumed = train_config(config(tmp_path / "resumed", f"ckpt_path={last}"))
    again = checkpoint.load(resumed["last_checkpoint"]).state_dict
    for name, tensor in final["state_dict"].items():
        assert torch.allclose(again[name].float(), tensor.float(), atol=1e-6), name
    assert resumed["valid"] == whole["valid"] and resumed["test"] == whole["test"]

    # eval.py reads the budget from the checkpoint, or takes a smaller one: the same scores.
    # Both runs write <output_dir>/eval_metrics.json: the second replaces the first.
    overrides = [
        f"ckpt={whole['best_checkpoint']}",
        "split=all",
        f"output_dir={tmp_path}",
        "overwrite=true",
    ]
    for budget in ("null", "24"):
        cfg = compose_config("eval", [*overrides, f"max_tokens={budget}"])
        with caplog.at_level(logging.WARNING):
            scores = run_eval(cfg)
        for split in ("valid", "test"):
            assert scores[split]["rocauc"] == pytest.approx(whole[split]["rocauc"], abs=1e-6)
    assert "on their own" in caplog.text  # the smaller budget was used: some graphs went alone
