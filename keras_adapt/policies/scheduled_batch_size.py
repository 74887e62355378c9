"""ScheduledBatchSizePolicy: grow the batch on a schedule instead of decaying the LR."""

from keras_adapt.checks import check_int, invalid
from keras_adapt.policies.batch_size_policy import BatchSizePolicy


class ScheduledBatchSizePolicy(BatchSizePolicy):
    """Sets the global batch at given epochs ("Don't decay the learning rate,
    increase the batch size", Smith et al. 2017).

    Where a step schedule would divide the learning rate by a factor, this
    policy multiplies the batch by it instead: same noise reduction, fewer
    updates. Changes happen at the beginning of the listed epochs.

    Args:
        schedule: ``{epoch: global_batch}``; at the start of each listed epoch
            the global batch becomes that value (clipped to the bounds).
        min_batch, max_batch: bounds (default: the smallest and largest
            value of the schedule and the starting batch).
        **kwargs: see :class:`BatchSizePolicy`.

    Example:

    >>> from keras_adapt.policies import ScheduledBatchSizePolicy
    >>> policy = ScheduledBatchSizePolicy({2: 256, 4: 1024}, min_batch=64, max_batch=1024,
    ...                                   micro_batch_size=32)
    >>> policy.batch_for_epoch(3)
    256
    """

    def __init__(self, schedule, min_batch=1, max_batch=None, **kwargs):
        if not isinstance(schedule, dict) or not schedule:
            raise invalid(
                "schedule", schedule, "use a non-empty dict "
                "{epoch: global_batch}, e.g. {30: 1024, 60: 4096}"
            )
        clean = {}
        for epoch, batch in schedule.items():
            epoch = int(epoch) if isinstance(epoch, str) and epoch.isdigit() else epoch
            check_int("schedule epoch", epoch, 0)
            clean[epoch] = check_int(f"schedule[{epoch}]", batch)
        if max_batch is None:
            max_batch = max(clean.values())
        super().__init__(min_batch, max_batch, **kwargs)
        self.schedule = dict(sorted(clean.items()))

    def batch_for_epoch(self, epoch):
        """The scheduled global batch for ``epoch`` (None before the first entry)."""
        chosen = None
        for start, batch in self.schedule.items():
            if epoch >= start:
                chosen = batch
        return chosen

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        target = self.batch_for_epoch(epoch)
        if target is None or self.batch.value is None:
            return
        if self.base_batch is None:
            self.base_batch = self.batch.value
        # Also right for a resumed fit(initial_epoch=...) between two entries.
        self.change_batch(target, f"schedule: epoch {epoch} -> batch {target}")

    def get_config(self):
        config = super().get_config()
        config["schedule"] = {str(k): v for k, v in self.schedule.items()}
        return config
