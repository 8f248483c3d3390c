"""The checkpoint record: format versions, and checkpoints of format 1 (written before the format
had a number) loading, evaluating and predicting exactly as they did."""

import json
import math
from pathlib import Path

import pytest
import torch

from graphormer import Predictor, checkpoint
from graphormer.checkpoint import FORMAT_VERSION, META_KEY, CheckpointError
from graphormer.testing import model_preset
from graphormer.training import GraphormerModule

from helpers import call_failing, call_script

FIXTURES = Path(__file__).parent / "fixtures"
FORMAT1 = FIXTURES / "format1_tiny.ckpt"
FORMAT1_EXPECTED = json.loads((FIXTURES / "format1_tiny.json").read_text())
TASK = {"name": "x", "task_type": "regression", "num_tasks": 1, "metric": "rmse"}


def test_a_format_1_checkpoint_reads_as_format_1():
    record = checkpoint.load(FORMAT1)
    assert record.format_version == 1 and "format_version" not in record.meta
    assert record.precision == "32-true"
    assert record.task == {
        "name": "nci_tpsa",
        "task_type": "regression",
        "num_tasks": 1,
        "metric": "rmse",
    }
    assert record.data["dataset"]["source"] == "smiles_csv"
    module = GraphormerModule.from_checkpoint(record)
    assert not module.training and module.config.hidden_dim == 16


def test_a_format_1_checkpoint_predicts_exactly_as_before():
    predictor = Predictor.from_checkpoint(FORMAT1, device="cpu")
    smiles = FORMAT1_EXPECTED["smiles"]
    with pytest.warns(UserWarning, match="1 of 5 molecules have no prediction"):
        table = predictor.predict(smiles)
    got = [None if math.isnan(v) else v for v in table["tpsa"].tolist()]
    assert got[-1] is None and table["error"].iloc[-1].startswith("invalid SMILES")
    torch.testing.assert_close(
        torch.tensor(got[:-1]), torch.tensor(FORMAT1_EXPECTED["tpsa"][:-1]), rtol=0, atol=1e-4
    )
    embeddings = predictor.embed(smiles[:2])
    torch.testing.assert_close(
        torch.from_numpy(embeddings),
        torch.tensor(FORMAT1_EXPECTED["embedding_first_two"]),
        rtol=0,
        atol=1e-5,
    )


def test_a_format_1_checkpoint_evaluates_exactly_as_before(tmp_path):
    output = tmp_path / "eval.json"
    call_script(  # eval.py's main() in-process; test_install runs graphormer-eval in a process
        "eval.py",
        [
            f"ckpt={FORMAT1}",
            "split=all",
            f"dataset.root={tmp_path / 'data'}",
            f"output={output}",
            f"hydra.run.dir={tmp_path / 'eval'}",
        ],
        cwd=tmp_path,
    )
    scores = json.loads(output.read_text())
    for split in ("valid", "test"):
        expected = FORMAT1_EXPECTED["eval"][split]
        assert scores[split]["num_graphs"] == expected["num_graphs"]
        assert scores[split]["rmse"] == pytest.approx(expected["rmse"], abs=1e-4)


def test_saved_checkpoints_carry_the_current_format_and_load_back(tmp_path):
    module = GraphormerModule(model=model_preset("graphormer_tiny"), task=TASK, data=None)
    path = checkpoint.save(tmp_path / "m.ckpt", module.state_dict(), dict(module.hparams))
    assert not list(tmp_path.glob("*.partial")) and not list(tmp_path.glob(".*partial"))
    stored = torch.load(path, weights_only=True)
    assert stored[META_KEY]["format_version"] == FORMAT_VERSION
    record = checkpoint.load(path)
    assert record.format_version == FORMAT_VERSION and record.data is None
    again = GraphormerModule.from_checkpoint(path)
    for name, tensor in module.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name


def test_a_newer_format_is_refused_with_the_fix(tmp_path):
    module = GraphormerModule(model=model_preset("graphormer_tiny"), task=TASK, data=None)
    path = checkpoint.save(tmp_path / "m.ckpt", module.state_dict(), dict(module.hparams))
    stored = torch.load(path, weights_only=True)
    stored[META_KEY]["format_version"] = FORMAT_VERSION + 1
    torch.save(stored, path)
    with pytest.raises(CheckpointError, match=f"format {FORMAT_VERSION + 1}.*upgrade graphormer"):
        checkpoint.load(path)
    result = call_failing("predict.py", [f"ckpt={path}", "smiles=[CCO]"], cwd=tmp_path)
    assert "upgrade graphormer" in result.stderr


def test_a_failed_save_leaves_no_file_behind(tmp_path, monkeypatch):
    module = GraphormerModule(model=model_preset("graphormer_tiny"), task=TASK, data=None)

    def full_disk(obj, path, *args, **kwargs):
        Path(path).write_bytes(b"trunc")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError, match="No space"):
        checkpoint.save(tmp_path / "m.ckpt", module.state_dict(), dict(module.hparams))
    assert list(tmp_path.iterdir()) == []
