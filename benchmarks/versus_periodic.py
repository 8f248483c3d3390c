"""Graphormer on periodic slabs with and without periodic images, against PyG's SchNet and
DimeNet++ with periodic neighbours, on EMT energies and forces built offline with ASE; and an IS2RE
check: relaxed energies with and without the position-change auxiliary target.

    python benchmarks/versus_periodic.py --work /tmp/vpbc [--quick] [--structures 600] \
        [--relaxed 300] [--epochs 30] [--force-weight 1]

Data (made once and cached under ``--work`` as extended XYZ): ``graphormer.testing.emt_slabs``:
fcc(100) and fcc(111) slabs of Cu, Ag, Au, Ni, Pd, Pt, Al (2 x 2, 3 layers, the bottom layer
fixed and tagged 0, 6 A of vacuum, periodic in x and y) with an H, C, N, O, OH or CO adsorbate
at a random site, shaken, with ASE's EMT energy and forces; a second set relaxed by BFGS (at most
``--relax-steps`` steps) for IS2RE. Split 80/10/10, seeded.

Rows, trained by one loop here (the same split, epochs, batch size, AdamW with a one-cycle learning
rate, L1 of the standardised energy plus L1 of the forces in the same units): ``mean`` (the training
energies' mean; forces zero), ``graphormer_pbc`` (``model.channels=3d``, tags, periodic images
within 6 A of the adsorbate, the vector head for forces), ``graphormer_pbc_gradient`` (the same
model with ``model.forces=gradient``: no vector head, forces as its energy's negative gradient with
respect to the real atoms' positions, each image moving with its source atom), ``graphormer_nopbc``
(the same frames with ``pbc`` off: no images), ``schnet_pbc`` (PyG's SchNet over every periodic pair
within 5 A, forces as the energy's negative gradient), ``dimenet_pbc`` (PyG's DimeNet++ blocks,
``versus_3d.py``'s sizes, over the same pairs, under a forward of this script's own: PyG's computes
distances and angles from ``pos[i] - pos[j]``; here every edge vector carries its cell shift and
each triplet's two edges their own, so angles across the boundary are right; triplets in plain
torch, without torch-sparse; forces as SchNet's). IS2RE rows: ``is2re_aux`` (relaxed energy plus the
position change, L1, weight 15 -> 1) and ``is2re_plain`` (the relaxed energy alone). Each row prints
its test energy MAE and median absolute error (a few strongly repulsive structures, an adsorbate
placed close above an atom, carry most of the MAE of a small test split) and its force MAE.
``--quick`` is a smoke run (40 structures, 24 relaxed, 2 epochs).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import torch

from common import dimenet_plus_plus, merge_results, triplets

ROWS = (
    "mean",
    "graphormer_pbc",
    "graphormer_pbc_gradient",
    "graphormer_nopbc",
    "schnet_pbc",
    "dimenet_pbc",
    "is2re_aux",
    "is2re_plain",
)
PBC_CUTOFF = 6.0  # Angstrom: images kept near the adsorbate
SCHNET_CUTOFF = 5.0


def build_data(work: Path, structures: int, relaxed: int, relax_steps: int) -> dict:
    """The two sets as ASE frames, cached as extended XYZ under ``work``."""
    import ase.io

    from graphormer.testing import emt_slabs

    work.mkdir(parents=True, exist_ok=True)
    found = {}
    for name, count, steps in (("slabs", structures, 0), ("is2re", relaxed, relax_steps)):
        path = work / f"{name}_{count}_{steps}.extxyz"
        if not path.is_file():
            start = time.perf_counter()
            ase.io.write(path, emt_slabs(count, seed=count, relax_steps=steps))
            print(f"built {path} in {time.perf_counter() - start:.0f} s", flush=True)
        found[name] = ase.io.read(path, ":")
    return found


def split(n: int) -> dict[str, list[int]]:
    order = np.random.default_rng(0).permutation(n).tolist()
    train, valid = int(0.8 * n), int(0.9 * n)
    return {"train": order[:train], "valid": order[train:valid], "test": order[valid:]}


def graphs_of(frames: list, periodic: bool, relaxed: bool, around: str = "adsorbate") -> list:
    """Each frame as the ase source builds it (images, tags; ``dataset.pbc_around=around``);
    ``periodic`` False drops pbc."""
    from graphormer.data.sources.ase import structures_to_graphs

    copies = []
    for original in frames:
        frame = original.copy()  # without the stored calculator: its values go into info
        if not relaxed:
            frame.info["energy"] = original.get_potential_energy()
            frame.arrays["forces"] = original.get_forces()
        frame.pbc = frame.pbc & periodic
        copies.append(frame)
    targets = ["energy_relaxed"] if relaxed else ["energy"]
    vectors = [] if relaxed else ["forces"]
    return structures_to_graphs(
        copies,
        targets,
        vectors,
        "benchmark",
        pbc_cutoff=PBC_CUTOFF,
        relaxed_positions="pos_relaxed" if relaxed else None,
        pbc_around=around,
    )


# The rows' settings (the command's options): each run_row and graphormer call reads them.
SETTINGS = {
    "layers": 4,
    "width": 64,
    "force_weight": 1.0,
    "messages": False,
    "around": "adsorbate",
    "min_tag": 1,
    "dimenet_blocks": 3,
    "centrality_cutoff": None,
    "centrality_gates": False,
    "vector_messages": False,
    "message_basis": "kernels",
    "centrality_basis": "kernels",
    "angle_cutoff": None,
    "angular_messages": 0,
    "seed": 0,
}


def graphormer(vector: bool, forces: str = "head", settings: dict | None = None) -> torch.nn.Module:
    """The benchmark's Graphormer; ``settings`` replace :data:`SETTINGS`' values."""
    s = {**SETTINGS, **(settings or {})}
    from graphormer.data.sources.ase import ELEMENTS
    from graphormer.models import Graphormer, GraphormerConfig

    config = GraphormerConfig(
        num_layers=s["layers"],
        hidden_dim=s["width"],
        ffn_dim=s["width"],
        num_heads=8,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        readout="token_sum",
        readout_min_tag=s["min_tag"],
        channels="3d",
        num_kernels=64,
        num_tags=3,
        atom_feature_dims=[ELEMENTS],
        bond_feature_dims=[1],
        atom_vector_tasks=1 if vector else 0,
        forces=forces,
        distance_messages=s["messages"],
        message_cutoff=SCHNET_CUTOFF,
        centrality_cutoff=s["centrality_cutoff"],
        centrality_gates=s["centrality_gates"],
        vector_messages=s["vector_messages"] and s["messages"],
        message_basis=s["message_basis"] if s["messages"] else "kernels",
        centrality_basis=s["centrality_basis"],
        angle_cutoff=s["angle_cutoff"],
        angular_messages=s["angular_messages"] if s["messages"] else 0,
    )
    return Graphormer(config)


class PeriodicSchNet(torch.nn.Module):
    """PyG's SchNet over every pair within the cutoff, cell shifts included; forces as the
    energy's negative gradient."""

    def __init__(self) -> None:
        super().__init__()
        from torch_geometric.nn.models import SchNet

        self.pairs = None
        self.net = SchNet(
            hidden_channels=64,
            num_filters=64,
            num_interactions=4,
            cutoff=SCHNET_CUTOFF,
            interaction_graph=self._graph,
        )

    def _graph(self, pos, batch):
        edge_index, shift = self.pairs
        source, target = edge_index
        return edge_index, (pos[source] + shift - pos[target]).norm(dim=-1)

    def forward(self, z, pos, batch, pairs):
        self.pairs = pairs
        pos = pos.requires_grad_(True)
        energy = self.net(z, pos, batch).view(-1)
        (grad,) = torch.autograd.grad(energy.sum(), pos, create_graph=self.training)
        return energy, -grad


