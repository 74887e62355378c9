"""``SyncStrategy``: how the workers' models are kept in agreement."""

import tensorflow as tf


class SyncStrategy:
    """Base class of the synchronisation strategies.

    A strategy is a small object holding its parameters. The optimizer keeps
    the *choice* of strategy and every parameter in ``tf.Variable``\\ s of its
    :class:`~keras_adapt.sync.SyncState` (``optimizer.adapt_state.sync``), so
    switching strategy or changing a parameter never retraces the train
    function.

    Every strategy other than :class:`~keras_adapt.sync.AllReduceSGD` is
    *local*: each worker applies its own gradient (no gradient allreduce),
    then on its synchronisation updates (:meth:`sync_due`) the strategy's
    :meth:`synchronize` combines the models with one grouped allreduce of
    the weights. Optimizer slots (momentum, Adam moments) stay local under
    every local strategy (see docs/sync_strategies.md).

    Subclasses set ``name`` and ``index`` (the value of the strategy variable;
    fixed per class) and implement :meth:`params` and :meth:`synchronize`.

    Example:

    >>> from keras_adapt.sync import LocalSGD, SyncStrategy
    >>> s = LocalSGD(period=4)
    >>> isinstance(s, SyncStrategy), s.name, s.params()
    (True, 'local_sgd', {'period': 4, 'start_after': 0})
    """

    name = None
    index = None
    #: Whether this strategy applies each worker's own gradient.
    local = True
    #: Whether its synchronisation leaves every worker with the same model
    #: (LocalSGD, BMUF; not SMA or EASGD, which only pull the models together).
    agrees = True
    #: Whether its updates never meet in a collective (PairAveraging): the
    #: callbacks' own per-interval collectives are then skipped where they can be.
    asynchronous = False

    def params(self):
        """The parameters, by name (the names of :class:`SyncState` variables)."""
        raise NotImplementedError

    def with_params(self, **params):
        """A copy with some parameters changed (validated).

        Example:

        >>> from keras_adapt.sync import ModelAveraging
        >>> ModelAveraging(0.1).with_params(alpha=0.5)
        ModelAveraging(alpha=0.5)
        """
        unknown = sorted(set(params) - set(self.params()))
        if unknown:
            raise ValueError(
                f"{type(self).__name__} has no parameter {', '.join(unknown)}; "
                f"its parameters are {', '.join(sorted(self.params())) or 'none'}"
            )
        return type(self)(**{**self.params(), **params})

    def sync_due(self, variables, count):
        """In-graph: whether the update number ``count`` (0-based, counted
        since this strategy was selected) synchronises the models. Every H-th
        update by default (H = ``variables["period"]``)."""
        return tf.equal(tf.math.floormod(count + 1, variables["period"]), 0)

    def synchronize(self, context):
        """In-graph: combines the models on a synchronisation update (after
        this worker's own update). ``context`` is a :class:`SyncContext`."""
        raise NotImplementedError

    def __eq__(self, other):
        return type(self) is type(other) and self.params() == other.params()

    def __hash__(self):
        return hash((type(self), tuple(sorted(self.params().items()))))

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"


class SyncContext:
    """What a strategy's :meth:`SyncStrategy.synchronize` works on (in-graph).

    Attributes:
        weights: the model variables the workers share (worker-local ones excluded).
        variables: the :class:`SyncState` parameter variables, by name.
        num_workers: N.
        learning_rate: a function returning the current effective learning
            rate (a float32 tensor).
        extra: the strategy's own state (BMUF's global model and block
            velocity, EASGD's centre), made at the first trace.
        updates: the updates done under the strategy before this one (a tensor).
        exchange: PairAveraging's transport (else None).

    Example:

    >>> import tensorflow as tf
    >>> from keras_adapt.sync.base import SyncContext
    >>> ctx = SyncContext([tf.Variable([1.0])], {}, 1, lambda: tf.constant(0.1), {})
    >>> [t.numpy().tolist() for t in ctx.mean([tf.constant([2.0])])]
    [[2.0]]
    """

    def __init__(self, weights, variables, num_workers, learning_rate, extra, reduction=None,
                 updates=None, exchange=None):
        self.weights = weights
        self.updates = updates
        self.exchange = exchange
        self.variables = variables
        self.num_workers = num_workers
        self.learning_rate = learning_rate
        self.extra = extra
        self._reduction = reduction

    def mean(self, tensors):
        """The average of ``tensors`` over the workers: one grouped allreduce
        (always an average, uncompressed, over the optimizer's process set)."""
        from keras_adapt import _hvd

        if self._reduction is None:
            self._reduction = _hvd.Reduction()
        return self._reduction.allreduce([tf.convert_to_tensor(t) for t in tensors])

    def assign(self, variables, values):
        """Assigns ``values`` to ``variables``; returns an op that runs them."""
        return tf.group([v.assign(x) for v, x in zip(variables, values)])
