"""Load on graphormer-serve: N concurrent clients for a while, over loopback.

    python benchmarks/serve_load.py                          # slim preset; 1 then 16 clients, 60 s each
    python benchmarks/serve_load.py --ckpt RUN --clients 1,4,16 --seconds 30 --per-request 8
    python benchmarks/serve_load.py --onnx

Starts ``scripts/serve.py`` on a free port of 127.0.0.1 (never another interface), then for each
client count runs that many threads, each posting ``--per-request`` NCI molecules per request
(keep-alive connection) until the time is up. Prints requests/s, molecules/s, p50 and p99
latency, errors (non-200 answers, failed connections), rows dropped (rows missing or not in the
order sent) and the server's memory (its processes' resident set) before and after each round.
Without ``--ckpt`` the model is the preset with random weights (speed does not depend on them);
``--onnx`` serves it exported (ONNX Runtime in the server, no torch).
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).parent))

MAX_CLIENTS = 64
MAX_SECONDS = 600


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="graphormer_slim", help="preset under configs/model/")
    parser.add_argument("--ckpt", default=None, help="a trained checkpoint or run folder")
    parser.add_argument("--clients", default="1,16", help="client counts, one round each")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each round")
    parser.add_argument("--per-request", type=int, default=1, help="molecules per request")
    parser.add_argument("--onnx", action="store_true", help="serve the model exported to ONNX")
    parser.add_argument("--threads", type=int, default=1, help="the server's CPU threads")
    args = parser.parse_args()
    counts = [int(c) for c in args.clients.split(",")]
    if not all(1 <= c <= MAX_CLIENTS for c in counts) or not 0 < args.seconds <= MAX_SECONDS:
        parser.error(f"--clients in 1..{MAX_CLIENTS}, --seconds in (0, {MAX_SECONDS}]")

    import psutil
    from predict_throughput import preset_checkpoint

    from graphormer.testing import nci_smiles, running_server

    work = Path(tempfile.mkdtemp(prefix="serve_load_"))
    ckpt = args.ckpt or preset_checkpoint(args.model, work / "model.ckpt")
    if args.onnx:
        from graphormer.inference import Predictor
        from graphormer.inference.onnx_export import export_onnx

        ckpt = export_onnx(Predictor.from_checkpoint(ckpt, device="cpu"), work / "model.onnx")[0]
    smiles = [s for s in nci_smiles()[:2000] if "." not in s]
    serve_dir = f"hydra.run.dir={work / 'serve'}"
    with running_server(ckpt, serve_dir, threads=args.threads) as (url, pid):
        server = psutil.Process(pid)
        address = urlsplit(url)
        assert address.hostname == "127.0.0.1", "loopback only"
        _round(address, smiles, 2, 3.0, args.per_request)  # warm-up: workers, caches
        print(f"{'clients':>7} {'req/s':>7} {'mol/s':>7} {'p50 ms':>7} {'p99 ms':>7} "
              f"{'errors':>6} {'dropped':>7} {'memory MB start -> end':>24}")  # fmt: skip
        for count in counts:
            before = _memory(server)
            found = _round(address, smiles, count, args.seconds, args.per_request)
            after = _memory(server)
            latencies = sorted(found["latencies"])
            p50 = latencies[len(latencies) // 2] * 1e3 if latencies else float("nan")
            p99 = latencies[int(len(latencies) * 0.99)] * 1e3 if latencies else float("nan")
            print(f"{count:7d} {found['requests'] / found['seconds']:7.1f} "
                  f"{found['molecules'] / found['seconds']:7.1f} {p50:7.1f} {p99:7.1f} "
                  f"{found['errors']:6d} {found['dropped']:7d} "
                  f"{before / 1e6:11.0f} -> {after / 1e6:.0f}")  # fmt: skip


def _memory(process) -> int:
    """Resident bytes of the server and its workers."""
    total = 0
    for each in [process, *process.children(recursive=True)]:
        try:
            total += each.memory_info().rss
        except Exception:  # a worker that ended between the listing and the reading
            pass
    return total


def _round(address, smiles: list[str], clients: int, seconds: float, per_request: int) -> dict:
    lock = threading.Lock()
    totals = {"requests": 0, "molecules": 0, "errors": 0, "dropped": 0, "latencies": []}
    stop = time.monotonic() + seconds

    def client(offset: int) -> None:
        connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
        position = offset * 97
        mine = {"requests": 0, "molecules": 0, "errors": 0, "dropped": 0, "latencies": []}
        while time.monotonic() < stop:
            batch = [smiles[(position + k) % len(smiles)] for k in range(per_request)]
            position += per_request
            body = json.dumps({"smiles": batch})
            begin = time.perf_counter()
            try:
                connection.request("POST", "/predict", body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                answer = response.read()
            except (OSError, http.client.HTTPException):
                mine["errors"] += 1
                connection.close()
                connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
                continue
            mine["latencies"].append(time.perf_counter() - begin)
            mine["requests"] += 1
            if response.status != 200:
                mine["errors"] += 1
                continue
            rows = json.loads(answer)["rows"]
            returned = [row["smiles"] for row in rows]
            mine["dropped"] += sum(a != b for a, b in zip(batch, returned, strict=False))
            mine["dropped"] += max(0, len(batch) - len(returned))
            mine["molecules"] += len(returned)
        connection.close()
        with lock:
            for key, value in mine.items():
                totals[key] += value

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    begin = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    totals["seconds"] = time.monotonic() - begin
    return totals


if __name__ == "__main__":
    main()