class PeriodicDimeNet(torch.nn.Module):
    """PyG's DimeNet++ (``benchmarks/versus_3d.py``'s sizes) over every pair within the cutoff,
    cell shifts included; forces as the energy's negative gradient.

    PyG's own forward builds its edges and angles from positions alone, so this one calls the
    module's blocks itself: each edge vector is ``pos[source] + shift - pos[target]`` and each
    triplet's two edges keep their own shifts, so an angle across the cell's boundary is the
    angle between the images actually bonded. ``num_spherical`` and ``num_radial`` size the
    angle and distance bases (PyG builds them with sympy: 15 s at the defaults, 2 s at 3 and 3)."""

    def __init__(self, num_spherical: int = 7, num_radial: int = 6, num_blocks: int = 3) -> None:
        super().__init__()
        self.net = dimenet_plus_plus(SCHNET_CUTOFF, num_spherical, num_radial, num_blocks)

    def energy(self, z, pos, batch, pairs) -> torch.Tensor:
        """Each structure's energy ``[B]`` from ``pairs`` (:func:`periodic_pairs`)."""
        from torch_geometric.utils import scatter

        net, nodes = self.net, len(z)
        edge_index, shift = pairs
        source, target = edge_index  # j -> i, PyG's (row, col)
        *_, idx_kj, idx_ji = triplets(edge_index, nodes, shift)
        vector = pos[source] + shift - pos[target]  # [E, 3]: target to the source's image
        dist = vector.norm(dim=-1)
        # DimeNet++'s angle is the one between the directions of k -> j and j -> i (pi minus
        # the angle at j); negating both vectors, as here, leaves it unchanged.
        v_kj, v_ji = vector[idx_kj], vector[idx_ji]  # [T, 3]
        angle = torch.atan2(torch.linalg.cross(v_ji, v_kj).norm(dim=-1), (v_ji * v_kj).sum(dim=-1))
        rbf = net.rbf(dist)  # [E, num_radial]
        sbf = net.sbf(dist, angle, idx_kj)  # [T, num_spherical * num_radial]
        message = net.emb(z, rbf, target, source)  # [E, hidden]: one message per edge
        # Every block's output summed onto the edges' targets, the atoms' energies [N, 1].
        atoms = net.output_blocks[0](message, rbf, target, num_nodes=nodes)
        for interaction, output in zip(net.interaction_blocks, net.output_blocks[1:], strict=True):
            message = interaction(message, rbf, sbf, idx_kj, idx_ji)
            atoms = atoms + output(message, rbf, target, num_nodes=nodes)
        return scatter(atoms, batch, dim=0, reduce="sum").view(-1)

    def forward(self, z, pos, batch, pairs):
        pos = pos.requires_grad_(True)
        energy = self.energy(z, pos, batch, pairs)
        (grad,) = torch.autograd.grad(energy.sum(), pos, create_graph=self.training)
        return energy, -grad


