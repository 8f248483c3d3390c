"""``graphormer-predict`` (``python scripts/predict.py``): score the molecules of a CSV (or of the
command line) with a checkpoint.

graphormer-predict ckpt=PATH input=mols.csv [smiles_column=smiles] [output=preds.csv]
graphormer-predict ckpt=PATH smiles=[CCO,c1ccccc1O] [embeddings=FILE.npy|.parquet]
graphormer-predict ckpt=RUN_FOLDER|[A.ckpt,B.ckpt] ... [interval=0.9]: an ensemble: mean, <task>_std
graphormer-predict ckpt=PATH ... mc_dropout=K [interval=0.9]: K passes with dropout on
[overwrite=true]: replace existing outputs (never an input)
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from omegaconf import DictConfig

from graphormer.cli.common import (
    checkpoint_inputs,
    console_command,
    plain,
)
from graphormer.console import report
from graphormer.errors import ConfigError, DataError
from graphormer.outputs import atomic_path, check_outputs

if TYPE_CHECKING:
    from graphormer.inference.predictor import Predictions

__all__ = ["format_table", "main", "read_input", "run", "write_embeddings"]

_EMBEDDING_FORMATS = (".npy", ".parquet")
_SHOWN_ROWS = 5


def run(cfg: DictConfig) -> pd.DataFrame:
    """Predicts ``input`` (a CSV) or ``smiles`` (a list) with ``ckpt``; writes ``output`` (a CSV)
    or prints the table, and ``embeddings`` (``.npy``/``.parquet``)."""
    from graphormer.inference.predictor import LAYOUTS, Predictor, UnpredictableMoleculeWarning

    cfg = plain(cfg)
    embeddings = _embeddings_path(cfg.get("embeddings"))
    output = Path(str(cfg["output"])).expanduser() if cfg.get("output") else None
    check_outputs(
        {"output": output, "embeddings": embeddings},
        {**checkpoint_inputs(cfg["ckpt"]), "input": cfg.get("input") or None},
        overwrite=bool(cfg.get("overwrite")),
    )
    interval = cfg.get("interval")
    if interval is not None and (
        isinstance(interval, bool) or not isinstance(interval, int | float) or not 0 < interval < 1
    ):
        raise ConfigError(
            f"interval={interval!r} is not allowed: a coverage level in (0, 1), e.g. 0.9"
        )
    conformers = cfg.get("conformers", True)
    if not isinstance(conformers, bool):
        raise ConfigError(f"conformers={conformers!r} is not allowed: true or false")
    predictor = Predictor.from_checkpoint(
        cfg["ckpt"],
        device=cfg["device"],
        precision=cfg.get("precision"),
        batch_size=cfg["batch_size"],
        max_atoms=cfg.get("max_atoms"),
        mc_dropout=cfg.get("mc_dropout") or 0,
        allow_missing=bool((cfg.get("ensemble") or {}).get("allow_missing")),
        conformers=conformers,
    )
    if _is_graph_file(cfg.get("input")):
        # A torch.save list of PyG graphs (issue #17), or an ASE structure file: one row per
        # graph (frame), in file order.
        from graphormer.data.sources.pyg_file import read_graph_file

        if cfg.get("smiles") is not None:
            raise ConfigError("give either input=FILE or smiles=[...], not both")
        path = str(Path(str(cfg["input"])).expanduser())
        if _is_structure_file(path):
            graphs = predictor.structure_graphs(path)
        else:
            graphs = read_graph_file(path, key="input")
        table = pd.DataFrame({"graph": range(len(graphs))})
        splits = [g.get("split") for g in graphs]
        if any(isinstance(v, str) for v in splits):
            table["split"] = splits
        result = predictor.predict_graphs(
            graphs, embeddings=embeddings is not None, interval=interval
        )
    else:
        column = cfg.get("smiles_column") or predictor.training_smiles_column or "smiles"
        table, column = read_input(cfg.get("input"), cfg.get("smiles"), column)
        with warnings.catch_warnings():
            # The summary below names the rows without a prediction.
            warnings.simplefilter("ignore", UnpredictableMoleculeWarning)
            result = predictor.run(
                table[column].tolist(),
                embeddings=embeddings is not None,
                progress=cfg["progress"],
                interval=interval,
                features=table,
            )
    layout = cfg.get("layout") or "wide"
    if layout not in LAYOUTS:
        raise ConfigError(f"layout={layout} is not one of {', '.join(LAYOUTS)}")
    if layout == "long":
        structures = _is_structure_file(cfg.get("input"))
        if _is_graph_file(cfg.get("input")) and not structures:
            raise ConfigError(
                "layout=long writes one row per atom or bond of SMILES input or structures; "
                "not of graphs"
            )
        from graphormer.data.sources.ase import element_molecules

        molecules = element_molecules(graphs) if structures else table[column].tolist()
        out = predictor.atom_table(molecules, result)
    else:
        out = predictor.table(table, result)
    try:
        if output is not None:
            with atomic_path(output) as partial:
                out.to_csv(partial, index=False)
        else:
            print(format_table(out))
        if embeddings is not None:
            write_embeddings(embeddings, result.embeddings)
    except OSError as error:
        raise DataError(f"cannot write {error.filename or output}: {error.strerror}") from error
    noun = "graphs" if _is_graph_file(cfg.get("input")) else "molecules"
    _report(result, len(result.errors), output, embeddings, noun)
    return out


def _is_graph_file(path: Any) -> bool:
    """``input=`` names a torch.save file of PyG graphs (``.pt``/``.pth``) or a structure
    file ASE reads (:func:`_is_structure_file`), not a CSV."""
    return bool(path) and (
        Path(str(path)).suffix.lower() in (".pt", ".pth") or _is_structure_file(path)
    )


def _is_structure_file(path: Any) -> bool:
    """``input=`` names a structure file (extended XYZ, ASE .db, .traj)."""
    from graphormer.data.sources.ase import STRUCTURE_SUFFIXES

    return bool(path) and Path(str(path)).suffix.lower() in STRUCTURE_SUFFIXES


def format_table(table: pd.DataFrame) -> str:
    """The whole table as text: text columns left-aligned, numbers right-aligned, and empty
    predictions blank (as in the CSV)."""
    formatters = {}
    for column in table.columns:
        if not pd.api.types.is_numeric_dtype(table[column]):
            texts = ["" if v is None or v != v else str(v) for v in table[column]]
            width = max(len(str(column)), *(len(t) for t in texts))
            formatters[column] = lambda v, width=width: (
                "" if v is None or v != v else str(v)
            ).ljust(width)
    text = table.to_string(index=False, formatters=formatters, justify="left", na_rep="")
    return "\n".join(line.rstrip() for line in text.splitlines())


def read_input(
    path: str | None, smiles: Sequence[str] | str | None, smiles_column: str
) -> tuple[pd.DataFrame, str]:
    """The table to predict and its SMILES column: a CSV's columns kept as the text they hold
    (so that IDs such as ``007`` are written back unchanged), or a one-column table of
    ``smiles``."""
    if path and smiles is not None:
        raise ConfigError("give either input=FILE.csv or smiles=[...], not both")
    if smiles is not None:
        if isinstance(smiles, list | tuple):
            smiles = list(smiles)
        else:
            smiles = [smiles]  # one SMILES (Hydra reads a bare `smiles=C` as a string)
        if not smiles:
            raise ConfigError(
                "smiles= is empty: give one or more SMILES, e.g. 'smiles=[CCO,CC(=O)O]' (in "
                "single quotes for the shell)"
            )
        return pd.DataFrame({"smiles": [str(s) for s in smiles]}), "smiles"
    if not path:
        raise ConfigError(
            "nothing to predict: give input=FILE.csv (with a SMILES column) or smiles=[CCO,...]"
        )
    file = Path(path).expanduser()
    if not file.is_file():
        what = "is a folder" if file.is_dir() else "does not exist"
        raise DataError(f"input={path} {what}; give the path of a CSV of SMILES")
    sep = "\t" if file.suffix.lower() in (".tsv", ".tab") else ","
    try:
        table = pd.read_csv(file, sep=sep, dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError as error:
        raise DataError(f"input={path} is empty: it needs a header row and SMILES") from error
    except (pd.errors.ParserError, UnicodeDecodeError) as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise DataError(f"input={path} is not a readable CSV ({first})") from error
    if smiles_column not in table.columns:
        raise DataError(
            f"input={path} has no column {smiles_column!r}; its columns are "
            f"{list(table.columns)}. Set smiles_column= to the column holding SMILES (a file "
            "without a header row needs one)."
        )
    if len(table) == 0:
        raise DataError(f"input={path} has a header but no rows: nothing to predict")
    return table, smiles_column


def write_embeddings(path: Path, embeddings: np.ndarray) -> None:
    """``.npy``: the ``[n, d]`` float32 array; ``.parquet``: columns ``emb_0 .. emb_{d-1}``."""
    with atomic_path(path) as partial:
        if path.suffix.lower() == ".npy":
            np.save(partial, embeddings)
        else:
            columns = [f"emb_{j}" for j in range(embeddings.shape[1])]
            pd.DataFrame(embeddings, columns=columns).to_parquet(partial, index=False)


def _embeddings_path(value: Any) -> Path | None:
    if not value:
        return None
    path = Path(str(value)).expanduser()
    suffix = path.suffix.lower()
    if suffix not in _EMBEDDING_FORMATS:
        raise ConfigError(
            f"embeddings={value}: write embeddings to a .npy or .parquet file, e.g. "
            "embeddings=embeddings.npy"
        )
    if suffix == ".parquet" and not any(
        importlib.util.find_spec(engine) for engine in ("pyarrow", "fastparquet")
    ):
        raise ConfigError(
            f"embeddings={value}: writing .parquet needs pyarrow (pip install pyarrow, or "
            "pip install 'graphormer[parquet]'); or write embeddings=FILE.npy"
        )
    return path


def _report(
    result: Predictions,
    rows: int,
    output: Path | None,
    embeddings: Path | None,
    noun: str = "molecules",
) -> None:
    failed = [i for i, error in enumerate(result.errors) if error]
    lines = [f"predicted {rows - len(failed)} of {rows} {noun}"]
    if failed:
        shown = ", ".join(str(i) for i in failed[:_SHOWN_ROWS])
        more = f" and {len(failed) - _SHOWN_ROWS} more" if len(failed) > _SHOWN_ROWS else ""
        where = "0-based, header excluded" if noun == "molecules" else f"0-based {noun}"
        lines.append(
            f"no prediction for {len(failed)} row(s) ({shown}{more}; {where}): "
            "see their `error` column"
        )
    if output is not None:
        lines.append(f"predictions: {output.resolve()}")
    if embeddings is not None:
        lines.append(f"embeddings: {embeddings.resolve()}")
    # The table itself goes to stdout when there is no output file; the summary to stderr then,
    # so that `predict.py ... > table.txt` holds the table alone.
    report("\n".join(lines), stream=sys.stdout if output is not None else sys.stderr)


main = console_command("predict", run, smiles_keys=("smiles",))


if __name__ == "__main__":
    main()
