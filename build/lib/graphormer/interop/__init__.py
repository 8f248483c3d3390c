"""Published Graphormer weights in and out: Microsoft's and Hugging Face's layouts
(:mod:`~graphormer.interop.layouts`; in: :mod:`~graphormer.interop.microsoft`,
:mod:`~graphormer.interop.huggingface`; out: :mod:`~graphormer.interop.export`), read from files as data (:mod:`~graphormer.interop.read`)
and written as checkpoints of ours (:mod:`~graphormer.interop.write`)."""

from graphormer.interop.export import to_microsoft
from graphormer.interop.huggingface import (
    from_huggingface,
    huggingface_settings,
    huggingface_to_microsoft_names,
)
from graphormer.interop.layouts import CONVENTIONS, ConversionError, IndexConvention
from graphormer.interop.microsoft import from_microsoft
from graphormer.interop.read import Source, read_source
from graphormer.interop.write import convert_checkpoint, convert_source, fine_tune_overrides

__all__ = [
    "CONVENTIONS",
    "ConversionError",
    "IndexConvention",
    "Source",
    "convert_checkpoint",
    "convert_source",
    "fine_tune_overrides",
    "from_huggingface",
    "from_microsoft",
    "huggingface_settings",
    "huggingface_to_microsoft_names",
    "read_source",
    "to_microsoft",
]
