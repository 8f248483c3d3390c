"""Fine-tuning a new run from a checkpoint of ours (trained, or converted by
:mod:`graphormer.interop`) without ever loading it silently wrong."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from graphormer import checkpoint as checkpoints
from graphormer.checkpoint import CheckpointError
from graphormer.console import report as console_report
from graphormer.models.graphormer import GraphormerConfig
from graphormer.training.module import GraphormerModule, masked_loss

__all__ = [
    "HeadProbe",
    "PretrainedReport",
    "ProbeReport",
    "architecture",
    "load_pretrained",
    "probe_new_head",
]

log = logging.getLogger(__name__)

# Settings that change what the same tensors compute, or which tensors exist: a checkpoint trained
# with other values does not fit, even where names and shapes happen to agree (pre- vs post-LN).
_STRUCTURE = (
    "num_layers",
    "hidden_dim",
    "ffn_dim",
    "num_heads",
    "pre_layernorm",
    "uses_embedding_layernorm",
    "final_layernorm",
    "atom_feature_dims",
    "bond_feature_dims",
    "node_continuous_dim",
    "edge_continuous_dim",
    "feature_stride",
    "max_degree",
    "max_distance",
    "unreachable_as_far",
    "edge_encoding",
    "multi_hop_max_dist",
    "attention_max_distance",
    # The 3D channel: whether the distance encoding exists, its kernels and what pairs it sees.
    "channels",
    "num_kernels",
    "cutoff",
    "centrality_cutoff",
    "centrality_gates",
    "centrality_basis",
    "angle_cutoff",
    # Periodic structures: the tag embedding's rows, and how often the layers run.
    "num_tags",
    "blocks",
    # Messages through distance filters: whether their blocks exist, how far they reach, and
    # whether they carry vectors, what their filters read, and the angles they add.
    "distance_messages",
    "message_cutoff",
    "vector_messages",
    "message_basis",
    "angular_messages",
    "directional_messages",
    # How the attention's scores become weights.
    "attention_activation",
)


def architecture(model: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of a checkpoint's ``model`` that make its network what it is (which tensors
    exist, their shapes, what they compute), by config key; regularisation (dropouts), the
    number of tasks and the output layer are the fine-tuning run's own."""
    keys = ["embedding_layernorm" if k == "uses_embedding_layernorm" else k for k in _STRUCTURE]
    return {k: model[k] for k in keys if k in model}


def _is_output_layer(name: str) -> bool:
    # The molecule output layer, the heads of atom and bond targets (issue #18) and the
    # molecule-feature input (issue #22: its features and training statistics are the new
    # dataset's) and the readout's map (issue #22: token_sum's is per task; token_mean's is new
    # whenever the checkpoint read the graph token alone): the new task's own.
    prefixes = (
        "model.head.",
        "model.atom_head.",
        "model.bond_head.",
        "model.vector_head.",
        "model.vector_out.",
        "model.molecule_input.",
        "model.readout.",
    )
    return name.startswith(prefixes) or name == "model.head_bias"


def _is_molecule_head(name: str) -> bool:
    return name.startswith(("model.head_transform.", "model.head_norm."))


