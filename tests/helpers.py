"""The tests' shared helpers, in one place: real molecules (from :mod:`graphormer.testing`, which
the benchmarks share), composing the packaged configs, running the commands as a user does."""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir

from graphormer import checkpoint
from graphormer.cli import CONFIGS
from graphormer.cli.train import build_loggers, settings_from
from graphormer.interop import to_microsoft
from graphormer.models import Graphormer, GraphormerConfig
from graphormer.testing import (  # noqa: F401 (re-exported for the tests)
    NCI_SMILES,
    NCI_TPSA,
    model_preset,
    nci_graphs,
    nci_ogb_dataset,
    nci_smiles,
    nci_table,
    to_data,
    write_ogb_layout,
)
from graphormer.training import build_datamodule, build_module, train

REPO = Path(__file__).resolve().parents[1]

# A tiny, quiet, fast training run.
TINY = [
    "model=graphormer_tiny",
    "trainer.enable_progress_bar=false",
    "datamodule.batch_size=32",
    "optim.lr=1e-3",
]


def tiny_3d(tmp_path: Path, channels: str = "3d", epochs: int = 1) -> list[str]:
    """Overrides of a tiny positions model (16 kernels) trained ``epochs`` in ``tmp_path/run``,
    its data cache in ``tmp_path/data``."""
    return [
        f"dataset.root={tmp_path / 'data'}",
        f"output_dir={tmp_path / 'run'}",
        f"model.channels={channels}",
        "model.num_kernels=16",
        f"trainer.max_epochs={epochs}",
        *TINY,
    ]


# A tagged slab model trained for IS2RE: tags 0-2, the energy over the moving atoms, and their
# position changes by L1 with Graphormer-3D's weight falling from 15 to 1.
IS2RE_TINY = [
    "dataset.pbc_cutoff=5.0",
    "model.num_tags=3",
    "model.readout_min_tag=1",
    "item_loss=l1",
    "loss_weights={atom_vector: 15.0}",
    "loss_weights_end={atom_vector: 1.0}",
]


def without_module(monkeypatch, missing: str) -> None:
    """Makes ``import missing`` fail, as where the package is not installed."""
    import builtins

    real_import = builtins.__import__

    def blocked(name, *args, **kwargs):
        if name == missing:
            raise ImportError(f"no {missing}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", blocked)


def csv_cache(csv: Path) -> Path:
    """The data cache of runs on ``csv``, in the folder beside it: the runs of a whole session
    on one CSV (the ``nci_csv`` fixture's) featurise its molecules once, as one user's runs on
    one file do. Each cache folder is keyed by the file's bytes and the columns and features
    read, so a run of other settings makes a folder of its own."""
    return csv.parent / "data"


def nci_tpsa_run(csv: Path, output_dir: Path) -> list[str]:
    """The overrides of a run on the ``nci_csv`` fixture's TPSA column (its cache shared, see
    :func:`csv_cache`), written to ``output_dir``."""
    return [
        "dataset=smiles_csv",
        f"dataset.path={csv}",
        "dataset.targets=[tpsa]",
        f"dataset.root={csv_cache(csv)}",
        f"output_dir={output_dir}",
    ]


def tpsa_run_args(csv: Path, out: Path, *extra: str) -> list[str]:
    """train.py's arguments for a TINY run on the ``nci_csv`` fixture's TPSA column into ``out``
    (its data cache :func:`csv_cache`)."""
    return [
        "dataset=smiles_csv",
        f"dataset.path={csv}",
        "dataset.targets=[tpsa]",
        f"dataset.root={csv_cache(csv)}",
        f"hydra.run.dir={out}",
        *TINY,
        *extra,
    ]


