"""How sure the model is (#19): ensembles, MC dropout, conformal intervals, calibrated
probabilities and cross-validation, on rdkit's NCI molecules (TPSA), trained in-process."""

import json
import shutil
import struct
import zipfile

import numpy as np
import pandas as pd
import pytest

from graphormer import checkpoint as checkpoints
from graphormer.checkpoint import CheckpointError
from graphormer.cli.eval import run as eval_run
from graphormer.cli.predict import run as predict_run
from graphormer.cli.train import run as train_run
from graphormer.cli.train import settings_from
from graphormer.errors import ConfigError
from graphormer.inference.predictor import Predictor
from graphormer.training.calibration import (
    Calibration,
    conformal_radius,
    expected_calibration_error,
)
from graphormer.training.crossval import assign_folds
from graphormer.training.evaluation import evaluate
from graphormer.training.members import resolve_members
from graphormer.training.module import GraphormerModule

from helpers import (
    REPO,
    TINY,
    call_script,
    compose_config,
    compose_train,
    csv_cache,
    nci_table,
    read_json,
    run_failing,
    run_script,
    tpsa_run_args,
)

MOLECULES = ["CCO", "c1ccccc1O", "CC(=O)Oc1ccccc1C(=O)O", "NCCc1ccc(O)c(O)c1"]


@pytest.fixture(scope="module")
def tpsa_csv(tmp_path_factory):
    """1,000 NCI molecules with their TPSA and a binary label (TPSA above the median)."""
    table = nci_table().iloc[:1000].copy()
    table["polar"] = (table.tpsa > table.tpsa.median()).astype(float)
    path = tmp_path_factory.mktemp("trust") / "tpsa.csv"
    table.to_csv(path, index=False)
    return path


def _train(csv, out, *overrides):
    cfg = compose_train(
        [
            "dataset=smiles_csv",
            f"dataset.path={csv}",
            f"dataset.root={csv_cache(csv)}",
            "dataset.targets=[tpsa]",
            "dataset.split=random",
            "dataset.split_ratios=[0.6,0.2,0.2]",
            f"output_dir={out}",
            "~logger",
            *TINY,
            "optim.lr=3e-3",
            *overrides,
        ]
    )
    return train_run(cfg)


def nci_tpsa(nci_csv, out, *extra):
    """The overrides of an in-process TINY run on ``nci_csv``'s TPSA into ``out``, no logger."""
    return tpsa_run_args(nci_csv, out, f"output_dir={out}", "~logger", *extra)


@pytest.fixture(scope="module")
def ensemble_run(tpsa_csv, tmp_path_factory):
    """An ensemble of 3 tiny members, 4 epochs each: ``(run folder, metrics.json)``."""
    out = tmp_path_factory.mktemp("ensemble") / "run"
    metrics = _train(tpsa_csv, out, "ensemble.size=3", "trainer.max_epochs=4")
    return out, metrics


def test_ensemble_trains_members_in_one_folder_and_beats_their_mean(ensemble_run):
    out, metrics = ensemble_run
    assert read_json(out / "metrics.json") == json.loads(json.dumps(metrics))
    assert metrics["ensemble_size"] == 3
    assert [m["seed"] for m in metrics["members"]] == [42, 43, 44]
    for i in range(3):
        member = read_json(out / "members" / str(i) / "metrics.json")
        assert member["best_checkpoint"].startswith(str((out / "members" / str(i)).resolve()))
        assert metrics["members"][i]["test"] == member["test"]
    # Members differ (seeds), and the ensemble's test RMSE is below their mean.
    tests = [m["test"]["rmse"] for m in metrics["members"]]
    assert len(set(tests)) == 3
    assert metrics["members_mean"]["test"]["rmse"] == pytest.approx(np.mean(tests))
    assert metrics["test"]["rmse"] < metrics["members_mean"]["test"]["rmse"]
    print(f"ensemble test RMSE {metrics['test']['rmse']:.3f}, members {tests}")