@dataclass
class PretrainedReport:
    """What :func:`load_pretrained` copied, re-initialised and found not to fit.

    Attributes:
        path: the checkpoint.
        copied: our tensors initialised from it.
        num_parameters: the number of values in ``copied``.
        output_layer: the output layer's tensors, re-initialised for the new task.
        not_in_checkpoint: our tensors the checkpoint lacks (they keep their fresh initialisation).
        not_in_model: the checkpoint's network tensors this model has no place for.
        shape_mismatches: ``"name [checkpoint shape] vs [our shape]"`` for tensors not copied.
        setting_differences: ``"key: checkpoint value vs ours"`` for settings that change what the
            network computes.
        unused_head: the checkpoint's molecule head, left out by a model of atom targets alone
            (issue #18).
    """

    path: str
    copied: list[str] = field(default_factory=list)
    num_parameters: int = 0
    output_layer: list[str] = field(default_factory=list)
    not_in_checkpoint: list[str] = field(default_factory=list)
    not_in_model: list[str] = field(default_factory=list)
    shape_mismatches: list[str] = field(default_factory=list)
    setting_differences: list[str] = field(default_factory=list)
    unused_head: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        """True when every network tensor but the output layer was copied, with equal settings."""
        return not (
            self.not_in_checkpoint
            or self.not_in_model
            or self.shape_mismatches
            or self.setting_differences
        )

    def problems(self) -> str:
        parts = []
        if self.setting_differences:
            parts.append(
                "settings differ (checkpoint vs this model): " + _listing(self.setting_differences)
            )
        if self.shape_mismatches:
            parts.append(
                "shapes differ (checkpoint vs this model): " + _listing(self.shape_mismatches)
            )
        if self.not_in_model:
            parts.append("not in this model: " + _listing(self.not_in_model))
        if self.not_in_checkpoint:
            parts.append("not in the checkpoint: " + _listing(self.not_in_checkpoint))
        return "; ".join(parts)

    def summary(self) -> str:
        text = (
            f"pretrained={self.path}: copied {len(self.copied)} tensors "
            f"({self.num_parameters:,} parameters); re-initialised for the new task: "
            f"{', '.join(self.output_layer)}"
        )
        heads = sorted({name.split(".")[1] for name in self.output_layer})
        if "atom_head" in heads:
            text += " (new atom head: the atom targets of this run)"
        if "bond_head" in heads:
            text += " (new bond head: fine-tuning the encoder into bond targets)"
        if self.unused_head:
            text += (
                f"; left out (the checkpoint's molecule head; this model predicts atom or bond "
                f"targets alone): {_listing(self.unused_head)}"
            )
        if self.not_in_checkpoint:
            text += f"; re-initialised (not in the checkpoint): {_listing(self.not_in_checkpoint)}"
        return text


