"""Every config field has a one-line help; error messages name the value and the choices."""

import pytest

from rlvr_jax import cli
from rlvr_jax.train import config as config_lib
from rlvr_jax.train import config_help


def _fields():
  return cli.flatten(config_lib.base_config())


def test_every_field_has_help_and_no_help_is_stale():
  fields = _fields()
  missing = [f for f in fields if not config_help.help_for(f)]
  assert not missing, f"fields without a line in config_help.FIELD_HELP: {missing}"
  stale = [f for f in config_help.FIELD_HELP if f not in fields]
  assert not stale, f"FIELD_HELP entries for fields that no longer exist: {stale}"
  assert all(f in fields for f in config_help.CHOICES)
  for field, text in config_help.FIELD_HELP.items():
    assert isinstance(text, str) and "\n" not in text and len(text) <= 100, field


def test_choices_are_the_values_validate_accepts():
  for field, choices in config_help.CHOICES.items():
    for value in choices:
      c = config_lib.base_config()
      node = c
      *blocks, leaf = field.split(".")
      for b in blocks:
        node = node[b]
      node[leaf] = value
      try:
        config_lib.validate(c)
      except config_lib.ConfigError as e:  # only a *combination* may be refused, not the value
        assert not str(e).startswith(f"config.{field}: {value!r}"), e


def test_objective_kwargs_help_names_the_objectives_using_it():
  text = config_help.help_for("objective.kwargs.clip_high")
  assert "dapo" in text and "used by" in text


@pytest.mark.parametrize(
  "typo,expected",
  [("rl.num_stepz", ["rl.num_steps"]), ("rll.num_steps", ["rl.num_steps"]),
   ("num_samples", ["eval.num_samples", "sampling.num_samples"]), ("optim.xyz", [])],
)  # fmt: skip
def test_closest_field(typo, expected):
  assert sorted(cli.closest_fields(typo, _fields())) == expected


def test_explain_config_error_adds_value_and_choices():
  c = config_lib.base_config()
  c.model.dtype = "float16"
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(c)
  msg = cli.explain_config_error(e.value, c)
  assert msg.startswith("config.model.dtype: 'float16'") and "valid: float32, bfloat16" in msg
  c = config_lib.base_config()
  c.rl.num_steps = 0
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(c)
  assert cli.explain_config_error(e.value, c) == "config.rl.num_steps: must be >= 1 (got 0)"


def test_experiment_names_resolve_to_files():
  assert cli.resolve_experiment("default").endswith("experiments/default.py")
  assert cli.resolve_experiment("experiments/default.py") == "experiments/default.py"
  assert "smollm2_arithmetic" in cli.experiment_names()
  assert "ablation_toy" not in cli.experiment_names()  # no get_config(): not an experiment
  with pytest.raises(cli.UsageError, match="no experiment of that name.*default"):
    cli.resolve_experiment("defualt")


def test_override_of_a_block_or_unknown_field_is_named():
  c = config_lib.base_config()
  with pytest.raises(cli.UsageError, match=r"config.rl: a block of fields, not a value"):
    cli.check_overrides(c, ["prog", "--config.rl=3"])
  with pytest.raises(cli.UsageError, match=r"did you mean config.logging.plot\?"):
    cli.check_overrides(c, ["prog", "--noconfig.logging.plott"])
  cli.check_overrides(c, ["prog", "--config.rl.num_steps=3", "--noconfig.logging.plot"])