def test_ensemble_intervals_cover_and_spread_follows_error(ensemble_run):
    _, metrics = ensemble_run
    test = metrics["uncertainty"]["test"]
    assert test["interval_scores"] == "normalized"
    coverage = {level: v["tpsa"]["coverage"] for level, v in test["intervals"].items()}
    assert 0.85 <= coverage["0.9"] <= 0.97, coverage
    assert coverage["0.8"] < coverage["0.9"] < coverage["0.95"]
    widths = [test["intervals"][k]["tpsa"]["mean_width"] for k in ("0.8", "0.9", "0.95")]
    assert widths == sorted(widths) and widths[0] > 0
    rho = test["std_error_spearman"]["tpsa"]
    assert rho > 0.1, rho
    print(f"coverage {coverage}, Spearman(std, |error|) {rho:.3f}")


def test_eval_of_the_folder_reproduces_the_ensemble_metrics(ensemble_run, tmp_path):
    out, metrics = ensemble_run
    found = evaluate(out, split="all", output=tmp_path / "eval.json", accelerator="cpu")
    assert found["ensemble_size"] == 3
    assert found["test"]["rmse"] == pytest.approx(metrics["test"]["rmse"], abs=1e-5)
    assert found["valid"]["rmse"] == pytest.approx(metrics["valid"]["rmse"], abs=1e-5)
    cover = found["uncertainty"]["test"]["intervals"]["0.9"]["tpsa"]["coverage"]
    assert cover == metrics["uncertainty"]["test"]["intervals"]["0.9"]["tpsa"]["coverage"]
    # A list of the members' checkpoints is the same ensemble (no calibration.json: no intervals).
    paths = [m["best_checkpoint"] for m in metrics["members"]]
    listed = evaluate(paths, split="test", output=tmp_path / "list.json", accelerator="cpu")
    assert listed["test"]["rmse"] == pytest.approx(metrics["test"]["rmse"], abs=1e-5)
    assert "intervals" not in listed["uncertainty"]["test"]


def test_predict_with_an_ensemble_gives_std_and_intervals(ensemble_run):
    out, metrics = ensemble_run
    predictor = Predictor.from_checkpoint(out, device="cpu")
    result = predictor.run(MOLECULES, interval=0.9)
    table = predictor.table(pd.DataFrame({"smiles": MOLECULES}), result)
    assert list(table.columns) == [
        "smiles",
        "tpsa",
        "tpsa_std",
        "tpsa_lower",
        "tpsa_upper",
        "error",
    ]
    assert (table.tpsa_std > 0).all()
    assert (table.tpsa_lower < table.tpsa).all() and (table.tpsa < table.tpsa_upper).all()
    # Normalised intervals: half-widths proportional to each molecule's spread.
    ratio = (table.tpsa_upper - table.tpsa) / table.tpsa_std
    assert np.allclose(ratio, ratio.iloc[0], rtol=1e-4)
    # The mean of the members' own predictions.
    singles = [
        Predictor.from_checkpoint(m["best_checkpoint"], device="cpu").run(MOLECULES).values
        for m in metrics["members"]
    ]
    assert np.allclose(result.values, np.mean(singles, 0), atol=1e-4)
    assert np.allclose(result.std, np.std(singles, 0), atol=1e-4)
    # One member alone: no spread column; its plain residual intervals come from its own run.
    single = Predictor.from_checkpoint(metrics["members"][0]["best_checkpoint"], device="cpu")
    alone = single.run(MOLECULES, interval=0.9)
    assert alone.std is None
    width = alone.upper - alone.lower
    assert np.allclose(width, width[0], rtol=1e-5)  # residual quantiles: one width
    with pytest.raises(ConfigError, match="needs at least 999 labelled validation molecules"):
        single.run(MOLECULES, interval=0.999)  # 200 validation molecules: 0.995 at most


