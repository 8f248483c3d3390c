"""The prediction server: LitServe (on FastAPI and uvicorn) around a trained model.

LitServe was chosen over a bare FastAPI app because it batches concurrent requests for us: the
single-molecule requests of many clients that arrive within ``batch_timeout`` run as one batch
of the network in its inference worker, which is what makes a server of small requests fast.

Routes: ``POST /predict`` (``{"smiles": [...]}``: one row per SMILES, in order), ``POST /explain``
(``{"smiles": "..."}``: a PNG of the molecule shaded by the graph token's attention, or by each
atom's contribution for a ``token_sum`` model), ``GET /health``, ``GET /model`` and the page at
``/``. Requests are data: no path, pickle or configuration is ever read from one.
"""

from __future__ import annotations

import hmac
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import litserve as ls
import numpy as np
import pandas as pd
from fastapi import HTTPException, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.middleware.base import BaseHTTPMiddleware

__all__ = ["Limits", "PredictionAPI", "build_server", "check_exposure"]

STATIC = Path(__file__).resolve().parent / "static"
# Hosts that only this machine reaches: no API key needed.
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
# GET /model's layout version: bumped when its keys change.
MODEL_INFO_VERSION = 1


@dataclass(frozen=True)
class Limits:
    """What one request may ask: ``rows`` SMILES per request, ``smiles_length`` characters per
    SMILES, ``max_atoms`` atoms per molecule (a larger one gets an ``error`` row), and the body's
    bytes."""

    rows: int = 1000
    smiles_length: int = 500
    max_atoms: int = 200
    body_bytes: int = 1_000_000


def check_exposure(host: str, api_key: str | None) -> None:
    """A server reachable from other machines needs an API key."""
    from graphormer.errors import ConfigError

    if host not in LOCAL_HOSTS and not api_key:
        raise ConfigError(
            f"host={host} serves the model to other machines: set an API key in the "
            "GRAPHORMER_API_KEY environment variable (clients send it as the X-API-Key header), "
            "or serve on host=127.0.0.1"
        )


def request_smiles(body: Any, limits: Limits, key: str = "smiles") -> list[str]:
    """The SMILES of a request body, or an HTTPException (4xx) saying what is wrong with it."""
    if not isinstance(body, dict) or key not in body:
        raise HTTPException(422, f'send a JSON object {{"{key}": [...]}}')
    smiles = body[key]
    if isinstance(smiles, str):
        smiles = [smiles]
    if not isinstance(smiles, list) or not all(isinstance(s, str) for s in smiles):
        raise HTTPException(422, f"{key} must be a list of SMILES strings")
    if not smiles:
        raise HTTPException(422, f"{key} is empty: send at least one SMILES")
    if len(smiles) > limits.rows:
        raise HTTPException(
            413, f"{len(smiles)} SMILES in one request, more than {limits.rows}: split it"
        )
    long = [i for i, s in enumerate(smiles) if len(s) > limits.smiles_length]
    if long:
        raise HTTPException(
            413,
            f"SMILES {long[0]} has {len(smiles[long[0]])} characters, more than "
            f"{limits.smiles_length}",
        )
    return smiles


def _number(value: Any) -> Any:
    """A JSON value: NaN (no prediction) as null, numpy scalars as Python numbers."""
    if value is None or value is pd.NA:
        return None
    if isinstance(value, np.integer | int):
        return int(value)
    value = float(value)
    return None if math.isnan(value) else value


class PredictionAPI(ls.LitAPI):
    """``POST /predict``: LitServe's batching gathers concurrent requests; one model run scores
    all their SMILES; each request gets its own rows back, in order."""

    def __init__(self, ckpt: str, limits: Limits, interval: float | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ckpt = ckpt
        self.limits = limits
        self.interval = interval

    def setup(self, device: str) -> None:
        self.predictor = load_predictor(self.ckpt, self.limits.max_atoms)

    # No annotation on `request` nor on encode_response's result: LitServe builds the route from
    # them, and unannotated means "the JSON body" and "a JSON response".
    def decode_request(self, request, **kwargs: Any) -> list[str]:  # noqa: ANN001
        return request_smiles(request, self.limits)

    def batch(self, inputs: list[list[str]]) -> list[list[str]]:
        return inputs

    def predict(self, requests: list[list[str]], **kwargs: Any) -> list[list[dict]]:
        import warnings

        smiles = [s for request in requests for s in request]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # failed rows are reported in their `error`
            if is_onnx(self.ckpt):
                table = self.predictor.predict(smiles, interval=self.interval)
            else:
                result = self.predictor.run(smiles, interval=self.interval)
                table = self.predictor.table(_smiles_frame(smiles), result)
        rows = [
            {k: (v if k in ("smiles", "error") else _number(v)) for k, v in row.items()}
            for row in table.to_dict("records")
        ]
        out, start = [], 0
        for request in requests:
            out.append(rows[start : start + len(request)])
            start += len(request)
        return out

    def unbatch(self, output: list[list[dict]]) -> list[list[dict]]:
        return output

    def encode_response(self, output: list[dict], **kwargs: Any):
        return {"rows": output}


def is_onnx(ckpt: str) -> bool:
    """Whether ``ckpt`` is a file of graphormer-export (served by ONNX Runtime, without torch)."""
    return str(ckpt).endswith(".onnx")


def load_predictor(ckpt: str, max_atoms: int) -> Any:
    """The predictor of ``ckpt``: an OnnxPredictor for an exported ``.onnx`` file, else the
    torch Predictor of a checkpoint, run folder or ensemble folder (on the CPU)."""
    if is_onnx(ckpt):
        from graphormer.portable.onnx_predictor import OnnxPredictor

        return OnnxPredictor(ckpt, max_atoms=max_atoms)
    from graphormer.inference.predictor import Predictor

    return Predictor.from_checkpoint(ckpt, device="cpu", max_atoms=max_atoms)


def _smiles_frame(smiles: list[str]) -> pd.DataFrame:
    return pd.DataFrame({"smiles": pd.Series(smiles, dtype=object)})


class _Guard(BaseHTTPMiddleware):
    """Before LitServe sees a request: the API key (when one is set) and the body's size and
    JSON (LitServe would answer a body that is not JSON with a 500)."""

    def __init__(self, app: Any, api_key: str | None, limits: Limits) -> None:
        super().__init__(app)
        self.api_key = api_key
        self.limits = limits

    async def dispatch(self, request: Request, call_next):
        open_paths = ("/", "/app.js", "/health")
        if self.api_key and request.url.path not in open_paths:
            given = request.headers.get("x-api-key", "")
            if not hmac.compare_digest(given.encode(), self.api_key.encode()):
                return _error(401, "send the server's API key as the X-API-Key header")
        if request.method == "POST":
            body = await request.body()
            if len(body) > self.limits.body_bytes:
                return _error(413, f"the body is over {self.limits.body_bytes} bytes: split it")
            try:
                json.loads(body)
            except ValueError:
                return _error(400, 'the body is not JSON: send {"smiles": [...]}')
        return await call_next(request)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=status)


