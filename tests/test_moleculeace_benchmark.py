"""benchmarks/moleculeace.py: reading the sets from the wheel, the split, the Tanimoto kernel,
the scores and the summary's win counts (the training runs themselves are the benchmark's); and
benchmarks/epoch_profile.py's table of an epoch's parts."""

import sys
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import moleculeace  # noqa: E402

SMILES = ["CCO", "CCN", "c1ccccc1", "CC(=O)O", "CCCl", "CCBr", "COC", "CCC", "CN", "CO", "CS"]


def a_set(n: int = 40) -> pd.DataFrame:
    rng = np.random.default_rng(1)
    return pd.DataFrame(
        {
            "smiles": [SMILES[i % len(SMILES)] for i in range(n)],
            "exp_mean [nM]": rng.uniform(1, 1000, n),
            "y": rng.normal(size=n),
            "cliff_mol": (np.arange(n) % 3 == 0).astype(int),
            "split": ["test" if i % 4 == 0 else "train" for i in range(n)],
        }
    )


def test_sets_are_read_from_the_wheel_without_importing_it(tmp_path):
    wheel = tmp_path / "MoleculeACE-3.0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("MoleculeACE/__init__.py", "raise RuntimeError('imported')")
        for name in ("CHEMBL1_Ki", "CHEMBL2_EC50"):
            archive.writestr(
                f"MoleculeACE/Data/benchmark_data/{name}.csv", a_set().to_csv(index=False)
            )
    for given in (wheel, tmp_path):  # the wheel, or the folder pip download wrote it to
        sets = moleculeace.read_sets(given)
        assert sorted(sets) == ["CHEMBL1_Ki", "CHEMBL2_EC50"]
        assert list(sets["CHEMBL1_Ki"].columns) == ["smiles", "y", "cliff_mol", "split"]
        assert np.allclose(sets["CHEMBL2_EC50"]["y"], a_set()["y"])


def test_a_folder_without_the_data_is_one_error_naming_the_download(tmp_path):
    with pytest.raises(SystemExit, match="pip download MoleculeACE==3.0.0 --no-deps"):
        moleculeace.read_sets(tmp_path)
    (tmp_path / "CHEMBL9_Ki.csv").write_text("smiles,y\nCCO,1.0\n")
    with pytest.raises(SystemExit, match=r"lacks the columns \['cliff_mol', 'split'\]"):
        moleculeace.read_sets(tmp_path)


def test_validation_is_a_seeded_tenth_of_train_and_the_test_split_is_the_sets_own():
    table = a_set(200)
    split = moleculeace.split_rows(table)
    train = set(np.flatnonzero(table["split"] == "train"))
    assert split["test"] == list(np.flatnonzero(table["split"] == "test"))
    assert set(split["train"]) | set(split["valid"]) == train
    assert not set(split["train"]) & set(split["valid"])
    assert len(split["valid"]) == round(len(train) / 10)
    assert moleculeace.split_rows(table) == split  # the same rows for every model and seed


def test_tanimoto_kernel_on_counts_has_known_values():
    a = np.array([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [2.0, 0.0, 0.0]])
    b = np.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 3.0], [0.0, 0.0, 0.0]])
    gram = moleculeace.tanimoto_kernel(a, b)
    # <a,b> / (|a|^2 + |b|^2 - <a,b>): identical 1, half-shared 1 / (2 + 1 - 1), disjoint 0
    assert np.allclose(gram[0], [1.0, 0.5, 0.0, 0.0])
    assert np.allclose(gram[1], [0.0, 0.0, 0.0, 1.0])  # two empty fingerprints are identical
    assert np.allclose(gram[2], [2 / (4 + 2 - 2), 2 / (4 + 1 - 2), 0.0, 0.0])


def test_cliff_rmse_scores_only_the_test_molecules_in_a_cliff_pair():
    table = a_set(40)
    split = moleculeace.split_rows(table)
    test = np.asarray(split["test"])
    pred = table["y"].to_numpy()[test].copy()
    cliff = table["cliff_mol"].to_numpy()[test] == 1
    pred[cliff] += 2.0  # wrong by 2 on every cliff molecule, exact elsewhere
    scores = moleculeace.scores(pred, table, split)
    assert scores["cliff_rmse"] == pytest.approx(2.0)
    assert scores["rmse"] == pytest.approx(2.0 * np.sqrt(cliff.mean()))


