"""The dependency rules of the tree (WORKSPACE.md, "Layout"), checked on the source.

* Pure math (``losses/``, ``advantages/``, ``logprobs/``, ``regularizers``, ``types``) imports only
  jax (with jax's own numpy and, optionally, chex), a few pure-computation stdlib modules, and
  other pure-math modules of ``rlvr_jax``.
* ``rewards/`` and ``envs/`` import no jax (the runtime check that workers start without jax is
  ``test_rewards_runtime.py``; this one also covers modules no test happens to import) and no
  ``rlvr_jax`` code outside ``rewards/``.
* ``model/`` and ``sampling/`` import no training code (``rlvr_jax.train``, ``rlvr_jax.main``).

Every ``import`` / ``from ... import`` in a module counts, including those inside functions, and so
do ``importlib.import_module("...")`` calls with a literal name. A failure names the file, the line
and the import.
"""

import ast
import pathlib
import subprocess
import sys
import textwrap

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "rlvr_jax"

PURE_MATH = ("losses", "advantages", "logprobs", "regularizers", "types")
PURE_THIRD_PARTY = {"jax", "numpy", "chex"}  # numpy: jax's host arrays (float0 cotangents, checks)
PURE_STDLIB = {"__future__", "abc", "collections", "dataclasses", "enum", "functools", "itertools",
               "math", "numbers", "operator", "typing"}  # fmt: skip
JAX_FAMILY = {"jax", "jaxlib", "chex", "flax", "optax", "orbax", "ml_dtypes"}
TRAINING = ("rlvr_jax.train", "rlvr_jax.main")


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _files(*names: str) -> list[pathlib.Path]:
  """The .py files of the named subpackages / modules of rlvr_jax."""
  out = []
  for name in names:
    package, module = PACKAGE / name, PACKAGE / f"{name}.py"
    assert package.is_dir() != module.is_file(), f"rlvr_jax/{name} should be a package or a module"
    out += sorted(package.rglob("*.py")) if package.is_dir() else [module]
  return out


def imports(path: pathlib.Path) -> list[tuple[int, str]]:
  """(line, absolute dotted name) of every import in the file; ``from a import b`` gives ``a.b``
  (b may be a submodule) and relative imports are resolved against the file's package."""
  tree = ast.parse(path.read_text(), filename=str(path))
  module = _module_name(path)
  package = module if path.name == "__init__.py" else module.rpartition(".")[0]
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found += [(node.lineno, alias.name) for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
      found += [(node.lineno, f"{base}.{alias.name}" if alias.name != "*" else base)
                for alias in node.names]  # fmt: skip
    elif (
      isinstance(node, ast.Call)
      and isinstance(node.func, ast.Attribute)
      and node.func.attr == "import_module"
      and node.args
      and isinstance(node.args[0], ast.Constant)
      and isinstance(node.args[0].value, str)
    ):
      found.append((node.lineno, node.args[0].value))
  return found


def _under(name: str, prefixes) -> bool:
  return any(name == p or name.startswith(p + ".") for p in prefixes)


def pure_math_violations(path: pathlib.Path) -> list[str]:
  allowed_internal = tuple(f"rlvr_jax.{name}" for name in PURE_MATH)
  bad = []
  for line, name in imports(path):
    top = name.split(".")[0]
    if top == "rlvr_jax":
      ok = _under(name, allowed_internal) or name == "rlvr_jax"
    else:
      ok = top in PURE_THIRD_PARTY or top in PURE_STDLIB
    if not ok:
      bad.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}")
  return bad


def rewards_violations(path: pathlib.Path, allowed=("rlvr_jax.rewards",)) -> list[str]:
  bad = []
  for line, name in imports(path):
    top = name.split(".")[0]
    if top in JAX_FAMILY or (top == "rlvr_jax" and not _under(name, allowed)):
      bad.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}")
  return bad


def training_violations(path: pathlib.Path) -> list[str]:
  return [f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
          for line, name in imports(path) if _under(name, TRAINING)]  # fmt: skip


def _report(rule: str, bad: list[str]) -> str:
  return f"{rule} broken by:\n  " + "\n  ".join(bad)


