"""A dataset's folder on disk, as every source meets it: missing (and not downloadable),
outdated, left half-written by a failed download, or holding a cache that cannot be read."""

from __future__ import annotations

import os
import os.path as osp
import shutil

from graphormer.errors import DataError, UserFacingError
from graphormer.safe_io import download_timeout, load_data

__all__ = [
    "DatasetCacheError",
    "DatasetNotFoundError",
    "check_pyg_markers",
    "check_release",
    "corrupt_cache_message",
    "download_failed",
    "fetch_zip",
    "remove_empty_tree",
]


class DatasetNotFoundError(UserFacingError, FileNotFoundError):
    """A dataset is neither on disk nor downloadable; the message says where to put it."""


class DatasetCacheError(DataError):
    """A processed dataset file cannot be read; the message names it and how to rebuild it."""


def corrupt_cache_message(path: str, error: Exception, folder: str | None = None) -> str:
    """What to say when a dataset cache (a file, or the ``folder`` of several) cannot be read:
    the cache, the reason, the folder to delete so that the next run rebuilds it."""
    reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
    reason = reason.split(". ")[0][:160]
    return (
        f"the dataset cache {path} cannot be read ({type(error).__name__}: {reason}); it is "
        f"truncated or corrupt. Delete the folder {folder or osp.dirname(path)} and run again to "
        "rebuild it"
    )


def check_pyg_markers(processed_dir: str) -> None:
    """PyG reads ``pre_transform.pt`` and ``pre_filter.pt`` of a processed folder with
    ``torch.load(weights_only=False)``, i.e. it unpickles them in full. It writes plain strings
    there, so anything a safe load refuses was put there by someone else: refuse it first."""
    for name in ("pre_transform.pt", "pre_filter.pt"):
        path = osp.join(processed_dir, name)
        if not osp.isfile(path):
            continue
        try:
            load_data(path)
        except Exception as error:
            raise DatasetCacheError(
                f"the dataset cache file {path} holds more than data ({type(error).__name__}), "
                f"so it is not read. Delete the folder {processed_dir} and run again to rebuild it"
            ) from error


def check_release(name: str, folder: str, release_file: str) -> None:
    """OGB would ask ``input()`` here; an empty leftover folder is removed, anything else errors."""
    if not osp.isdir(folder) or osp.exists(osp.join(folder, release_file)):
        return
    if remove_empty_tree(folder):
        return
    raise DatasetNotFoundError(
        f"{folder} holds a copy of {name} without {release_file}, which OGB uses to mark an "
        f"outdated release. Fix: delete {folder} to download the current release, or, if it is a "
        f"current copy, create an empty {osp.join(folder, release_file)}."
    )


def remove_empty_tree(folder: str) -> bool:
    """Removes ``folder`` if it holds no files at any depth (the leftovers of a failed download)."""
    if not osp.isdir(folder):
        return True
    for _, _, files in os.walk(folder):
        if files:
            return False
    shutil.rmtree(folder)
    return True


def download_failed(
    what: str, raw_dir: str, url: str, error: Exception, fix: str
) -> DatasetNotFoundError:
    """The one error of a download that failed (no network, DNS, HTTP, a timeout, a bad zip):
    what is missing and where, the URL and why (the error's first line), and ``fix``, how to
    put the files there by hand."""
    reason = str(error).strip().splitlines()[0][:160] if str(error).strip() else ""
    return DatasetNotFoundError(
        f"{what} is not in {osp.abspath(raw_dir)} and could not be downloaded from {url} "
        f"({type(error).__name__}: {reason}). Fix: {fix}"
    )


def fetch_zip(
    url: str,
    folder: str,
    unpacked: str,
    raw_dir: str,
    *,
    lacks: str,
    what: str,
    fix: str,
    leftover: str,
) -> None:
    """Downloads the zip ``url`` into ``folder``, unpacks it there and moves its ``unpacked``
    folder to ``raw_dir``. A ``raw_dir`` holding files already is never replaced (an error
    says it ``lacks`` the expected ones); a failed download removes ``leftover`` if it holds
    no file and is :func:`download_failed` of ``what`` with ``fix``."""
    if osp.isdir(raw_dir) and os.listdir(raw_dir):
        raise DatasetNotFoundError(
            f"{osp.abspath(raw_dir)} lacks {lacks}; put the files of {url} there (or delete "
            "the folder to download them again)"
        )
    from torch_geometric.data import download_url, extract_zip

    try:
        with download_timeout():
            path = download_url(url, folder, log=False)
        extract_zip(path, folder, log=False)
        os.unlink(path)
        os.makedirs(osp.dirname(raw_dir), exist_ok=True)
        os.replace(osp.join(folder, unpacked), raw_dir)
    except Exception as error:  # no network, DNS failure, HTTP error, timeout, bad zip ...
        remove_empty_tree(leftover)
        raise download_failed(what, raw_dir, url, error, fix) from error
