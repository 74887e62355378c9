"""The stored form of keras-adapt's records in TensorBoard logs.

``metadata`` is the one schema (plugin names, tags, data classes, the event
record and the stored format's version), imported by the writers
(``summary``, ``keras_adapt.events``) and the readers (``reader``, used by
``keras_adapt.report`` and by the TensorBoard plugin
``tensorboard_plugin_adapt``). The library owns the schema; its viewer
imports it, never the reverse. ``metadata`` and ``reader`` import no
TensorFlow, so TensorBoard loads them in its own process without it.

Example:

>>> from keras_adapt.record import metadata
>>> metadata.EVENTS_TAG
'adapt/events'
"""
