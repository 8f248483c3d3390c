"""Graphormer graph transformers for molecular and OGB graph datasets."""

__version__ = "0.1.0"

__all__ = ["Predictor", "__version__"]


def __getattr__(name: str):
    # Imported on first use: `import graphormer.models` stays light (torch alone), while
    # `from graphormer import Predictor` brings in the data and training stack it needs.
    if name == "Predictor":
        from graphormer.inference.predictor import Predictor

        return Predictor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