def periodic_pairs(frames: list, offsets: list[int]):
    """``edge_index`` (source, target) and the source's cell shift ``[E, 3]`` of every pair
    within :data:`SCHNET_CUTOFF`, batch-wide atom numbering: as ASE's neighbour list, over as
    many cells along each periodic direction as the cutoff and the atoms' spread need (one cell
    each way misses pairs of a slanted fcc(111) cell whose atoms span almost a whole cell)."""
    import itertools

    sources, targets, shifts = [], [], []
    for frame, first in zip(frames, offsets, strict=True):
        cell = np.asarray(frame.cell)
        reciprocal = np.asarray(frame.cell.reciprocal())  # rows: 1 / plane spacing, no 2 pi
        frac = frame.positions @ reciprocal.T
        reach = [
            math.ceil(np.ptp(frac[:, a]) + SCHNET_CUTOFF * np.linalg.norm(reciprocal[a]))
            if frame.pbc[a]
            else 0
            for a in range(3)
        ]
        cells = itertools.product(*(range(-n, n + 1) for n in reach))
        moves = np.array(list(cells), dtype=np.float64) @ cell
        pos = frame.positions
        gap = pos[None, :, None] + moves[:, None, None] - pos[None, None, :]  # [S, j, i, 3]
        dist = np.linalg.norm(gap, axis=-1)
        keep = (dist < SCHNET_CUTOFF) & (dist > 1e-8)
        s, j, i = np.nonzero(keep)
        sources.append(j + first)
        targets.append(i + first)
        shifts.append(moves[s])
    edge_index = torch.from_numpy(np.stack([np.concatenate(sources), np.concatenate(targets)]))
    return edge_index.long(), torch.from_numpy(np.concatenate(shifts)).float()