def series_csv(work, n=60):
    """NCI molecules, each also as a homologue (one more carbon on a methyl end, written as a
    second SMILES), with a TPSA-like target and a numeric column: a random split puts most
    molecules' close analogue in training."""
    from rdkit import Chem

    table = nci_table().head(n)
    rows = []
    for smiles, tpsa in zip(table.smiles, table.tpsa, strict=True):
        rows.append((smiles, tpsa, len(smiles)))
        homologue = Chem.MolToSmiles(Chem.MolFromSmiles("C" + smiles)) if smiles[0] == "C" else None
        if homologue and Chem.MolFromSmiles(homologue) is not None:
            rows.append((homologue, tpsa + 0.5, len(homologue)))
    path = work / "series.csv"
    pd.DataFrame(rows, columns=["smiles", "tpsa", "length"]).to_csv(path, index=False)
    return path


def compose_config(name: str, overrides) -> object:
    """A packaged config (``train``, ``eval``, ...) composed with ``overrides``, as the command
    line would."""
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(name, overrides=list(overrides))


def compose_train(overrides):
    return compose_config("train", overrides)


def untrained_checkpoint(path, overrides, target_mean=None, target_std=None, precision="32-true"):
    """A checkpoint as train.py writes it (hyperparameters, weights, digest), without training:
    the model train.py would build from ``overrides``, with chosen regression statistics. Its
    weights are drawn from the run's seed, whatever ran before (the global stream is kept)."""
    cfg = compose_train([f"output_dir={path.parent}", "model=graphormer_tiny", *overrides])
    settings = settings_from(cfg)
    datamodule = build_datamodule(settings.dataset, settings.datamodule)
    with torch.random.fork_rng():
        torch.manual_seed(settings.seed)
        module = build_module(settings, datamodule)
    if target_mean is not None:
        module.target_mean.copy_(torch.tensor(target_mean))
        module.target_std.copy_(torch.tensor(target_std))
    return checkpoint.save(path, module.state_dict(), dict(module.hparams), precision=precision)


def train_config(cfg, **kwargs) -> dict:
    """Trains in-process from a composed ``train`` config, as ``graphormer-train`` does (its
    settings and its logger), with extra ``train()`` arguments (callbacks)."""
    return train(settings_from(cfg), loggers=build_loggers(cfg), **kwargs)


def csv_train_config(csv: Path, work: Path, *overrides: str):
    """The ``train`` config of a TINY in-process run on a SMILES CSV into ``work / "run"``, its
    data cache in ``work / "data"``; ``overrides`` (the target columns among them) come last."""
    return compose_train(
        [
            "dataset=smiles_csv",
            f"dataset.path={csv}",
            f"dataset.root={work / 'data'}",
            f"output_dir={work / 'run'}",
            *TINY,
            *overrides,
        ]
    )


def fit_item_ensemble(csv: Path, work: Path, targets, metric: str) -> dict:
    """An ensemble of two TINY members (2 epochs each) on a CSV's atom or bond ``targets``
    (overrides), fitted as train.py fits one into ``work / "run"``, with what every such
    ensemble owes checked: its metric and size, its members' mean, and eval's score of the
    folder equal to the run's. Its metrics."""
    from graphormer.training.evaluation import evaluate
    from graphormer.training.experiment import fit

    cfg = csv_train_config(
        csv, work, *targets, "ensemble.size=2", "trainer.max_epochs=2", "~logger", "optim.lr=2e-3"
    )
    found = fit(settings_from(cfg))
    assert found["metric"] == metric and found["ensemble_size"] == 2
    members = [m["test"][metric] for m in found["members"]]
    assert found["members_mean"]["test"][metric] == pytest.approx(np.mean(members))
    scored = evaluate(work / "run", split="test", output=work / "eval.json")
    assert scored["test"][metric] == pytest.approx(found["test"][metric], rel=1e-6)
    return found