def test_pure_math_imports_only_jax_and_pure_math():
  files = _files(*PURE_MATH)
  names = {_module_name(f) for f in files}
  # the walk sees the parts, not only the package fronts (so the rule cannot pass vacuously)
  assert {
    "rlvr_jax.losses.registry",
    "rlvr_jax.advantages.group",
    "rlvr_jax.logprobs.fused",
  } <= names
  bad = [v for f in files for v in pure_math_violations(f)]
  assert not bad, _report("pure math imports only jax (+numpy, chex), pure stdlib, pure math", bad)


def test_rewards_import_no_jax():
  files = _files("rewards")
  assert len(files) > 5
  bad = [v for f in files for v in rewards_violations(f)]
  assert not bad, _report("rewards/ imports no jax and no rlvr_jax outside rewards/", bad)


def test_envs_import_no_jax():
  # environments run host-side in worker processes, as rewards do (they may use the rewards'
  # worker machinery, sandbox and safe evaluator, and the char tokenizer)
  files = _files("envs")
  assert len(files) > 5
  allowed = ("rlvr_jax.envs", "rlvr_jax.rewards", "rlvr_jax.data.char_tokenizer")
  bad = [v for f in files for v in rewards_violations(f, allowed)]
  assert not bad, _report("envs/ imports no jax and only envs/, rewards/ of rlvr_jax", bad)


def test_model_and_sampling_import_no_training_code():
  files = _files("model", "sampling")
  assert len(files) > 5
  bad = [v for f in files for v in training_violations(f)]
  assert not bad, _report("model/ and sampling/ import nothing from train/ or main", bad)


def test_the_checks_catch_bad_imports(tmp_path, monkeypatch):
  # A fake rlvr_jax tree with one offending import per rule: each must be reported by name.
  fake = tmp_path / "rlvr_jax"
  (fake / "losses").mkdir(parents=True)
  (fake / "losses" / "bad.py").write_text(
    textwrap.dedent("""\
      import jax
      from . import surrogates
      from ..model import decoder
      def f():
        import subprocess
        return importlib.import_module("rlvr_jax.train.step")
      """)
  )
  (fake / "reward.py").write_text(
    "import jax.numpy as jnp\nfrom rlvr_jax.losses import aggregate\n"
  )
  (fake / "sampler.py").write_text(
    "from rlvr_jax.train import config\nfrom rlvr_jax import types\n"
  )
  monkeypatch.setitem(globals(), "PACKAGE", fake)
  assert pure_math_violations(fake / "losses" / "bad.py") == [
    "rlvr_jax/losses/bad.py:3 imports rlvr_jax.model.decoder",
    "rlvr_jax/losses/bad.py:5 imports subprocess",
    "rlvr_jax/losses/bad.py:6 imports rlvr_jax.train.step",
  ]
  assert rewards_violations(fake / "reward.py") == [
    "rlvr_jax/reward.py:1 imports jax.numpy",
    "rlvr_jax/reward.py:2 imports rlvr_jax.losses.aggregate",
  ]
  assert training_violations(fake / "sampler.py") == [
    "rlvr_jax/sampler.py:1 imports rlvr_jax.train.config"
  ]


def test_pure_math_packages_import_alone_in_any_order():
  # regularizers -> losses.aggregation -> losses/__init__ -> registry -> regularizers is a cycle;
  # importing regularizers FIRST is the order that would break if it were not safe. Loading the pure
  # packages must pull in no model / sampling / train / rewards code.
  code = (
    "import sys\n"
    "import rlvr_jax.regularizers, rlvr_jax.logprobs, rlvr_jax.advantages, rlvr_jax.losses\n"
    "from rlvr_jax import losses\n"
    "assert losses.OBJECTIVES and losses.step_statistics\n"
    "print(sorted(m for m in sys.modules if m.startswith('rlvr_jax')))\n"
  )
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent, timeout=300
  )
  assert out.returncode == 0, out.stderr
  loaded = ast.literal_eval(out.stdout.strip().splitlines()[-1])
  pure = [f"rlvr_jax.{name}" for name in PURE_MATH]
  outside = [m for m in loaded if m != "rlvr_jax" and not _under(m, pure)]
  assert not outside, f"importing the pure-math packages also loaded {outside}"
