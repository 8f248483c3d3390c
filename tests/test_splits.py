"""Splits a user gives: a column naming each row's split, or a JSON file of rows per split (#19)."""

import json

import pandas as pd
import pytest
import torch

from graphormer.data import SmilesCsvSource
from graphormer.data.splits import column_split, file_split
from graphormer.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def split_csv(nci_csv, tmp_path_factory):
    """nci_csv (303 rows, rows 10, 41 and 42 unparseable) with a `split` column: every fifth row
    valid, every fifth (offset 1) test, the rest train."""
    table = pd.read_csv(nci_csv)
    table["split"] = [
        "valid" if i % 5 == 0 else "test" if i % 5 == 1 else "train" for i in range(len(table))
    ]
    path = tmp_path_factory.mktemp("split") / "with_split.csv"
    table.to_csv(path, index=False)
    return path, table


def _rows_of(loaded, name):
    return loaded.dataset.row.view(-1)[loaded.split[name]].tolist()


def test_split_column_puts_each_row_where_it_says(split_csv, tmp_path):
    path, table = split_csv
    source = SmilesCsvSource(
        str(path), ["tpsa"], split="column", split_column="split", root=str(tmp_path)
    )
    with pytest.warns(UserWarning, match="skipped 3 row"):
        loaded = source.load()
    bad = {10, 41, 42}
    for name in ("train", "valid", "test"):
        expected = [i for i in range(len(table)) if table.split[i] == name and i not in bad]
        assert sorted(_rows_of(loaded, name)) == expected
    # The labels stay with their rows.
    graph = int(loaded.split["test"][0])
    row = int(loaded.dataset.row[graph])
    assert float(loaded.dataset[graph].y[0, 0]) == pytest.approx(table.tpsa[row])


def test_split_file_lists_rows_per_split(split_csv, tmp_path):
    path, table = split_csv
    rows = {"train": list(range(50, 303)), "valid": list(range(0, 25)), "test": list(range(25, 50))}
    file = tmp_path / "split.json"
    file.write_text(json.dumps(rows))
    source = SmilesCsvSource(str(path), ["tpsa"], split_file=str(file), root=str(tmp_path))
    assert source.split == "file"
    with pytest.warns(UserWarning, match="41, 42"):  # listed rows without a molecule are named
        loaded = source.load()
    assert _rows_of(loaded, "valid") == list(range(0, 10)) + list(range(11, 25))
    assert _rows_of(loaded, "test") == [r for r in range(25, 50) if r not in (41, 42)]
    assert len(loaded.split["train"]) == 253


@pytest.mark.parametrize(
    "listed, message",
    [
        ({"train": [0, 1], "valid": [2], "test": [303]}, r"rows 303, outside the input's 303 rows"),
        ({"train": [0, 1], "valid": [1], "test": [3]}, r"row 1 in 'train' and 'valid'"),
        ({"train": [0, 1], "valid": [], "test": [3]}, r"valid split\(s\) empty"),
        ({"train": [0], "valid": [2], "test": [3], "extra": []}, r"exactly the keys"),
        ({"train": [0.5], "valid": [2], "test": [3]}, r"list of integers"),
    ],
)
def test_bad_split_files_are_one_clear_error(tmp_path, listed, message):
    file = tmp_path / "split.json"
    file.write_text(json.dumps(listed))
    with pytest.raises((DataError, ConfigError), match=message):
        file_split(str(file), 303, list(range(303)))


def test_bad_split_column_values_are_named_with_their_rows():
    labels = ["train", "valid", "test", "Train", "train", None]
    with pytest.raises(ConfigError, match=r"holds 'Train' at rows 3 .*train, valid or test"):
        column_split(labels, range(6), "split")
    with pytest.raises(ConfigError, match=r"holds '' at rows 2"):
        column_split(["train", "valid", float("nan"), "test"], range(4), "split")
    with pytest.raises(ConfigError, match=r"test split\(s\) empty"):
        column_split(["train", "valid", " train "], range(3), "split")
    split = column_split(["train", "valid", " test "], range(3), "split")
    assert {k: v.tolist() for k, v in split.items()} == {"train": [0], "valid": [1], "test": [2]}
    assert all(v.dtype == torch.long for v in split.values())


def test_split_settings_that_contradict_each_other_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="split=column needs dataset.split_column"):
        SmilesCsvSource("x.csv", ["y"], split="column")
    with pytest.raises(ConfigError, match="both choose the split"):
        SmilesCsvSource("x.csv", ["y"], split="random", split_file="s.json")
    with pytest.raises(ConfigError, match="only with dataset.split=column"):
        SmilesCsvSource("x.csv", ["y"], split_column="split")
    with pytest.raises(ConfigError, match="one of scaffold, random, column, file"):
        SmilesCsvSource("x.csv", ["y"], split="stratified")
