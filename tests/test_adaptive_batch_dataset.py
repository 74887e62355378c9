"""AdaptiveBatchDataset: sharding, passes, size changes at the next batch, fit()."""

import numpy as np
import pytest

import keras
import keras_adapt
from keras_adapt.data import AdaptiveBatchDataset


def test_shards_are_disjoint_equal_and_cover_the_data_each_pass():
    x = np.arange(103, dtype=np.float32)
    shards = [AdaptiveBatchDataset(x, micro_batch_size=17, num_workers=2, rank=r, seed=5)
              for r in range(2)]
    assert shards[0].shard_size == shards[1].shard_size == 51
    seen = [np.concatenate([s.next_indices() for _ in range(3)]) for s in shards]
    assert len(set(seen[0]) & set(seen[1])) == 0  # disjoint
    assert all(len(set(s)) == 51 for s in seen)  # a full pass, no repeats
    # The next pass is a different permutation on each rank too.
    nxt = shards[0].next_indices()
    assert not np.array_equal(nxt, seen[0][:17])


def test_size_change_applies_to_the_next_batch_and_passes_are_counted():
    x = np.arange(40, dtype=np.float32)
    ds = AdaptiveBatchDataset(x, x, micro_batch_size=10, num_workers=1, rank=0, shuffle=False)
    it = iter(ds.dataset)
    assert len(next(it)[0]) == 10
    ds.micro_batch_size = 25
    xb, yb = next(it)
    assert [int(v) for v in xb] == list(range(10, 35))
    np.testing.assert_array_equal(xb.numpy(), yb.numpy())
    xb, _ = next(it)  # wraps into the second pass
    assert [int(v) for v in xb] == list(range(35, 40)) + list(range(0, 20))
    assert ds.passes == pytest.approx(60 / 40)
    assert ds.changes == [(1, 25)] and ds.steps_per_epoch == 4


def test_fit_runs_on_the_stream_and_the_batch_changes_between_steps():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((400, 4)).astype("float32")
    y = x.sum(1, keepdims=True)
    ds = AdaptiveBatchDataset(x, y, micro_batch_size=8, num_workers=1, rank=0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.05)), "mse")
    sizes = []

    class Grow(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            sizes.append(int(model.optimizer.gradient_statistics.batch_size.numpy()))
            if batch == 4:
                ds.micro_batch_size = 32

    keras_adapt.callbacks.GradientStatsMonitor(1).set_model(model)  # records b in-graph
    model.fit(ds.dataset, steps_per_epoch=10, epochs=1, verbose=0, callbacks=[Grow()])
    assert sizes[-10:] == [8] * 5 + [32] * 5
    assert ds.samples >= 5 * 8 + 5 * 32


@pytest.mark.parametrize("kwargs, match", [
    ({"micro_batch_size": 0}, "micro_batch_size=0"),
    ({"micro_batch_size": 1000}, "larger than this worker's share"),
    ({"num_workers": 2, "rank": 2}, "rank=2"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AdaptiveBatchDataset(np.zeros((100, 2)), micro_batch_size=kwargs.pop("micro_batch_size", 4),
                             **kwargs)


def test_x_and_y_lengths_must_match():
    with pytest.raises(ValueError, match="same number of samples"):
        AdaptiveBatchDataset(np.zeros((10, 2)), np.zeros(9), micro_batch_size=2)
