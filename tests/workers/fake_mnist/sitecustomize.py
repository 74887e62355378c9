"""Test-only: ``keras.datasets.mnist.load_data`` returns seeded synthetic
data of MNIST's shapes and dtypes instead of downloading MNIST.

tests/test_elastic_example.py puts this folder first on the PYTHONPATH of
the Horovod example it runs (Python imports ``sitecustomize`` at start-up).
The replacement is set on ``keras.src.datasets.mnist`` as soon as that
module is loaded, before Keras's public ``keras.datasets.mnist`` (and
``tf.keras.datasets.mnist``) imports the name, on Keras 3 and tf.keras 2.
"""

import importlib.abc
import importlib.util
import sys

MODULE = "keras.src.datasets.mnist"
SAMPLES = 2048  # training images; 512 test images


def load_data(path="mnist.npz"):
    """MNIST's ``((x_train, y_train), (x_test, y_test))``: uint8 images of
    28 x 28 and uint8 labels 0-9, seeded; ``path`` is ignored."""
    import numpy as np

    rng = np.random.default_rng(0)

    def split(n):
        return (rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
                rng.integers(0, 10, (n,), dtype=np.uint8))

    return split(SAMPLES), split(SAMPLES // 4)


class _Patch(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Loads MODULE with its own loader, then replaces its ``load_data``."""

    def find_spec(self, name, path=None, target=None):
        if name != MODULE:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        self.loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        module.load_data = load_data


sys.meta_path.insert(0, _Patch())
