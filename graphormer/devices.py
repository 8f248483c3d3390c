"""What depends on the device: the precision names and their dtypes, ``auto`` precision, and the
default batch padding. Training, evaluation and prediction all ask here."""

from __future__ import annotations

import importlib.util

import torch

from graphormer.errors import ConfigError

__all__ = [
    "DEFAULT_PRECISION",
    "PRECISIONS",
    "check_precision_package",
    "native_bf16",
    "on_gpu",
    "resolve_pad_to_multiple",
    "resolve_precision",
]

# Lightning's precision names (and their short aliases): (weights dtype, autocast dtype).
PRECISIONS: dict[str, tuple[torch.dtype, torch.dtype | None]] = {
    "32-true": (torch.float32, None),
    "32": (torch.float32, None),
    "64-true": (torch.float64, None),
    "64": (torch.float64, None),
    "bf16-mixed": (torch.float32, torch.bfloat16),
    "bf16": (torch.float32, torch.bfloat16),
    "16-mixed": (torch.float32, torch.float16),
    "16": (torch.float32, torch.float16),
    "bf16-true": (torch.bfloat16, None),
    "16-true": (torch.float16, None),
}
# A checkpoint that records no precision (converted weights) is run in full precision.
DEFAULT_PRECISION = "32-true"
# Lightning precisions whose plugin needs a package of its own: (module, what it is, install).
_PRECISION_PACKAGES = {
    "transformer-engine": (
        "transformer_engine",
        "NVIDIA's Transformer Engine",
        "pip install 'transformer-engine[pytorch]'",
    ),
}


def check_precision_package(precision: str, key: str = "trainer.precision") -> None:
    """Refuses, naming ``key`` and how to install it, a precision whose package is missing
    (Lightning would stop with a traceback when the trainer is built)."""
    needed = _PRECISION_PACKAGES.get(str(precision))
    if needed is None or importlib.util.find_spec(needed[0]) is not None:
        return
    module, what, install = needed
    raise ConfigError(
        f"{key}={precision} needs {what} (the {module} package), which is not installed: "
        f"{install}, or choose {key}=bf16-mixed"
    )


def flushes_subnormals() -> bool:
    """Whether this thread reads and writes subnormal floats as zero (``torch.set_flush_denormal``,
    which has no getter): a subnormal float32 times one is zero then."""
    subnormal = torch.tensor([4096], dtype=torch.int32).view(torch.float32)  # 5.7e-42
    return float(subnormal * 1.0) == 0.0


def on_gpu(accelerator: str | None) -> bool:
    """Whether a Lightning ``accelerator`` setting puts the work on a GPU."""
    accelerator = str(accelerator or "auto")
    return accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())


def resolve_precision(precision: str | None, gpu: bool) -> str:
    """The precision to run in; ``auto`` is bf16-mixed on GPUs (16-mixed on those without
    bfloat16) and 32-true on the CPU; None is :data:`DEFAULT_PRECISION`."""
    precision = str(precision or DEFAULT_PRECISION)
    if precision != "auto":
        return precision
    if not gpu:
        return "32-true"
    return "bf16-mixed" if native_bf16() else "16-mixed"


def native_bf16() -> bool:
    """Whether the GPU computes bfloat16 natively (Ampere and later): torch's check also counts
    emulation, which is slow, on older GPUs."""
    if not torch.cuda.is_available():
        return True  # the accelerator is chosen elsewhere; bf16 is the GPU default
    try:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # older torch: no emulation to exclude
        return torch.cuda.is_bf16_supported()


def resolve_pad_to_multiple(pad_to_multiple: int | None, gpu: bool) -> int:
    """Batch padding: nodes + graph token rounded up to a multiple of this. None is 8 on GPUs
    (tensor cores and the fused attention kernels want aligned lengths) and 1 on the CPU, where
    padding is pure extra work (slim trains 4-8% faster unpadded)."""
    if pad_to_multiple is not None:
        return int(pad_to_multiple)
    return 8 if gpu else 1
