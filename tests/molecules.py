"""The tests' real molecules: re-exported from :mod:`graphormer.testing`, which benchmarks share."""

from graphormer.testing import (  # noqa: F401
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
