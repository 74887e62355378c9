"""Seeded synthetic tasks shipped with keras-adapt (no downloads).

* :func:`linear_regression`: Gaussian inputs, a known true weight and Gaussian
  label noise; the gradient noise scale at any weight has a closed form
  (:func:`linear_regression_gradient_stats`), which the tests use as truth.
* :func:`teacher_student`: labels from a fixed random "teacher" network with
  label noise; scales to any size and gets harder as the student improves,
  so its noise scale grows during training.
"""

import numpy as np


def _rng(seed):
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {seed!r}")
    return np.random.default_rng(int(seed))


def linear_regression(num_samples, dim, true_weights, noise_std=1.0, seed=0):
    """Samples ``y = x . w* + eps`` with ``x ~ N(0, I)`` and ``eps ~ N(0, noise_std^2)``.

    Example:

    >>> import numpy as np
    >>> from keras_adapt.data import linear_regression
    >>> x, y = linear_regression(4, 3, np.ones(3), seed=1)
    >>> x.shape, y.shape, x.dtype.name
    ((4, 3), (4, 1), 'float32')
    """
    if num_samples < 1 or dim < 1:
        raise ValueError(f"num_samples={num_samples} and dim={dim} must be positive ints")
    w = np.asarray(true_weights, dtype=np.float64).reshape(dim)
    rng = _rng(seed)
    x = rng.standard_normal((num_samples, dim))
    y = x @ w + noise_std * rng.standard_normal(num_samples)
    return x.astype(np.float32), y.reshape(-1, 1).astype(np.float32)


def linear_regression_gradient_stats(weights, true_weights, noise_std=1.0):
    """Analytic |G|^2, tr(Sigma) and B_simple of the mean-squared-error loss.

    For the per-sample loss ``(x . w - y)^2`` with ``x ~ N(0, I_d)`` the
    per-sample gradient is ``g = 2 x (x . d - eps)`` with ``d = w - w*``, so
    ``G = 2 d`` and, by Isserlis' theorem, ``Cov(g) = 4 (|d|^2 I + d d^T +
    sigma^2 I)``, hence ``tr(Sigma) = 4 ((dim + 1) |d|^2 + dim sigma^2)``.

    Example:

    >>> from keras_adapt.data import linear_regression_gradient_stats
    >>> s = linear_regression_gradient_stats([1.0, 0.0], [0.0, 0.0], noise_std=1.0)
    >>> s["grad_sqr"], s["grad_var"], s["gns"]
    (4.0, 20.0, 5.0)
    """
    w = np.asarray(weights, dtype=np.float64).ravel()
    w_true = np.asarray(true_weights, dtype=np.float64).ravel()
    delta = w - w_true
    d2 = float(delta @ delta)
    dim = w.size
    grad_sqr = 4.0 * d2
    grad_var = 4.0 * ((dim + 1) * d2 + dim * noise_std**2)
    return {"grad_sqr": grad_sqr, "grad_var": grad_var, "gns": grad_var / grad_sqr}


def teacher_student(num_samples, dim=32, num_classes=10, hidden=64, label_noise=0.05, seed=0):
    """Classification data labelled by a fixed random two-layer teacher network.

    A fraction ``label_noise`` of labels is replaced by a random class, which
    bounds the reachable accuracy at about ``1 - label_noise * (1 - 1/num_classes)``.
    The teacher depends only on ``seed``, so train and test sets drawn with
    different ``num_samples`` share it.

    Example:

    >>> from keras_adapt.data import teacher_student
    >>> x, y = teacher_student(100, dim=8, num_classes=3, seed=0)
    >>> x.shape, y.shape, int(y.max()) <= 2
    ((100, 8), (100,), True)
    """
    if num_samples < 1:
        raise ValueError(f"num_samples={num_samples} must be a positive int")
    if not 0.0 <= label_noise < 1.0:
        raise ValueError(f"label_noise={label_noise} must be in [0, 1)")
    teacher = _rng(seed)
    w1 = teacher.standard_normal((dim, hidden)) / np.sqrt(dim)
    w2 = teacher.standard_normal((hidden, num_classes)) / np.sqrt(hidden)
    rng = _rng(seed + 1_000_003 + num_samples)
    x = rng.standard_normal((num_samples, dim))
    logits = np.tanh(x @ w1) @ w2
    y = np.argmax(logits, axis=1)
    flip = rng.random(num_samples) < label_noise
    y[flip] = rng.integers(0, num_classes, flip.sum())
    return x.astype(np.float32), y.astype(np.int64)
