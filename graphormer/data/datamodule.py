"""The LightningDataModule: a dataset source, structural preprocessing, size limits, loaders."""

from __future__ import annotations

import errno
import hashlib
import logging
import os
from collections.abc import Sequence

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from graphormer.console import report
from graphormer.data.collate import GraphormerCollator, padded_length
from graphormer.data.locks import exclusive_lock
from graphormer.data.sampling import SizeGroupedBatchSampler, budget_batch_size, pack_by_tokens
from graphormer.data.sources.base import LoadedDataset, Source
from graphormer.data.structure import StructuralFeatures
from graphormer.data.tasks import TaskInfo, check_scorable
from graphormer.devices import resolve_pad_to_multiple
from graphormer.errors import ConfigError, DataError

__all__ = ["GraphDataModule", "IndexedSubset"]

log = logging.getLogger(__name__)


class IndexedSubset(Dataset):
    """Items ``(dataset_index, graph)`` of ``dataset`` at ``indices``. With ``conformers`` C > 1
    (evaluation of graphs holding C conformers ``[N, C, 3]``), every graph C times in a row,
    item ``i`` reading conformer ``i % C`` as its ``pos``: each conformer once, never a random
    one, so that the predictions' mean over them is what prediction gives."""

    def __init__(
        self, dataset: Dataset, indices: Sequence[int] | torch.Tensor, conformers: int = 1
    ) -> None:
        self.dataset = dataset
        self.indices = torch.as_tensor(indices, dtype=torch.long)
        self.conformers = conformers

    def __len__(self) -> int:
        return len(self.indices) * self.conformers

    def __getitem__(self, i: int):
        index = int(self.indices[i // self.conformers])
        graph = self.dataset[index]
        if self.conformers > 1:
            graph.pos = graph.conformers[:, i % self.conformers]  # [N, 3]
        return index, graph


class GraphDataModule(pl.LightningDataModule):
    """Loads a dataset source with cached structural features and serves dense Graphormer batches.

    Args:
        source (Source): where the graphs come from.
        batch_size (int, optional): training graphs per batch (per device). (default: :obj:`64`)
        eval_batch_size (int | None, optional): evaluation batch size; defaults to ``batch_size``.
        num_workers (int, optional): DataLoader worker processes. (default: :obj:`0`)
        max_nodes (int, optional): training skips graphs with more nodes (one warning counts them);
            evaluation keeps every graph. (default: :obj:`128`)
        max_hops (int, optional): shortest-path edges per pair; must be >= the model's
            ``multi_hop_max_dist``. (default: :obj:`5`)
        pad_to_multiple (int | None, optional): pad node counts (plus the graph token) to a
            multiple of this; None for the device's default (8 with a GPU, 1 on the CPU).
            (default: :obj:`None`)
        on_the_fly (bool, optional): compute structural features per batch instead of caching them
            with the dataset (for datasets too large to cache). (default: :obj:`False`)
        group_by_size (bool, optional): batch graphs of similar size together (training: shuffled
            pools, see :class:`SizeGroupedBatchSampler`; evaluation: sorted), which cuts the
            padding of dense batches several-fold. (default: :obj:`True`)
        seed (int, optional): seed of the training shuffle. (default: :obj:`0`)
        max_tokens (int | None, optional): a hard bound on a batch's size, training and
            evaluation: ``graphs x padded node count`` (graph token included, rounded to
            ``pad_to_multiple``, as the collator pads), on top of the graph counts. Training
            packs size-sorted graphs under it, or, with ``group_by_size=False``, takes as many
            random graphs as the largest one allows; evaluation gives a graph too large for it
            alone a batch of its own. (default: :obj:`None`, no budget; fairseq's
            ``max_tokens``)
    """

    def __init__(
        self,
        source: Source,
        batch_size: int = 64,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        max_nodes: int = 128,
        max_hops: int = 5,
        pad_to_multiple: int | None = None,
        on_the_fly: bool = False,
        group_by_size: bool = True,
        seed: int = 0,
        max_tokens: int | None = None,
    ) -> None:
        super().__init__()
        # null means: the default behaviour
        optional = ("eval_batch_size", "max_tokens", "pad_to_multiple")
        for key, value, least in (
            ("batch_size", batch_size, 1),
            ("eval_batch_size", eval_batch_size, 1),
            ("num_workers", num_workers, 0),
            ("max_nodes", max_nodes, 1),
            ("max_hops", max_hops, 1),
            ("pad_to_multiple", pad_to_multiple, 1),
            ("max_tokens", max_tokens, 1),
        ):
            if value is None and key in optional:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                null = " or null" if key in optional else ""
                raise ConfigError(
                    f"datamodule.{key} must be an integer >= {least}{null}, got {value!r}"
                )
        # Beyond the largest training graph (and the GPUs' alignment, 8) padding only adds
        # nodes: datamodule.pad_to_multiple=100000 asked for 120 GB before the first batch.
        widest = max(8, max_nodes + 1)
        if pad_to_multiple is not None and pad_to_multiple > widest:
            raise ConfigError(
                f"datamodule.pad_to_multiple={pad_to_multiple} pads every batch beyond its "
                f"largest graph (datamodule.max_nodes={max_nodes}, plus the graph token): give "
                f"a multiple of at most {widest}, e.g. 8 (GPU alignment), or null for the "
                "device's default"
            )
        self.source = source
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.max_nodes = max_nodes
        self.max_tokens = max_tokens
        pad_to_multiple = resolve_pad_to_multiple(pad_to_multiple, torch.cuda.is_available())
        self.pad_to_multiple = pad_to_multiple
        self.pre_transform = None if on_the_fly else StructuralFeatures(max_hops)
        self.collator = GraphormerCollator(max_hops=max_hops, pad_to_multiple=pad_to_multiple)
        self.group_by_size = group_by_size
        self.seed = seed
        self.loaded: LoadedDataset | None = None
        self._train_sampler: SizeGroupedBatchSampler | None = None
        self._start_epoch = 0
        self.sizes: torch.Tensor | None = None
        self.train_index: torch.Tensor | None = None
        self._told_alone: set[str] = set()  # splits whose over-budget graphs were logged

    @property
    def task(self) -> TaskInfo:
        return self.source.task_info()

    def prepare_data(self) -> None:
        # Downloads and preprocesses once (rank 0 of each node). The loaded dataset is kept, so
        # that this process's setup() does not read it from disk a second time. The lock makes
        # the nodes of a multi-node run that share a file system take turns: the first one
        # processes, the others find the finished cache (never a half-written one).
        if self.loaded is None:
            name = self.source.name
            lock = os.path.join(str(self.source.root), f".graphormer-prepare-{name}.lock")
            with exclusive_lock(lock):  # one per dataset: other datasets' runs are not held
                self.loaded = self._load()

    def _load(self) -> LoadedDataset:
        """The source's dataset; a root where its files or caches cannot be written (a file, a
        read-only folder without the prepared dataset) is one error naming ``dataset.root``."""
        root = os.path.abspath(os.path.expanduser(str(self.source.root)))
        if os.path.exists(root) and not os.path.isdir(root):
            raise DataError(
                f"dataset.root={self.source.root} is a file, not a folder: give dataset.root= "
                "the folder that holds (or is to hold) the dataset and its caches"
            )
        try:
            return self.source.load(self.pre_transform)
        except OSError as error:
            where = os.path.abspath(str(error.filename or ""))
            unwritable = error.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR)
            if not unwritable or os.path.commonpath([root, where]) != root:
                raise
            raise DataError(
                f"dataset.root={self.source.root}: cannot write {where} ({error.strerror}); give "
                "dataset.root= a writable folder (a read-only one works once it holds the "
                "prepared dataset)"
            ) from error

    def setup(self, stage: str | None = None) -> None:
        if stage in (None, "fit"):
            self._check_max_tokens()
        if self.train_index is not None:
            return
        if self.loaded is None:  # ranks that did not prepare the data
            self.loaded = self._load()
        sizes = self.sizes = self.source.node_counts(self.loaded.dataset)
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
        self._check_target_range()
        # Training's validation and test: a metric that cannot score them fails now, not after
        # the first epoch (evaluating a checkpoint scores only the splits it is asked for).
        if self.task.num_tasks and stage in (None, "fit"):
            for split in ("valid", "test"):
                if self.is_labelled(split):
                    check_scorable(self.task, self.split_targets(split), split)
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

    def _budget_fits_training(self) -> bool:
        largest = padded_length(self.max_nodes, self.pad_to_multiple)
        return self.max_tokens is None or self.max_tokens >= largest

    def _check_max_tokens(self) -> None:
        """Training needs every graph it keeps (up to ``max_nodes`` nodes) to fit the budget;
        evaluation does not (a graph too large goes alone), so evaluation skips this check."""
        if not self._budget_fits_training():
            largest = padded_length(self.max_nodes, self.pad_to_multiple)
            raise ConfigError(
                f"datamodule.max_tokens={self.max_tokens} cannot hold one training graph of "
                f"datamodule.max_nodes={self.max_nodes} nodes: padded with the graph token to a "
                f"multiple of datamodule.pad_to_multiple={self.pad_to_multiple}, it takes "
                f"{largest} tokens; raise datamodule.max_tokens to at least {largest}, or lower "
                "datamodule.max_nodes"
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

    def _check_target_range(self) -> None:
        """Regression targets a float32 loss and metric can square and sum: a value of 3e38 is
        a float32 number, but its square is not, and the run would end with an RMSE of inf."""
        task = self.task
        if task.is_classification or task.is_multiclass or not task.num_tasks:
            return
        y = self.loaded.dataset.y
        y = y.view(y.size(0), -1).double()
        for split, index in self.loaded.split.items():
            values = y[index].abs()
            values = torch.where(torch.isnan(values), torch.zeros_like(values), values)
            rows, columns = torch.nonzero(values > MAX_TARGET_MAGNITUDE, as_tuple=True)
            if len(rows):
                largest = float(values.max())
                graphs = ", ".join(str(int(index[r])) for r in rows[:5].tolist())
                more = f" and {len(rows) - 5} more" if len(rows) > 5 else ""
                raise DataError(
                    f"{task.name}: target {int(columns[0])} of the {split} split holds values as "
                    f"large as {largest:.3g} (graphs {graphs}{more}); losses and metrics square "
                    f"them in float32, which overflows beyond |y| = {MAX_TARGET_MAGNITUDE:.0e}: "
                    "rescale the target (e.g. its log10 or other units) or leave those labels "
                    "empty"
                )

    def data_digest(self) -> str:
        """A digest of the graphs and labels the run trains and selects on, as read (every
        split's members in order, labels, node counts, and the atoms, bonds and their features
        of in-memory datasets): a resume compares it with its checkpoint's, so that a training
        file changed at the same path is not trained on without a word."""
        digest = hashlib.sha256(b"graphormer-data-v1")

        def feed(name: str, tensor: torch.Tensor) -> None:
            tensor = tensor.detach().cpu().contiguous().reshape(-1)
            digest.update(f"{name}|{tensor.dtype}|{tensor.numel()}|".encode())
            digest.update(tensor.view(torch.uint8).numpy())  # the bytes in place, no copy

        for split in sorted(self.loaded.split):
            feed(f"split:{split}", torch.as_tensor(self.loaded.split[split]))
        dataset = self.loaded.dataset
        feed("y", dataset.y)
        feed("nodes", torch.as_tensor(self.source.node_counts(dataset)))
        storage = getattr(dataset, "_data", None)
        for key in ("x", "edge_index", "edge_attr"):
            value = getattr(storage, key, None) if storage is not None else None
            if isinstance(value, torch.Tensor):
                feed(key, value)
        return digest.hexdigest()[:16]

    def split_sizes(self) -> dict[str, int]:
        """Graphs per split (training before the ``max_nodes`` filter)."""
        return {k: len(index) for k, index in self.loaded.split.items()}

    def is_labelled(self, split: str) -> bool:
        """Whether ``split`` exists and has labels (PCQM4Mv2's test splits have none)."""
        return split in self.loaded.split and split in self.loaded.labelled

    def describe(self) -> str:
        """One line: the dataset, its split sizes, what training skips and the token budget."""
        text = f"{self.task.name}: {_sizes_text(self.split_sizes())}"
        skipped = self.split_sizes()["train"] - len(self.train_index)
        if skipped:
            text += f" ({skipped} training graphs above max_nodes={self.max_nodes} skipped)"
        if self.max_tokens is not None and self._budget_fits_training():
            world, _ = self._world()
            sampler = self._make_train_sampler(world, 0, epoch=0)
            text += f"; max_tokens {self.max_tokens}: {len(sampler):,} training batches per epoch"
            text += " per device" if world > 1 else ""
            if not self.group_by_size:
                text += f" of {sampler.batch_size} graphs"
        elif self.max_tokens is not None:
            text += f"; max_tokens {self.max_tokens} (evaluation only: too small to train with)"
        return text

    def _world(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return 1, 0
        return trainer.world_size, trainer.global_rank

    def _loader(
        self, index: torch.Tensor, batch_sampler: Sampler[list[int]], conformers: int = 1
    ) -> DataLoader:
        return DataLoader(
            IndexedSubset(self.loaded.dataset, index, conformers),
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

    def _make_train_sampler(self, world: int, rank: int, epoch: int) -> SizeGroupedBatchSampler:
        sizes = self.sizes[self.train_index]
        batch_size, max_tokens = self.batch_size, self.max_tokens
        if not self.group_by_size:
            # Every graph counts the same: one shuffled pool, random batches, dealt to ranks
            # and resumed exactly as the grouped ones. A budget then fixes the graphs per batch
            # at what the largest training graph allows, so that any draw fits and the number
            # of batches is the same every epoch.
            if max_tokens is not None:
                batch_size = budget_batch_size(
                    int(sizes.max()), batch_size, max_tokens, self.pad_to_multiple
                )
            sizes, max_tokens = torch.zeros(len(sizes)), None
        return SizeGroupedBatchSampler(
            sizes,
            batch_size,
            world,
            rank,
            seed=self.seed,
            epoch=epoch,
            max_tokens=max_tokens,
            pad_to_multiple=self.pad_to_multiple,
        )

    def train_dataloader(self) -> DataLoader:
        self._check_max_tokens()  # also when setup() ran for evaluation first
        world, rank = self._world()
        self._train_sampler = self._make_train_sampler(world, rank, self._next_train_epoch())
        return self._loader(self.train_index, self._train_sampler)

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
        if self.max_tokens is not None:
            self._log_alone(split, index, rank)
        conformers = self.eval_conformers
        if conformers > 1:
            # Each graph once per conformer, in a row (IndexedSubset's items); the module and
            # evaluate() average the predictions of a dataset index.
            shard = [p * conformers + c for p in shard for c in range(conformers)]
            batches = self._eval_batches(index.repeat_interleave(conformers), shard)
            return self._loader(index, batches, conformers)
        return self._loader(index, self._eval_batches(index, shard))

    @property
    def eval_conformers(self) -> int:
        """Conformers each graph holds (its source's, ``dataset.num_conformers``; 1: one
        ``pos`` or none): evaluation reads every one and scores the mean of their
        predictions, as prediction from SMILES does."""
        return max(1, int(self.source.prediction_conformers()))

    def _eval_batches(self, index: torch.Tensor, positions: list[int]) -> list[list[int]]:
        """``positions`` (into ``index``) in their order, in batches of ``eval_batch_size``
        graphs and, with ``max_tokens``, of at most that many padded nodes."""
        step = self.eval_batch_size
        if self.max_tokens is None:
            return [positions[i : i + step] for i in range(0, len(positions), step)]
        lengths = padded_length(self.sizes[index[positions]], self.pad_to_multiple)
        counts = pack_by_tokens(lengths.tolist(), step, self.max_tokens)
        return [b.tolist() for b in torch.tensor(positions, dtype=torch.long).split(counts)]

    def probe_dataloader(self, split: str, max_graphs: int | None = None) -> DataLoader:
        """Every graph of ``split`` (for ``train``, the graphs training reads), or a seeded
        sample of ``max_graphs`` of them, in evaluation batches by size, the same on every
        rank (not sharded): what a fit on a frozen network reads
        (``pretrained_head=probe``)."""
        index = self.train_index if split == "train" else self.loaded.split[split]
        if max_graphs is not None and len(index) > max_graphs:
            generator = torch.Generator().manual_seed(self.seed)
            index = index[
                torch.randperm(len(index), generator=generator)[:max_graphs].sort().values
            ]
        order = torch.argsort(self.sizes[index], stable=True).tolist()
        return self._loader(index, self._eval_batches(index, order))

    def _log_alone(self, split: str, index: torch.Tensor, rank: int) -> None:
        """Once per split: graphs that alone exceed the budget (evaluated, one per batch)."""
        lengths = padded_length(self.sizes[index], self.pad_to_multiple)
        alone = lengths > self.max_tokens
        if rank == 0 and alone.any() and split not in self._told_alone:
            self._told_alone.add(split)
            log.warning(
                "%d %s graphs exceed datamodule.max_tokens=%d on their own (largest: %d "
                "tokens); each is evaluated in a batch of its own",
                int(alone.sum()),
                split,
                self.max_tokens,
                int(lengths.max()),
            )

    def val_dataloader(self) -> DataLoader:
        return self.eval_dataloader("valid")

    def test_dataloader(self) -> DataLoader:
        return self.eval_dataloader("test")

    def train_targets(self) -> torch.Tensor:
        """Targets ``[num_train_graphs, T]`` of the graphs training uses (NaN = missing)."""
        # The dataset's stacked `y` of every graph, one [G, T] tensor (public on PyG datasets).
        y = self.loaded.dataset.y
        return y.view(y.size(0), -1)[self.train_index]

    def _split_index(self, split: str) -> torch.Tensor:
        return self.train_index if split == "train" else self.loaded.split[split]

    def train_rows(self, key: str) -> torch.Tensor | None:
        """The rows of the per-node or per-edge feature ``key`` (``x_continuous``, ...) of the
        graphs training uses, ``[rows, F]``; None when the graphs have no such feature."""
        return self.split_rows(key, "train")

    def split_rows(self, key: str, split: str) -> torch.Tensor | None:
        """The rows of the feature ``key`` of ``split``'s graphs (for ``train``, the graphs
        training uses), ``[rows, F]``; None when the graphs have no such feature."""
        dataset = self.loaded.dataset
        slices = getattr(dataset, "slices", None)
        if slices is None or key not in slices:
            return None
        ptr = slices[key]
        values = dataset._data[key]  # the collated storage (every graph's rows, in order)
        index = self._split_index(split)
        starts, ends = ptr[index], ptr[index + 1]
        counts = ends - starts
        offsets = torch.repeat_interleave(starts - (counts.cumsum(0) - counts), counts)
        rows = torch.arange(int(counts.sum())) + offsets
        return values[rows].float()

    def train_statistics(
        self, key: str, chunk_rows: int = 1 << 22
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Mean and standard deviation (population) ``[F]`` float64 of the feature ``key``
        over the graphs training uses, as :meth:`train_rows` would give them, computed over
        chunks of about ``chunk_rows`` rows (ogbg-ppa's edge features would be GBs at once:
        issue #17); None when the graphs have no such feature."""
        dataset = self.loaded.dataset
        slices = getattr(dataset, "slices", None)
        if slices is None or key not in slices:
            return None
        ptr, values = slices[key], dataset._data[key]
        index = self.train_index
        counts = ptr[index + 1] - ptr[index]
        width = values.size(-1)
        total = torch.zeros((), dtype=torch.float64)
        mean = torch.zeros(width, dtype=torch.float64)
        spread = torch.zeros(width, dtype=torch.float64)  # sum of squared deviations
        # Whole graphs per chunk: each chunk ends with the graph that crosses a multiple of
        # chunk_rows (a graph larger than that is a chunk of its own).
        marks = torch.arange(1, int(counts.sum()) // chunk_rows + 1) * chunk_rows
        ends = torch.searchsorted(counts.cumsum(0), marks)
        for part in torch.tensor_split(torch.arange(len(index)), (ends + 1).tolist()):
            starts, sizes = ptr[index[part]], counts[part]
            if not int(sizes.sum()):
                continue
            offsets = torch.repeat_interleave(starts - (sizes.cumsum(0) - sizes), sizes)
            rows = values[torch.arange(int(sizes.sum())) + offsets].double()
            n = torch.tensor(float(len(rows)), dtype=torch.float64)
            chunk_mean = rows.mean(0)
            chunk_spread = ((rows - chunk_mean) ** 2).sum(0)
            # Chan et al.'s pairwise update: exact to rounding, whatever the chunks.
            delta = chunk_mean - mean
            spread += chunk_spread + delta**2 * total * n / (total + n)
            mean += delta * n / (total + n)
            total += n
        if not total:
            return torch.zeros(width, dtype=torch.float64), torch.ones(width, dtype=torch.float64)
        return mean, (spread / total).sqrt()

    def split_targets(self, split: str) -> torch.Tensor:
        """Targets ``[n, T]`` of every graph of ``split``, in the split's order (NaN = missing)."""
        y = self.loaded.dataset.y
        return y.view(y.size(0), -1)[self.loaded.split[split]]

    def split_size(self, split: str) -> int:
        return len(self.loaded.split[split])


# The largest regression target trained and scored: its square (1e30) summed over 1e8 graphs stays
# below float32's maximum (3.4e38), so no loss or RMSE overflows to inf.
MAX_TARGET_MAGNITUDE = 1e15


def _sizes_text(sizes: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sizes.items())