def test_a_missing_member_is_named_and_refused_unless_allowed(ensemble_run, tmp_path):
    out, _ = ensemble_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("data"))
    shutil.rmtree(copy / "members" / "1" / "checkpoints")
    with pytest.raises(CheckpointError, match=r"member 1 .* has no best checkpoint.*allow_missing"):
        resolve_members(copy)
    found = resolve_members(copy, allow_missing=True)
    assert len(found.paths) == 2 and "member 1" in found.missing[0]
    predictor = Predictor.from_checkpoint(copy, device="cpu", allow_missing=True)
    assert len(predictor.modules) == 2
    assert predictor.calibration is None  # fitted for three members, not these two
    with pytest.raises(ConfigError, match="needs the run's calibration"):
        predictor.run(MOLECULES, interval=0.9)
    # A member's damaged checkpoint is refused by its digest, as any checkpoint.
    best = found.paths[0]
    data = bytearray(best.read_bytes())
    # One byte of the largest tensor's stored bytes (not the zip's alignment padding, which
    # holds nothing to verify): torch stores its records uncompressed.
    with zipfile.ZipFile(best) as archive:
        largest = max(
            (i for i in archive.infolist() if "/data/" in i.filename),
            key=lambda i: i.compress_size,
        )
    name_len, extra_len = struct.unpack(
        "<HH", data[largest.header_offset + 26 : largest.header_offset + 30]
    )
    start = largest.header_offset + 30 + name_len + extra_len
    data[start + largest.compress_size // 2] ^= 0xFF
    best.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=str(best.name)):
        Predictor.from_checkpoint(copy, device="cpu", allow_missing=True)


def test_mc_dropout_gives_a_reproducible_spread(ensemble_run):
    _, metrics = ensemble_run
    path = metrics["members"][0]["best_checkpoint"]
    with pytest.raises(ConfigError, match="mc_dropout=5 needs dropout"):
        Predictor.from_checkpoint(path, device="cpu", mc_dropout=5)
    with pytest.raises(ConfigError, match="is for a single model"):
        Predictor.from_checkpoint(ensemble_run[0], device="cpu", mc_dropout=5)
    record = checkpoints.load(path)
    record.hyper_parameters["model"]["dropout"] = 0.2  # the same weights, with dropout
    module = GraphormerModule.from_checkpoint(record)
    plain = Predictor(module, ["tpsa"], device="cpu").run(MOLECULES).values
    mc = Predictor(module, ["tpsa"], device="cpu", mc_dropout=8)
    first, again = mc.run(MOLECULES), mc.run(MOLECULES)
    assert (first.std > 0).all()
    np.testing.assert_array_equal(first.values, again.values)  # seeded passes
    assert not np.allclose(first.values, plain)  # dropout was on
    assert np.allclose(first.values, plain, rtol=0.5)  # ... and the mean stays close


def test_binary_calibration_is_fitted_on_valid_and_reported_by_eval(tpsa_csv, tmp_path):
    out = tmp_path / "binary"
    metrics = _train(
        tpsa_csv,
        out,
        "dataset.targets=[polar]",
        "dataset.task_type=binary",
        "calibration=isotonic",
        "trainer.max_epochs=2",
    )
    fitted = Calibration.load(out / "calibration.json")
    assert metrics["calibration"]["method"] == "isotonic" == fitted.method
    # Isotonic regression is calibrated on the data it was fitted on.
    assert fitted.ece_after[0] < 1e-6 < fitted.ece_before[0]
    found = evaluate(out, split="test", output=tmp_path / "eval.json", accelerator="cpu")
    ece = found["uncertainty"]["test"]
    assert ece["calibration"] == "isotonic"
    assert set(ece["ece_before"]) == set(ece["ece_after"]) == {"polar"}
    print(
        f"test ECE before {ece['ece_before']['polar']:.4f}, after {ece['ece_after']['polar']:.4f}"
    )
    predictor = Predictor.from_checkpoint(out, device="cpu")
    values = predictor.run(MOLECULES).values
    raw = predictor.module  # the calibrated probabilities are the fitted map of the raw ones
    assert predictor.calibration is not None and raw is predictor.modules[0]
    assert ((values >= 0) & (values <= 1)).all()
    with pytest.raises(ConfigError, match="interval=0.9 is for regression"):
        predictor.run(MOLECULES, interval=0.9)