def build_server(
    ckpt: str,
    *,
    limits: Limits | None = None,
    api_key: str | None = None,
    interval: float | None = None,
    max_batch_size: int = 64,
    batch_timeout: float = 0.01,
    timeout: float = 60,
) -> ls.LitServer:
    """The LitServer of a trained checkpoint (a file, a run or an ensemble folder) or of an
    exported ``.onnx`` file (no torch; no pictures)."""
    limits = limits or Limits()
    # The main process keeps a predictor too: GET /model and POST /explain are answered here,
    # and a bad checkpoint is an error before any worker starts.
    predictor = load_predictor(ckpt, limits.max_atoms)
    if interval is not None:  # a run without calibration is refused now, not per request
        predictor.run(["C"], interval=interval)
    api = PredictionAPI(
        ckpt, limits, interval, max_batch_size=max_batch_size, batch_timeout=batch_timeout
    )
    server = ls.LitServer(
        api,
        accelerator="cpu",
        timeout=timeout,
        middlewares=[(_Guard, {"api_key": api_key, "limits": limits})],
    )
    _add_routes(server.app, ckpt, predictor, limits, interval)
    return server


def model_info(ckpt: str, predictor: Any, interval: float | None) -> dict:
    """``GET /model``: what the model predicts, in which units, how well it scored."""
    if is_onnx(ckpt):
        task_type, members = predictor.task_type, len(predictor.sessions)
        outputs = predictor.output_names()
        if predictor.is_multiclass:
            outputs.append(predictor.task_names[0])
        metrics = predictor.metadata.get("metrics") or {}
    else:
        from graphormer.inference.onnx_export import run_metrics

        task_type, members = predictor.task.task_type, len(predictor.modules)
        outputs = list(predictor.outputs(np.zeros((0, predictor.task.num_outputs))).keys())
        metrics = run_metrics(ckpt)
    return {
        "format_version": MODEL_INFO_VERSION,
        "task_type": task_type,
        "tasks": list(predictor.task_names),
        "outputs": outputs,
        "units": "the training targets' units" if task_type == "regression" else "probabilities",
        "members": members,
        "spread": predictor.spread,
        "interval": interval,
        "metrics": metrics,
        "pictures": not is_onnx(ckpt),
    }


def _add_routes(
    app: Any, ckpt: str, predictor: Any, limits: Limits, interval: float | None
) -> None:
    info = model_info(ckpt, predictor, interval)
    # LitServe answers "/" with a line of its own: the page takes its place.
    app.router.routes = [r for r in app.router.routes if getattr(r, "path", None) != "/"]

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.get("/app.js", include_in_schema=False)
    def script() -> FileResponse:
        return FileResponse(STATIC / "app.js", media_type="text/javascript")

    @app.get("/model")
    def model() -> dict:
        return info

    @app.post("/explain")
    async def explain(request: Request) -> Response:
        [smiles] = request_smiles(await request.json(), Limits(rows=1, **_rest(limits)))
        if is_onnx(ckpt):
            raise HTTPException(
                501, "pictures need the model's attention: serve the checkpoint (ckpt=RUN)"
            )
        return Response(explain_png(predictor, smiles, limits.max_atoms), media_type="image/png")


def _rest(limits: Limits) -> dict:
    return {"smiles_length": limits.smiles_length, "max_atoms": limits.max_atoms}


def explain_png(predictor: Any, smiles: str, max_atoms: int) -> bytes:
    """The molecule shaded by each atom's contribution (a ``token_sum`` model's first task) or
    by the graph token's rolled-out attention; a 422 for a molecule that has no picture."""
    from graphormer.data.featurize import featurize_smiles
    from graphormer.inference.pictures import attention_legend, draw_atom_values, draw_molecule

    error = featurize_smiles([smiles], max_atoms).errors[0]
    if error:
        raise HTTPException(422, f"no picture of {smiles!r}: {error}")
    maps = predictor.attention_maps([smiles])[0]
    if maps.atom_contributions:
        name, values = next(iter(maps.atom_contributions.items()))
        return draw_atom_values(smiles, np.asarray(values), f"contribution to {name}", size=400)
    attention = maps.graph_token_attention()
    return draw_molecule(smiles, attention, size=400, legend=attention_legend(attention))
