"""The stored form of keras-adapt's records: the schema, its writers and its readers.

``metadata`` is the one schema (plugin names, tags, data classes, the event
record and the stored format's version), imported by the writers
(``summary``: TensorBoard summaries; ``events``: the adaptation events, one
JSON line each in ``adapt_events.jsonl``, and their listeners) and the
readers (``reader``: a TensorBoard data provider's adapt data, used by the
TensorBoard plugin ``tensorboard_plugin_adapt``; ``runs``: a log
directory's runs read on this machine, used by ``keras-adapt report`` and
``keras-adapt plan``). The library owns the schema; its viewer imports it,
never the reverse. Only ``summary`` imports TensorFlow: TensorBoard loads
``metadata`` and ``reader`` in its own process without it.

Example:

>>> from keras_adapt.record import metadata
>>> metadata.EVENTS_TAG
'adapt/events'
"""
