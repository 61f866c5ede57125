"""The block order of prepared data: a permutation per epoch, disjoint per process, a function of (seed, batch)."""
import numpy as np
import pytest

from modeling_angpt.data.loader import BlockOrder, epoch_key, permute


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1000, 4097])
def test_each_epoch_is_a_permutation_of_all_blocks(n):
    for epoch in range(3):
        order = permute(np.arange(n), n, epoch_key(seed=5, epoch=epoch))
        assert sorted(order.tolist()) == list(range(n))


def test_the_order_is_shuffled_and_differs_by_seed_and_epoch():
    n = 10_000
    first = permute(np.arange(n), n, epoch_key(1, 0))
    assert not np.array_equal(first, np.arange(n))
    assert abs(np.corrcoef(first, np.arange(n))[0, 1]) < 0.05             # no trace of corpus order
    assert not np.array_equal(first, permute(np.arange(n), n, epoch_key(1, 1)))
    assert not np.array_equal(first, permute(np.arange(n), n, epoch_key(2, 0)))


def test_processes_split_each_global_batch_as_one_process_with_the_whole_batch_would_read_it():
    n, batch = 1000, 8
    ranks = [BlockOrder(n, batch, processes=2, rank=r, seed=3) for r in (0, 1)]
    single = BlockOrder(n, 2 * batch, processes=1, rank=0, seed=3)
    for index in (0, 1, 61, 62, 63, 500):                                   # across epochs (62 batches each)
        parts = [order.batch(index) for order in ranks]
        assert not set(parts[0]) & set(parts[1])
        assert np.concatenate(parts).tolist() == single.batch(index).tolist()
    epoch = np.concatenate([ranks[0].batch(i) for i in range(ranks[0].per_epoch)]
                           + [ranks[1].batch(i) for i in range(ranks[1].per_epoch)])
    assert len(set(epoch.tolist())) == len(epoch) == 62 * 16                # no block twice in an epoch


def test_too_few_blocks_for_one_global_batch_is_one_line():
    with pytest.raises(ValueError, match="fewer than one global batch"):
        BlockOrder(10, 8, processes=2, rank=0, seed=0)
