import json
import math
import os
from pathlib import Path

import hydra
import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from graphormer import checkpoint as checkpoint_record
from graphormer.batch import GraphormerBatch
from graphormer.cli.train import settings_from
from graphormer.data import GraphormerCollator, StructuralFeatures, build_source
from graphormer.devices import resolve_pad_to_multiple, resolve_precision
from graphormer.models import Graphormer, GraphormerConfig
from graphormer.training import (
    CheckpointError,
    GraphormerModule,
    masked_loss,
    warmup_linear_decay,
)

from helpers import (
    TINY,
    call_script,
    compose_config,
    compose_train,
    csv_cache,
    evaluate_run,
    nci_graphs,
    nci_tpsa_run,
    options,
    run_failing,
    run_script,
    to_data,
    train_config,
)

# -- configs -----------------------------------------------------------------------------------


def test_every_group_option_composes_and_instantiates(tmp_path, nci_csv):
    assert len(options("dataset")) >= 14 and len(options("trainer")) == 3
    from graphormer.testing import nci_tu, shape_graphs

    torch.save(shape_graphs(6), tmp_path / "graphs.pt")
    nci_tu(tmp_path, "NCI_TU", limit=20)
    for name in options("dataset"):
        extra = []
        if name == "smiles_csv":
            extra = [f"dataset.path={nci_csv}", "dataset.targets=[tpsa]"]
        if name == "pyg_file":
            extra = [f"dataset.path={tmp_path / 'graphs.pt'}"]
        if name == "tu":
            extra = ["dataset.name=NCI_TU", f"dataset.root={tmp_path}"]
        cfg = compose_train([f"dataset={name}", f"output_dir={tmp_path}", *extra])
        source = build_source(OmegaConf.to_container(cfg.dataset))
        assert source.task_info().num_tasks >= 1
    # Each preset builds the model it promises (parameter counts on OGB features, one task).
    counts = {
        "graphormer_tiny": 36_869,  # 36,837 and token_sum's 32
        "graphormer_slim": 502_377,  # 502,297 and token_sum's 80
        "graphormer_small": 12_687_937,
        "graphormer_base": 47_550_785,
        "graphormer_base_microsoft": 47_549_185,
        "graphormer_base_microsoft_preln": 47_549_185,  # the same tensors, LayerNorms moved
        "graphormer_large": 120_326_209,
    }
    assert set(options("model")) == set(counts)
    from graphormer.models.graphormer import resolve_depth

    for name in options("model"):
        cfg = compose_train([f"model={name}", f"output_dir={tmp_path}"])
        # On the meta device: the same modules and shapes, without allocating and initialising
        # 120M weights (test_model builds slim, small and base for real).
        values = dict(cfg.model)  # num_layers: auto (slim) is 12 where the data is no series
        values["num_layers"] = resolve_depth(values["num_layers"], analogues=False)
        with torch.device("meta"):
            model = Graphormer(GraphormerConfig.from_dict(values))
        assert sum(p.numel() for p in model.parameters()) == counts[name], name
    for name in options("trainer"):
        cfg = compose_train(
            [f"trainer={name}", "trainer.accelerator=cpu", f"output_dir={tmp_path}"]
        )
        settings = settings_from(cfg).trainer
        precision = resolve_precision(settings.precision, gpu=False)
        trainer = pl.Trainer(**{**settings.lightning_kwargs(), "precision": precision})
        assert isinstance(trainer, pl.Trainer)
        # CPU runs never switch to bf16 behind the user's back (trainer=ddp says auto).
        assert str(trainer.precision) == "32-true", name
    # logger=mlflow writes to MLflow's own store (./mlruns): test_trust.py checks it.
    for name in (n for n in options("logger") if n != "mlflow"):
        cfg = compose_train([f"logger={name}", f"output_dir={tmp_path}"])
        logger = hydra.utils.instantiate(cfg.logger)
        assert str(tmp_path) in logger.save_dir
    for name in options("optim"):
        cfg = compose_train([f"optim={name}", f"output_dir={tmp_path}"])
        assert cfg.optim.lr > 0
    for name in options("experiment"):
        cfg = compose_train([f"experiment={name}", f"output_dir={tmp_path}"])
        build_source(OmegaConf.to_container(cfg.dataset))