def test_a_binary_ensemble_is_scored_on_its_members_mean_probability(tmp_path):
    """Accuracy (reported beside ROC-AUC for a user's graphs, issue #17) and ROC-AUC of an
    ensemble are those of its members' mean probability."""
    import torch
    from sklearn.metrics import roc_auc_score

    from graphormer.data import build_source
    from graphormer.testing import shape_graphs

    graphs = shape_graphs(150, seed=2)
    flipped = np.random.default_rng(0).random(len(graphs)) < 0.2  # noisy labels: not all right
    for graph, flip in zip(graphs, flipped, strict=True):  # cycles against the other shapes
        graph.y = ((graph.y == 0) != bool(flip)).float().view(1, 1)
    path = tmp_path / "graphs.pt"
    torch.save(graphs, path)
    cfg = compose_train(
        [
            *TINY,
            "dataset=pyg_file",
            f"dataset.path={path}",
            "dataset.task_type=binary",
            "dataset.categorical_node_columns=[0]",
            f"dataset.root={tmp_path}",
            f"output_dir={tmp_path / 'run'}",
            "ensemble.size=2",
            "trainer.max_epochs=3",
            "~logger",
        ]
    )
    metrics = train_run(cfg)
    found = evaluate(tmp_path / "run", split="test", output=tmp_path / "eval.json")
    # The oracle: each member's probabilities for the test graphs from the Predictor, averaged
    # here and scored by scikit-learn.
    source = build_source({"source": "pyg_file", "path": str(path), "task_type": "binary"})
    test = source.load().split["test"].tolist()
    y = np.array([float(graphs[i].y) for i in test])
    mean = np.mean(
        [
            Predictor.from_checkpoint(m["best_checkpoint"], device="cpu")
            .predict_graphs([graphs[i] for i in test])
            .values[:, 0]
            for m in metrics["members"]
        ],
        0,
    )
    assert found["ensemble_size"] == 2 and found["test"]["num_graphs"] == len(test) > 0
    assert found["test"]["acc"] == pytest.approx(np.mean((mean > 0.5) == y), abs=1e-9)
    assert found["test"]["rocauc"] == pytest.approx(roc_auc_score(y, mean), abs=1e-6)
    # Neither all right nor all wrong, so that a threshold on the wrong side would show.
    assert 0 < np.mean((mean > 0.5) == y) < 1 and 0 < y.mean() < 1


def test_binary_calibration_on_a_regression_task_is_refused_before_training(tpsa_csv, tmp_path):
    out = tmp_path / "regression"
    with pytest.raises(ConfigError, match="calibration=temperature calibrates binary probabil"):
        _train(tpsa_csv, out, "calibration=temperature")
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())


def test_cross_validation_gives_one_result_per_fold(tpsa_csv, tmp_path):
    out = tmp_path / "cv"
    summary = _train(tpsa_csv, out, "cv.folds=3", "trainer.max_epochs=1")
    assert [r["fold"] for r in summary["folds"]] == [0, 1, 2]
    assert summary["kind"].startswith("3-fold cross-validation (scaffold-grouped)")
    assert summary == read_json(out / "cv_metrics.json")
    tests = [r["test"]["rmse"] for r in summary["folds"]]
    assert summary["test"]["mean"] == pytest.approx(np.mean(tests))
    assert summary["test"]["std"] == pytest.approx(np.std(tests, ddof=1))
    # The test folds partition the molecules.
    rows = [set(read_json(out / "folds" / str(k) / "split.json")["test"]) for k in range(3)]
    assert not (rows[0] & rows[1]) and not (rows[1] & rows[2]) and not (rows[0] & rows[2])
    assert len(rows[0] | rows[1] | rows[2]) == 1000
    # Two folds' models are not one ensemble: each was tested on molecules the other trained on.
    folds = [
        str(next((out / "folds" / str(k) / "checkpoints").glob("best-*.ckpt"))) for k in (0, 1)
    ]
    with pytest.raises(CheckpointError, match="share one dataset and split"):
        Predictor.from_checkpoint(folds, device="cpu")


def test_cross_validation_refuses_an_official_split(ogb_root, tmp_path):
    cfg = compose_train(
        [
            "dataset=ogbg-molhiv",
            f"dataset.root={ogb_root}",
            "cv.folds=5",
            f"output_dir={tmp_path}",
            "~logger",
        ]
    )
    with pytest.raises(
        ConfigError, match="cv.folds resamples the split, but ogbg-molhiv has OGB's official split"
    ):
        train_run(cfg)
    with pytest.raises(ConfigError, match="give one"):
        train_run(compose_train(["cv.folds=3", "cv.replicates=2", f"output_dir={tmp_path}"]))


