"""The pure math of adaptation: no TensorFlow, Keras or Horovod.

* :mod:`~keras_adapt.formulas.communication`: the share of a step the
  gradients' transfer takes, and what float16 makes of it;
* :mod:`~keras_adapt.formulas.goodput`: a sample's statistical efficiency
  at a batch and the goodput gain of a move (Pollux, McCandlish et al.);
* :mod:`~keras_adapt.formulas.scaling_rules`: how the learning rate follows
  the batch size (linear, square root, AdaScale);
* :mod:`~keras_adapt.formulas.throughput`: the time of one optimizer update
  as a function of micro-batch, workers and accumulation, fitted online.

The policies (:mod:`keras_adapt.policies`, which re-exports the public
names), the elastic resize rule and the planner (:mod:`keras_adapt.plan`)
import them; they import nothing else of keras-adapt, so ``keras-adapt
plan`` runs without TensorFlow.

Example:

>>> from keras_adapt import formulas
>>> formulas.goodput.statistical_efficiency(96, 32, 32.0)
0.5
>>> formulas.scaling_rules.get("sqrt").factor(4.0)
2.0
>>> formulas.throughput.ThroughputModel(warmup=0).configurations()
{}
"""

from keras_adapt.formulas import communication, goodput, scaling_rules, throughput

__all__ = ["communication", "goodput", "scaling_rules", "throughput"]