def _listing(items: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


# The network's buffers that standardise the task's targets, as the module's target_mean and
# target_std do: the new task's own (set in setup), never copied from a checkpoint.
_TASK_BUFFERS = frozenset({"model.force_scale"})  # model.forces=gradient's energy-to-force scale


def _is_network(name: str) -> bool:
    """A tensor of the network (``model.``) that fine-tuning copies."""
    return name.startswith("model.") and name not in _TASK_BUFFERS


def load_pretrained(module: GraphormerModule, path: str, strict: bool = True) -> PretrainedReport:
    """Initialises ``module``'s network from a checkpoint of ours (trained or converted) to
    fine-tune it.

    Every network tensor is copied except the output layer, which is re-initialised for the new
    task as Microsoft's Graphormer does when fine-tuning; the target standardisation belongs to the
    new task and is not copied either. The checkpoint must fit: the same structural settings and,
    tensor for tensor, the same names and shapes.

    Args:
        module (GraphormerModule): the new run's module.
        path (str): a checkpoint written by ``train.py`` or ``scripts/convert.py``.
        strict (bool, optional): a checkpoint that does not fit is an error (the config key
            ``pretrained_strict``); if False, the tensors that fit are copied and a WARNING lists
            the rest. A checkpoint with no tensor in common is an error either way.
            (default: :obj:`True`)

    Returns:
        A :class:`PretrainedReport`, also logged.

    Raises:
        CheckpointError: the file is missing or unreadable, shares no tensor with the model, or
            (``strict``) does not fit it.
    """
    if not Path(path).is_file():
        raise CheckpointError(
            f"pretrained={path} does not exist; give a checkpoint written by train.py or "
            "scripts/convert.py"
        )
    record = checkpoints.load(path)
    state = record.state_dict
    own = module.state_dict()
    report = PretrainedReport(str(path))
    report.setting_differences = _setting_differences(record.model, module.config, path)
    theirs = {k: v for k, v in state.items() if _is_network(k) and not _is_output_layer(k)}
    mine = {k: v for k, v in own.items() if _is_network(k)}
    if module.config.num_tasks == 0:  # atom/bond targets alone: no molecule head to copy into
        report.unused_head = sorted(k for k in theirs if _is_molecule_head(k))
        theirs = {k: v for k, v in theirs.items() if not _is_molecule_head(k)}
    report.output_layer = sorted(k for k in mine if _is_output_layer(k))
    matched = {}
    for name, tensor in mine.items():
        if _is_output_layer(name):
            continue
        if name not in theirs:
            report.not_in_checkpoint.append(name)
        elif theirs[name].shape != tensor.shape:
            report.shape_mismatches.append(
                f"{name} {list(theirs[name].shape)} vs {list(tensor.shape)}"
            )
        else:
            matched[name] = theirs[name]
    report.not_in_model = sorted(k for k in theirs if k not in mine)
    report.copied = sorted(matched)
    report.num_parameters = sum(t.numel() for t in matched.values())
    if not matched:
        raise CheckpointError(
            f"pretrained={path} shares no tensor with this model (name and shape): "
            f"{report.problems()}. Use a checkpoint of this architecture"
        )
    if not report.fits:
        if strict:
            raise CheckpointError(
                f"pretrained={path} does not fit this model: {report.problems()}. Set the model "
                "options the checkpoint was trained with (its hyper_parameters.model), or "
                "pretrained_strict=false to copy only the tensors that fit"
            )
        log.warning("%s; copied only the tensors that fit: %s", report.summary(), report.problems())
    module.load_state_dict(matched, strict=False)
    # Debug only: train() reports the summary on the console and in train.log once.
    log.debug(report.summary())
    return report


def _setting_differences(
    stored: Mapping[str, Any], config: GraphormerConfig, path: str
) -> list[str]:
    try:
        theirs = GraphormerConfig.from_dict(
            {
                **stored,
                "num_tasks": config.num_tasks,
                "atom_tasks": config.atom_tasks,
                "bond_tasks": config.bond_tasks,
            }
        )
    except (TypeError, ValueError) as error:
        raise CheckpointError(
            f"pretrained={path} describes a model this version cannot build ({error})"
        ) from error
    differences = []
    for key in _STRUCTURE:
        a, b = getattr(theirs, key), getattr(config, key)
        if a != b:
            name = "embedding_layernorm" if key == "uses_embedding_layernorm" else key
            differences.append(f"model.{name} {a!r} vs {b!r}")
    return differences


# pretrained_head=probe: at most this many training (and validation) graphs feed the fit.
PROBE_MAX_GRAPHS = 50_000
# The L2 penalties on the output layer's weights tried; the validation loss chooses one.
PROBE_PENALTIES = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)
# Without labelled validation graphs, this one.
PROBE_DEFAULT_PENALTY = 1e-2


@dataclass
class ProbeReport:
    """What ``pretrained_head=probe`` fitted (:func:`probe_new_head`).

    Attributes:
        fitted: the tensors fitted (``model.head.weight`` ...); empty for a model with no
            molecule head (atom or bond targets alone).
        graphs: training graphs the fit read.
        penalty: the L2 penalty chosen.
        valid_before: the validation loss (the training loss's, standardised targets) with the
            re-initialised output layer; None without labelled validation graphs.
        valid_after: the same with the fitted layer.
    """

    fitted: list[str] = field(default_factory=list)
    graphs: int = 0
    penalty: float = PROBE_DEFAULT_PENALTY
    valid_before: float | None = None
    valid_after: float | None = None

    def summary(self) -> str:
        if not self.fitted:
            return (
                "pretrained_head=probe: this model has no molecule output layer to fit (its "
                "atom and bond heads start re-initialised)"
            )
        text = (
            f"pretrained_head=probe: fitted {', '.join(self.fitted)} on the frozen pre-trained "
            f"network ({self.graphs:,} training graphs, L2 penalty {self.penalty:g}"
        )
        if self.valid_before is not None and self.valid_after is not None:
            text += (
                f"; validation loss {self.valid_before:.4g} re-initialised, "
                f"{self.valid_after:.4g} fitted"
            )
        return text + "); fine-tuning starts from it"