def test_folds_keep_groups_whole_and_balance_positives():
    groups = [f"g{i // 4}" for i in range(40)] + [f"s{i}" for i in range(20)]
    positives = np.array([i % 2 == 0 for i in range(60)])
    fold_of = assign_folds(groups, 4, positives)
    for key in set(groups):
        assert len({fold_of[i] for i, g in enumerate(groups) if g == key}) == 1
    sizes = np.bincount(fold_of, minlength=4)
    assert sizes.max() - sizes.min() <= 4
    pos = np.bincount(fold_of, weights=positives, minlength=4)
    assert pos.max() - pos.min() <= 4


def test_conformal_radius_and_ece_known_answers():
    scores = np.arange(1, 20, dtype=float)  # 19 scores: level 0.9 takes the 18th smallest
    assert conformal_radius(scores, 0.9) == 18.0
    assert conformal_radius(scores, 0.5) == 10.0
    with pytest.raises(ConfigError, match="needs at least 19 labelled validation molecules"):
        conformal_radius(scores[:10], 0.95)
    probs = np.array([0.05, 0.05, 0.95, 0.95, 0.55])
    labels = np.array([0.0, 0.0, 1.0, 1.0, np.nan])
    assert expected_calibration_error(probs, labels) == pytest.approx(0.05)
    assert expected_calibration_error(np.array([0.8, 0.8]), np.array([1.0, 0.0])) == pytest.approx(
        0.3
    )


def test_scripts_train_an_ensemble_then_eval_and_predict_use_every_member(nci_csv, tmp_path):
    """As a user runs it: train.py ensemble.size=2, then eval.py and predict.py on the folder
    (their applications called in-process, with the configs they compose; train.py in a process
    of its own runs in conftest's trained_run)."""
    out = tmp_path / "run"
    ensemble = ["dataset.split=random", "ensemble.size=2"]
    with pytest.raises(ConfigError, match="ensemble.parallel=true trains each member on a GPU"):
        train_run(compose_train(nci_tpsa(nci_csv, out, *ensemble, "ensemble.parallel=true")))
    log = call_script(
        "train.py", tpsa_run_args(nci_csv, out, *ensemble, "trainer.max_epochs=2"), cwd=tmp_path
    )
    assert f"evaluate with: python {REPO / 'scripts' / 'eval.py'} ckpt={out.resolve()}" in log
    for i, seed in enumerate((42, 43)):  # each member resumable as a run of its own
        config = (out / "members" / str(i) / ".hydra" / "config.yaml").read_text()
        assert f"seed: {seed}" in config and "size: 1" in config
        assert (out / "members" / str(i) / "logs").is_dir()  # its own CSV logs
    preds = tmp_path / "preds.csv"
    predict_run(
        compose_config(
            "predict",
            [f"ckpt={out}", "smiles=[CCO,c1ccccc1O]", "interval=0.8", f"output={preds}"],
        )
    )
    table = pd.read_csv(preds)
    assert list(table.columns) == [
        "smiles",
        "tpsa",
        "tpsa_std",
        "tpsa_lower",
        "tpsa_upper",
        "error",
    ]
    assert (table.tpsa_lower < table.tpsa).all() and (table.tpsa < table.tpsa_upper).all()
    metrics = read_json(out / "metrics.json")
    members = ",".join(m["best_checkpoint"] for m in metrics["members"])
    result = tmp_path / "eval.json"
    eval_run(
        compose_config("eval", [f"ckpt=[{members}]", f"output={result}", f"output_dir={tmp_path}"])
    )
    found = read_json(result)
    assert found["ensemble_size"] == 2
    assert found["test"]["rmse"] == pytest.approx(metrics["test"]["rmse"], abs=1e-5)
    assert "std_error_spearman" in found["uncertainty"]["test"]