def fine_tune_into_items(csv: Path, work: Path, level: str, targets, alone, *extra: str):
    """A molecule-level run on a CSV's ``heavy`` column, then a run of molecule and ``level``
    targets (``"atom"`` or ``"bond"``; ``targets``: their overrides) initialised from it, the
    level's loss weighted 2; then a fresh model of the task ``alone`` (that level's targets
    alone, a TaskInfo) loaded from the molecule run, checked: the encoder copied, the new head
    initialised, and the report saying so. The second run's metrics and the report."""
    from graphormer.training import GraphormerModule
    from graphormer.training.pretrained import load_pretrained

    common = ["dataset.targets=[heavy]", "dataset.split=random", "trainer.max_epochs=1"]
    common += ["logger=csv", f"output_dir={work / 'mol'}"]
    first = train_config(csv_train_config(csv, work, *common))["best_checkpoint"]
    both = train_config(
        csv_train_config(
            csv,
            work,
            *common,
            *targets,
            f"pretrained={first}",
            f"loss_weights={{{level}: 2.0}}",
            f"output_dir={work / 'both'}",
            *extra,
        )
    )
    module = GraphormerModule.from_checkpoint(both["best_checkpoint"])
    assert module.loss_weights[level] == 2.0 and getattr(module.config, f"{level}_tasks") == 1

    fresh = GraphormerModule(model=dict(module.hparams["model"]), task=alone.to_dict())
    report = load_pretrained(fresh, first)
    assert report.fits and report.copied
    assert report.output_layer
    assert all(k.startswith(f"model.{level}_head.") for k in report.output_layer)
    assert f"new {level} head" in report.summary() and "left out" in report.summary()
    source = GraphormerModule.from_checkpoint(first).state_dict()
    for name in report.copied:
        assert torch.equal(fresh.state_dict()[name], source[name])
    return both, report


def predict_item_column(checkpoint: Path, csv: Path, work: Path, name: str):
    """predict.py on a CSV that holds the true lists of an atom or bond target ``name``: the wide
    table (its predictions in ``<name>_pred``, beside the truth), then the long layout, one row
    per atom or bond with the same values. The true and the predicted values, concatenated."""
    args = [f"ckpt={checkpoint}", f"input={csv}", "device=cpu"]
    call_script("predict.py", [*args, f"output={work / 'wide.csv'}"], cwd=work)
    table = pd.read_csv(work / "wide.csv")
    assert list(table.columns) == ["smiles", name, f"{name}_pred", "error"]
    truth = np.concatenate([json.loads(c) for c in table[name]])
    predicted = np.concatenate([json.loads(c) for c in table[f"{name}_pred"]])
    assert len(truth) == len(predicted)
    call_script("predict.py", [*args, f"output={work / 'long.csv'}", "layout=long"], cwd=work)
    rows = pd.read_csv(work / "long.csv")
    assert len(rows) == len(truth) and rows[name].to_numpy() == pytest.approx(predicted, abs=1e-5)
    return truth, predicted


def explain_item_values(checkpoint: Path, smiles: str, level: str, name: str, work: Path):
    """The atom or bond values (``level``, target ``name``) that explain's maps of ``smiles``
    carry, checked against the Predictor's own, and written as explain.py writes them: a 600 x
    600 picture ``<level>s_<name>.png`` and the values in summary.json. The values and the
    picture (RGB)."""
    from PIL import Image

    from graphormer.inference import Predictor
    from graphormer.inference.explain import write_explanation

    predictor = Predictor.from_checkpoint(checkpoint, device="cpu")
    maps = predictor.attention(smiles)
    values = getattr(maps, f"{level}_predictions")[name]
    wide = predictor.predict([smiles])
    assert values == pytest.approx(json.loads(wide[name][0]), abs=1e-5)
    picture_path = work / f"{level}s_{name}.png"
    assert picture_path in write_explanation(maps, work)
    picture = Image.open(picture_path).convert("RGB")
    assert picture.size == (600, 600)
    summary = json.loads((work / "summary.json").read_text())
    assert summary[f"{level}_predictions"][name] == pytest.approx(values)
    return values, picture


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


