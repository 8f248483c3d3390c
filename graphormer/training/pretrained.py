"""Fine-tuning: initialise a new run's network from another checkpoint's weights."""

from __future__ import annotations

import logging

from graphormer.training.checkpoint import load_checkpoint_file
from graphormer.training.module import GraphormerModule

__all__ = ["load_pretrained"]

log = logging.getLogger(__name__)


def load_pretrained(module: GraphormerModule, path: str, strict: bool = True) -> None:
    """Initialises ``module`` from another run's checkpoint for fine-tuning.

    Every network weight whose name and shape match is copied except the final output layer,
    which is re-initialised as Microsoft's Graphormer does when fine-tuning; the target
    standardisation belongs to the new task and is not copied either.
    """
    state = load_checkpoint_file(path)["state_dict"]
    own = module.state_dict()
    matched = {
        k: v
        for k, v in state.items()
        if k.startswith("model.")
        and not k.startswith("model.head.")
        and k in own
        and own[k].shape == v.shape
    }
    if not matched:
        raise ValueError(f"pretrained={path} shares no weights with this model configuration")
    module.load_state_dict(matched, strict=False)
    fresh = sorted(k for k in own if k not in matched)
    log.info("initialised %d tensors from %s; newly initialised: %s", len(matched), path, fresh)