def run_row(
    row: str, data: dict, epochs: int, batch_size: int, lr: float, settings: dict | None = None
) -> dict:
    """Train and test one row; ``settings`` replace :data:`SETTINGS`' values."""
    s = {**SETTINGS, **(settings or {})}
    messages, around, min_tag = s["messages"], s["around"], s["min_tag"]
    dimenet_blocks, centrality_cutoff = s["dimenet_blocks"], s["centrality_cutoff"]
    from graphormer.data.collate import GraphormerCollator

    torch.manual_seed(s["seed"])
    relaxed = row.startswith("is2re")
    frames = data["is2re" if relaxed else "slabs"]
    parts = split(len(frames))
    dense = row not in ("schnet_pbc", "dimenet_pbc")
    periodic = row != "graphormer_nopbc"
    graphs = graphs_of(frames, periodic, relaxed, around) if dense else []
    key = "energy_relaxed" if relaxed else None
    energy = torch.tensor(
        [f.info[key] if key else f.get_potential_energy() for f in frames], dtype=torch.float32
    )
    mean, std = float(energy[parts["train"]].mean()), float(energy[parts["train"]].std())
    gradient = row == "graphormer_pbc_gradient"
    vector = row in ("graphormer_pbc", "graphormer_pbc_gradient", "graphormer_nopbc", "is2re_aux")
    if dense:
        # Forces in the energy's standardised units (the vector scale below): force_scale 1.
        forces = "gradient" if gradient else "head"
        model = graphormer(vector, forces, s)
    else:
        model = (
            PeriodicSchNet() if row == "schnet_pbc" else PeriodicDimeNet(num_blocks=dimenet_blocks)
        )
    # The vector target's scale: forces in the energy's standardised units; position changes by
    # their root mean square norm.
    if relaxed:
        change = torch.cat([g.y_atom_vector[:, 0] for g in (graphs[i] for i in parts["train"])])
        change = change[~torch.isnan(change).any(-1)]
        scale = float(change.pow(2).sum(-1).mean().sqrt())
    else:
        scale = std
    collate = GraphormerCollator(max_hops=1)
    steps = epochs * math.ceil(len(parts["train"]) / batch_size)
    optimiser = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, lr, total_steps=steps, pct_start=0.1)
    generator = torch.Generator().manual_seed(s["seed"])

    def outputs(chosen):
        if dense:
            batch = collate([graphs[i] for i in chosen])
            out = model.forward_levels(batch)
            vectors = out.get("atom_vector")
            labels = batch.y_atom_vector
            mask = batch.atom_mask
            pred = None if vectors is None else vectors[:, :, 0][mask]
            target = None if labels is None else labels[:, :, 0][mask]
            return out["molecule"].view(-1), pred, target
        sizes = [len(frames[i]) for i in chosen]
        offsets = np.cumsum([0, *sizes[:-1]]).tolist()
        z = torch.cat([torch.from_numpy(frames[i].numbers) for i in chosen]).long()
        pos = torch.cat([torch.from_numpy(frames[i].positions) for i in chosen]).float()
        batch = torch.arange(len(chosen)).repeat_interleave(torch.tensor(sizes))
        pairs = periodic_pairs([frames[i] for i in chosen], offsets)
        pred_energy, forces = model(z, pos, batch, pairs)
        target = torch.cat([torch.from_numpy(frames[i].get_forces()) for i in chosen]).float()
        return pred_energy, forces, target

    start = time.perf_counter()
    for epoch in range(epochs):
        model.train()
        order = torch.randperm(len(parts["train"]), generator=generator).tolist()
        total = 0.0
        for first in range(0, len(order), batch_size):
            chosen = [parts["train"][i] for i in order[first : first + batch_size]]
            progress = (epoch * len(order) + first) / max(epochs * len(order), 1)
            pred, pred_vec, target_vec = outputs(chosen)
            loss = (pred - (energy[chosen] - mean) / std).abs().mean()
            if pred_vec is not None and target_vec is not None:
                labelled = ~torch.isnan(target_vec).any(-1)
                # Microsoft's 15 -> 1 for the position change; the forces' own weight
                weight = 15.0 - 14.0 * progress if relaxed else s["force_weight"]
                error = (pred_vec[labelled] - target_vec[labelled] / scale).abs().mean()
                loss = loss + weight * error
            optimiser.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
            optimiser.step()
            schedule.step()
            total += float(loss.detach())
        print(f"  {row} epoch {epoch + 1}/{epochs} train loss {total:.3f}", flush=True)
    model.eval()
    energy_error, force_error, atoms = [], 0.0, 0
    for first in range(0, len(parts["test"]), 32):
        chosen = parts["test"][first : first + 32]
        with torch.set_grad_enabled(not dense):
            pred, pred_vec, target_vec = outputs(chosen)
        energy_error += (pred.detach() * std + mean - energy[chosen]).abs().tolist()
        if pred_vec is not None and not relaxed:
            force_error += float((pred_vec.detach() * scale - target_vec).abs().sum())
            atoms += target_vec.numel()
    return {
        "row": row
        + "+messages" * (messages and dense)
        + "+vectors" * (messages and s["vector_messages"] and dense)
        + "+grid" * (messages and s["message_basis"] == "grid" and dense)
        + "+all_atoms" * (min_tag == 0 and dense)
        + "+all_images" * (around == "all" and dense and periodic)
        + f"+{dimenet_blocks}_blocks" * (row == "dimenet_pbc" and dimenet_blocks != 3)
        + (f"+local_centrality_{centrality_cutoff:g}" if centrality_cutoff and dense else "")
        + "+gated_centrality" * (s["centrality_gates"] and dense)
        + "+grid_centrality" * (s["centrality_basis"] == "grid" and dense)
        + (f"+angles_{s['angle_cutoff']:g}" if s["angle_cutoff"] and dense else "")
        + f"+angular_messages_{s['angular_messages']}"
        * (messages and s["angular_messages"] > 0 and dense)
        + f"+layers_{s['layers']}" * (s["layers"] != SETTINGS["layers"] and dense)
        + f"+width_{s['width']}" * (s["width"] != SETTINGS["width"] and dense)
        + f"+force_weight_{s['force_weight']:g}"
        * (s["force_weight"] != SETTINGS["force_weight"] and not relaxed)
        + f"+seed_{s['seed']}" * (s["seed"] != 0),
        "energy_mae": float(np.mean(energy_error)),
        "energy_median": float(np.median(energy_error)),
        "energy_errors": energy_error,
        "force_mae": force_error / atoms if atoms else None,
        "wall_s": time.perf_counter() - start,
    }