def test_classical_rows_fit_on_the_training_rows_and_predict_the_test_split():
    table = a_set(60)
    split = moleculeace.split_rows(table)
    found = {}
    for row in ("svm", "rf", "svm+rf"):
        pred, wall = moleculeace.run_classical(row, table, split, seed=0)
        assert pred.shape == (len(split["test"]),) and np.isfinite(pred).all() and wall > 0
        found[row] = pred, wall
    # The classical ensemble: the mean of the two (each seeded, so the same fits again).
    np.testing.assert_allclose(found["svm+rf"][0], (found["svm"][0] + found["rf"][0]) / 2)
    assert "svm+rf" in moleculeace.BASELINES


def test_summary_counts_wins_over_the_sets_where_every_row_finished():
    def runs(test, cliff):
        return [{"rmse": test, "cliff_rmse": cliff, "wall_s": 1.0}]

    results = {
        ("A", "graphormer"): runs(0.5, 0.9),
        ("A", "chemprop"): runs(0.6, 0.8),
        ("B", "graphormer"): runs(0.7, 1.0),
        ("B", "chemprop"): runs(0.7, 1.1),  # a tie counts as a win for both
        ("C", "graphormer"): runs(0.1, 0.1),  # chemprop did not finish C: not counted
    }
    text = moleculeace.summary(results, {"A": 10, "B": 20, "C": 30}, ["graphormer", "chemprop"])
    assert "| graphormer | 2 | 1 | 0.600 | 0.950 |" in text
    assert "| chemprop | 1 | 1 | 0.650 | 0.950 |" in text
    assert "| C (30) | graphormer | 0.100 ± 0.000 |" in text
    # Set by set over A and B: test 0.5 - 0.6 and 0.7 - 0.7, cliff 0.9 - 0.8 and 1.0 - 1.1.
    assert (
        "graphormer against chemprop (2 set(s)): test RMSE lower on 1 of 2, difference "
        "-0.050 ± 0.050; cliff RMSE lower on 1 of 2, difference +0.000 ± 0.100; wall time "
        "1.00x to 1.00x chemprop's, 1.00x in the median, 2 of 2 at most chemprop's." in text
    )


def test_summary_pairs_a_lever_with_the_defaults_and_times_against_chemprop():
    def runs(test, cliff, wall):
        return [{"rmse": test, "cliff_rmse": cliff, "wall_s": wall}]

    results = {
        ("A", "graphormer"): runs(0.5, 0.9, 100.0),
        ("A", "graphormer+pretrained"): runs(0.4, 1.0, 150.0),
        ("A", "chemprop"): runs(0.6, 0.8, 50.0),
        ("B", "graphormer"): runs(0.7, 1.0, 60.0),
        ("B", "graphormer+pretrained"): runs(0.8, 1.2, 40.0),
        ("B", "chemprop"): runs(0.7, 1.1, 80.0),
        ("C", "graphormer"): runs(0.6, 0.6, 30.0),
        ("C", "graphormer+pretrained"): runs(0.5, 0.9, 30.0),
        ("C", "chemprop"): runs(0.9, 0.9, 10.0),
    }
    rows = ["graphormer", "graphormer+pretrained", "chemprop"]
    text = moleculeace.summary(results, {"A": 10, "B": 20, "C": 30}, rows)
    # pretrained - graphormer: test -0.1, +0.1, -0.1 (mean -0.033, sd 0.115, se 0.067);
    # cliff +0.1, +0.2, +0.3 (mean +0.2, sd 0.1, se 0.058)
    assert (
        "graphormer+pretrained against graphormer (3 set(s)): test RMSE lower on 2 of 3, "
        "difference -0.033 ± 0.067; cliff RMSE lower on 0 of 3, difference +0.200 ± 0.058." in text
    )
    # wall ratios 3.0, 0.5, 3.0 against chemprop
    assert "wall time 0.50x to 3.00x chemprop's, 3.00x in the median, 1 of 3 at most" in text
    assert "graphormer against graphormer" not in text
    assert "chemprop against" not in text


