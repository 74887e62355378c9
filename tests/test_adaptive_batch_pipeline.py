"""AdaptiveBatchPipeline and plain tf.data input: sizes per batch exactly as decided,
passes without loss or repeats, remainders, fit on both stacks, policies driving it."""

import time

import numpy as np
import pytest
import tensorflow as tf

import keras
import keras_adapt
from keras_adapt.actuators import GlobalBatchSize
from keras_adapt.data import AdaptiveBatchPipeline, fixed_batch_size
from keras_adapt.policies import ScheduledBatchSizePolicy


def _examples(n, seed=7):
    """A user's pipeline of single examples: map, seeded shuffle, prefetch."""
    ds = tf.data.Dataset.range(n).map(
        lambda i: {"id": i, "x": tf.fill([3], tf.cast(i, tf.float32))},
        num_parallel_calls=tf.data.AUTOTUNE)
    return ds.shuffle(n, seed=seed).prefetch(tf.data.AUTOTUNE)


def _expected_sizes(initial, decisions, count):
    sizes, size = [], initial
    for b in range(count):
        size = decisions.get(b, size)
        sizes.append(size)
    return sizes


def test_batches_have_the_decided_sizes_and_each_pass_is_the_input_stream():
    n, decisions = 50, {3: 7, 8: 2, 10: 16, 14: 5}
    pipeline = AdaptiveBatchPipeline(_examples(n), micro_batch_size=4, prefetch=8)
    it = iter(pipeline.dataset)
    ids, sizes = [], []
    for b in range(20):
        if b in decisions:
            pipeline.micro_batch_size = decisions[b]
        batch = next(it)
        sizes.append(len(batch["id"]))
        ids.extend(batch["id"].numpy().tolist())
        np.testing.assert_array_equal(batch["x"].numpy(), np.repeat(batch["id"].numpy()[:, None], 3, 1))
    assert sizes == _expected_sizes(4, decisions, 20)
    assert pipeline.changes == sorted(decisions.items())
    assert [pipeline.size_of(b) for b in range(20)] == sizes
    assert pipeline.batches == 20
    # The batches are the user's stream cut in pieces: same order, nothing
    # lost or repeated, and every pass (50 examples) is a permutation.
    truth = [int(e["id"]) for e in _examples(n).repeat().take(len(ids))]
    assert ids == truth
    for p in range(len(ids) // n):
        assert sorted(ids[p * n:(p + 1) * n]) == list(range(n))
    assert len(ids) // n >= 2  # several passes, batches spanning their borders


def test_one_pass_per_iterator_ends_with_the_remainder_and_numbers_continue():
    pipeline = AdaptiveBatchPipeline(tf.data.Dataset.range(10), micro_batch_size=4, repeat=False)
    first = [b.numpy().tolist() for b in pipeline.dataset]
    assert first == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    pipeline.micro_batch_size = 3
    second = [b.numpy().tolist() for b in pipeline.dataset]
    assert second == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert pipeline.changes == [(3, 3)] and pipeline.batches == 7
    # A pass that ends on a batch border forms no empty batch.
    even = AdaptiveBatchPipeline(tf.data.Dataset.range(8), micro_batch_size=4, repeat=False)
    assert [b.numpy().tolist() for b in even.dataset] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert even.batches == 2


def test_prefetch_after_the_pipeline_delays_the_switch_to_the_recorded_batch():
    # Buffering after the pipeline forms batches early; the change then
    # applies from the first batch not yet formed, and changes names it.
    pipeline = AdaptiveBatchPipeline(tf.data.Dataset.range(1000), micro_batch_size=2)
    it = iter(pipeline.dataset.prefetch(3))
    sizes = [len(next(it))]
    deadline = time.time() + 10
    while pipeline.batches < 4 and time.time() < deadline:
        time.sleep(0.01)
    pipeline.micro_batch_size = 5
    sizes += [len(next(it)) for _ in range(8)]
    (start, size), = pipeline.changes
    assert size == 5 and start >= 2  # batches 1 .. start-1 were formed ahead
    assert sizes == [2] * start + [5] * (9 - start)


def _model(dim):
    model = keras.Sequential([keras.Input((dim,)), keras.layers.Dense(1)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse")
    return model


class StepSizes(keras.callbacks.Callback):
    """Makes the decisions between steps and reads each step's batch from the graph."""

    def __init__(self, decide=None):
        super().__init__()
        self.decide = decide or {}
        self.sizes = []

    def on_train_batch_begin(self, batch, logs=None):
        if len(self.sizes) in self.decide:
            self.decide[len(self.sizes)]()

    def on_train_batch_end(self, batch, logs=None):
        self.sizes.append(int(self.model.optimizer.gradient_statistics.batch_size.numpy()))


def _xy(n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 4)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, x.sum(1, keepdims=True)))


def test_fit_uses_the_new_size_from_the_next_step_across_epochs_and_fit_calls():
    examples = _xy(300).map(lambda x, y: (2.0 * x, 2.0 * y), num_parallel_calls=tf.data.AUTOTUNE)
    examples = examples.shuffle(300, seed=1).prefetch(tf.data.AUTOTUNE)
    pipeline = AdaptiveBatchPipeline(examples, micro_batch_size=8, prefetch=32)
    model = _model(4)
    keras_adapt.callbacks.GradientStatsMonitor(1).set_model(model)  # records b in-graph

    def setter(m):
        return lambda: setattr(pipeline, "micro_batch_size", m)

    steps = StepSizes({3: setter(20), 6: setter(5), 11: setter(13)})  # 6: an epoch border
    model.fit(pipeline.dataset, steps_per_epoch=6, epochs=2, verbose=0, callbacks=[steps])
    model.fit(pipeline.dataset, steps_per_epoch=4, epochs=1, verbose=0, callbacks=[steps])
    assert steps.sizes == [8] * 3 + [20] * 3 + [5] * 5 + [13] * 5
    assert [m for _, m in pipeline.changes] == [20, 5, 13]
    assert int(model.optimizer.iterations.numpy()) == 16


def test_policy_grows_micro_batch_then_accumulation_through_the_pipeline():
    pipeline = AdaptiveBatchPipeline(_xy(500).shuffle(500, seed=2), micro_batch_size=16)
    model = _model(4)
    policy = ScheduledBatchSizePolicy({1: 64, 2: 128}, dataset=pipeline, max_micro_batch_size=32)
    steps = StepSizes()
    model.fit(pipeline.dataset, steps_per_epoch=8, epochs=3, verbose=0, callbacks=[policy, steps])
    # one worker: 16 x 1 -> 32 x 2 -> 32 x 4, switching at the epoch borders
    assert steps.sizes == [16] * 8 + [32] * 16
    assert policy.batch.accumulation.steps == 4
    assert int(model.optimizer.iterations.numpy()) == 8 + 8 // 2 + 8 // 4
    assert [(e["after"]["micro_batch_size"], e["after"]["accumulation"])
            for e in policy.events if e["kind"] == "batch_size"] == [(32, 2), (32, 4)]
    assert [m for _, m in pipeline.changes] == [32]


def test_policy_given_a_plain_batched_dataset_changes_only_k():
    data = _xy(200).batch(10, drop_remainder=True).repeat()
    model = _model(4)
    policy = ScheduledBatchSizePolicy({1: 40}, dataset=data)
    steps = StepSizes()
    model.fit(data, steps_per_epoch=8, epochs=2, verbose=0, callbacks=[policy, steps])
    assert steps.sizes == [10] * 16
    assert policy.batch.state() == {"batch_size": 40, "micro_batch_size": 10, "accumulation": 4,
                                    "workers": 1}
    assert int(model.optimizer.iterations.numpy()) == 8 + 2


def test_plain_dataset_with_a_remainder_needs_micro_batch_size():
    data = _xy(25).batch(10)  # last batch 5: the batch dimension is unknown
    assert fixed_batch_size(data) is None
    with pytest.raises(ValueError, match=r"cannot tell the micro-batch.*micro_batch_size=b"):
        GlobalBatchSize(_model(4), dataset=data)
    batch = GlobalBatchSize(_model(4), dataset=data, micro_batch_size=10)
    assert batch.set(30) == 30 and batch.accumulation.steps == 3
    with pytest.raises(ValueError, match="micro_batch_size=12 does not match"):
        GlobalBatchSize(_model(4), dataset=data.unbatch().batch(10, drop_remainder=True),
                        micro_batch_size=12)
    with pytest.raises(ValueError, match="AdaptiveBatchPipeline object itself"):
        GlobalBatchSize(_model(4), dataset=AdaptiveBatchPipeline(_xy(25), 5).dataset)
    with pytest.raises(TypeError, match="got list"):
        GlobalBatchSize(_model(4), dataset=[1, 2])


def test_fixed_batch_size_reads_every_component():
    ds = tf.data.Dataset.from_tensor_slices({"a": np.zeros((8, 2)), "b": np.zeros(8)})
    assert fixed_batch_size(ds.batch(4, drop_remainder=True)) == 4
    assert fixed_batch_size(ds) is None  # a scalar component: not batched
    with pytest.raises(TypeError, match="tf.data.Dataset"):
        fixed_batch_size(np.zeros(3))


@pytest.mark.parametrize("kwargs, error, match", [
    ({"dataset": np.zeros(4)}, TypeError, "AdaptiveBatchDataset"),
    ({"micro_batch_size": 0}, ValueError, "micro_batch_size=0"),
    ({"micro_batch_size": 2.5}, ValueError, "micro_batch_size=2.5"),
    ({"repeat": "yes"}, TypeError, "repeat must be True or False"),
    ({"prefetch": -3}, ValueError, "prefetch=-3"),
])
def test_bad_arguments(kwargs, error, match):
    args = {"dataset": tf.data.Dataset.range(4), "micro_batch_size": 2, **kwargs}
    with pytest.raises(error, match=match):
        AdaptiveBatchPipeline(**args)


def test_bad_new_size_is_refused_and_changes_nothing():
    pipeline = AdaptiveBatchPipeline(tf.data.Dataset.range(4), micro_batch_size=2)
    with pytest.raises(ValueError, match="micro_batch_size=-1"):
        pipeline.micro_batch_size = -1
    assert pipeline.micro_batch_size == 2 and pipeline.changes == []
