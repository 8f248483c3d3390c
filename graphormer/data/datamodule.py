"""The LightningDataModule: a dataset source, structural preprocessing, size limits, loaders."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from graphormer.data.collate import GraphormerCollator
from graphormer.data.sources import LoadedDataset, OGBSource, SmilesCsvSource
from graphormer.data.tasks import TaskInfo
from graphormer.data.transforms import StructuralFeatures

__all__ = ["GraphDataModule", "IndexedSubset", "ShardSampler"]

log = logging.getLogger(__name__)


class IndexedSubset(Dataset):
    """Items ``(dataset_index, graph)`` of ``dataset`` at ``indices``."""

    def __init__(self, dataset: Dataset, indices: Sequence[int] | torch.Tensor) -> None:
        self.dataset = dataset
        self.indices = torch.as_tensor(indices, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        index = int(self.indices[i])
        return index, self.dataset[index]


class ShardSampler(Sampler[int]):
    """Every ``num_replicas``-th item from ``rank``: each item on exactly one rank, none repeated.

    torch's ``DistributedSampler`` pads shards with duplicates to equal length, which would count
    some graphs twice in a metric; evaluation uses this sampler and gathers by dataset index.
    """

    def __init__(self, length: int, num_replicas: int = 1, rank: int = 0) -> None:
        self.length, self.num_replicas, self.rank = length, num_replicas, rank

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.length, self.num_replicas))

    def __len__(self) -> int:
        return len(range(self.rank, self.length, self.num_replicas))


class GraphDataModule(pl.LightningDataModule):
    """Loads a dataset source with cached structural features and serves dense Graphormer batches.

    Args:
        source (OGBSource | SmilesCsvSource): where the graphs come from.
        batch_size (int, optional): training graphs per batch (per device). (default: :obj:`64`)
        eval_batch_size (int | None, optional): evaluation batch size; defaults to ``batch_size``.
        num_workers (int, optional): DataLoader worker processes. (default: :obj:`0`)
        max_nodes (int, optional): training skips graphs with more nodes (one warning counts them);
            evaluation keeps every graph. (default: :obj:`128`)
        max_hops (int, optional): shortest-path edges per pair; must be >= the model's
            ``multi_hop_max_dist``. (default: :obj:`5`)
        pad_to_multiple (int, optional): pad node counts to a multiple of this. (default: :obj:`8`)
        on_the_fly (bool, optional): compute structural features per batch instead of caching them
            with the dataset (for datasets too large to cache). (default: :obj:`False`)
        seed (int, optional): seed of the training shuffle. (default: :obj:`0`)
    """

    def __init__(
        self,
        source: OGBSource | SmilesCsvSource,
        batch_size: int = 64,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        max_nodes: int = 128,
        max_hops: int = 5,
        pad_to_multiple: int = 8,
        on_the_fly: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"datamodule.batch_size must be >= 1, got {batch_size}")
        if max_nodes < 1:
            raise ValueError(f"datamodule.max_nodes must be >= 1, got {max_nodes}")
        self.source = source
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.max_nodes = max_nodes
        self.pre_transform = None if on_the_fly else StructuralFeatures(max_hops)
        self.collator = GraphormerCollator(max_hops=max_hops, pad_to_multiple=pad_to_multiple)
        self.seed = seed
        self.loaded: LoadedDataset | None = None
        self.train_index: torch.Tensor | None = None

    @property
    def task(self) -> TaskInfo:
        return self.source.task_info()

    def prepare_data(self) -> None:
        # Downloads and preprocesses once (rank 0 of each node); later loads read the cache.
        self.source.load(self.pre_transform)

    def setup(self, stage: str | None = None) -> None:
        if self.loaded is not None:
            return
        self.loaded = self.source.load(self.pre_transform)
        sizes = _num_nodes(self.loaded.dataset)
        train = self.loaded.split["train"]
        too_big = sizes[train] > self.max_nodes
        if too_big.any():
            log.warning(
                "training skips %d of %d graphs with more than datamodule.max_nodes=%d nodes "
                "(largest: %d); validation and test keep every graph",
                int(too_big.sum()),
                len(train),
                self.max_nodes,
                int(sizes[train].max()),
            )
        self.train_index = train[~too_big]
        for split in ("valid", "test"):
            index = self.loaded.split[split]
            if len(index) and int(sizes[index].max()) > self.max_nodes:
                log.info(
                    "%s holds %d graphs above max_nodes=%d; they are evaluated, not dropped",
                    split,
                    int((sizes[index] > self.max_nodes).sum()),
                    self.max_nodes,
                )

    def _world(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return 1, 0
        return trainer.world_size, trainer.global_rank

    def _loader(self, index: torch.Tensor, batch_size: int, sampler: Sampler) -> DataLoader:
        return DataLoader(
            IndexedSubset(self.loaded.dataset, index),
            batch_size=batch_size,
            sampler=sampler,
            collate_fn=self.collator,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=torch.cuda.is_available(),
        )

    def train_dataloader(self) -> DataLoader:
        subset_len = len(self.train_index)
        world, rank = self._world()
        if world > 1:
            sampler: Sampler = DistributedSampler(
                range(subset_len), num_replicas=world, rank=rank, shuffle=True, seed=self.seed
            )
        else:
            generator = torch.Generator().manual_seed(self.seed)
            sampler = torch.utils.data.RandomSampler(range(subset_len), generator=generator)
        return self._loader(self.train_index, self.batch_size, sampler)

    def eval_dataloader(self, split: str) -> DataLoader:
        """A loader over every graph of ``split`` (``valid``/``test``), sharded across ranks."""
        index = self.loaded.split[split]
        world, rank = self._world()
        return self._loader(index, self.eval_batch_size, ShardSampler(len(index), world, rank))

    def val_dataloader(self) -> DataLoader:
        return self.eval_dataloader("valid")

    def test_dataloader(self) -> DataLoader:
        return self.eval_dataloader("test")

    def train_targets(self) -> torch.Tensor:
        """Targets ``[num_train_graphs, T]`` of the graphs training uses (NaN = missing)."""
        # The collated storage holds every graph's y as one [G, T] tensor.
        y = self.loaded.dataset._data.y
        return y.view(y.size(0), -1)[self.train_index]

    def split_size(self, split: str) -> int:
        return len(self.loaded.split[split])


def _num_nodes(dataset) -> torch.Tensor:
    ptr = dataset.slices["x"]
    return ptr[1:] - ptr[:-1]
