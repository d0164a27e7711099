"""Configs: command-line overrides of any field, fail-fast validation naming the field."""

import glob
import importlib.util
import inspect

import pytest
from absl import flags
from ml_collections import config_flags

from rlvr_jax import losses
from rlvr_jax.train import config as config_lib
from rlvr_jax.train import methods

EXPERIMENTS = sorted(glob.glob("experiments/*.py"))


def _parse(*overrides, path="experiments/default.py"):
  argv = ["prog", f"--config={path}", *overrides]
  fv = flags.FlagValues()
  # Override flags are discovered from the argv given at definition time.
  config_flags.DEFINE_config_file("config", None, "config", flag_values=fv, sys_argv=argv)
  fv(argv)
  return fv.config


def _load(path):
  spec = importlib.util.spec_from_file_location("exp", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_overrides_reach_nested_and_objective_fields():
  c = _parse(
    "--config.rl.num_steps=7",
    "--config.objective.name=dapo",
    "--config.objective.kwargs.clip_high=0.3",
    "--config.objective.kwargs.loss_agg_mode=token_mean",
    "--config.data.task.max_value=20",
    "--config.logging.tensorboard=False",
  )
  assert c.rl.num_steps == 7 and c.objective.name == "dapo" and c.data.task.max_value == 20
  assert c.logging.tensorboard is False
  assert config_lib.objective_kwargs(c) == {"clip_high": 0.3, "loss_agg_mode": "token_mean"}
  config_lib.validate(c)


def test_unknown_or_badly_typed_override_fails():
  with pytest.raises(flags.IllegalFlagValueError):
    _parse("--config.rl.num_steps=many")
  with pytest.raises((flags.Error, AttributeError, KeyError)):
    _parse("--config.rl.no_such_field=1")


@pytest.mark.parametrize(
  "override,field",
  [
    ("--config.rl.num_microbatches=3", "config.rl.num_microbatches"),
    ("--config.sampling.num_samples=1", "config.sampling.num_samples"),
    ("--config.sampling.phase_steps=-1", "config.sampling.phase_steps"),
    ("--config.objective.name=ppo2", "config.objective.name"),
    ("--config.rl.advantage=vtrace", "config.rl.advantage"),
    ("--config.optim.learning_rate=-1.0", "config.optim.learning_rate"),
    ("--config.objective.kwargs.kl_coef=0.1", "config.rl.use_reference"),
    ("--config.data.task.ops=-", "config.warm_start.drop_carry_prob"),
    ("--config.model.source=smollm2", "config.tokenizer.kind"),
    ("--config.objective.name=copo", "config.rl.advantage"),
    ("--config.rl.fused_loss=yes", "config.rl.fused_loss"),
  ],
)
def test_validation_names_the_field(override, field):
  c = _parse(override)
  with pytest.raises(config_lib.ConfigError, match=field.replace(".", r"\.")):
    config_lib.validate(c)


def test_every_objective_hyperparameter_is_overridable():
  known = config_lib.objective_hyperparameters()
  for name, fn in losses.OBJECTIVES.items():
    for p in inspect.signature(fn).parameters.values():
      if p.kind == p.KEYWORD_ONLY and p.name not in methods.array_kwargs():
        assert p.name in known, (name, p.name)
  assert known["clip_high"] is float and known["loss_agg_mode"] is str


@pytest.mark.parametrize("path", EXPERIMENTS)
def test_experiment_configs_validate_and_document_themselves(path):
  module = _load(path)
  if not hasattr(module, "get_config"):
    pytest.skip(f"{path} is not a config file")
  doc = module.__doc__ or ""
  assert "python -m rlvr_jax.main" in doc and "Expected" in doc, path
  config_lib.validate(module.get_config())