def probe_new_head(module: GraphormerModule, datamodule: Any, device: torch.device) -> ProbeReport:
    """Fits the new task's molecule output layer on the frozen pre-trained network: the first
    step of linear-probe-then-fine-tune (Kumar et al., ICLR 2022), whose fine-tuning then starts
    from a fitted output layer rather than a random one that would first pull the pre-trained
    features towards its noise.

    The molecule output is linear in :meth:`Graphormer.head_inputs` (the head's state and, for
    ``readout=token_sum``, the atoms' sum), so the fit is a generalised linear model on them,
    computed once in eval mode (no dropout): the training loss itself (squared error on
    standardised targets, binary or multi-class cross-entropy, L1; missing labels skipped) plus
    an L2 penalty on the layer's weights, minimised in float64 (:func:`_fit_linear`) for each of
    :data:`PROBE_PENALTIES`, keeping the one of least validation loss. The fitted maps replace
    ``model.head`` (and ``model.readout`` for ``token_sum``; a shared ``head_bias`` takes the
    intercept). Atom and bond heads keep their initialisation. Measured on issue #22's built
    sets it fine-tuned worse than the random start (docs/benchmarks/small-set-defaults.md), so it is opt-in.

    Args:
        module (GraphormerModule): the fine-tuning run's module, after :func:`load_pretrained`
            and the module's ``setup`` (the target standardisation).
        datamodule: its :class:`~graphormer.data.datamodule.GraphDataModule`, set up.
        device (torch.device): where the network runs.
    """
    model = module.model
    report = ProbeReport()
    if model.head is None:
        return report
    train = _head_features(module, datamodule.probe_dataloader("train", PROBE_MAX_GRAPHS), device)
    valid = None
    if datamodule.split_sizes().get("valid") and datamodule.is_labelled("valid"):
        valid = _head_features(
            module, datamodule.probe_dataloader("valid", PROBE_MAX_GRAPHS), device
        )
    report.graphs = len(train[0])
    name = module.loss_name
    shared = model.head_bias is not None
    x_train, centre = _centred(torch.cat(train[:-1], 1), centred=not shared)
    y_train = _standardised(module, train[-1])
    outputs = model.head.out_features

    def fit(penalty: float) -> tuple[torch.Tensor, torch.Tensor]:
        return _fit_linear(name, x_train, y_train, outputs, shared, penalty)

    if valid is not None:
        x_valid = torch.cat(valid[:-1], 1)
        y_valid = _standardised(module, valid[-1])
        weight, bias = _current_maps(model)
        report.valid_before = float(masked_loss(x_valid @ weight + bias, y_valid, name))
        fits = []
        for penalty in PROBE_PENALTIES:
            weight, bias = fit(penalty)
            with torch.no_grad():
                score = float(masked_loss((x_valid - centre) @ weight + bias, y_valid, name))
            fits.append((score, -penalty, penalty, weight, bias))
        report.valid_after, _, report.penalty, weight, bias = min(fits, key=lambda f: f[:2])
    else:
        report.penalty = PROBE_DEFAULT_PENALTY
        weight, bias = fit(report.penalty)
    bias = bias - centre @ weight  # W (x - c) + b = W x + (b - W c)
    width = model.head.in_features
    fitted = {"model.head.weight": weight[:width].T}
    if model.readout is not None and model.config.readout == "token_sum":
        fitted["model.readout.weight"] = weight[width:].T
    if shared:
        fitted["model.head_bias"] = bias.reshape(1)
    else:
        fitted["model.head.bias"] = bias
    trainer = getattr(module, "_trainer", None)
    if trainer is not None and trainer.world_size > 1:
        # Every rank fitted on the same graphs; rank 0's fit, exactly, for all.
        fitted = trainer.strategy.broadcast({k: v.cpu() for k, v in fitted.items()}, src=0)
    own = dict(module.named_parameters())
    with torch.no_grad():
        for name, value in fitted.items():
            own[name].copy_(value.to(own[name].dtype))
    report.fitted = sorted(fitted)
    return report