def test_ensembles_average_the_seeds_predictions_and_sum_their_wall_times(tmp_path):
    import argparse
    import json

    table = a_set(40)
    split = moleculeace.split_rows(table)
    true = table["y"].to_numpy()[split["test"]]
    args = argparse.Namespace(
        work=tmp_path, seeds=[0, 1], rows=["graphormer", "svm"], graphormer_rows={"graphormer": []}
    )
    results = {}
    # graphormer's two seeds err by +1 and +0.5 on every molecule: their mean by +0.75
    for seed, shift in ((0, 1.0), (1, 0.5)):
        pred = true + shift
        run = {**moleculeace.scores(pred, table, split), "wall_s": 10.0 + seed, "pred": list(pred)}
        folder = tmp_path / "runs" / "A" / "graphormer" / f"seed{seed}"
        folder.mkdir(parents=True)
        (folder / "result.json").write_text(json.dumps(run))
        results.setdefault(("A", "graphormer"), []).append(run)
    # the SVM's seed-0 run finished before predictions were kept: refitted, then kept
    pred, _ = moleculeace.run_classical("svm", table, split, seed=0)
    svm = {**moleculeace.scores(pred, table, split), "wall_s": 2.0}
    for seed in (0, 1):
        folder = tmp_path / "runs" / "A" / "svm" / f"seed{seed}"
        folder.mkdir(parents=True)
        (folder / "result.json").write_text(json.dumps(svm))
    results["A", "svm"] = [svm, svm]
    results["B", "graphormer"] = results["A", "graphormer"][:1]  # one seed: no ensemble
    found, rows = moleculeace.ensembles(args, ["A", "B"], {"A": table, "B": table}, results)
    assert rows == ["graphormer x2", "svm x2"] and sorted(found) == [
        ("A", "graphormer x2"),
        ("A", "svm x2"),
    ]
    assert results["A", "graphormer"][0]["rmse"] == pytest.approx(1.0)
    (ensemble,) = found["A", "graphormer x2"]
    assert ensemble["rmse"] == pytest.approx(0.75) and ensemble["cliff_rmse"] == pytest.approx(0.75)
    assert ensemble["wall_s"] == 21.0
    assert found["A", "svm x2"][0]["rmse"] == pytest.approx(svm["rmse"])  # the same model twice
    kept = json.loads((tmp_path / "runs" / "A" / "svm" / "seed1" / "result.json").read_text())
    assert np.allclose(kept["pred"], pred)


def test_ensemble_rows_pair_with_the_baselines_ensembles():
    def runs(test, cliff, wall):
        return [{"rmse": test, "cliff_rmse": cliff, "wall_s": wall}]

    results = {
        ("A", "graphormer x3"): runs(0.5, 0.9, 300.0),
        ("A", "chemprop x3"): runs(0.6, 0.8, 150.0),
        ("A", "svm x3"): runs(0.55, 0.85, 1.0),
    }
    rows = ["graphormer x3", "chemprop x3", "svm x3"]
    text = moleculeace.summary(results, {"A": 10}, rows)
    assert "| A (10) | graphormer x3 | 0.500 ± 0.000 |" in text
    assert (
        "graphormer x3 against chemprop x3 (1 set(s)): test RMSE lower on 1 of 1, difference "
        "-0.100 ± nan; cliff RMSE lower on 0 of 1, difference +0.100 ± nan; wall time 2.00x to "
        "2.00x chemprop x3's, 2.00x in the median, 0 of 1 at most chemprop x3's." in text
    )
    assert "graphormer x3 against svm x3 (1 set(s)): test RMSE lower on 1 of 1" in text
    assert "chemprop x3 against" not in text and "svm x3 against" not in text


def test_ensemble_needs_two_seeds(tmp_path, capsys):
    with pytest.raises(SystemExit):
        moleculeace.main(["--data", str(tmp_path), "--work", str(tmp_path), "--ensemble"])
    assert "--ensemble needs two or more --seeds" in capsys.readouterr().err


def test_epoch_profile_leaves_out_the_first_epoch_and_splits_the_forward_pass():
    import epoch_profile

    profile = epoch_profile.EpochProfile()
    first = {"loader": 9.0, "forward": 9.0, "backward": 9.0, "optimiser": 9.0, "epoch": 99.0}
    later = {
        "loader": 0.5,
        "forward": 2.0,
        "layers": 1.5,
        "attention bias": 0.2,
        "backward": 3.0,
        "optimiser": 0.25,
        "validation": 0.5,
        "epoch": 6.5,
    }
    profile.epochs, profile.batches = [first, later, later], [17, 17, 17]
    mean = profile.table()
    assert mean["epoch"] == 6.5 and mean["batches"] == 17
    assert mean["forward, other"] == pytest.approx(2.0 - 1.5 - 0.2)
    assert mean["rest"] == pytest.approx(6.5 - (0.5 + 2.0 + 3.0 + 0.25 + 0.5))


