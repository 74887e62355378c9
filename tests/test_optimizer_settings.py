"""AdaptSettings: the optimizer's settings as one checked, frozen object."""

import dataclasses
import inspect

import numpy as np
import pytest

import keras
import keras_adapt
from keras_adapt.optimizer import DEFAULT_STATS_INTERVAL, AdaptSettings, distributed_class
from keras_adapt.sync import AllReduceSGD, LocalSGD

# The defaults as DistributedOptimizer's docstring documents them (the API reference), written
# out here independently of the code.
DOCUMENTED_DEFAULTS = {
    "gradient_stats": True, "ema_decay": 0.99, "batch_size": None, "skip_nonfinite": False,
    "stats_interval": 10, "sparse_as_dense": False, "backward_passes_per_step": 1,
    "average_aggregated_gradients": False, "compression": None, "op": None,
    "gradient_predivide_factor": 1.0, "process_set": None, "scale_local_gradients": True,
    "local_layers": None, "sync_strategy": None,
}


def test_the_factory_signature_takes_its_defaults_from_the_settings():
    params = inspect.signature(keras_adapt.DistributedOptimizer).parameters
    assert list(params)[0] == "optimizer"
    signature = {name: p.default for name, p in params.items() if name != "optimizer"}
    fields = {f.name: f.default for f in dataclasses.fields(AdaptSettings)}
    assert signature == fields == DOCUMENTED_DEFAULTS
    assert DEFAULT_STATS_INTERVAL == 10


def test_made_settings_normalise_layers_and_strategies():
    settings = AdaptSettings()
    assert settings.local_layers == ()
    assert len(settings.sync_strategy) == 1 and isinstance(settings.sync_strategy[0], AllReduceSGD)
    layer = keras.layers.Dense(2)
    settings = AdaptSettings(local_layers=layer, sync_strategy=["local_sgd", "allreduce_sgd"],
                             gradient_predivide_factor=2)
    assert settings.local_layers == (layer,)
    assert [type(s) for s in settings.sync_strategy] == [LocalSGD, AllReduceSGD]
    assert settings.gradient_predivide_factor == 2.0
    assert isinstance(settings.gradient_predivide_factor, float)


def test_the_optimizer_carries_the_settings_it_was_given():
    opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1), ema_decay=0.9,
                                           stats_interval=3, backward_passes_per_step=2)
    assert opt.adapt_settings is type(opt).adapt_settings
    assert (opt.adapt_settings.ema_decay, opt.adapt_settings.stats_interval,
            opt.adapt_settings.backward_passes_per_step) == (0.9, 3, 2)
    assert opt.gradient_statistics.ema_decay == 0.9
    assert int(opt.gradient_statistics.interval.numpy()) == 3
    assert opt.adapt_state.accumulation.steps_value == 2


@pytest.mark.parametrize("kwargs,err,message", [
    ({"gradient_stats": "yes"}, TypeError, "gradient_stats='yes' is not valid; use True or False"),
    ({"scale_local_gradients": None}, TypeError,
     "scale_local_gradients=None is not valid; use True or False"),
    ({"ema_decay": 0.0}, ValueError, "ema_decay=0.0 is not valid; use a float"),
    ({"batch_size": -4}, ValueError, "batch_size=-4 is not valid; use a positive int"),
    ({"stats_interval": 0}, ValueError, "stats_interval=0 is not valid; use a positive int"),
    ({"backward_passes_per_step": 1.5}, ValueError,
     "backward_passes_per_step=1.5 is not valid; use a positive int"),
    ({"gradient_predivide_factor": -1.0}, ValueError,
     "gradient_predivide_factor=-1.0 is not valid; use a float > 0"),
    ({"compression": "fp16"}, ValueError, "compression='fp16' is not valid; use"),
    ({"local_layers": ["dense"]}, TypeError, "local_layers holds str: 'dense', which is not valid"),
    ({"sync_strategy": "gossip"}, ValueError, "sync_strategy='gossip' is not a known strategy"),
])
def test_an_invalid_value_raises_naming_it(kwargs, err, message):
    with pytest.raises(err) as caught:
        AdaptSettings(**kwargs)
    assert str(caught.value).startswith(message)
    with pytest.raises(err) as caught:  # the factory raises the same error
        keras_adapt.DistributedOptimizer(keras.optimizers.SGD(), **kwargs)
    assert str(caught.value).startswith(message)


def test_settings_are_frozen_and_replace_checks_the_new_value():
    settings = AdaptSettings(ema_decay=0.9)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.ema_decay = 0.5
    changed = dataclasses.replace(settings, stats_interval=4)
    assert (changed.ema_decay, changed.stats_interval) == (0.9, 4)
    assert settings.stats_interval == 10  # the original is unchanged
    assert changed.sync_strategy == settings.sync_strategy  # normalised values pass again
    with pytest.raises(ValueError, match="stats_interval=0 is not valid"):
        dataclasses.replace(settings, stats_interval=0)


def test_distributed_class_refuses_a_dict():
    with pytest.raises(TypeError, match=r"settings=\{'gradient_stats': False\} is not valid; "
                                        "use a keras_adapt.optimizer.AdaptSettings"):
        distributed_class(keras.optimizers.SGD, {"gradient_stats": False})


def test_config_round_trip_keeps_the_settings():
    opt = keras_adapt.DistributedOptimizer(keras.optimizers.Adam(0.01), ema_decay=0.95,
                                           skip_nonfinite=True, stats_interval=2)
    copy = type(opt).from_config(opt.get_config())
    assert copy.adapt_settings == opt.adapt_settings
    assert copy.get_config() == opt.get_config()
    assert not set(copy.get_config()) & {f.name for f in dataclasses.fields(AdaptSettings)}
    assert copy.gradient_statistics.ema_decay == 0.95 and copy.adapt_state.skip_nonfinite
    assert copy.adapt_state is not opt.adapt_state


def test_load_model_makes_the_settings_it_is_given(tmp_path):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    model.fit(np.ones((8, 3)), np.ones((8, 1)), batch_size=4, verbose=0)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras_adapt.load_model(path, ema_decay=0.8, stats_interval=5)
    assert loaded.optimizer.adapt_settings == AdaptSettings(ema_decay=0.8, stats_interval=5)
    assert int(np.asarray(loaded.optimizer.iterations)) == 2
    resaved = str(tmp_path / "again.keras")
    loaded.save(resaved)
    again = keras_adapt.load_model(resaved, ema_decay=0.8, stats_interval=5)
    assert again.optimizer.adapt_settings.ema_decay == 0.8
    assert int(np.asarray(again.optimizer.iterations)) == 2
