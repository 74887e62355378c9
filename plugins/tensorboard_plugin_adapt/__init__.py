"""TensorBoard plugin "adapt": noise scale, batch size and rescaling events.

``metadata`` is the one schema module that the writers (``summary``,
``keras_adapt.events``) and the reader (``plugin``) import. It has no
TensorFlow dependency, so TensorBoard can load it without TensorFlow.
"""