def start_script(script: str, args, cwd, stdout=subprocess.PIPE) -> subprocess.Popen:
    """Starts ``scripts/<script>`` as a user would (no stdin, one thread), without waiting."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / script), *args],
        cwd=cwd,
        env=env,
        stdout=stdout,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )


def _run(script: str, args, cwd, timeout):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / script), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def run_script(script, args, cwd, timeout=600) -> str:
    """Runs ``scripts/<script>`` that must succeed; returns its stdout and stderr."""
    result = _run(script, args, cwd, timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result.stdout + result.stderr


def run_failing(script, args, cwd, timeout=300) -> subprocess.CompletedProcess:
    """Runs a script that must stop on a user error: exit status 1 and no traceback."""
    result = _run(script, args, cwd, timeout)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-5000:]
    assert "Traceback" not in result.stderr, result.stderr[-5000:]
    return result


def call(script: str, args, cwd) -> subprocess.CompletedProcess:
    """Runs ``scripts/<script>``'s application in this process, as its console command does
    (``main()`` with ``args`` as the command line, from ``cwd``): its exit status, stdout and
    stderr as a subprocess run gives them, without the seconds of imports a new process costs.
    For what the application does; a process's own boundary (a signal, a fresh interpreter, the
    start-up time, more than one rank) needs :func:`run_script`. What the application changes in
    the process (logging, warnings, the environment, Hydra's singletons, this thread's flushing of
    subnormal floats) is put back, and what a
    process lets go of when it ends (the run folders it holds, its record of a rewritten resume
    config) is let go of."""
    import contextlib
    import importlib
    import io
    import logging
    import warnings

    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from graphormer import rundir
    from graphormer.cli import train as train_command
    from graphormer.devices import flushes_subnormals

    held = set(rundir._HELD)
    flushing = flushes_subnormals()
    main = importlib.import_module(f"graphormer.cli.{Path(script).stem}").main
    argv = [str(REPO / "scripts" / script), *map(str, args)]
    out, err = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    environ, here, saved_argv = dict(os.environ), os.getcwd(), sys.argv
    formatwarning = warnings.formatwarning
    code = 0
    try:
        os.chdir(cwd)
        sys.argv = argv
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            try:
                main()
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else (stop.code is not None)
                if isinstance(stop.code, str):
                    print(stop.code, file=err)
            finally:
                logging.captureWarnings(False)
    finally:
        sys.argv = saved_argv
        os.chdir(here)
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)
        warnings.formatwarning = formatwarning
        os.environ.clear()
        os.environ.update(environ)
        GlobalHydra.instance().clear()
        HydraConfig.instance().cfg = None
        for folder in set(rundir._HELD) - held:  # a process's locks end with it
            rundir.release_run_dir(folder)
        train_command._REPLACED.clear()
        torch.set_flush_denormal(flushing)
    return subprocess.CompletedProcess(argv, int(code), out.getvalue(), err.getvalue())


def call_script(script: str, args, cwd) -> str:
    """:func:`call` of a command that must succeed; its stdout and stderr."""
    result = call(script, args, cwd)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result.stdout + result.stderr


def call_failing(script: str, args, cwd) -> subprocess.CompletedProcess:
    """:func:`call` of a command that must stop on a user error: exit status 1, no traceback."""
    result = call(script, args, cwd)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-5000:]
    assert "Traceback" not in result.stderr, result.stderr[-5000:]
    return result


def evaluate_run(metrics: dict, work: Path, *overrides: str) -> tuple[dict, str]:
    """scripts/eval.py on a run's best checkpoint, all splits: the JSON it wrote, and its output.
    In-process (:func:`call_script`): eval.py in a process of its own runs in test_checkpoint
    and test_install."""
    result_path = work / "eval.json"
    log = call_script(
        "eval.py",
        [
            f"ckpt={metrics['best_checkpoint']}",
            "split=all",
            f"output={result_path}",
            f"hydra.run.dir={work / 'eval'}",
            "overwrite=true",  # eval.json of an earlier test on the same shared run
            *overrides,
        ],
        cwd=work,
    )
    return json.loads(result_path.read_text()), log


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


# -- published-weights layouts (Microsoft's fairseq checkpoints) ------------------------------


def microsoft_config(**overrides) -> GraphormerConfig:
    """A small model with the settings a conversion from Microsoft's layout produces."""
    values = dict(
        num_layers=2,
        hidden_dim=32,
        ffn_dim=48,
        num_heads=4,
        dropout=0.0,
        pre_layernorm=False,
        embedding_layernorm=True,
        feature_stride=512,
        max_degree=510,
        max_distance=509,
        unreachable_as_far=True,
        head_bias="shared",
        num_tasks=3,
    )
    values.update(overrides)
    return GraphormerConfig(**values)


