"""Convert published Graphormer weights: python scripts/convert.py source=PATH output=FILE.ckpt"""

import shlex

import hydra
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from graphormer.console import report
from graphormer.errors import run_reporting_errors
from graphormer.interop import convert_checkpoint, fine_tune_overrides


def model_presets() -> dict[str, dict]:
    """Every ``configs/model`` preset, composed as train.py composes it."""
    loader = GlobalHydra.instance().config_loader()
    return {
        name: OmegaConf.to_container(
            hydra.compose(config_name="train", overrides=[f"model={name}"]).model, resolve=True
        )
        for name in loader.get_group_options("model")
    }


def convert(cfg: DictConfig) -> None:
    values = OmegaConf.to_container(cfg, resolve=True)
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
    overrides = [f"pretrained={path.resolve()}", *fine_tune_overrides(config, model_presets())]
    command = " ".join(shlex.quote(o) for o in overrides)
    report(f"fine-tune with: python scripts/train.py {command} dataset=...")


@hydra.main(config_path="../configs", config_name="convert", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_reporting_errors(convert, cfg)


if __name__ == "__main__":
    main()