def _head_features(
    module: GraphormerModule, loader: Any, device: torch.device
) -> tuple[torch.Tensor, ...]:
    """``(state [N, d], atoms [N, d] (token_sum only), targets [N, T])`` in float64 on the CPU,
    from the network in eval mode."""
    model = module.model
    training = model.training
    model.eval()
    states, atom_sums, targets = [], [], []
    try:
        with torch.no_grad():
            for batch in loader:
                batch = batch.to(device)
                h, _ = model.encode(batch)
                state, atoms = model.head_inputs(h, batch)
                states.append(state.double().cpu())
                if atoms is not None:  # token_sum's
                    atom_sums.append(atoms.double().cpu())
                targets.append(batch.y.view(batch.num_graphs, -1).double().cpu())
    finally:
        model.train(training)
    parts = [torch.cat(states)] + ([torch.cat(atom_sums)] if atom_sums else [])
    return (*parts, torch.cat(targets))


def _standardised(module: GraphormerModule, y: torch.Tensor) -> torch.Tensor:
    """Targets as training's loss compares them (in its float32), back in float64."""
    return module.standardised_targets(y.to(module.target_mean)).double().cpu()


def _centred(x: torch.Tensor, centred: bool) -> tuple[torch.Tensor, torch.Tensor]:
    centre = x.mean(0) if centred else torch.zeros_like(x[0])
    return x - centre, centre


