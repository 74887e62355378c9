"""The step timer leaves out what is not training: paused work is subtracted,
skipped updates and an epoch's end are dropped; a clock the test advances
stands for time, so every kept interval is known exactly."""

import threading

import numpy as np
import pytest

import keras
import keras_adapt
from keras_adapt.monitors import paused, skip_update
from keras_adapt.monitors.step_pauses import MODEL_WORK
from keras_adapt.policies import BatchSizePolicy, UpdateTimer


class Clock:
    """Seconds that pass only when the test says so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class KeptTimer(UpdateTimer):
    """An UpdateTimer that lists the updates it kept: (update number, seconds)."""

    def __init__(self, clock):
        super().__init__(clock=clock)
        self.kept = []
        self._number = 0

    def end_update(self):
        seconds, count = self.timed()
        super().end_update()
        after, after_count = self.timed()
        if after_count > count:
            self.kept.append((self._number, after - seconds))
        self._number += 1


def _steps(timer, clock, seconds, work=None):
    """Runs micro-steps of ``seconds`` each, one update apiece, as the policy
    calls the timer; ``work[i]()`` runs after step i (its callbacks)."""
    timer.begin_fit()
    for i, s in enumerate(seconds):
        timer.begin_step(i > 0)
        if i > 0:
            timer.end_update()
        clock.now += s
        if work and i in work:
            work[i]()
    timer.begin_step(True)
    timer.end_update()


def test_paused_seconds_are_subtracted_and_skipped_updates_dropped():
    clock = Clock()
    timer = KeptTimer(clock)

    def evaluate():
        with paused():
            clock.now += 100.0
            with paused():  # nested: counted once
                clock.now += 10.0

    def skip():
        clock.now += 1000.0
        skip_update()

    def skip_two():
        skip_update(2)

    def unmarked():
        clock.now += 7.0

    _steps(timer, clock, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
           {1: evaluate, 3: skip, 5: skip_two, 7: unmarked})
    # 1: 110 s paused, kept at 2; 3 dropped; 5 and 6 dropped; 7 keeps what nobody marked
    assert timer.kept == [(0, 1.0), (1, 2.0), (2, 3.0), (4, 5.0), (7, 15.0)]
    assert timer.dropped_updates == 3
    assert timer.timed() == (26.0, 5)


def test_an_epoch_end_drops_its_update_and_the_next():
    clock = Clock()
    timer = KeptTimer(clock)
    timer.begin_fit()
    for epoch in range(2):
        for i in range(3):
            timer.begin_step(i > 0)
            if i > 0:
                timer.end_update()
            clock.now += 1.0 + i
        timer.end_epoch()   # the policy's on_epoch_end, then the update's end
        timer.end_update()
    # epoch 0: updates 0, 1 kept, 2 (its end) dropped; epoch 1: 3 (after it) and 5 dropped
    assert timer.kept == [(0, 1.0), (1, 2.0), (4, 2.0)]
    assert timer.dropped_updates == 3


def test_a_pause_on_another_thread_drops_the_update_it_overlaps():
    clock = Clock()
    timer = KeptTimer(clock)

    def elsewhere():
        def work():
            with paused():
                clock.now += 50.0
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()

    _steps(timer, clock, [1.0, 2.0, 3.0], {1: elsewhere})
    assert timer.kept == [(0, 1.0), (2, 3.0)]
    assert timer.dropped_updates == 1


def test_skip_update_refuses_a_bad_count():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match=f"count={bad!r} is not valid; use a positive int"):
            skip_update(bad)
    with pytest.raises(TypeError, match="clock=3 is not valid"):
        UpdateTimer(clock=3)


class _Timed(BatchSizePolicy):
    """A batch-size policy that only times (one batch: it never decides)."""

    def __init__(self, timer):
        super().__init__(min_batch=8, max_batch=8, micro_batch_size=8, interval=10**6)
        self.update_timer = timer


def test_a_fit_with_evaluations_in_its_callbacks_times_only_the_steps():
    # 12 steps of one epoch: the callback placed first makes step n take
    # 1 + n seconds; the one after the policy, in on_train_batch_end,
    # evaluates at steps 2, 5 and 8 (model.evaluate: 100 s each), pauses 50 s
    # at step 4, marks step 6 (and costs 1000 s) and does 7 unmarked seconds
    # at step 9. Step 11 ends the epoch.
    clock = Clock()
    timer = KeptTimer(clock)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse")
    x, y = np.ones((96, 4), "float32"), np.ones((96, 1), "float32")

    class StepCost(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch > 0:
                clock.now += float(batch)  # step batch - 1 took 1 + (batch - 1) s

    class EvaluationCost(keras.callbacks.Callback):
        def on_test_begin(self, logs=None):
            clock.now += 100.0

    class Work(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch in (2, 5, 8):
                self.model.evaluate(x, y, verbose=0, callbacks=[EvaluationCost()])
            elif batch == 4:
                with paused():
                    clock.now += 50.0
            elif batch == 6:
                clock.now += 1000.0
                skip_update()
            elif batch == 9:
                clock.now += 7.0

    policy = _Timed(timer)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[StepCost(), policy, Work()])
    expected = [(n, 1.0 + n + (7.0 if n == 9 else 0.0)) for n in range(11) if n != 6]
    assert timer.kept == expected
    assert timer.dropped_updates == 2  # step 6, and step 11 at the epoch's end
    for name in MODEL_WORK:  # attached at the fit's begin
        assert getattr(model, name).keras_adapt_paused