def test_unknown_config_key_fails_with_hydras_message():
    with pytest.raises(ConfigCompositionException, match="Could not override 'trainer.max_epoch'"):
        compose_train(["trainer.max_epoch=3"])
    with pytest.raises(ConfigCompositionException, match="Could not find 'model/graphormer_huge'"):
        compose_train(["model=graphormer_huge"])


def test_model_hops_beyond_cached_hops_is_rejected(tmp_path, ogb_root):
    from graphormer.training import build_datamodule, build_module

    cfg = compose_train(
        [
            f"dataset.root={ogb_root}",
            f"output_dir={tmp_path}",
            "model.multi_hop_max_dist=6",
            "datamodule.max_hops=3",
        ]
    )
    dm = build_datamodule(
        OmegaConf.to_container(cfg.dataset), OmegaConf.to_container(cfg.datamodule)
    )
    with pytest.raises(ValueError, match="datamodule.max_hops"):
        build_module(settings_from(cfg), dm)


# -- pieces --------------------------------------------------------------------------------------


def test_masked_loss_ignores_missing_labels():
    pred = torch.tensor([[0.0, 2.0], [1.0, -1.0]], requires_grad=True)
    target = torch.tensor([[1.0, float("nan")], [0.0, float("nan")]])
    loss = masked_loss(pred, target, "bce")
    expected = torch.nn.functional.binary_cross_entropy_with_logits(
        torch.tensor([0.0, 1.0]), torch.tensor([1.0, 0.0])
    )
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert pred.grad[:, 1].abs().sum() == 0
    empty = masked_loss(pred, torch.full_like(target, float("nan")), "l1")
    assert empty.item() == 0.0 and empty.requires_grad
    assert masked_loss(pred, torch.zeros(2, 2), "l1").item() == pytest.approx(1.0)


@pytest.mark.parametrize("loss", ["bce", "l1", "mse"])
def test_masked_loss_equals_the_loss_of_the_labelled_entries(loss):
    # masked_loss weighs entries instead of selecting them (no host synchronisation, #21): the
    # same value and gradient as the loss of the selected entries.
    torch.manual_seed(0)
    pred = torch.randn(16, 3, requires_grad=True)
    target = torch.randint(0, 2, (16, 3)).float()
    target[torch.rand(16, 3) < 0.4] = float("nan")
    labelled = ~torch.isnan(target)
    functions = {"bce": F.binary_cross_entropy_with_logits, "l1": F.l1_loss, "mse": F.mse_loss}
    selected = pred.detach().clone().requires_grad_()
    expected = functions[loss](selected[labelled], target[labelled])
    expected.backward()
    value = masked_loss(pred, target, loss)
    value.backward()
    torch.testing.assert_close(value, expected)
    torch.testing.assert_close(pred.grad, selected.grad)
    # A NaN prediction where the label is missing stays out of the loss and the gradient.
    broken = pred.detach().clone()
    broken[~labelled] = float("nan")
    broken.requires_grad_()
    again = masked_loss(broken, target, loss)
    again.backward()
    torch.testing.assert_close(again, expected)
    assert torch.isfinite(broken.grad).all()


def test_batches_go_to_a_gpu_without_blocking(monkeypatch):
    # Lightning calls our batch's to(device) without non_blocking: a host synchronisation per
    # tensor on a GPU (#21). The module asks for non-blocking copies there, and only there.
    calls = []

    def to(self, device, non_blocking=False):
        calls.append((torch.device(device).type, non_blocking))
        return self

    monkeypatch.setattr(GraphormerBatch, "to", to)
    task = {"name": "toy", "task_type": "regression", "num_tasks": 1, "metric": "mae"}
    module = GraphormerModule(model={"num_layers": 1, "hidden_dim": 16, "num_heads": 2}, task=task)
    graphs = [StructuralFeatures(5)(to_data(g, 1.0)) for g in nci_graphs(4)]
    batch = GraphormerCollator(max_hops=5)(graphs)
    for device in ("cuda", "cpu"):
        assert module.transfer_batch_to_device(batch, torch.device(device), 0) is batch
    assert calls == [("cuda", True), ("cpu", False)]


def test_warmup_then_linear_decay():
    lrs = [warmup_linear_decay(s, 10, 110, 1e-3, 1e-9) for s in range(120)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert lrs[60] == pytest.approx(1e-9 + (1e-3 - 1e-9) * 0.5)
    assert lrs[110] == lrs[119] == 1e-9
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:], strict=False))


