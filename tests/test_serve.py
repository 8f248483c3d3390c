"""graphormer-serve (issue 40): the API through LitServe's test harness and FastAPI's client:
good rows, bad rows, limits, the key, concurrency."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers import nci_smiles, nci_table, run_failing, untrained_checkpoint

pytest.importorskip("litserve", reason="the serve extra (litserve) is absent")
pytest.importorskip("httpx", reason="the serve extra (httpx, FastAPI's test client) is absent")

from fastapi.testclient import TestClient  # noqa: E402
from litserve.utils import wrap_litserve_start  # noqa: E402

from graphormer.errors import UserFacingError  # noqa: E402
from graphormer.serving.app import Limits, build_server, check_exposure  # noqa: E402


@pytest.fixture(scope="module")
def ckpt(esol_checkpoint):
    return esol_checkpoint


@pytest.fixture(scope="module")
def client(ckpt):
    server = build_server(str(ckpt), limits=Limits(rows=20, smiles_length=100, max_atoms=60))
    with wrap_litserve_start(server) as started, TestClient(started.app) as test_client:
        yield test_client


def test_predict_keeps_rows_in_order_with_errors(client):
    smiles = ["CCO", "C1CC", "c1ccccc1O", "C" * 70]
    response = client.post("/predict", json={"smiles": smiles})
    assert response.status_code == 200
    rows = response.json()["rows"]
    assert [r["smiles"] for r in rows] == smiles
    assert [bool(r["error"]) for r in rows] == [False, True, False, True]
    assert rows[1]["error"].startswith("invalid SMILES")
    assert "max_atoms=60" in rows[3]["error"]
    assert isinstance(rows[0]["task_0"], float) and rows[1]["task_0"] is None


def test_predict_matches_the_predictor(client, ckpt):
    from graphormer import Predictor

    smiles = list(nci_smiles()[:12])
    expected = Predictor.from_checkpoint(ckpt, device="cpu").predict(smiles)
    rows = client.post("/predict", json={"smiles": smiles}).json()["rows"]
    assert [r["task_0"] for r in rows] == pytest.approx(expected.task_0.tolist(), abs=1e-5)


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"smiles": ["C"] * 21}, 413, "more than 20"),
        ({"smiles": ["C" * 101]}, 413, "more than 100"),
        ({"smiles": []}, 422, "empty"),
        ({"smiles": [1, 2]}, 422, "list of SMILES"),
        ({"molecules": ["CCO"]}, 422, '{"smiles"'),
        ("not json", 400, "not JSON"),
    ],
)
def test_bad_requests_are_4xx_with_a_json_error(client, body, status, words):
    if isinstance(body, str):
        response = client.post("/predict", content=body)
    else:
        response = client.post("/predict", json=body)
    assert response.status_code == status
    assert words in response.json()["detail"]
    assert "Traceback" not in response.text


def test_concurrent_clients_each_get_their_own_rows(client):
    """16 clients at once (LitServe batches them): every row back, to its own client."""
    smiles = list(nci_smiles()[:64])

    def ask(i):
        mine = smiles[i * 4 : i * 4 + 4]
        rows = client.post("/predict", json={"smiles": mine}).json()["rows"]
        return [r["smiles"] for r in rows] == mine

    with ThreadPoolExecutor(16) as pool:
        assert all(pool.map(ask, range(16)))


def test_model_health_page_and_picture(client):
    assert client.get("/health").status_code == 200
    info = client.get("/model").json()
    assert info["tasks"] == ["task_0"] and info["task_type"] == "regression"
    assert info["format_version"] == 1
    page = client.get("/")
    assert page.status_code == 200 and "/app.js" in page.text
    assert 'fetch("/predict"' in client.get("/app.js").text
    picture = client.post("/explain", json={"smiles": "CC(=O)Oc1ccccc1C(=O)O"})
    assert picture.status_code == 200 and picture.content[:8] == b"\x89PNG\r\n\x1a\n"
    bad = client.post("/explain", json={"smiles": "C1CC"})
    assert bad.status_code == 422 and "invalid SMILES" in bad.json()["detail"]


def test_api_key(ckpt):
    with pytest.raises(UserFacingError, match="GRAPHORMER_API_KEY"):
        check_exposure("0.0.0.0", None)
    check_exposure("0.0.0.0", "secret")
    server = build_server(str(ckpt), api_key="secret")
    with wrap_litserve_start(server) as started, TestClient(started.app) as test_client:
        assert test_client.post("/predict", json={"smiles": ["CCO"]}).status_code == 401
        assert test_client.get("/model").status_code == 401
        keyed = test_client.post(
            "/predict", json={"smiles": ["CCO"]}, headers={"X-API-Key": "secret"}
        )
        assert keyed.status_code == 200
        assert test_client.get("/").status_code == 200


def test_an_exported_model_is_served_without_pictures(ckpt, client, tmp_path):
    """ckpt=model.onnx: ONNX Runtime answers /predict with the checkpoint's rows; /explain
    says why it has no picture."""
    pytest.importorskip("onnxruntime", reason="the onnx extra (onnxruntime) is absent")
    from graphormer import Predictor
    from graphormer.inference.onnx_export import export_onnx

    [path] = export_onnx(Predictor.from_checkpoint(ckpt, device="cpu"), tmp_path / "m.onnx")
    smiles = ["CCO", "C1CC", *nci_smiles()[:6]]
    expected = client.post("/predict", json={"smiles": smiles}).json()["rows"]
    server = build_server(str(path), limits=Limits(rows=20, smiles_length=100, max_atoms=60))
    with wrap_litserve_start(server) as started, TestClient(started.app) as onnx_client:
        rows = onnx_client.post("/predict", json={"smiles": smiles}).json()["rows"]
        assert [r["error"] for r in rows] == [r["error"] for r in expected]
        for found, wanted in zip(rows, expected, strict=True):
            assert found["task_0"] == pytest.approx(wanted["task_0"], abs=1e-4, nan_ok=True)
        info = onnx_client.get("/model").json()
        assert info["tasks"] == ["task_0"] and info["pictures"] is False
        picture = onnx_client.post("/explain", json={"smiles": "CCO"})
        assert picture.status_code == 501 and "ckpt=RUN" in picture.json()["detail"]


def test_an_exported_model_with_molecule_features_is_served(tmp_path):
    """An exported model reading Morgan counts: the server's worker computes them from each
    request's SMILES (no torch on the ONNX path) and answers the Predictor's rows."""
    pytest.importorskip("onnxruntime", reason="the onnx extra (onnxruntime) is absent")
    from graphormer import Predictor
    from graphormer.inference.onnx_export import export_onnx
    from graphormer.serving.app import PredictionAPI, model_info

    nci_table().iloc[:20].to_csv(tmp_path / "mols.csv", index=False)
    ckpt = untrained_checkpoint(
        tmp_path / "morgan.ckpt",
        [
            "dataset=smiles_csv",
            f"dataset.path={tmp_path / 'mols.csv'}",
            "dataset.targets=[tpsa]",
            "dataset.molecule_features=morgan_counts",
            f"dataset.root={tmp_path / 'cache'}",
        ],
    )
    predictor = Predictor.from_checkpoint(ckpt, device="cpu")
    [path] = export_onnx(predictor, tmp_path / "morgan.onnx")
    api = PredictionAPI(str(path), Limits(), None)
    api.setup("cpu")
    requests = [["CCO", "C1CC"], list(nci_smiles()[:5])]
    rows = [row for request in api.predict(requests) for row in request]
    expected = predictor.predict([s for request in requests for s in request])
    assert [r["error"] for r in rows] == expected.error.tolist()
    assert rows[1]["tpsa"] is None  # the unparsable row keeps its place, without a value
    found = [float("nan") if r["tpsa"] is None else r["tpsa"] for r in rows]
    assert found == pytest.approx(expected.tpsa.tolist(), abs=1e-4, nan_ok=True)
    assert model_info(str(path), api.predictor, None)["tasks"] == ["tpsa"]


def test_serve_command_refuses_other_hosts_without_a_key(ckpt, tmp_path, monkeypatch):
    """graphormer-serve host=0.0.0.0 without GRAPHORMER_API_KEY: one error line, nothing served."""
    monkeypatch.delenv("GRAPHORMER_API_KEY", raising=False)
    args = [f"ckpt={ckpt}", "host=0.0.0.0", f"hydra.run.dir={tmp_path / 'serve'}"]
    result = run_failing("serve.py", args, cwd=tmp_path)
    assert result.stderr.strip().splitlines()[-1].startswith("error: host=0.0.0.0")
    assert "GRAPHORMER_API_KEY" in result.stderr


@pytest.mark.parametrize(
    ("argument", "expected"),
    [
        ("port=abc", "error: port='abc' is not allowed: a TCP port"),
        ("port=70000", "error: port=70000 is not allowed: a TCP port"),
        ("batch_timeout=x", "error: batch_timeout='x' is not allowed"),
        ("prot=8001", "error: prot is not a key of this config: did you mean port?"),
    ],
)
def test_serve_settings_are_checked_before_anything_is_served(argument, expected, tmp_path):
    """A bad port, wait or key is one error line (they were a ValueError traceback, or uvicorn's
    own failure once the model was loaded)."""
    args = ["ckpt=missing.ckpt", argument, f"hydra.run.dir={tmp_path / 'serve'}"]
    result = run_failing("serve.py", args, cwd=tmp_path)
    assert result.stderr.strip().splitlines()[-1].startswith(expected), result.stderr
