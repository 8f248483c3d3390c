"""Graphormer graph transformers for molecular and OGB graph datasets."""

__version__ = "0.1.0"