def test_mlflow_logger_records_the_config_and_the_metrics(nci_csv, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    store = tmp_path / "mlruns"
    overrides = [
        "dataset=smiles_csv",
        f"dataset.path={nci_csv}",
        f"dataset.root={tmp_path / 'data'}",
        "dataset.targets=[tpsa]",
        "dataset.split=random",
        f"output_dir={tmp_path / 'run'}",
        "logger=mlflow",
        f"logger.tracking_uri=file:{store}",
        "trainer.max_epochs=2",
        *TINY,
    ]
    metrics = train_run(compose_train(overrides))
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"file:{store}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "smiles_csv"]
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.data.params["config/trainer/max_epochs"] == "2"
    assert run.data.params["config/dataset/targets"] == "['tpsa']"
    assert run.data.metrics["test/rmse"] == pytest.approx(metrics["test"]["rmse"], rel=1e-5)
    history = client.get_metric_history(run.info.run_id, "val/rmse")
    assert len(history) == 2  # one per epoch
    # Without the package: one error naming the extra that installs it.
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"pip install 'graphormer\[mlflow\]'"):
        train_run(
            compose_train([*overrides[:-6], f"output_dir={tmp_path / 'again'}", "logger=mlflow"])
        )


@pytest.mark.slow
def test_optuna_search_completes_and_its_best_settings_reproduce_its_value(nci_csv, tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    import yaml

    common = [
        "dataset=smiles_csv",
        f"dataset.path={nci_csv}",
        f"dataset.root={tmp_path / 'data'}",
        "dataset.targets=[tpsa]",
        "dataset.split=random",
        "trainer.max_epochs=2",
        "trainer.enable_progress_bar=false",
        "~logger",
    ]
    sweep = tmp_path / "sweep"
    log = run_script(
        "train.py",
        [
            "-m",
            "hparams_search=optuna",
            *common,
            f"hydra.sweep.dir={sweep}",
            "hydra.sweeper.n_trials=3",
            "hydra.sweeper.sampler.n_startup_trials=2",
        ],
        cwd=tmp_path,
    )
    assert "Best parameters" in log and "Directions: ['minimize']" in log  # rmse
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    trials = [read_json(p) for p in sorted(sweep.glob("*/metrics.json"))]
    assert len(trials) == 3  # each trial an ordinary run folder
    assert best["best_value"] == min(t["valid"]["rmse"] for t in trials)
    again = [f"{k}={v}" for k, v in best["best_params"].items()]
    metrics = train_run(compose_train([*common, *again, f"output_dir={tmp_path / 'best'}"]))
    assert metrics["valid"]["rmse"] == pytest.approx(best["best_value"], abs=1e-6)


def test_optuna_search_direction_follows_the_metric(tmp_path):
    # The config selects Hydra's Optuna sweeper, a plugin of the optional `optuna` extra.
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    from hydra import compose, initialize_config_dir

    from graphormer.cli import CONFIGS

    # The objective is the monitored metric: monitor= decides where given (an atom-level MAE
    # monitored on a ROC-AUC dataset is minimised).
    for dataset, monitor, direction in (
        ("ogbg-molhiv", None, "maximize"),
        ("nci_tpsa", None, "minimize"),
        ("ogbg-molhiv", "val/atom_mae", "minimize"),
        ("nci_tpsa", "val/rocauc", "maximize"),
    ):
        overrides = ["hparams_search=optuna", f"dataset={dataset}", f"output_dir={tmp_path}"]
        overrides += [f"monitor={monitor}"] if monitor else []
        with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
            cfg = compose("train", overrides=overrides, return_hydra_config=True)
        assert cfg.hydra.sweeper.direction == direction
        assert "optim.lr" in cfg.hydra.sweeper.params


def test_a_failed_member_is_reported_and_refused_unless_allowed(nci_csv, tmp_path):
    # optim.lr=1e3 diverges: each member stops with its NaN loss.
    overrides = nci_tpsa(nci_csv, tmp_path / "run", "ensemble.size=2", "optim.lr=1e3")
    with pytest.raises(ConfigError, match=r"every ensemble member failed \(member 0: .*NaN"):
        train_run(compose_train(overrides))
    state = read_json(tmp_path / "run" / "ensemble.json")
    assert set(state["failed"]) == {"0", "1"} and state["seeds"] == [42, 43]


def test_one_failed_member_is_refused_unless_allow_missing(nci_csv, tmp_path, monkeypatch):
    from graphormer.training import ensemble
    from graphormer.training.module import NonFiniteError

    real = ensemble.train

    def second_member_fails(settings, loggers=None, **kwargs):
        if settings.seed == 43:
            raise NonFiniteError("train/loss is NaN at step 3")
        return real(settings, loggers=loggers, **kwargs)

    monkeypatch.setattr(ensemble, "train", second_member_fails)
    overrides = ["dataset.split=random", "ensemble.size=2", "trainer.max_epochs=1"]
    with pytest.raises(ConfigError, match=r"member\(s\) 1 \(train/loss is NaN at step 3\) failed"):
        train_run(compose_train(nci_tpsa(nci_csv, tmp_path / "strict", *overrides)))
    assert read_json(tmp_path / "strict" / "ensemble.json")["failed"] == {
        "1": "train/loss is NaN at step 3"
    }
    out = tmp_path / "allowed"
    metrics = train_run(
        compose_train(nci_tpsa(nci_csv, out, *overrides, "ensemble.allow_missing=true"))
    )
    assert metrics["members"][1]["failed"] == "train/loss is NaN at step 3"
    assert metrics["test"]["rmse"] == pytest.approx(metrics["members"][0]["test"]["rmse"], abs=1e-5)
    with pytest.raises(CheckpointError, match="member 1 .* has no best checkpoint"):
        resolve_members(out)


def test_an_interrupted_ensemble_resumes_member_by_member(nci_csv, tmp_path):
    from graphormer.training.ensemble import train_ensemble

    out = tmp_path / "run"
    overrides = nci_tpsa(nci_csv, out, "dataset.split=random", "ensemble.size=2")
    first = train_run(compose_train([*overrides, "trainer.max_epochs=1"]))
    kept = (out / "members" / "0" / "checkpoints" / "last.ckpt").stat().st_mtime_ns
    # Member 1 as a kill during its training leaves it: checkpoints, no final metrics.
    (out / "members" / "1" / "metrics.json").unlink()
    (out / "members" / "1" / "calibration.json").unlink()
    settings = settings_from(compose_train([*overrides, "trainer.max_epochs=2"]))
    again = train_ensemble(settings, resume=True)
    assert (out / "members" / "0" / "checkpoints" / "last.ckpt").stat().st_mtime_ns == kept
    assert again["members"][0]["test"] == first["members"][0]["test"]
    resumed = read_json(out / "members" / "1" / "metrics.json")
    assert resumed["epochs"] == 2  # it continued from its epoch-1 checkpoint
    assert again["members"][1]["test"] == resumed["test"]
    assert Calibration.load(out / "calibration.json").fits(
        [checkpoints.load(m["best_checkpoint"]).meta["weights_sha256"] for m in again["members"]]
    )


@pytest.mark.slow
def test_train_script_resumes_an_ensemble_folder(nci_csv, tmp_path):
    out = tmp_path / "run"
    dataset = [
        "dataset=smiles_csv",
        f"dataset.path={nci_csv}",
        f"dataset.root={tmp_path / 'data'}",
        "dataset.targets=[tpsa]",
        "dataset.split=random",
    ]
    args = [*dataset, "ensemble.size=2", "trainer.max_epochs=1", f"hydra.run.dir={out}", *TINY]
    run_script("train.py", args, cwd=tmp_path)
    (out / "members" / "1" / "metrics.json").unlink()
    refused = run_failing("train.py", [f"ckpt_path={out}", "model.hidden_dim=64"], tmp_path)
    assert "model.hidden_dim would change the ensemble this resumes" in refused.stderr
    log = run_script("train.py", [f"ckpt_path={out}", "trainer.max_epochs=2"], cwd=tmp_path)
    assert "ensemble member 0 finished before: kept" in log
    assert "ensemble member 1: resuming" in log
    assert read_json(out / "members" / "1" / "metrics.json")["epochs"] == 2
    assert read_json(out / "metrics.json")["ensemble_size"] == 2


def test_replicates_train_on_seeded_random_splits(nci_csv, tmp_path):
    out = tmp_path / "cv"
    overrides = nci_tpsa(nci_csv, out, "cv.replicates=2", "trainer.max_epochs=1")
    summary = train_run(compose_train(overrides))
    assert summary["kind"] == "2 seeded random splits" and len(summary["folds"]) == 2
    seeds = [read_json(out / "folds" / str(k) / "metrics.json") for k in range(2)]
    assert seeds[0]["test"] != seeds[1]["test"]  # other molecules, another score
    assert summary["valid"]["n"] == 2