def mean_rows(data: dict) -> list[dict]:
    found = []
    for name, key in (("slabs", None), ("is2re", "energy_relaxed")):
        frames = data[name]
        parts = split(len(frames))
        energy = np.array([f.info[key] if key else f.get_potential_energy() for f in frames])
        guess = energy[parts["train"]].mean()
        forces = None
        if key is None:
            forces = float(np.mean([np.abs(frames[i].get_forces()).mean() for i in parts["test"]]))
        errors = np.abs(energy[parts["test"]] - guess)
        found.append(
            {
                "row": f"training mean ({name})",
                "energy_mae": float(errors.mean()),
                "energy_median": float(np.median(errors)),
                "force_mae": forces,
                "wall_s": 0.0,
            }
        )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--structures", type=int, default=600)
    parser.add_argument("--relaxed", type=int, default=300)
    parser.add_argument("--relax-steps", type=int, default=50)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument(
        "--force-weight",
        type=float,
        default=1.0,
        help="the slab rows' force loss weight beside the energy's (the IS2RE rows keep "
        "Microsoft's 15 -> 1 for the position change)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="every row's initialisation and batch order (the data and its split stay fixed): "
        "rerun with another seed to see how far a row moves by chance",
    )
    parser.add_argument(
        "--messages",
        action="store_true",
        help="the Graphormer rows with model.distance_messages=true (cutoff 5 A, as SchNet's)",
    )
    parser.add_argument(
        "--min-tag",
        type=int,
        choices=(0, 1),
        default=1,
        help="the Graphormers' energy sums the atoms of tag at least this "
        "(model.readout_min_tag): 1, Microsoft's readout, the atoms that move; 0, every atom, "
        "as SchNet and DimeNet++ sum",
    )
    parser.add_argument(
        "--pbc-around",
        choices=("adsorbate", "all"),
        default="adsorbate",
        help="the Graphormers' periodic images near the adsorbate atoms (Microsoft's) or near "
        "every atom (dataset.pbc_around=all: each atom's whole neighbourhood within the images' "
        "cutoff, as SchNet's and DimeNet++'s neighbour lists)",
    )
    parser.add_argument(
        "--dimenet-blocks",
        type=int,
        default=3,
        help="DimeNet++'s interaction blocks (3); 0 keeps its embedding and first output "
        "block: an embedded-atom form of pair sums, no angles",
    )
    parser.add_argument(
        "--centrality-cutoff",
        type=float,
        default=None,
        help="the Graphormers' 3D centrality sums the pairs closer than this, faded smoothly "
        "(model.centrality_cutoff; default: every pair, Graphormer-3D's)",
    )
    parser.add_argument(
        "--centrality-gates",
        action="store_true",
        help="the Graphormers' 3D centrality gates each pair's kernels by its pair of elements "
        "(model.centrality_gates)",
    )
    parser.add_argument(
        "--vector-messages",
        action="store_true",
        help="with --messages, the messages also carry vectors (model.vector_messages: PaiNN's "
        "equivariant message and update)",
    )
    parser.add_argument(
        "--centrality-basis",
        choices=("kernels", "grid"),
        default="kernels",
        help="with --centrality-cutoff, what the Graphormers' 3D centrality sums "
        "(model.centrality_basis): the learned kernels, or a fixed Gaussian grid",
    )
    parser.add_argument(
        "--message-basis",
        choices=("kernels", "grid"),
        default="kernels",
        help="with --messages, what the messages' filters read (model.message_basis): the "
        "distance encoding's learned kernels, or SchNet's fixed Gaussian grid",
    )
    parser.add_argument(
        "--angle-cutoff",
        type=float,
        help="the Graphormers' atoms add a histogram of the angles between their neighbours "
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
    args = parser.parse_args()
    if args.angular_messages < 0:
        parser.error(f"--angular-messages {args.angular_messages}: give 0 (none) or more")
    if args.angular_messages and not args.messages:
        parser.error("--angular-messages adds angles to the distance messages: add --messages")
    if args.angle_cutoff is not None and not 0 < args.angle_cutoff <= PBC_CUTOFF:
        parser.error(
            f"--angle-cutoff {args.angle_cutoff}: give a distance above 0 A and at most the "
            f"periodic images' {PBC_CUTOFF:g} A"
        )
    if args.vector_messages and not args.messages:
        parser.error("--vector-messages adds vectors to the distance messages: add --messages")
    if args.centrality_basis != "kernels" and args.centrality_cutoff is None:
        parser.error(
            "--centrality-basis grid spans 0 to the centrality's cutoff: add --centrality-cutoff"
        )
    if args.message_basis != "kernels" and not args.messages:
        parser.error("--message-basis chooses what the distance messages read: add --messages")
    settings = {key: getattr(args, key) for key in SETTINGS if key != "around"}
    settings["around"] = args.pbc_around
    if args.quick:
        args.structures, args.relaxed, args.relax_steps, args.epochs = 40, 24, 10, 2
    # Subnormal floats read and written as zero for every row, as train.py trains on a CPU (the
    # 3D kernels hold some; they take a slow path in the CPU's arithmetic), set before torch
    # starts any thread.
    torch.set_flush_denormal(True)
    torch.set_num_threads(1)
    data = build_data(args.work, args.structures, args.relaxed, args.relax_steps)
    print(
        f"structures: {len(data['slabs'])} (IS2RE: {len(data['is2re'])}); epochs "
        f"{args.epochs}, batch {args.batch_size}, lr {args.lr}",
        flush=True,
    )
    results = mean_rows(data) if "mean" in args.rows else []
    for row in [r for r in args.rows if r != "mean"]:
        results.append(run_row(row, data, args.epochs, args.batch_size, args.lr, settings))
    print(
        "\n| model | test energy MAE (eV) | median energy error (eV) | test force MAE (eV/A) "
        "| wall (s) |"
    )
    print("|---|---|---|---|---|")
    for r in results:
        force = "-" if r["force_mae"] is None else f"{r['force_mae']:.3f}"
        print(
            f"| {r['row']} | {r['energy_mae']:.3f} | {r['energy_median']:.3f} | {force} "
            f"| {r['wall_s']:.0f} |"
        )
    # One file per data size and budget; a row's name holds its model and loss settings, so the
    # rows of earlier commands with other settings stay and a rerun of a row replaces it.
    budget = f"{args.structures}_{args.relaxed}_{args.epochs}_{args.batch_size}_{args.lr:g}"
    merge_results(args.work / f"results_{budget}.json", results)


if __name__ == "__main__":
    main()