def random_model(config: GraphormerConfig, seed: int = 0) -> Graphormer:
    """Every parameter random (not the N(0, 0.02) init), so that a misplaced row shows."""
    torch.manual_seed(seed)
    model = Graphormer(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    return model


def write_fairseq(path, config, model, **extra):
    settings, theirs = to_microsoft(config, model.state_dict())
    checkpoint = {
        "model": theirs,
        "args": argparse.Namespace(**settings, criterion="l1_loss", dataset_name="pcqm4mv2"),
        "extra_state": {"val_loss": np.float64(0.087)},  # fairseq keeps numpy scalars here
        **extra,
    }
    torch.save(checkpoint, path)
    return path


# -- 3D and periodic test structures ------------------------------------------------------------


def small_3d_model(dtype=torch.float64, **settings) -> Graphormer:
    """A seeded 2-layer, 16-wide 3D model (8 kernels, token_sum, no dropout) with ``settings``,
    its weights moved away from the initialisation's ones and near-zeros."""
    torch.manual_seed(0)
    values = dict(num_layers=2, hidden_dim=16, ffn_dim=16, num_heads=2, dropout=0.0)
    values.update(attention_dropout=0.0, activation_dropout=0.0, channels="3d", num_kernels=8)
    values.update(readout="token_sum")
    model = Graphormer(GraphormerConfig(**{**values, **settings})).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def proper_rotation(seed: int = 1) -> torch.Tensor:
    """A random proper rotation ``[3, 3]`` (float64), seeded."""
    generator = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(3, 3, generator=generator, dtype=torch.float64))
    return q * torch.sign(torch.det(q))


def moved_graphs(graphs, rotation, shift) -> list:
    """Copies of ``graphs`` with positions rotated by ``rotation`` and shifted by ``shift``."""
    out = []
    for g in graphs:
        h = g.clone()
        h.pos = g.pos @ rotation.T + shift
        out.append(h)
    return out


MOLECULES_3D = ["CCO", "c1ccccc1O", "CC(=O)Nc1ccc(OCC)cc1", "[Na+]"]


def positioned_graphs(smiles=MOLECULES_3D, seed: int = 0):
    """Molecules with random positions (a spread of a few Angstrom), float64."""
    from graphormer.data.featurize import featurize_smiles

    generator = torch.Generator().manual_seed(seed)
    graphs = featurize_smiles(list(smiles)).graphs
    for g in graphs:
        g.pos = 2.0 * torch.randn(g.num_nodes, 3, generator=generator, dtype=torch.float64)
    return graphs


def float64_batch(graphs, dtype=torch.float64, max_hops: int = 5):
    """Graphs with positions collated, the positions kept in ``dtype``: the collator stores
    float32, and tests of exact invariance compare in float64."""
    from graphormer.data.collate import GraphormerCollator

    batch = GraphormerCollator(max_hops=max_hops)(graphs)
    batch.pos = torch.zeros(batch.pos.shape, dtype=dtype)
    for i, g in enumerate(graphs):
        batch.pos[i, : g.num_nodes] = g.pos.to(dtype)
    return batch


