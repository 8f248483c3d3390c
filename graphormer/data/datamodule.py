"""The LightningDataModule: a dataset source, structural preprocessing, size limits, loaders."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from graphormer.console import report
from graphormer.data.collate import GraphormerCollator
from graphormer.data.locks import exclusive_lock
from graphormer.data.sources import LoadedDataset, OGBSource, SmilesCsvSource
from graphormer.data.tasks import TaskInfo
from graphormer.data.transforms import StructuralFeatures
from graphormer.errors import ConfigError, DataError

__all__ = ["GraphDataModule", "IndexedSubset", "SizeGroupedBatchSampler"]

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


class SizeGroupedBatchSampler(Sampler[list[int]]):
    """Shuffled batches of similar-sized graphs, so that little of a dense batch is padding.

    Each epoch: shuffle, cut into pools of ``pool_batches`` batches, sort each pool by graph size,
    split it into batches, shuffle the batch order (as fairseq's ``batch_by_size``, which
    Microsoft's Graphormer trained with). Under DDP the batches are dealt to ranks in turn, each
    rank getting the same number (a few batches repeat to even them out).

    Args:
        sizes (torch.Tensor): ``[n]`` node counts of the items.
        batch_size (int): items per batch.
        num_replicas (int, optional): ranks. (default: :obj:`1`)
        rank (int, optional): this rank. (default: :obj:`0`)
        seed (int, optional): base seed; the epoch is added. (default: :obj:`0`)
        pool_batches (int, optional): batches per sorted pool; larger pools pad less but mix
            less. (default: :obj:`32`)
        epoch (int, optional): the epoch of the first pass; each pass over the data advances
            it by one (Lightning calls ``set_epoch`` on samplers, not on batch samplers).
            (default: :obj:`0`)
    """

    def __init__(
        self,
        sizes: torch.Tensor,
        batch_size: int,
        num_replicas: int = 1,
        rank: int = 0,
        seed: int = 0,
        pool_batches: int = 32,
        epoch: int = 0,
    ) -> None:
        self.sizes = torch.as_tensor(sizes)
        self.batch_size = batch_size
        self.num_replicas, self.rank = num_replicas, rank
        self.seed = seed
        self.pool = pool_batches * batch_size
        self.epoch = epoch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _batches(self) -> list[list[int]]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.sizes), generator=generator)
        batches = []
        for start in range(0, len(order), self.pool):
            pool = order[start : start + self.pool]
            pool = pool[torch.argsort(self.sizes[pool], stable=True)]
            batches += [b.tolist() for b in pool.split(self.batch_size)]
        shuffled = torch.randperm(len(batches), generator=generator).tolist()
        return [batches[i] for i in shuffled]

    def __iter__(self) -> Iterator[list[int]]:
        # A generator: the epoch is drawn (and `epoch` advanced to the next one, which the
        # datamodule saves in checkpoints) only when the first batch is asked for. A DataLoader
        # with workers calls iter() twice per pass and discards the first iterator unread.
        batches = self._batches()
        self.epoch += 1
        per_rank = len(self)
        total = per_rank * self.num_replicas
        batches = (batches * (total // max(len(batches), 1) + 1))[:total]
        yield from batches[self.rank :: self.num_replicas]

    def __len__(self) -> int:
        num_batches = -(-len(self.sizes) // self.batch_size)
        return -(-num_batches // self.num_replicas)


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
        group_by_size (bool, optional): batch graphs of similar size together (training: shuffled
            pools, see :class:`SizeGroupedBatchSampler`; evaluation: sorted), which cuts the
            padding of dense batches several-fold. (default: :obj:`True`)
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
        group_by_size: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__()
        for key, value, least in (
            ("batch_size", batch_size, 1),
            ("eval_batch_size", eval_batch_size, 1),
            ("num_workers", num_workers, 0),
            ("max_nodes", max_nodes, 1),
            ("max_hops", max_hops, 1),
            ("pad_to_multiple", pad_to_multiple, 1),
        ):
            if value is None and key == "eval_batch_size":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(f"datamodule.{key} must be an integer >= {least}, got {value!r}")
        self.source = source
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.max_nodes = max_nodes
        self.pre_transform = None if on_the_fly else StructuralFeatures(max_hops)
        self.collator = GraphormerCollator(max_hops=max_hops, pad_to_multiple=pad_to_multiple)
        self.group_by_size = group_by_size
        self.seed = seed
        self.loaded: LoadedDataset | None = None
        self._train_sampler: SizeGroupedBatchSampler | None = None
        self._start_epoch = 0
        self.sizes: torch.Tensor | None = None
        self.train_index: torch.Tensor | None = None

    @property
    def task(self) -> TaskInfo:
        return self.source.task_info()

    def prepare_data(self) -> None:
        # Downloads and preprocesses once (rank 0 of each node). The loaded dataset is kept, so
        # that this process's setup() does not read it from disk a second time. The lock makes
        # the nodes of a multi-node run that share a file system take turns: the first one
        # processes, the others find the finished cache (never a half-written one).
        if self.loaded is None:
            name = str(getattr(self.source, "name", "dataset"))
            lock = os.path.join(str(self.source.root), f".graphormer-prepare-{name}.lock")
            with exclusive_lock(lock):  # one per dataset: other datasets' runs are not held
                self.loaded = self.source.load(self.pre_transform)

    def setup(self, stage: str | None = None) -> None:
        if self.train_index is not None:
            return
        if self.loaded is None:  # ranks that did not prepare the data
            self.loaded = self.source.load(self.pre_transform)
        sizes = self.sizes = _num_nodes(self.loaded.dataset)
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
        self._check_splits(len(train))
        trainer = getattr(self, "trainer", None)
        if trainer is None or trainer.is_global_zero:
            report(f"data: {self.describe()}")
        for split in (k for k in self.loaded.split if k != "train"):
            index = self.loaded.split[split]
            if len(index) and int(sizes[index].max()) > self.max_nodes:
                log.info(
                    "%s holds %d graphs above max_nodes=%d; they are evaluated, not dropped",
                    split,
                    int((sizes[index] > self.max_nodes).sum()),
                    self.max_nodes,
                )

    def _check_splits(self, num_train: int) -> None:
        """Every split must hold graphs: an empty one would train or score nothing, and show up
        only later as a missing or meaningless number."""
        sizes = self.split_sizes()
        missing = [k for k in ("train", "valid") if k not in sizes]
        if missing:
            raise DataError(f"{self.task.name} has no {' and no '.join(missing)} split")
        empty = [k for k, size in sizes.items() if size == 0]
        if empty:
            raise DataError(
                f"{self.task.name}: the {' and '.join(empty)} split(s) hold no graphs (split sizes "
                f"{_sizes_text(sizes)}). With a scaffold split of few or mostly acyclic "
                "molecules, use dataset.split=random or other dataset.split_ratios; give "
                "more molecules otherwise."
            )
        if len(self.train_index) == 0:
            raise DataError(
                f"{self.task.name}: all {num_train} training graphs have more than "
                f"datamodule.max_nodes={self.max_nodes} nodes, so training would see none; "
                "raise datamodule.max_nodes"
            )

    def split_sizes(self) -> dict[str, int]:
        """Graphs per split (training before the ``max_nodes`` filter)."""
        return {k: len(index) for k, index in self.loaded.split.items()}

    def is_labelled(self, split: str) -> bool:
        """Whether ``split`` exists and has labels (PCQM4Mv2's test splits have none)."""
        return split in self.loaded.split and split in self.loaded.labelled

    def describe(self) -> str:
        """One line: the dataset, its split sizes and what training skips."""
        text = f"{self.task.name}: {_sizes_text(self.split_sizes())}"
        skipped = self.split_sizes()["train"] - len(self.train_index)
        if skipped:
            text += f" ({skipped} training graphs above max_nodes={self.max_nodes} skipped)"
        return text

    def _world(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return 1, 0
        return trainer.world_size, trainer.global_rank

    def _loader(self, index: torch.Tensor, batch_sampler: Sampler[list[int]]) -> DataLoader:
        return DataLoader(
            IndexedSubset(self.loaded.dataset, index),
            batch_sampler=batch_sampler,
            collate_fn=self.collator,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=torch.cuda.is_available(),
            # Each iterator draws its workers' base seed from this generator, not from torch's
            # global one, which then feeds dropout alone: the same results with or without
            # (persistent) workers, and after a resume.
            generator=torch.Generator().manual_seed(self.seed),
        )

    def state_dict(self) -> dict[str, int]:
        """Saved in checkpoints: the next training epoch the sampler draws."""
        return {"next_train_epoch": self._next_train_epoch()}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self._start_epoch = int(state_dict.get("next_train_epoch", 0))
        self._train_sampler = None

    def _next_train_epoch(self) -> int:
        sampler = self._train_sampler
        return sampler.epoch if sampler is not None else self._start_epoch

    def train_dataloader(self) -> DataLoader:
        index = self.train_index
        world, rank = self._world()
        # Without size grouping every graph counts the same: one shuffled pool, random batches,
        # dealt to ranks and resumed exactly as the grouped ones.
        sizes = self.sizes[index] if self.group_by_size else torch.zeros(len(index))
        self._train_sampler = SizeGroupedBatchSampler(
            sizes,
            self.batch_size,
            world,
            rank,
            seed=self.seed,
            epoch=self._next_train_epoch(),
        )
        return self._loader(index, self._train_sampler)

    def eval_dataloader(self, split: str) -> DataLoader:
        """A loader over every graph of ``split`` (``valid``/``test``), sharded across ranks."""
        index = self.loaded.split[split]
        world, rank = self._world()
        # Every world-th graph from this rank's offset: each graph on exactly one rank, none
        # repeated (torch's DistributedSampler pads with duplicates, which would skew metrics).
        shard = torch.arange(rank, len(index), world)
        if self.group_by_size and len(shard):
            # Order never changes a metric (predictions are gathered by dataset index).
            shard = shard[torch.argsort(self.sizes[index[shard]], stable=True)]
        shard = shard.tolist()
        if not shard and len(index):
            # More ranks than graphs: this rank scores a repeat of the first graph, so that it
            # still joins every collective (an empty loader would skip the epoch-end hooks and
            # leave the other ranks waiting). Predictions are de-duplicated by dataset index.
            shard = [0]
        batches = [
            shard[i : i + self.eval_batch_size] for i in range(0, len(shard), self.eval_batch_size)
        ]
        return self._loader(index, batches)

    def val_dataloader(self) -> DataLoader:
        return self.eval_dataloader("valid")

    def test_dataloader(self) -> DataLoader:
        return self.eval_dataloader("test")

    def train_targets(self) -> torch.Tensor:
        """Targets ``[num_train_graphs, T]`` of the graphs training uses (NaN = missing)."""
        # The dataset's stacked `y` of every graph, one [G, T] tensor (public on PyG datasets).
        y = self.loaded.dataset.y
        return y.view(y.size(0), -1)[self.train_index]

    def split_size(self, split: str) -> int:
        return len(self.loaded.split[split])


def _num_nodes(dataset) -> torch.Tensor:
    if hasattr(dataset, "node_counts"):  # PCQM4Mv2's compact graphs
        return dataset.node_counts
    ptr = dataset.slices["x"]
    return ptr[1:] - ptr[:-1]


def _sizes_text(sizes: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sizes.items())
