"""``graphormer-convert`` (``python scripts/convert.py``): Microsoft's or Hugging Face's Graphormer
weights into a graphormer checkpoint.

graphormer-convert source=PATH output=FILE.ckpt [overwrite=true] [key=value ...]
"""

from __future__ import annotations

import shlex

import hydra
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from graphormer.cli.common import console_command, plain
from graphormer.console import command as program
from graphormer.console import report
from graphormer.outputs import check_outputs

__all__ = ["main", "model_presets", "run"]


def model_presets() -> dict[str, dict]:
    """Every ``configs/model`` preset, composed as graphormer-train composes it."""
    loader = GlobalHydra.instance().config_loader()
    return {
        name: OmegaConf.to_container(
            hydra.compose(config_name="train", overrides=[f"model={name}"]).model, resolve=True
        )
        for name in loader.get_group_options("model")
    }


def run(cfg: DictConfig) -> None:
    from graphormer.interop import convert_checkpoint, fine_tune_overrides

    values = plain(cfg)
    check_outputs(
        {"output": values["output"]},
        {"source": values["source"]},
        overwrite=bool(values.get("overwrite")),
    )
    path, config = convert_checkpoint(
        values["source"],
        values["output"],
        trust_source=bool(values["trust_source"]),
        convention=values["convention"],
        settings=values["settings"],
        atom_feature_dims=values["atom_feature_dims"],
        bond_feature_dims=values["bond_feature_dims"],
        num_tasks=values["num_tasks"],
        task=values["task"],
    )
    layers = "pre-LN" if config.pre_layernorm else "post-LN"
    report(
        f"converted {values['source']}: {config.num_layers} x {config.hidden_dim}, "
        f"{config.num_heads} heads, {layers}, {config.edge_encoding}, {config.num_tasks} output(s)"
    )
    report(f"wrote {path.resolve()}")
    # Microsoft fine-tuned its published weights at peak lr 2e-4 (our plain default is 1e-3).
    overrides = [
        f"pretrained={path.resolve()}",
        *fine_tune_overrides(config, model_presets()),
        "optim.lr=2e-4",
    ]
    command = " ".join(shlex.quote(o) for o in overrides)
    report(f"fine-tune with: {program('train')} {command} dataset=...")


main = console_command("convert", run)


if __name__ == "__main__":
    main()