def periodic_graph(atoms, positions, cutoff: float, tags=None):
    """An ASE structure at ``positions`` (float64) as a bond-less graph with its periodic images
    within ``cutoff`` (graphormer.data.periodic)."""
    from torch_geometric.data import Data

    from graphormer.data.periodic import with_images

    graph = Data(
        x=torch.as_tensor(atoms.numbers - 1).view(-1, 1),
        pos=torch.as_tensor(positions, dtype=torch.float64),
        edge_index=torch.zeros(2, 0, dtype=torch.long),
        edge_attr=torch.zeros(0, 1, dtype=torch.long),
        y=torch.zeros(1, 1),
        num_nodes=len(atoms),
    )
    return with_images(graph, np.asarray(atoms.cell), atoms.pbc, tags, cutoff, "test")


def slab_batch(count: int, seed: int):
    """``count`` EMT slabs (graphormer.testing.emt_slabs) with their energies, images within
    6 A of the adsorbate, collated with float64 positions."""
    from graphormer.data.collate import GraphormerCollator
    from graphormer.data.sources.ase import structures_to_graphs
    from graphormer.testing import emt_slabs

    frames = emt_slabs(count, seed=seed)
    for frame in frames:
        frame.info["energy"] = frame.get_potential_energy()
    graphs = structures_to_graphs(frames, ["energy"], [], "test", pbc_cutoff=6.0)
    batch = GraphormerCollator(max_hops=1)(graphs)
    batch.pos = batch.pos.double()
    return batch


def energy_at(model, batch, pos) -> torch.Tensor:
    """The model's first molecule output for ``batch`` with its positions replaced by ``pos``,
    without gradients (finite differences)."""
    import dataclasses

    with torch.no_grad():
        return model._levels(dataclasses.replace(batch, pos=pos))["molecule"][:, 0]


def copper_placements(seed: int, outside: int, fraction: float, axis: int):
    """A rattled 2 x 2 x 2 cubic Cu cell and three placements of its atoms that a periodic
    model must not tell apart: its first ``outside`` atoms moved ``fraction`` of cell vector
    ``axis`` out of the cell (as files hold them), the same wrapped into the cell, and the
    first shifted by a lattice vector."""
    from ase.build import bulk

    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((2, 2, 2))
    atoms.rattle(0.1, seed=seed)
    cell = atoms.cell.array
    start = atoms.positions.copy()
    start[:outside] -= fraction * cell[axis]
    wrapped = atoms.copy()
    wrapped.positions = start
    wrapped.wrap()
    return atoms, [start, wrapped.positions, start + cell[1] - cell[2]]


def periodic_batch(graphs):
    """Periodic graphs (:func:`periodic_graph`) collated with float64 positions."""
    return float64_batch(graphs, max_hops=1)


def rotated_levels(model, rotation, shift, graphs=None) -> dict:
    """``model.forward_levels`` of :func:`positioned_graphs` (or ``graphs``), after asserting
    that moving them by ``rotation`` and ``shift`` leaves the energies unchanged and rotates
    the per-atom vectors with them (float64, to 1e-9)."""
    graphs = positioned_graphs() if graphs is None else graphs
    before = model.forward_levels(float64_batch(graphs))
    after = model.forward_levels(float64_batch(moved_graphs(graphs, rotation, shift)))
    torch.testing.assert_close(after["molecule"], before["molecule"], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(
        after["atom_vector"], before["atom_vector"] @ rotation.T, rtol=1e-9, atol=1e-9
    )
    return before


def assert_reflection_and_order_invariant(model) -> None:
    """``model``'s energies of :func:`positioned_graphs` are unchanged by a reflection of every
    structure (which keeps every angle) and by shuffling one molecule's atoms (float64, to
    1e-9)."""
    graphs = positioned_graphs()
    batch = float64_batch(graphs)
    mirror = torch.diag(torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64))
    reflected = positioned_graphs()
    for g in reflected:
        g.pos = g.pos @ mirror.T
    torch.testing.assert_close(model(float64_batch(reflected)), model(batch), rtol=1e-9, atol=1e-9)
    graph = graphs[2]
    perm = torch.randperm(graph.num_nodes, generator=torch.Generator().manual_seed(2))
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(len(perm))
    shuffled = graph.clone()
    shuffled.x, shuffled.pos = graph.x[perm], graph.pos[perm]
    shuffled.edge_index = inverse[graph.edge_index]
    torch.testing.assert_close(
        model(float64_batch([shuffled])), model(batch)[2:3], rtol=1e-9, atol=1e-9
    )