def test_a_lever_is_a_row_whose_settings_are_kept_and_never_reused_under_its_name(tmp_path):
    from common import lever_rows

    fixed = {"graphormer": [], "graphormer+pretrained": ["+pretrained"]}
    names = ("graphormer", "chemprop")
    morgan = ["morgan", "dataset.molecule_features=morgan_counts"]
    rows = lever_rows(
        fixed, names, [morgan, ["six", "model.num_layers=6", "+pretrained"]], tmp_path
    )
    assert rows["morgan"] == morgan[1:] and rows["six"][-1] == "+pretrained"
    assert rows["graphormer"] == [] and fixed == {
        "graphormer": [],
        "graphormer+pretrained": ["+pretrained"],
    }
    assert lever_rows(fixed, names, [morgan], tmp_path)["morgan"] == morgan[1:]  # same: reused
    with pytest.raises(SystemExit, match="ran before with .* give these settings another name"):
        lever_rows(fixed, names, [["morgan", "dataset.molecule_features=rdkit2d"]], tmp_path)
    with pytest.raises(SystemExit, match="--lever chemprop is already a row"):
        lever_rows(fixed, names, [["chemprop", "model.num_layers=6"]], tmp_path)
    with pytest.raises(SystemExit, match="needs KEY=VALUE settings"):
        lever_rows(fixed, names, [["bare"]], tmp_path)


def test_the_similarity_table_reports_what_auto_chooses_from_the_validation_molecules():
    from graphormer.data.descriptors import nearest_similarity_median

    from common import similarity_table

    train = ["CC(=O)Nc1ccc(O)cc1", "CN1CCC[C@H]1c1cccnc1", "CC(C)Cc1ccc(C(C)C(=O)O)cc1"]
    # paracetamol's chloro analogue, ibuprofen's methyl ester: close, not the same
    analogues = ["CC(=O)Nc1ccc(Cl)cc1", "CC(C)Cc1ccc(C(C)C(=O)OC)cc1"]
    strangers = ["FC(F)(F)F", "O=S(=O)(O)O"]
    smiles = train + analogues + strangers
    split = {"train": [0, 1, 2], "valid": [3, 4], "test": [5, 6]}
    close = nearest_similarity_median(train, analogues)
    far = nearest_similarity_median(train, strangers)
    assert 0.5 <= close < 1.0 and far < 0.2
    assert nearest_similarity_median(train, train[:2]) == 1.0
    table = similarity_table({"near": (smiles, split), "far": (smiles, {**split, "valid": [5, 6]})})
    near_row, far_row = table.splitlines()[2:]
    assert near_row == f"| near | {close:.2f} | {far:.2f} | morgan_counts | 6 |"
    assert far_row == f"| far | {far:.2f} | {far:.2f} | the graph alone | 12 |"


def test_a_work_folder_keeps_the_runs_of_one_thread_setting(tmp_path):
    import argparse

    from common import check_threads_record

    def args(threads, work):
        return argparse.Namespace(threads=threads, work=work)

    check_threads_record(args(2, tmp_path / "two"))
    check_threads_record(args(2, tmp_path / "two"))  # the same setting: reused
    with pytest.raises(SystemExit, match="timed with --threads 2, not 1; give this setting"):
        check_threads_record(args(1, tmp_path / "two"))
    (tmp_path / "old" / "runs").mkdir(parents=True)  # runs from before the record: one thread
    with pytest.raises(SystemExit, match="timed on one thread; give --threads 0 another --work"):
        check_threads_record(args(0, tmp_path / "old"))
    check_threads_record(args(1, tmp_path / "old"))
    with pytest.raises(SystemExit, match="--threads -1: give 1 or more"):
        check_threads_record(args(-1, tmp_path / "new"))


def test_run_timed_gives_the_command_its_threads(monkeypatch):
    import subprocess

    from common import run_timed

    seen = []
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    monkeypatch.setattr(
        subprocess,
        "run",
        lambda cmd, **kw: seen.append(kw["env"]) or subprocess.CompletedProcess(cmd, 0),
    )
    run_timed(["true"], "x")  # one thread unless told
    for threads in (2, 0):
        run_timed(["true"], "x", threads=threads)
    assert [env.get("OMP_NUM_THREADS") for env in seen] == ["1", "2", None]
