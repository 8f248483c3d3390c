"""Graphormer with atom positions against a 2D Graphormer, PyG's SchNet and DimeNet++, on
conformer energies and forces built offline from rdkit's NCI molecules.

    python benchmarks/versus_3d.py --work /tmp/v3d [--quick] [--molecules 2000] [--epochs 30] \
        [--rows mean graphormer_2d graphormer_3d schnet dimenet++]

Data (made once and cached under ``--work``): small molecules of rdkit's
``RDConfig.RDDataDir/NCI/first_5K.smi`` (at most 20 heavy atoms, all with MMFF94 parameters),
hydrogens explicit, five ETKDGv3 conformers each (fixed seed, not minimised). Each conformer's
target is its MMFF94 energy minus the lowest of its molecule's five (kcal/mol), and its MMFF94
forces (kcal/mol/A, every atom). The split is by molecule (80/10/10, seeded): a test molecule has
no conformer in training.

Rows, all trained by one loop here (the same split, epochs, batch size, optimiser, learning-rate
schedule and loss: L1 of the standardised energy plus L1 of the forces in the same units, times
``--force-weight``):
``mean`` (no training: the training conformers' mean energy; and the per-molecule mean, the mean
of each test molecule's own conformers: an oracle, about the best a model blind to positions can
do), ``graphormer_2d`` (bonds only), ``graphormer_3d`` (``model.channels=3d`` with the vector
head for forces, or with ``--forces gradient`` ``model.forces=gradient``: forces as the energy's
negative gradient),
``graphormer_both`` (bonds and positions in every batch; its forces as ``graphormer_3d``'s),
``schnet`` and ``dimenet++``
(``torch_geometric.nn.models``; forces as the negative gradient of the energy; with
``--dimenet-blocks 0`` DimeNet++'s embedding and first output block alone, no angles). PyG's radius
graph and DimeNet's triplets need torch-cluster and torch-sparse, which are not dependencies here:
this script gives both models pairs within the cutoff and triplets computed with plain torch (for
DimeNet++ by replacing the two functions its module calls). Each row trains in a subprocess of its
own, one at a time, with one thread (``--threads N``: N; the accuracy is the same, the wall time
not comparable with one thread's); its peak memory is that process's peak resident set.

Two energy errors are printed. The energy relative to a molecule's lowest conformer depends on
which other conformers were drawn, not on one conformer's geometry, and under a split by molecule
each test molecule's own mean is an oracle; the MAE of energies centred per molecule (each
prediction minus the mean of its molecule's predictions, against each target minus the mean of its
targets) is the well-posed measure: a model blind to positions predicts one value per molecule and
scores exactly the per-molecule mean's error. ``--loss centred`` trains the energy on the same
differences (batches of whole molecules); its models learn no offset per molecule, so their
relative error is not printed. Test energy MAEs and force MAE (kcal/mol, kcal/mol/A), wall seconds
of training and evaluation, and peak memory are printed side by side; ``--profile STEPS`` times
the training steps of ``graphormer_3d`` with the other options' settings (messages, forces,
angles) by section instead. ``--quick`` is a small smoke run (120
molecules, 2 epochs). Each row's name carries every setting that is not the default (``+gradient``,
``+vector_messages``, ``+layers_6``, ``+force_weight_3``, ...), and the rows are added to
``results_<molecules>_<epochs>_<batch>_<lr>_<loss>.json`` under ``--work``, a rerun replacing
only its own row, so several commands can share one ``--work``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from common import dimenet_plus_plus, failed, merge_results, triplets

ROWS = ("mean", "graphormer_2d", "graphormer_3d", "graphormer_both", "schnet", "dimenet++")
CONFORMERS = 5
SEED = 0x3D
CUTOFF = 5.0  # Angstrom, SchNet's and DimeNet++'s neighbour radius


# -- data ------------------------------------------------------------------------------------


def _molecule(smiles: str, max_heavy: int) -> dict | None:
    """Five unminimised ETKDG conformers of ``smiles`` with explicit hydrogens, their MMFF94
    energies and forces, and the OGB features of the molecule with hydrogens; None when it is
    too large, MMFF94 lacks parameters or RDKit cannot embed it."""
    from ogb.utils.features import atom_to_feature_vector, bond_to_feature_vector
    from rdkit import Chem, RDLogger
    from rdkit.Chem import AllChem

    RDLogger.DisableLog("rdApp.*")
    mol = Chem.MolFromSmiles(smiles)
    if mol is None or not 2 <= mol.GetNumAtoms() <= max_heavy or len(Chem.GetMolFrags(mol)) > 1:
        return None
    mol = Chem.AddHs(mol)
    props = AllChem.MMFFGetMoleculeProperties(mol)
    if props is None:
        return None
    params = AllChem.ETKDGv3()
    params.randomSeed = SEED
    ids = list(AllChem.EmbedMultipleConfs(mol, numConfs=CONFORMERS, params=params))
    if len(ids) < CONFORMERS:
        return None
    positions, energies, forces = [], [], []
    for conf in ids:
        field = AllChem.MMFFGetMoleculeForceField(mol, props, confId=conf)
        positions.append(mol.GetConformer(conf).GetPositions())
        energies.append(field.CalcEnergy())
        forces.append(-np.asarray(field.CalcGrad()).reshape(-1, 3))
    x = np.array([atom_to_feature_vector(a) for a in mol.GetAtoms()], dtype=np.int64)
    edges, attrs = [], []
    for bond in mol.GetBonds():
        i, j = bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()
        feature = bond_to_feature_vector(bond)
        edges += [(i, j), (j, i)]
        attrs += [feature, feature]
    energies = np.array(energies)
    return {
        "smiles": smiles,
        "z": np.array([a.GetAtomicNum() for a in mol.GetAtoms()], dtype=np.int64),
        "x": x,
        "edge_index": np.array(edges, dtype=np.int64).reshape(-1, 2).T,
        "edge_attr": np.array(attrs, dtype=np.int64).reshape(-1, 3),
        "pos": np.stack(positions).astype(np.float32),  # [C, n, 3]
        "energy": (energies - energies.min()).astype(np.float32),  # [C]
        "forces": np.stack(forces).astype(np.float32),  # [C, n, 3]
    }


def build_data(work: Path, molecules: int, max_heavy: int = 20) -> dict:
    """The molecules (cached as ``work/data_<molecules>.pt``, plain tensors and lists)."""
    path = work / f"data_{molecules}.pt"
    if path.exists():
        return torch.load(path, weights_only=True)
    from concurrent.futures import ProcessPoolExecutor

    from graphormer.testing import nci_smiles

    smiles = list(nci_smiles())
    kept: list[dict] = []
    start = time.perf_counter()
    workers = max(1, min(2, os.cpu_count() or 1))
    with ProcessPoolExecutor(workers) as pool:
        block = 64  # a block at a time: stop as soon as there are enough
        for first in range(0, len(smiles), block):
            chosen = smiles[first : first + block]
            kept += [m for m in pool.map(_molecule, chosen, [max_heavy] * len(chosen)) if m]
            if len(kept) >= molecules:
                break
    kept = kept[:molecules]
    print(
        f"data: {len(kept)} molecules x {CONFORMERS} conformers in "
        f"{time.perf_counter() - start:.0f} s",
        flush=True,
    )
    data = {
        "smiles": [m["smiles"] for m in kept],
        **{
            key: [torch.from_numpy(m[key]) for m in kept]
            for key in ("z", "x", "edge_index", "edge_attr", "pos", "energy", "forces")
        },
    }
    order = torch.randperm(len(kept), generator=torch.Generator().manual_seed(0))
    a, b = int(0.8 * len(kept)), int(0.9 * len(kept))
    data["split"] = {"train": order[:a], "valid": order[a:b], "test": order[b:]}
    work.mkdir(parents=True, exist_ok=True)
    torch.save(data, path)
    return data


def samples(data: dict, split: str) -> list[tuple[int, int]]:
    """(molecule, conformer) pairs of a split."""
    return [(int(m), c) for m in data["split"][split] for c in range(CONFORMERS)]


# -- models ----------------------------------------------------------------------------------


def pairs_within(pos: torch.Tensor, batch: torch.Tensor, cutoff: float):
    """``edge_index`` ``[2, E]`` (source, target) of atom pairs of one molecule closer than
    ``cutoff``, and their distances (what torch-cluster's radius graph gives)."""
    same = batch.unsqueeze(0) == batch.unsqueeze(1)
    dist = torch.cdist(pos, pos)
    keep = same & (dist < cutoff) & ~torch.eye(len(pos), dtype=torch.bool)
    target, source = keep.nonzero(as_tuple=True)
    edge_index = torch.stack([source, target])
    return edge_index, (pos[source] - pos[target]).norm(dim=-1)


class PygModel(torch.nn.Module):
    """SchNet or DimeNet++ on (z, pos, batch); forces as the energy's negative gradient."""

    def __init__(self, kind: str, dimenet_blocks: int = 3) -> None:
        super().__init__()
        from torch_geometric.nn.models import SchNet

        if kind == "schnet":
            self.net = SchNet(
                hidden_channels=64,
                num_filters=64,
                num_interactions=4,
                cutoff=CUTOFF,
                interaction_graph=lambda pos, batch: pairs_within(pos, batch, CUTOFF),
            )
        else:
            from torch_geometric.nn.models import dimenet

            # torch-cluster and torch-sparse are absent: the module's two helpers, in torch.
            dimenet.radius_graph = lambda pos, r, batch, max_num_neighbors: pairs_within(
                pos, batch, r
            )[0]
            dimenet.triplets = triplets
            self.net = dimenet_plus_plus(CUTOFF, num_blocks=dimenet_blocks)

    def forward(self, z, pos, batch):
        pos = pos.requires_grad_(True)
        energy = self.net(z, pos, batch).view(-1)
        (grad,) = torch.autograd.grad(energy.sum(), pos, create_graph=self.training)
        return energy, -grad


def graphormer(channels: str, args: argparse.Namespace):
    """The Graphormer of a row (``channels`` 2d, 3d or both) with ``args``' settings."""
    from graphormer.models import Graphormer, GraphormerConfig

    three_d = channels != "2d"
    messages = args.messages
    config = GraphormerConfig(
        num_layers=args.layers,
        hidden_dim=args.width,
        ffn_dim=args.ffn or args.width,
        num_heads=8,
        num_kernels=args.kernels,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        readout="token_sum",
        channels=channels,
        channel_probs=[0.0, 0.0, 1.0],  # with "both": bonds and positions in every batch
        atom_vector_tasks=1 if three_d else 0,
        # Forces in the energy's standardised units, as the loss compares them: force_scale 1.
        forces="gradient" if three_d and args.forces == "gradient" else "head",
        distance_messages=messages != "off" and three_d,
        vector_messages=messages == "vectors" and three_d,
        message_cutoff=CUTOFF,
        message_basis=args.message_basis if messages != "off" and three_d else "kernels",
        centrality_cutoff=args.centrality_cutoff if three_d else None,
        centrality_gates=args.centrality_gates and three_d,
        centrality_basis=args.centrality_basis if three_d else "kernels",
        angle_cutoff=args.angle_cutoff if three_d else None,
        angular_messages=args.angular_messages if messages != "off" and three_d else 0,
        directional_messages=args.directional_messages and messages != "off" and three_d,
        attention_activation=args.attention,
        cutoff=args.cutoff if three_d else None,
    )
    return Graphormer(config)


# -- training --------------------------------------------------------------------------------


class Batches:
    """The batches of one split for one row: Graphormer's dense batches or PyG's flat ones."""

    def __init__(self, data: dict, items: list[tuple[int, int]], dense: bool) -> None:
        self.data, self.items, self.dense = data, items, dense
        self.graphs = {}
        if dense:
            from torch_geometric.data import Data

            from graphormer.data.structure import StructuralFeatures

            transform = StructuralFeatures(max_hops=5)
            for m in {m for m, _ in items}:
                graph = Data(
                    x=data["x"][m],
                    edge_index=data["edge_index"][m],
                    edge_attr=data["edge_attr"][m],
                    num_nodes=len(data["z"][m]),
                )
                self.graphs[m] = transform(graph)

    def __call__(self, order: list[int], size: int):
        for first in range(0, len(order), size):
            chosen = [self.items[i] for i in order[first : first + size]]
            yield self._dense(chosen) if self.dense else self._flat(chosen)

    def _dense(self, chosen):
        from graphormer.data.collate import GraphormerCollator

        graphs = []
        for m, c in chosen:
            g = self.graphs[m].clone()
            g.pos = self.data["pos"][m][c]
            g.y = self.data["energy"][m][c].view(1, 1)
            g.y_atom_vector = self.data["forces"][m][c].unsqueeze(1)  # [n, 1, 3]
            graphs.append(g)
        batch = GraphormerCollator(max_hops=5)(graphs)
        forces = batch.y_atom_vector[:, :, 0][batch.node_mask]  # [atoms, 3]
        return batch, batch.y.view(-1), forces

    def _flat(self, chosen):
        z = torch.cat([self.data["z"][m] for m, _ in chosen])
        pos = torch.cat([self.data["pos"][m][c] for m, c in chosen])
        sizes = torch.tensor([len(self.data["z"][m]) for m, _ in chosen])
        batch = torch.arange(len(chosen)).repeat_interleave(sizes)
        energy = torch.stack([self.data["energy"][m][c] for m, c in chosen])
        forces = torch.cat([self.data["forces"][m][c] for m, c in chosen])
        return (z, pos, batch), energy, forces


def predict(model, inputs, dense: bool):
    """Energies ``[B]`` and forces ``[atoms, 3]`` (None for a model without them)."""
    if not dense:
        return model(*inputs)
    out = model.forward_levels(inputs)
    energy = out["molecule"].view(-1)
    vectors = out.get("atom_vector")
    forces = None if vectors is None else vectors[:, :, 0][inputs.node_mask]
    return energy, forces


def centred_mae(molecules: list[int], predicted: torch.Tensor, target: torch.Tensor) -> float:
    """MAE of energies centred per molecule: each prediction minus the mean of its molecule's
    predictions, against each target minus the mean of its molecule's targets. A model that
    predicts one value per molecule (blind to positions) scores the error of each molecule's own
    mean; only the differences between a molecule's conformers count."""
    ids = torch.unique(torch.tensor(molecules), return_inverse=True)[1]
    count = torch.bincount(ids).to(target.dtype)

    def centred(values: torch.Tensor) -> torch.Tensor:
        means = torch.zeros_like(count).index_add(0, ids, values.to(count.dtype)) / count
        return values - means[ids]

    return float((centred(predicted) - centred(target)).abs().mean())


def evaluate(model, data: dict, split: str, dense: bool, mean: float, std: float) -> dict:
    """Energy MAE, energy MAE centred per molecule and force MAE of a split."""
    items = samples(data, split)
    predicted, force_error, atoms, has_forces = [], 0.0, 0, True
    model.eval()
    for inputs, _, forces in Batches(data, items, dense)(list(range(len(items))), 64):
        with torch.set_grad_enabled(not dense):
            pred_energy, pred_forces = predict(model, inputs, dense)
        predicted.append(pred_energy.detach() * std + mean)
        if pred_forces is None:
            has_forces = False
            continue
        force_error += float((pred_forces.detach() * std - forces).abs().sum())
        atoms += forces.numel()
    predicted = torch.cat(predicted)
    target = torch.stack([data["energy"][m][c] for m, c in items])
    return {
        "energy_mae": float((predicted - target).abs().mean()),
        "centred_mae": centred_mae([m for m, _ in items], predicted, target),
        "force_mae": force_error / atoms if has_forces else None,
    }


DEFAULTS = {
    "layers": 4,
    "width": 64,
    "ffn": None,
    "kernels": 128,
    "force_weight": 1.0,
    "dimenet_blocks": 3,
}


def row_name(row: str, args: argparse.Namespace) -> str:
    """``row`` with every setting that is not the default, so that the rows of commands with other
    settings keep their own entries in one results file."""
    dense = row.startswith("graphormer")
    # graphormer_2d has no positions, hence no messages, whatever --messages says
    three_d = dense and row != "graphormer_2d"
    messages = three_d and args.messages != "off"
    return (
        row
        + "+gradient" * (three_d and args.forces == "gradient")
        + (f"+{MESSAGE_ROWS[args.messages]}" if messages else "")
        + "+grid" * (messages and args.message_basis == "grid")
        + (
            f"+local_centrality_{args.centrality_cutoff:g}"
            if three_d and args.centrality_cutoff
            else ""
        )
        + "+gated_centrality" * (three_d and args.centrality_gates)
        + "+grid_centrality" * (three_d and args.centrality_basis == "grid")
        + (f"+angles_{args.angle_cutoff:g}" if three_d and args.angle_cutoff else "")
        + (
            f"+angular_messages_{args.angular_messages}"
            if messages and args.angular_messages
            else ""
        )
        + "+directional" * (messages and args.directional_messages)
        + f"+layers_{args.layers}" * (dense and args.layers != DEFAULTS["layers"])
        + f"+width_{args.width}" * (dense and args.width != DEFAULTS["width"])
        + f"+ffn_{args.ffn}" * (dense and args.ffn is not None)
        + f"+{args.attention}" * (dense and args.attention != "softmax")
        + (f"+cutoff_{args.cutoff:g}" if three_d and args.cutoff else "")
        + f"+kernels_{args.kernels}" * (three_d and args.kernels != DEFAULTS["kernels"])
        + f"+force_weight_{args.force_weight:g}"
        * (row != "graphormer_2d" and args.force_weight != DEFAULTS["force_weight"])
        + f"+{args.dimenet_blocks}_blocks"
        * (row == "dimenet++" and args.dimenet_blocks != DEFAULTS["dimenet_blocks"])
    )


def train_row(row: str, data: dict, args: argparse.Namespace) -> dict:
    """Train one row with ``args``' budget and loss; its test (and validation) errors."""
    epochs, batch_size, lr = args.epochs, args.batch_size, args.lr
    torch.manual_seed(0)
    dense = row.startswith("graphormer")
    if dense:
        model = graphormer(row.removeprefix("graphormer_"), args)
    else:
        model = PygModel("schnet" if row == "schnet" else "dimenet", args.dimenet_blocks)
    train_items = samples(data, "train")
    energies = torch.stack([data["energy"][m][c] for m, c in train_items])
    mean, std = float(energies.mean()), float(energies.std())
    train_batches = Batches(data, train_items, dense)
    centred = args.loss == "centred"
    if centred:  # whole molecules per batch: all their conformers, one after the other
        batch_size = CONFORMERS * max(1, batch_size // CONFORMERS)
    steps = epochs * math.ceil(len(train_items) / batch_size)
    optimiser = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, lr, total_steps=steps, pct_start=0.1)
    generator = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    for epoch in range(epochs):
        model.train()
        if centred:
            molecules = torch.randperm(len(train_items) // CONFORMERS, generator=generator)
            order = (molecules.unsqueeze(1) * CONFORMERS + torch.arange(CONFORMERS)).view(-1)
            order = order.tolist()
        else:
            order = torch.randperm(len(train_items), generator=generator).tolist()
        total, count = 0.0, 0
        for inputs, energy, forces in train_batches(order, batch_size):
            pred_energy, pred_forces = predict(model, inputs, dense)
            # Standardised energies; forces in the same units (F = -dE/dx).
            target = (energy - mean) / std
            if centred:  # differences between a molecule's conformers only
                pred_energy, target = (
                    t.view(-1, CONFORMERS) - t.view(-1, CONFORMERS).mean(1, keepdim=True)
                    for t in (pred_energy, target)
                )
            loss = (pred_energy - target).abs().mean()
            if pred_forces is not None:
                loss = loss + args.force_weight * (pred_forces - forces / std).abs().mean()
            optimiser.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
            optimiser.step()
            schedule.step()
            total, count = total + float(loss.detach()), count + 1
        line = f"  {row} epoch {epoch + 1}/{epochs} train loss {total / count:.4f}"
        if (epoch + 1) % args.valid_every == 0 or epoch + 1 == epochs:
            valid = evaluate(model, data, "valid", dense, mean, std)
            line += f", valid centred MAE {valid['centred_mae']:.3f}"
            if valid["force_mae"] is not None:
                line += f", force MAE {valid['force_mae']:.2f}"
        print(line + f" ({time.perf_counter() - start:.0f} s)", flush=True)
    test = evaluate(model, data, "test", dense, mean, std)
    if args.loss == "centred":  # no offset per molecule was trained: no relative energies
        test["energy_mae"] = None
    return {
        "row": row_name(row, args),
        **test,
        "valid": evaluate(model, data, "valid", dense, mean, std),
        "wall_s": time.perf_counter() - start,
        "threads": args.threads,
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def profile(data: dict, args: argparse.Namespace) -> None:
    """Time the training steps of ``graphormer_3d`` with ``args``' settings by section (forward
    of the 3D encoding and its parts, the messages, the layers and the vector head; backward;
    optimiser) and print conformers/s."""
    batch_size, steps = args.batch_size, args.profile
    torch.manual_seed(0)
    model = graphormer("3d", args)
    items = samples(data, "train")
    batches = Batches(data, items, dense=True)
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-4)
    geometry = model.geometry
    sections = {
        "3D encoding (all)": [],  # geometry.encode, timed below
        "  MLP K -> K -> heads": [geometry.bias_mlp],
        "  3D centrality": [geometry.centrality],
        "messages": [*(model.messages or []), *(model.angular or [])],
        "layers": list(model.layers),
        "vector head": [model.vector_head] if model.vector_head is not None else [],
    }
    times = dict.fromkeys(["forward", *sections, "backward", "optimiser"], 0.0)
    started: dict[int, float] = {}
    for name, modules in sections.items():
        for module in modules:

            def before(module, args, name=name):
                started[id(module)] = time.perf_counter()

            def after(module, args, out, name=name):
                if counting:
                    times[name] += time.perf_counter() - started[id(module)]

            module.register_forward_pre_hook(before)
            module.register_forward_hook(after)
    encode = geometry.encode  # a method, not the module's forward: timed around the call

    def timed_encode(*args, **kwargs):
        start = time.perf_counter()
        found = encode(*args, **kwargs)
        if counting:
            times["3D encoding (all)"] += time.perf_counter() - start
        return found

    geometry.encode = timed_encode
    order = torch.randperm(len(items), generator=torch.Generator().manual_seed(0)).tolist()
    counting, warmup, done = False, 2, 0
    for step, (inputs, energy, forces) in enumerate(batches(order * steps, batch_size)):
        if step == warmup + steps:
            break
        counting = step >= warmup
        marks = [time.perf_counter()]
        pred_energy, pred_forces = predict(model, inputs, dense=True)
        loss = (pred_energy - energy).abs().mean() + (pred_forces - forces).abs().mean()
        marks.append(time.perf_counter())
        optimiser.zero_grad()
        loss.backward()
        marks.append(time.perf_counter())
        optimiser.step()
        marks.append(time.perf_counter())
        if counting:
            done += 1
            for k, name in enumerate(("forward", "backward", "optimiser")):
                times[name] += marks[k + 1] - marks[k]
    sizes = inputs.node_mask.sum(1).float()
    print(
        f"{done} steps of {batch_size} conformers (the last: {int(sizes.max())} atoms at most, "
        f"{float(sizes.pow(2).sum()) / inputs.node_mask.numel() / inputs.node_mask.size(1):.0%} "
        "of its padded pairs real)"
    )
    kernels = times["3D encoding (all)"] - times["  MLP K -> K -> heads"] - times["  3D centrality"]
    rows = list(times)
    rows.insert(rows.index("layers"), "  distances, pair affine, kernels")
    times["  distances, pair affine, kernels"] = kernels
    for name in rows:
        print(f"{name:36s} {1000 * times[name] / done:8.1f} ms")
    step = times["forward"] + times["backward"] + times["optimiser"]
    print(f"{'step':36s} {1000 * step / done:8.1f} ms: {batch_size * done / step:.1f} conformers/s")


def mean_rows(data: dict) -> list[dict]:
    train_items, test_items = samples(data, "train"), samples(data, "test")
    start = time.perf_counter()
    mean = float(torch.stack([data["energy"][m][c] for m, c in train_items]).mean())
    molecules = [m for m, _ in test_items]
    target = torch.stack([data["energy"][m][c] for m, c in test_items])
    per_molecule = torch.stack([data["energy"][m].mean() for m in molecules])
    forces = torch.cat([data["forces"][m][c].reshape(-1) for m, c in test_items])
    rows = []
    for name, predicted, force_mae in (
        ("training mean (forces: zero)", torch.full_like(target, mean), float(forces.abs().mean())),
        ("per-molecule mean (oracle)", per_molecule, None),
    ):
        rows.append(
            {
                "row": name,
                "energy_mae": float((predicted - target).abs().mean()),
                "centred_mae": centred_mae(molecules, predicted, target),
                "force_mae": force_mae,
                "wall_s": time.perf_counter() - start,
            }
        )
    return rows


MESSAGE_ROWS = {"on": "messages", "vectors": "vector_messages"}
TEST_KEYS = ("centred_mae", "energy_mae", "force_mae", "wall_s", "peak_mib")
# What each row's child process is told: the data, the budget, the loss, the model's sizes and
# options.
FORWARDED = (
    "work", "molecules", "epochs", "batch_size", "lr", "force_weight", "loss", "forces",
    "layers", "width", "ffn", "attention", "cutoff", "kernels", "valid_every", "messages",
    "message_basis", "centrality_cutoff", "centrality_gates", "centrality_basis", "angle_cutoff",
    "angular_messages", "directional_messages", "dimenet_blocks", "threads",
)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--molecules", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument(
        "--force-weight",
        type=float,
        default=DEFAULTS["force_weight"],
        help="weight of the force term of the loss",
    )
    parser.add_argument(
        "--loss",
        choices=("relative", "centred"),
        default="relative",
        help="the energy term: of each conformer's energy relative to its molecule's lowest, or "
        "centred per molecule (batches of whole molecules)",
    )
    parser.add_argument(
        "--forces",
        choices=("head", "gradient"),
        default="head",
        help="the 3D Graphormers' forces: from the vector head, or as the energy's negative "
        "gradient (as SchNet's and DimeNet++'s)",
    )
    parser.add_argument("--layers", type=int, default=DEFAULTS["layers"], help="Graphormer layers")
    parser.add_argument(
        "--width",
        type=int,
        default=DEFAULTS["width"],
        help="Graphormer width (and FFN, unless --ffn)",
    )
    parser.add_argument(
        "--ffn", type=int, help="the Graphormers' feed-forward width (default: --width)"
    )
    parser.add_argument(
        "--attention",
        choices=("softmax", "silu"),
        default="softmax",
        help="the Graphormers' attention weights (model.attention_activation): the paper's "
        "softmax, or SiLU of each score (unnormalised, TorchMD-Net's)",
    )
    parser.add_argument(
        "--cutoff",
        type=float,
        help="the 3D Graphormers' model.cutoff (A): farther pairs neither attend nor enter the "
        "centrality; with --attention silu the weights fade to 0 there (default: none)",
    )
    parser.add_argument("--kernels", type=int, default=DEFAULTS["kernels"], help="Gaussian kernels")
    parser.add_argument(
        "--messages",
        choices=("off", "on", "vectors"),
        default="off",
        help="the 3D Graphormers with model.distance_messages=true (cutoff 5 A, as SchNet's); "
        "vectors: with model.vector_messages=true as well (PaiNN's equivariant messages)",
    )
    parser.add_argument(
        "--message-basis",
        choices=("kernels", "grid"),
        default="kernels",
        help="with --messages, what the messages' filters read (model.message_basis): the "
        "distance encoding's learned kernels, or SchNet's fixed Gaussian grid (--kernels "
        "Gaussians from 0 to 5 A)",
    )
    parser.add_argument(
        "--centrality-cutoff",
        type=float,
        help="the 3D Graphormers' centrality sums the pairs closer than this many A, faded "
        "smoothly (model.centrality_cutoff; default: every pair, Graphormer-3D's)",
    )
    parser.add_argument(
        "--centrality-gates",
        action="store_true",
        help="the 3D Graphormers' centrality gates each pair by its pair of elements "
        "(model.centrality_gates)",
    )
    parser.add_argument(
        "--centrality-basis",
        choices=("kernels", "grid"),
        default="kernels",
        help="with --centrality-cutoff, what the 3D centrality sums (model.centrality_basis): "
        "the learned kernels, or a fixed Gaussian grid from 0 to the cutoff",
    )
    parser.add_argument(
        "--angle-cutoff",
        type=float,
        help="the 3D Graphormers' atoms add a histogram of the angles between their neighbours "
        "closer than this many A (model.angle_cutoff; default: none)",
    )
    parser.add_argument(
        "--angular-messages",
        type=int,
        default=0,
        metavar="L",
        help="with --messages, each layer adds sums over pairs of neighbours of the powers 1 to "
        "L of the cosine of the angle between them (model.angular_messages; default: 0, none)",
    )
    parser.add_argument(
        "--directional-messages",
        action="store_true",
        help="with --angular-messages, each pair also tells its source the angles its bond "
        "makes at the target (model.directional_messages)",
    )
    parser.add_argument(
        "--dimenet-blocks",
        type=int,
        default=DEFAULTS["dimenet_blocks"],
        help="DimeNet++'s interaction blocks (3); 0 keeps its embedding and first output "
        "block: each atom's energy a network of pair sums over its neighbours, no angles",
    )
    parser.add_argument(
        "--valid-every", type=int, default=5, help="epochs between validation errors"
    )
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS)
    parser.add_argument(
        "--profile",
        type=int,
        metavar="STEPS",
        help="time STEPS training steps of graphormer_3d (with the other options' settings)",
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads of each row's process (default 1)"
    )
    parser.add_argument("--only", help=argparse.SUPPRESS)  # a child process: one row
    args = parser.parse_args()
    if args.message_basis != "kernels" and args.messages == "off":
        parser.error("--message-basis chooses what the distance messages read: add --messages")
    if args.angular_messages < 0:
        parser.error(f"--angular-messages {args.angular_messages}: give 0 (none) or more")
    if args.angular_messages and args.messages == "off":
        parser.error("--angular-messages adds angles to the distance messages: add --messages")
    if args.directional_messages and not args.angular_messages:
        parser.error("--directional-messages reads the angular messages: add --angular-messages")
    if args.dimenet_blocks < 0:
        parser.error(f"--dimenet-blocks {args.dimenet_blocks}: give 0 or more")
    if args.centrality_cutoff is not None and args.centrality_cutoff <= 0:
        parser.error(f"--centrality-cutoff {args.centrality_cutoff}: give a distance above 0 A")
    if args.angle_cutoff is not None and args.angle_cutoff <= 0:
        parser.error(f"--angle-cutoff {args.angle_cutoff}: give a distance above 0 A")
    if args.centrality_basis != "kernels" and args.centrality_cutoff is None:
        parser.error(
            "--centrality-basis grid spans 0 to the centrality's cutoff: add --centrality-cutoff"
        )
    if args.quick:
        args.molecules, args.epochs = 120, 2
    if args.threads < 1:
        parser.error(f"--threads {args.threads}: give 1 or more")
    # Subnormal floats read and written as zero for every row, as train.py trains on a CPU: the
    # 3D kernels hold some, and they take a slow path in the CPU's arithmetic. Set before torch
    # starts its threads, which inherit it (set later, only this thread would have it).
    torch.set_flush_denormal(True)
    torch.set_num_threads(args.threads)
    data = build_data(args.work, args.molecules)
    if args.profile:
        profile(data, args)
        return
    if args.only:
        result = train_row(args.only, data, args)
        result["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print("RESULT " + json.dumps(result), flush=True)
        return
    split = {k: len(v) for k, v in data["split"].items()}
    print(
        f"molecules: {split} (x {CONFORMERS} conformers); epochs {args.epochs}, batch "
        f"{args.batch_size}, lr {args.lr}, {args.loss} energy loss, force weight "
        f"{args.force_weight}; Graphormers "
        f"{args.layers} layers x {args.width} (feed-forward {args.ffn or args.width}), "
        f"{args.kernels} kernels",
        flush=True,
    )
    results = mean_rows(data) if "mean" in args.rows else []
    for row in [r for r in args.rows if r != "mean"]:
        command = [sys.executable, __file__, "--only", row]
        for name in FORWARDED:
            value, flag = getattr(args, name), "--" + name.replace("_", "-")
            if isinstance(value, bool):  # a switch: present or absent
                command += [flag] * value
            elif value is not None:  # None: the option's default
                command += [flag, str(value)]
        threads = str(args.threads)
        env = dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
        # The child's lines as they come (a long row shows its epochs), its result at the end.
        with subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        ) as process:
            found = []
            for line in process.stdout:
                if line.startswith("RESULT "):
                    found.append(json.loads(line[7:]))
                else:
                    print(line, end="", flush=True)
            error = process.stderr.read()
        if process.returncode or not found:
            raise failed(row, process.returncode, error[-3000:])
        results.append(found[0])
        print(f"  {row}: test {json.dumps({k: found[0][k] for k in TEST_KEYS})}", flush=True)
    print(
        "\n| model | test energy MAE, centred per molecule (kcal/mol) | test energy MAE "
        "(kcal/mol) | test force MAE (kcal/mol/A) | wall (s) | peak memory (MiB) |"
    )
    print("|---|---|---|---|---|---|")
    for r in results:
        force = "-" if r["force_mae"] is None else f"{r['force_mae']:.2f}"
        relative = "-" if r["energy_mae"] is None else f"{r['energy_mae']:.3f}"
        peak = f"{r['peak_mib']:.0f}" if "peak_mib" in r else "-"
        print(
            f"| {r['row']} | {r['centred_mae']:.3f} | {relative} | {force} | "
            f"{r['wall_s']:.0f} | {peak} |"
        )
    # One file per data size, budget and energy loss; a row's name holds its model settings and
    # force weight, so the rows of earlier commands with other settings stay and a rerun of a row
    # replaces it.
    merge_results(
        args.work
        / f"results_{args.molecules}_{args.epochs}_{args.batch_size}_{args.lr:g}_{args.loss}.json",
        results,
    )


if __name__ == "__main__":
    main()