# -- end to end ---------------------------------------------------------------------------------


def test_train_writes_checkpoints_logs_and_metrics(trained_run):
    import pandas as pd

    _, out, log = trained_run
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["valid"]) == {"rocauc"} and set(metrics["test"]) == {"rocauc"}
    # The labels (TPSA above its median) are learnable from atoms and bonds: three epochs are
    # far better than chance (0.5), which misaligned labels or a broken encoding would give.
    assert metrics["valid"]["rocauc"] > 0.75 and metrics["test"]["rocauc"] > 0.6
    assert Path(metrics["best_checkpoint"]).is_file()
    assert metrics["last_checkpoint"] == str(out / "checkpoints" / "last.ckpt")
    # The logged validation curve holds every epoch, and the best checkpoint is its best.
    logged = pd.read_csv(out / "logs" / "version_0" / "metrics.csv")
    curve = logged["val/rocauc"].dropna().to_numpy()
    assert len(curve) == 3 and metrics["epochs"] == 3
    assert curve.max() == pytest.approx(metrics["valid"]["rocauc"], abs=1e-6)
    best_epoch = int(Path(metrics["best_checkpoint"]).stem.removeprefix("best-epoch"))
    assert curve[best_epoch] == curve.max()
    assert f"best checkpoint: {metrics['best_checkpoint']}" in log
    assert "metrics.json" in log
    # Quiet: no third-party adverts or known-harmless notices.
    for noise in ("Tip:", "litlogger", "GPU available", "LeafSpec", "logging interval"):
        assert noise not in log, noise


def test_eval_reproduces_the_recorded_metrics(trained_run):
    work, out, _ = trained_run
    metrics = json.loads((out / "metrics.json").read_text())
    result, log = evaluate_run(metrics, work)
    for split in ("valid", "test"):
        assert result[split]["rocauc"] == pytest.approx(metrics[split]["rocauc"], abs=1e-6)
    assert result["valid"]["num_graphs"] == 40
    assert "rocauc" in log and "valid" in log


def test_eval_reads_the_dataset_from_a_new_root(trained_run, ogb_root, tmp_path):
    import shutil

    _, out, _ = trained_run
    metrics = json.loads((out / "metrics.json").read_text())
    moved = tmp_path / "moved"
    shutil.copytree(
        ogb_root / "ogbg_molhiv", moved / "ogbg_molhiv", ignore=shutil.ignore_patterns("processed")
    )
    result, _ = evaluate_run(metrics, tmp_path, f"dataset.root={moved}")
    assert (moved / "ogbg_molhiv" / "processed" / "structural_v2_hops5").is_dir()
    assert result["test"]["rocauc"] == pytest.approx(metrics["test"]["rocauc"], abs=1e-6)


def test_eval_rejects_missing_corrupt_and_foreign_checkpoints(trained_run, tmp_path):
    _, out, _ = trained_run
    with pytest.raises(CheckpointError, match="does not exist"):
        GraphormerModule.from_checkpoint(tmp_path / "nope.ckpt")
    good = (out / "checkpoints" / "last.ckpt").read_bytes()
    corrupt = tmp_path / "corrupt.ckpt"
    corrupt.write_bytes(good[: len(good) // 2])
    with pytest.raises(CheckpointError, match="cannot be read"):
        GraphormerModule.from_checkpoint(corrupt)
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"lr": 1}}, foreign)
    with pytest.raises(CheckpointError, match="not written by graphormer"):
        GraphormerModule.from_checkpoint(foreign)
    checkpoint = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)
    checkpoint["hyper_parameters"]["model"]["hidden_dim"] = 64
    checkpoint_record.seal(checkpoint)  # as a tool would that rewrites the settings
    mismatched = tmp_path / "mismatched.ckpt"
    torch.save(checkpoint, mismatched)
    with pytest.raises(CheckpointError, match="does not match"):
        GraphormerModule.from_checkpoint(mismatched)