def _current_maps(model: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The output maps as they are, as one ``[D, T]`` weight and a ``[T]`` bias on raw features."""
    weights = [model.head.weight.detach().double().cpu().T]
    if model.readout is not None and model.config.readout == "token_sum":
        weights.append(model.readout.weight.detach().double().cpu().T)
    bias = torch.zeros(model.head.out_features, dtype=torch.float64)
    if model.head.bias is not None:
        bias = bias + model.head.bias.detach().double().cpu()
    if model.head_bias is not None:
        bias = bias + model.head_bias.detach().double().cpu()
    return torch.cat(weights), bias


def _fit_linear(
    name: str,
    x: torch.Tensor,
    y: torch.Tensor,
    outputs: int,
    shared: bool,
    penalty: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``W [D, T]``, ``b`` minimising the training loss of ``x W + b`` plus ``penalty |W|^2``
    (``x`` centred unless ``shared``): ridge regression in closed form for the squared error,
    Newton's method for binary cross-entropy, L-BFGS otherwise (a shared bias, multi-class
    cross-entropy, L1)."""
    if name == "mse" and not shared:
        return _ridge(x, y, penalty)
    if name == "bce" and not shared:
        return _logistic(x, y, penalty)
    weight = torch.zeros(x.size(1), outputs, dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(1 if shared else outputs, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS(
        [weight, bias],
        lr=1.0,
        max_iter=500,
        tolerance_grad=1e-10,
        tolerance_change=1e-14,
        history_size=50,
        line_search_fn="strong_wolfe",
    )

    def objective() -> torch.Tensor:
        optimizer.zero_grad()
        value = masked_loss(x @ weight + bias, y, name) + penalty * weight.pow(2).sum()
        value.backward()
        return value

    optimizer.step(objective)
    return weight.detach(), bias.detach()


def _logistic(x: torch.Tensor, y: torch.Tensor, penalty: float) -> tuple[torch.Tensor, ...]:
    """The exact minimum of masked_loss's binary cross-entropy over the labelled entries (of
    all tasks together) plus ``penalty |W|^2``: per task, L2-penalised logistic regression on
    its labelled rows by Newton's method with backtracking."""
    labelled = ~torch.isnan(y)
    count = int(labelled.sum())
    weight = torch.zeros(x.size(1), y.size(1), dtype=torch.float64)
    bias = torch.zeros(y.size(1), dtype=torch.float64)
    for t in range(y.size(1)):
        rows = labelled[:, t]
        if not rows.any():
            continue
        design = torch.cat([x[rows], torch.ones(int(rows.sum()), 1, dtype=x.dtype)], 1)
        ridge = torch.full((design.size(1),), 2 * penalty, dtype=x.dtype)
        ridge[-1] = 0.0  # the intercept is not penalised
        theta = _newton_logistic(design, y[rows, t], ridge, count)
        weight[:, t], bias[t] = theta[:-1], theta[-1]
    return weight, bias


def _newton_logistic(
    design: torch.Tensor, target: torch.Tensor, ridge: torch.Tensor, count: int
) -> torch.Tensor:
    """``theta`` minimising ``sum(log-loss(design theta, target)) / count + |sqrt(ridge)
    theta|^2 / 2`` (a convex function) by Newton's method with backtracking."""

    def objective(theta: torch.Tensor) -> torch.Tensor:
        logits = design @ theta
        data = (torch.nn.functional.softplus(logits) - target * logits).sum() / count
        return data + 0.5 * (ridge * theta * theta).sum()

    theta = torch.zeros(design.size(1), dtype=design.dtype)
    value = objective(theta)
    for _ in range(100):
        p = torch.sigmoid(design @ theta)
        gradient = design.T @ (p - target) / count + ridge * theta
        hessian = (design.T * (p * (1 - p))) @ design / count + torch.diag(ridge)
        step = torch.linalg.solve(hessian + 1e-12 * torch.eye(len(theta)), gradient)
        size = 1.0
        while size > 1e-10:
            candidate = objective(theta - size * step)
            if candidate <= value:
                break
            size /= 2
        else:
            break  # no decrease along Newton's direction: the minimum, to rounding
        theta, previous, value = theta - size * step, value, candidate
        if previous - value <= 1e-15 * max(1.0, abs(float(value))):
            break
    return theta


def _ridge(x: torch.Tensor, y: torch.Tensor, penalty: float) -> tuple[torch.Tensor, ...]:
    """The exact minimum of masked_loss's mean squared error over the labelled entries (of all
    tasks together) plus ``penalty |W|^2``, on centred ``x``: per task, ridge regression on its
    labelled rows with ``penalty`` times the number of labelled entries."""
    labelled = ~torch.isnan(y)  # [N, T]
    count = int(labelled.sum())
    weight = torch.zeros(x.size(1), y.size(1), dtype=torch.float64)
    bias = torch.zeros(y.size(1), dtype=torch.float64)
    eye = torch.eye(x.size(1), dtype=torch.float64)
    for t in range(y.size(1)):
        rows = labelled[:, t]
        if not rows.any():
            continue
        xt, yt = x[rows], y[rows, t]
        mean_x, mean_y = xt.mean(0), yt.mean()
        xc = xt - mean_x
        weight[:, t] = torch.linalg.solve(xc.T @ xc + penalty * count * eye, xc.T @ (yt - mean_y))
        bias[t] = mean_y - mean_x @ weight[:, t]
    return weight, bias


class HeadProbe(pl.Callback):
    """``pretrained_head=probe``: :func:`probe_new_head` once, as fitting starts (the network on
    its device, the targets' standardisation set); a resume never probes (its weights are its
    checkpoint's)."""

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        found = probe_new_head(pl_module, trainer.datamodule, pl_module.device)
        if trainer.is_global_zero:
            console_report(found.summary())
