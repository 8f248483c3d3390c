"""Two "nodes" of one CPU process each (torchrun --nnodes=2 on localhost, gloo): the dataset is
processed once, each rank trains on its own shard, and both end with the same weights."""

import json
import os
import shutil
import socket
import subprocess
import sys

from helpers import REPO, TINY


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_train_disjoint_shards_to_identical_weights(tmp_path, ogb_root):
    root = tmp_path / "data"  # a fresh copy: the two nodes must process it between them
    shutil.copytree(
        ogb_root / "ogbg_molhiv", root / "ogbg_molhiv", ignore=shutil.ignore_patterns("processed")
    )
    out, record = tmp_path / "run", tmp_path / "record"
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("PYTEST_CURRENT_TEST", None)  # PyG prints "Processing..." only outside pytest
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc_per_node=1",
                f"--node_rank={node}",
                "--master_addr=127.0.0.1",
                f"--master_port={port}",
                str(REPO / "tests" / "nodes_driver.py"),
                str(record),
                "dataset=ogbg-molhiv",
                f"dataset.root={root}",
                "trainer=ddp",
                "trainer.accelerator=cpu",
                "trainer.devices=1",
                "trainer.num_nodes=2",
                "trainer.max_epochs=2",
                f"output_dir={out}",
                *TINY,
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        for node in (0, 1)
    ]
    logs = []
    for node in nodes:
        output, _ = node.communicate(timeout=600)
        logs.append(output)
        assert node.returncode == 0, output[-4000:]
    ranks = [json.loads((tmp_path / f"record.rank{r}.json").read_text()) for r in (0, 1)]
    assert [(r["rank"], r["node_rank"], r["world_size"]) for r in ranks] == [(0, 0, 2), (1, 1, 2)]
    # Each epoch the two ranks trained on disjoint shards that together hold every training graph.
    for epoch in ("0", "1"):
        a, b = (set(r["seen"][epoch]) for r in ranks)
        assert a and b and not a & b
        assert sorted(a | b) == list(range(320))
    assert ranks[0]["weights"] == ranks[1]["weights"]
    # Processed once between the nodes (OGB prints "Processing..." when it does the work).
    assert sum(log.count("Processing...") for log in logs) == 1, logs
    assert (out / "metrics.json").is_file()