def test_smiles_csv_regression_in_process(tmp_path, nci_csv):
    import shutil

    from graphormer.cli.eval import run as run_eval

    csv = tmp_path / "molecules.csv"
    shutil.copy(nci_csv, csv)
    cfg = compose_train(
        [
            "dataset=smiles_csv",
            f"dataset.path={csv}",
            "dataset.targets=[tpsa]",
            # The copy's cache is the original's (keyed by the file's bytes, not its path).
            f"dataset.root={csv_cache(nci_csv)}",
            f"output_dir={tmp_path / 'run'}",
            "trainer.max_epochs=2",
            "logger=tensorboard",
            *TINY,
        ]
    )
    with pytest.warns(UserWarning, match="skipped 3 row"):
        results = train_config(cfg)
    assert results["metric"] == "rmse" and math.isfinite(results["test"]["rmse"])
    module = GraphormerModule.from_checkpoint(results["best_checkpoint"])
    # Plain hyperparameters: Lightning's own loader rebuilds it too, without Hydra.

    plain = GraphormerModule.load_from_checkpoint(results["best_checkpoint"], map_location="cpu")
    assert plain.task == module.task and torch.equal(plain.target_mean, module.target_mean)
    # Targets are standardised for training with the training split's statistics.
    assert 30 < float(module.target_mean) < 120 and float(module.target_std) > 5
    assert any((tmp_path / "run" / "tb").rglob("events.out.tfevents.*"))

    # The CSV moved: eval.py reads it from dataset.path= and reproduces the recorded numbers.
    moved = tmp_path / "elsewhere" / "molecules.csv"
    moved.parent.mkdir()
    csv.rename(moved)
    eval_cfg = compose_config(
        "eval",
        [
            f"ckpt={results['best_checkpoint']}",
            "split=all",
            f"dataset.path={moved}",
            f"output={tmp_path / 'eval.json'}",
            f"output_dir={tmp_path}",
        ],
    )
    with pytest.warns(UserWarning, match="skipped 3 row"):
        scores = run_eval(eval_cfg)
    for split in ("valid", "test"):
        assert scores[split]["rmse"] == pytest.approx(results[split]["rmse"], abs=1e-5)


def test_ddp_on_cpu_evaluates_every_graph_once(tmp_path, ddp_run):
    """trainer=ddp trainer.accelerator=cpu trainer.devices=2 on 12 tasks with missing labels; the
    31 test graphs split 16/15 over the ranks, in 4 and 3 batches: uneven shards, exact metrics
    (conftest's ddp_run; its FLAG perturbs training alone)."""
    out, log = ddp_run
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in log
    metrics = json.loads((out / "metrics.json").read_text())
    # A single-process evaluation of the same checkpoint gives the same numbers: the sharded
    # evaluation saw each valid and test graph exactly once (the module also checks the count).
    result, _ = evaluate_run(metrics, tmp_path, "accelerator=cpu")
    assert result["test"]["num_graphs"] == 31
    for split in ("valid", "test"):
        assert result[split]["rocauc"] == pytest.approx(metrics[split]["rocauc"], abs=2e-3)


@pytest.mark.slow
def test_offline_demo_learns(tmp_path):
    """README's demo, exactly as a newcomer runs it: it must beat predicting the mean."""
    out = tmp_path / "demo"
    run_script("train.py", ["experiment=demo", f"hydra.run.dir={out}"], cwd=tmp_path)
    metrics = json.loads((out / "metrics.json").read_text())
    # TPSA's standard deviation on these molecules is 42: what predicting the mean scores.
    assert metrics["valid"]["rmse"] < 25


# Slow: a duplicate of test_bad_input's test_user_errors_are_one_line_without_a_traceback, which
# runs the same eval.py ckpt=<missing file> in a subprocess by default.
@pytest.mark.slow
def test_scripts_report_user_errors_without_a_traceback(tmp_path):
    result = run_failing(
        "eval.py",
        [f"ckpt={tmp_path / 'missing.ckpt'}", f"hydra.run.dir={tmp_path / 'eval'}"],
        tmp_path,
    )
    assert "error: checkpoint" in result.stderr and "does not exist" in result.stderr


def test_pretrained_weights_initialise_all_but_the_output_layer(trained_run):
    from graphormer.training import GraphormerModule
    from graphormer.training.pretrained import load_pretrained

    _, out, _ = trained_run
    source = GraphormerModule.from_checkpoint(out / "checkpoints" / "last.ckpt")
    model = dict(source.hparams["model"])
    task = {"name": "toy", "task_type": "regression", "num_tasks": 3, "metric": "rmse"}
    module = GraphormerModule(model=model, task=task)
    load_pretrained(module, str(out / "checkpoints" / "last.ckpt"))
    theirs = source.state_dict()
    for name, tensor in module.state_dict().items():
        if name.startswith(("model.head.", "model.readout.")):
            assert tensor.shape[0] == 3  # a new output layer (and readout term) for the new task
        elif name.startswith("model."):
            assert torch.equal(tensor, theirs[name]), name
    assert float(module.target_std[0]) == 1.0  # task statistics are not carried over


