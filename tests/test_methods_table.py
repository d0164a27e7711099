"""docs/methods_table.md is generated from the registries and must match them."""

import importlib.util
import pathlib

from rlvr_jax import advantages, losses

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _tool():
  spec = importlib.util.spec_from_file_location(
    "methods_table", ROOT / "tools" / "methods_table.py"
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_methods_table_matches_the_registries():
  text = (ROOT / "docs" / "methods_table.md").read_text()
  assert text == _tool().render(), "stale: run `python tools/methods_table.py`"
  for name in list(losses.OBJECTIVES) + list(advantages.ESTIMATORS):
    assert f"| `{name}` |" in text, name


def test_the_table_follows_a_registration():
  tool = _tool()
  before = tool.render()
  spec = advantages.EstimatorSpec("test_table_only", advantages.rloo_advantages)
  advantages.register_estimator(spec)
  try:
    after = tool.render()
  finally:
    advantages.ESTIMATORS.pop("test_table_only")
  assert "| `test_table_only` |" in after and after != before and tool.render() == before
