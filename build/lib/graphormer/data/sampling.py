"""Batch samplers and the batch budget: which graphs share a batch.

The one rule for a batch's size under a budget lives here (:func:`pack_by_tokens`): the
datamodule packs training and evaluation batches with it, and the Predictor its batches of new
molecules, each with its own cost per graph.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import Sampler

from graphormer.data.collate import padded_length

__all__ = ["SizeGroupedBatchSampler", "budget_batch_size", "pack_by_tokens"]


def pack_by_tokens(lengths: Sequence[int], batch_size: int, max_tokens: int) -> list[int]:
    """Greedy batches over items in the given order: the item counts of consecutive batches,
    each holding at most ``batch_size`` items and ``count x largest cost <= max_tokens``.

    The one batch-budget rule. An item's cost is what padding it to the batch's largest item
    costs per item: its padded length (:func:`~graphormer.data.collate.padded_length`) for the
    datamodule's token budget, its attention pairs for the Predictor's. An item costlier than
    ``max_tokens`` alone gets a batch of its own (the caller decides whether that may happen).
    fairseq's ``batch_by_size`` packs the same way.

    Args:
        lengths (Sequence[int]): each item's cost (padded length).
        batch_size (int): most items per batch.
        max_tokens (int): most ``items x largest cost`` per batch.
    """
    counts: list[int] = []
    count = longest = 0
    for length in lengths:
        grown = max(longest, length)
        if count and (count == batch_size or (count + 1) * grown > max_tokens):
            counts.append(count)
            count, grown = 0, length
        count, longest = count + 1, grown
    if count:
        counts.append(count)
    return counts


def budget_batch_size(
    largest: int, batch_size: int, max_tokens: int, pad_to_multiple: int = 1
) -> int:
    """Graphs per batch of uniformly random batches under a token budget: as many as fit when
    all are padded to the ``largest`` graph, so that any draw fits (and every epoch has the
    same number of batches)."""
    return min(batch_size, max_tokens // int(padded_length(largest, pad_to_multiple)))


class SizeGroupedBatchSampler(Sampler[list[int]]):
    """Shuffled batches of similar-sized graphs, so that little of a dense batch is padding.

    Each epoch: shuffle, cut into pools of ``pool_batches`` batches, sort each pool by graph size,
    split it into batches, shuffle the batch order (as fairseq's ``batch_by_size``, which
    Microsoft's Graphormer trained with). Under DDP the batches are dealt to ranks in turn, each
    rank getting the same number (a few batches repeat to even them out).

    With ``max_tokens``, the whole set is sorted by size instead (ties in a new random order
    each epoch) and packed greedily under both ``batch_size`` and ``max_tokens``
    (:func:`pack_by_tokens`), then the batch order is shuffled. The packing depends only on the
    sorted sizes, so every epoch has the same number of batches (Lightning reads it once, for
    the epoch length and the learning-rate schedule) while their members change.

    Args:
        sizes (torch.Tensor): ``[n]`` node counts of the items.
        batch_size (int): most items per batch.
        num_replicas (int, optional): ranks. (default: :obj:`1`)
        rank (int, optional): this rank. (default: :obj:`0`)
        seed (int, optional): base seed; the epoch is added. (default: :obj:`0`)
        pool_batches (int, optional): batches per sorted pool; larger pools pad less but mix
            less. (default: :obj:`32`)
        epoch (int, optional): the epoch of the first pass; each pass over the data advances
            it by one (Lightning calls ``set_epoch`` on samplers, not on batch samplers).
            (default: :obj:`0`)
        max_tokens (int | None, optional): most ``items x padded length`` per batch; every
            item's padded length must fit. (default: :obj:`None`, no budget)
        pad_to_multiple (int, optional): the collator's padding multiple, for the padded
            lengths. (default: :obj:`1`)
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
        max_tokens: int | None = None,
        pad_to_multiple: int = 1,
    ) -> None:
        self.sizes = torch.as_tensor(sizes)
        self.batch_size = batch_size
        self.num_replicas, self.rank = num_replicas, rank
        self.seed = seed
        self.pool = pool_batches * batch_size
        self.epoch = epoch
        self.max_tokens = max_tokens
        # Items per batch, in size order: fixed once, so the count never changes.
        self.counts: list[int] | None = None
        if max_tokens is not None:
            lengths = padded_length(self.sizes.sort().values, pad_to_multiple)
            too_long = int(lengths.max()) if len(lengths) else 0
            if too_long > max_tokens:
                raise ValueError(
                    f"an item of padded length {too_long} exceeds max_tokens={max_tokens}"
                )
            self.counts = pack_by_tokens(lengths.tolist(), batch_size, max_tokens)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _batches(self) -> list[list[int]]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.sizes), generator=generator)
        if self.counts is not None:
            # Sorted by size, ties in this epoch's random order: the sorted sizes, and so the
            # cuts, are the same every epoch; which equal-sized graphs share a batch is not.
            order = order[torch.argsort(self.sizes[order], stable=True)]
            batches = [b.tolist() for b in order.split(self.counts)]
        else:
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
        if self.counts is not None:
            num_batches = len(self.counts)
        else:
            num_batches = -(-len(self.sizes) // self.batch_size)
        return -(-num_batches // self.num_replicas)