def test_prepare_script_caches_the_dataset(tmp_path, ogb_root):
    import shutil

    root = tmp_path / "data"
    shutil.copytree(
        ogb_root / "ogbg_molesol", root / "ogbg_molesol", ignore=shutil.ignore_patterns("processed")
    )
    log = call_script(
        "prepare.py",
        [
            "dataset=ogbg-molesol",
            f"dataset.root={root}",
            "datamodule.max_hops=3",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=tmp_path,
    )
    assert "ogbg-molesol: train 240, valid 30, test 30; task regression, 1 task(s)" in log
    assert (root / "ogbg_molesol" / "processed" / "structural_v2_hops3").is_dir()


def test_checkpoints_store_absolute_dataset_paths(tmp_path, monkeypatch):
    from graphormer.training.run import absolute_paths

    monkeypatch.chdir(tmp_path)
    stored = absolute_paths({"root": "data", "path": "mols.csv", "name": "x"})
    assert stored == {
        "root": str(tmp_path / "data"),
        "path": str(tmp_path / "mols.csv"),
        "name": "x",
    }
    assert absolute_paths({"path": "rdkit:NCI/first_5k.tpsa.csv"})["path"].startswith("rdkit:")


def test_resume_from_a_missing_checkpoint_is_a_clear_error(tmp_path):
    cfg = compose_train([f"output_dir={tmp_path}", f"ckpt_path={tmp_path / 'gone.ckpt'}"])
    with pytest.raises(CheckpointError, match="does not exist"):
        train_config(cfg)


def test_the_default_loss_follows_the_metric():
    from graphormer.data import TaskInfo
    from graphormer.training.module import auto_loss

    assert auto_loss(TaskInfo("a", "binary classification", 2, "rocauc")) == "bce"
    assert auto_loss(TaskInfo("b", "regression", 1, "rmse")) == "mse"
    assert auto_loss(TaskInfo("c", "regression", 1, "mae")) == "l1"


def test_fine_tuning_recipes_need_a_pretrained_checkpoint(tmp_path):
    from graphormer.errors import ConfigError

    for recipe in ("molhiv_finetune", "molpcba_finetune"):
        cfg = compose_train([f"experiment={recipe}", f"output_dir={tmp_path}"])
        assert cfg.flag.m > 0
        assert cfg.optim.total_steps > cfg.optim.warmup_steps > 0
        with pytest.raises(ConfigError, match="pass pretrained=FILE.ckpt"):
            train_config(cfg)
    # molhiv: Microsoft's pre-LN base as the fixed hiv_pre.sh (PR #96); molpcba: v1's large
    # model as pcba.sh.
    hiv = compose_train(["experiment=molhiv_finetune", f"output_dir={tmp_path}"])
    assert hiv.model == compose_train(["model=graphormer_base_microsoft_preln"]).model
    assert (hiv.model.pre_layernorm, hiv.model.embedding_layernorm) == (True, True)
    assert (hiv.model.num_layers, hiv.model.hidden_dim, hiv.model.num_heads) == (12, 768, 32)
    assert (hiv.optim.lr, hiv.optim.end_lr, hiv.optim.weight_decay) == (2e-4, 1e-5, 0.0)
    assert (hiv.optim.total_steps, hiv.optim.warmup_steps) == (1031, 164)
    assert hiv.optim.ema_decay is None  # the paper averages no weights (ours: 0.99)
    assert (hiv.flag.m, hiv.flag.step_size, hiv.flag.mag) == (3, 1e-2, 0.0)
    assert (hiv.datamodule.batch_size, hiv.trainer.devices, hiv.trainer.max_epochs) == (128, 1, 5)
    assert hiv.seed == 1 and hiv.trainer.gradient_clip_val == 5.0
    pcba = compose_train(["experiment=molpcba_finetune", f"output_dir={tmp_path}"])
    m = pcba.model
    assert (m.num_layers, m.hidden_dim, m.ffn_dim, m.num_heads) == (18, 1024, 1024, 32)
    assert (m.pre_layernorm, m.final_layernorm) == (True, True)
    assert (m.dropout, m.attention_dropout, m.activation_dropout, m.input_dropout) == (
        0.1,
        0.3,
        0.0,
        0.0,
    )
    assert (pcba.optim.lr, pcba.optim.total_steps, pcba.optim.warmup_steps) == (3e-4, 13671, 854)
    assert pcba.optim.ema_decay is None
    assert (pcba.flag.m, pcba.flag.step_size, pcba.flag.mag) == (4, 1e-3, 1e-3)
    assert pcba.trainer.precision == "32-true" and pcba.datamodule.batch_size == 64
    model = Graphormer(GraphormerConfig.from_dict({**pcba.model, "num_tasks": 128}))
    assert model.input_dropout.p == 0.0 and model.layers[0].dropout.p == 0.1
    cfg = compose_train(["experiment=pcqm4mv2_base", f"output_dir={tmp_path}"])
    assert (cfg.trainer.max_steps, cfg.optim.total_steps, cfg.optim.warmup_steps) == (
        1_000_000,
        1_000_000,
        60_000,
    )
    assert cfg.dataset.source == "pcqm4mv2" and cfg.loss == "l1"
    assert cfg.optim.ema_decay is None
    assert compose_train([f"output_dir={tmp_path}"]).optim.ema_decay == 0.99  # the plain default


def test_the_zinc_recipe_is_microsofts_v1_slim(tmp_path):
    # The paper's 0.122: v1.0's examples/benchmarking-gnns command and entry.py's defaults.
    cfg = compose_train(["experiment=zinc_slim", f"output_dir={tmp_path}"])
    model = cfg.model
    assert (model.num_layers, model.hidden_dim, model.ffn_dim, model.num_heads) == (12, 80, 80, 8)
    assert (model.pre_layernorm, model.embedding_layernorm, model.final_layernorm) == (
        True,
        False,
        True,
    )
    assert (model.dropout, model.attention_dropout, model.activation_dropout) == (0.1, 0.1, 0.0)
    assert model.input_dropout == 0.1 and model.multi_hop_max_dist == 20
    assert cfg.datamodule.max_hops == 20 and cfg.datamodule.batch_size == 256
    assert (cfg.optim.warmup_steps, cfg.optim.total_steps, cfg.trainer.max_steps) == (
        40_000,
        400_000,
        400_001,
    )
    assert (cfg.optim.lr, cfg.optim.end_lr, cfg.optim.weight_decay) == (2e-4, 1e-9, 0.01)
    assert cfg.optim.ema_decay is None
    assert cfg.trainer.gradient_clip_val is None and cfg.normalize_targets is False
    assert cfg.dataset.source == "zinc" and cfg.dataset.subset is True and cfg.loss == "l1"
    built = GraphormerConfig.from_dict({**model, "atom_feature_dims": [28], "num_tasks": 1})
    assert Graphormer(built).input_dropout.p == 0.1


def test_the_zinc_v2_recipe_is_microsofts_fairseq_slim(tmp_path):
    cfg = compose_train(["experiment=zinc_slim_v2", f"output_dir={tmp_path}"])
    model = cfg.model
    assert (model.num_layers, model.hidden_dim, model.ffn_dim, model.num_heads) == (12, 80, 80, 8)
    assert (model.pre_layernorm, model.embedding_layernorm) == (False, True)
    assert (model.dropout, model.attention_dropout, model.activation_dropout) == (0.0, 0.1, 0.1)
    assert (cfg.optim.warmup_steps, cfg.optim.total_steps, cfg.trainer.max_steps) == (
        60_000,
        400_000,
        400_000,
    )
    assert cfg.optim.ema_decay is None
    assert cfg.dataset.source == "zinc" and cfg.dataset.subset is True


def test_limited_evaluation_batches_warn_rather_than_fail(tmp_path, ogb_root):
    cfg = compose_train(
        [
            "dataset=ogbg-molhiv",
            f"dataset.root={ogb_root}",
            f"output_dir={tmp_path}",
            "trainer.max_epochs=1",
            "+trainer.limit_val_batches=1",
            *TINY,
        ]
    )
    with pytest.warns(UserWarning, match=r"val/rocauc is computed on 32 of the 40 valid graphs"):
        results = train_config(cfg)
    assert results["test"]["rocauc"] > 0  # the test split is still scored whole


def test_padding_follows_the_device_unless_set():
    assert resolve_pad_to_multiple(None, gpu=True) == 8
    assert resolve_pad_to_multiple(None, gpu=False) == 1
    assert resolve_pad_to_multiple(4, gpu=True) == 4
    cfg = compose_train(["output_dir=."])
    assert cfg.datamodule.pad_to_multiple is None


def test_the_fused_adamw_takes_the_same_steps():
    from graphormer.training.module import build_adamw

    torch.manual_seed(0)
    params = [torch.randn(40, 8, requires_grad=True), torch.randn(8, requires_grad=True)]
    copies = [p.detach().clone().requires_grad_(True) for p in params]
    settings = {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
    fused = build_adamw(params, **settings)
    plain = build_adamw(copies, **settings, fused=False)
    assert fused.defaults["fused"] and not plain.defaults["fused"]
    for mixed in ("16-mixed", "bf16-mixed"):
        assert not build_adamw(copies, **settings, precision=mixed).defaults["fused"]
    assert build_adamw(copies, **settings, precision="32-true").defaults["fused"]
    for _ in range(5):
        for group, opt in ((params, fused), (copies, plain)):
            opt.zero_grad()
            (group[0].sin().sum() + group[1].square().sum()).backward()
            opt.step()
    for a, b in zip(params, copies, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_training_on_a_cpu_flushes_subnormals_then_restores_the_default(
    tmp_path, nci_csv, monkeypatch
):
    from graphormer.training.run import subnormals_flushed

    def flushed() -> bool:  # a subnormal float32 reads as zero
        return float(torch.tensor([1e-39]) * 1.0) == 0.0

    seen = []
    step = GraphormerModule.training_step

    def watched(self, *args, **kwargs):
        seen.append(flushed())
        return step(self, *args, **kwargs)

    monkeypatch.setattr(GraphormerModule, "training_step", watched)
    cfg = compose_train(
        [
            *nci_tpsa_run(nci_csv, tmp_path / "run"),
            "trainer.max_epochs=1",
            *TINY,
        ]
    )
    with pytest.warns(UserWarning, match="skipped 3 row"):
        train_config(cfg)
    if not torch.set_flush_denormal(False):  # a CPU without the modes: nothing to flush
        pytest.skip("this CPU cannot flush subnormal floats")
    assert seen and all(seen)
    assert not flushed()  # the default again after training
    with subnormals_flushed(False):  # on a GPU: left as it is
        assert not flushed()


def test_the_train_command_flushes_subnormals_in_every_torch_thread(tmp_path, nci_csv):
    """The command sets the mode before torch starts its threads, which inherit it: a training
    step in a process of two threads reads as zero every subnormal of a product that both
    threads compute (set in training alone, the second thread's half stays subnormal)."""
    import subprocess
    import sys

    from graphormer.devices import flushes_subnormals

    before = flushes_subnormals()
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush subnormal floats")
    torch.set_flush_denormal(before)
    script = tmp_path / "watched_train.py"
    script.write_text(
        "import sys\n"
        "import torch\n"
        "from graphormer.cli.train import main\n"
        "from graphormer.training.module import GraphormerModule\n"
        "step = GraphormerModule.training_step\n"
        "def watched(self, *args, **kwargs):\n"
        "    bits = torch.full((1 << 20,), 4096, dtype=torch.int32)  # 5.7e-42 as float32\n"
        "    product = bits.view(torch.float32) * 1.0\n"
        "    print('zero share', float((product == 0).float().mean()), flush=True)\n"
        "    return step(self, *args, **kwargs)\n"
        "GraphormerModule.training_step = watched\n"
        "sys.argv = ['train.py', *sys.argv[1:]]\n"
        "main()\n"
    )
    arguments = [
        *nci_tpsa_run(nci_csv, tmp_path / "run"),
        f"hydra.run.dir={tmp_path / 'run'}",
        "trainer.max_epochs=1",
        *TINY,
    ]
    result = subprocess.run(
        [sys.executable, str(script), *arguments],
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "2"},
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    shares = [
        float(line.split()[-1]) for line in result.stdout.splitlines() if "zero share" in line
    ]
    assert shares and all(share == 1.0 for share in shares), shares