def assert_placements_agree(model, atoms, placements, cutoff: float = 3.0) -> None:
    """The energy of a periodic structure is the same whichever copy of each atom lies in the
    cell (:func:`copper_placements`)."""
    energies = [
        float(model(periodic_batch([periodic_graph(atoms, positions, cutoff)])))
        for positions in placements
    ]
    assert abs(energies[1] - energies[0]) < 1e-5 and abs(energies[2] - energies[0]) < 1e-5


def slab_gradient_settings() -> dict:
    """Settings of a :func:`small_3d_model` of EMT slabs (elements, tags) whose forces are its
    energy's gradient."""
    from graphormer.data.sources.ase import ELEMENTS

    return dict(
        atom_feature_dims=[ELEMENTS],
        bond_feature_dims=[1],
        num_heads=4,
        num_tags=3,
        atom_vector_tasks=1,
        forces="gradient",
        message_cutoff=5.0,
    )


def assert_forces_are_energy_gradients(model, batch, atom: int = 2) -> None:
    """The first structure's ``atom`` has as force the negative energy difference of moving it
    (and its periodic images, if it has any) a step each way along each axis, over the step's
    length."""
    vectors = model.forward_levels(batch)["atom_vector"]
    pos = batch.pos.clone()
    for axis in range(3):
        step = torch.zeros_like(pos)
        step[0, atom, axis] = 1e-5
        if batch.image_of is not None:
            step[0, batch.image_of[0] == atom, axis] = 1e-5  # the atom's images move with it
        difference = energy_at(model, batch, pos + step) - energy_at(model, batch, pos - step)
        expected = -float(difference[0]) / 2e-5
        torch.testing.assert_close(float(vectors[0, atom, 0, axis]), expected, rtol=1e-4, atol=1e-9)


def emt_run(tmp_path: Path, *overrides: str, frames: int = 24):
    """``train.py`` of a tiny 3D model on ``frames`` EMT structures written to
    ``tmp_path/emt.extxyz``, run in ``tmp_path/run`` with ``overrides``; the file, the run
    folder, the arguments and its metrics."""
    import ase.io

    from graphormer.testing import emt_frames

    path = tmp_path / "emt.extxyz"
    ase.io.write(path, emt_frames(frames))
    run = tmp_path / "run"
    args = [
        "dataset=ase",
        f"dataset.path={path}",
        f"dataset.root={tmp_path / 'data'}",
        f"hydra.run.dir={run}",
        "model.channels=3d",
        "model.num_kernels=16",
        *overrides,
        *TINY,
    ]
    call_script("train.py", args, cwd=tmp_path)
    return path, run, args, read_json(run / "metrics.json")


def assert_run_keeps_setting(tmp_path: Path, key: str, value: str, *overrides: str) -> None:
    """A 2-epoch :func:`emt_run` with ``model.<key>=<value>`` and ``overrides`` stores the
    setting in its checkpoint, and ``predict.py`` of its best checkpoint writes energies."""
    extra = (f"model.{key}={value}", *overrides, "trainer.max_epochs=2")
    path, run, _, metrics = emt_run(tmp_path, *extra)
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["hyper_parameters"]["model"][key] == value
    assert_predicts_energies(tmp_path, metrics["best_checkpoint"], path, 24)


def assert_predicts_energies(tmp_path: Path, ckpt: str, path: Path, count: int) -> None:
    """``predict.py`` of ``ckpt`` on the structure file ``path`` writes ``count`` energies,
    none missing, not all equal."""
    out = tmp_path / "pred.csv"
    call_script("predict.py", [f"ckpt={ckpt}", f"input={path}", f"output={out}"], cwd=tmp_path)
    energy = pd.read_csv(out).energy
    assert len(energy) == count and energy.notna().all() and energy.nunique() > 1
