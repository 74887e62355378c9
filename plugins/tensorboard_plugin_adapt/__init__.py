"""TensorBoard plugin "adapt": noise scale, batch size and rescaling events.

The viewer only: the schema, the writers and the readers of the stored data
live in the library (``keras_adapt.record``), which this plugin imports; the
library never imports the plugin.
"""
