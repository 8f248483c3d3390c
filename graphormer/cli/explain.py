"""``graphormer-explain`` (``python scripts/explain.py``): attention pictures of molecules.

graphormer-explain ckpt=PATH smiles=SMILES|[S1,S2,...] output=DIR [size=600] [overwrite=true]
graphormer-explain ckpt=PATH input=FRAMES.extxyz output=DIR   (a structure file's frames)

Writes DIR/mol_<i>/: rollout.png and layers.png (atoms shaded by the graph token's attention),
heads_layer<l>.png (per-head heatmaps), attention.npy and rollout.npy (the raw maps), and the
per-atom values a model gives (atom targets, token_sum contributions, vector norms).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig

from graphormer.cli.common import (
    checkpoint_inputs,
    console_command,
    plain,
)
from graphormer.console import report
from graphormer.errors import ConfigError, DataError
from graphormer.outputs import check_outputs

__all__ = ["main", "run"]

# Molecules whose attention is computed in one batch.
_BATCH = 16


def run(cfg: DictConfig) -> list[Path]:
    """Writes, for each SMILES of ``smiles``, a folder ``output/mol_<i>`` of pictures and maps
    (see :func:`~graphormer.inference.write_explanation`); returns the folders."""
    from graphormer.data.featurize import featurize_smiles
    from graphormer.inference.explain import norms, write_explanation
    from graphormer.inference.pictures import check_picture_size
    from graphormer.inference.predictor import Predictor

    cfg = plain(cfg)
    structures = cfg.get("input")
    if structures is not None and cfg.get("smiles") is not None:
        raise ConfigError("give either input=FILE or smiles=[...], not both")
    if structures is not None:
        _check_structure_file(structures)
    else:
        smiles = _smiles_list(cfg.get("smiles"))
    check_picture_size(cfg["size"])
    if not cfg.get("output"):
        raise ConfigError("give output=DIR, the folder to write the pictures to")
    check_outputs(
        {"output": cfg["output"]},
        {**checkpoint_inputs(cfg["ckpt"]), **({"input": structures} if structures else {})},
        overwrite=bool(cfg.get("overwrite")),
        folders=("output",),
    )
    predictor = Predictor.from_checkpoint(
        cfg["ckpt"],
        device=cfg["device"],
        precision=cfg.get("precision"),
        max_atoms=cfg.get("max_atoms"),
    )
    if structures is not None:
        from graphormer.inference.attention import structure_attention_maps

        path = str(Path(str(structures)).expanduser())
        graphs = predictor.structure_graphs(path)
        count = len(graphs)

        def explain(start: int, stop: int) -> list:
            return structure_attention_maps(predictor, graphs[start:stop], f"input={path}")
    else:
        # Every molecule is checked before anything is written.
        featurized = featurize_smiles(smiles, predictor.max_atoms)
        bad = [
            f"{s!r} (item {i}): {e}"
            for i, (s, e) in enumerate(zip(smiles, featurized.errors, strict=True))
            if e
        ]
        if bad:
            raise DataError(f"cannot explain {'; '.join(bad)}")
        count = len(smiles)

        def explain(start: int, stop: int) -> list:
            return predictor.attention_maps(smiles[start:stop])

    output = Path(cfg["output"]).expanduser()
    width = len(str(count - 1))
    folders = []
    for start in range(0, count, _BATCH):
        for offset, maps in enumerate(explain(start, start + _BATCH)):
            folder = output / f"mol_{start + offset:0{width}d}"
            write_explanation(maps, folder, size=cfg["size"])
            folders.append(folder)
            shown = ", ".join(
                [f"{k} {v:.4g}" for k, v in maps.predictions.items()]
                + [
                    f"{k} per atom [{', '.join(f'{v:.3g}' for v in values)}]"
                    for k, values in maps.atom_predictions.items()
                ]
                + [
                    f"{k} per bond [{', '.join(f'{v:.3g}' for v in values)}]"
                    for k, values in maps.bond_predictions.items()
                ]
                + [
                    f"{k} norm per atom [{', '.join(f'{v:.3g}' for v in norms(vectors))}]"
                    for k, vectors in maps.atom_vector_predictions.items()
                ]
            )
            report(f"{maps.smiles}: {shown}\n  pictures: {folder.resolve()}")
    return folders


def _check_structure_file(path: object) -> None:
    """``input=`` of explain.py is a structure file (its frames are explained)."""
    from graphormer.data.sources.ase import STRUCTURE_SUFFIXES

    if Path(str(path)).suffix.lower() not in STRUCTURE_SUFFIXES:
        raise ConfigError(
            f"input={path} is not a structure file ({', '.join(sorted(STRUCTURE_SUFFIXES))}): "
            "explain.py reads molecules as smiles=[...], or a structure file's frames as input="
        )


def _smiles_list(value: object) -> list[str]:
    if isinstance(value, str) and value:
        return [value]
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value):
        return [str(s) for s in value]
    raise ConfigError(
        "give smiles=SMILES or smiles=[...], the molecules to explain, e.g. "
        "'smiles=[CC(=O)Oc1ccccc1C(=O)O,CCO]' (in single quotes for the shell), or input=FILE, "
        "a structure file whose frames to explain"
    )


main = console_command("explain", run, smiles_keys=("smiles",))


if __name__ == "__main__":
    main()
