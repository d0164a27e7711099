"""Assert-test verdicts decided outside the sandbox, from values the program's process returns.

A test ``assert f(2) == 4`` is split into *probes*, the program-dependent parts (``f(2)``), which
the sandbox evaluates and serialises with exact-type checks, and the rest (``_p0 == 4``), which is
evaluated here on the decoded plain values. The sandbox never sees the expected values or the
comparisons, so an object whose ``__eq__`` is always true, a patched builtin or a rewritten test
list cannot make a test pass: the only way is to return the right values.

Splitting rules (``_Splitter``): a call of a program name (``f(...)``, ``Solution().g(...)``) or a
program name on its own is one probe, arguments included (they are inputs, not expected values);
comparisons, boolean and arithmetic operators, containers, subscripts, method calls and the
builtins in ``SAFE_BUILTINS`` (plus ``math``, ``cmath``) are evaluated here (a method is evaluated
here when its name is one of the plain types' methods, ``f(x).strip()``, else it is a probe), on the probes' values.
A test whose program-dependent part sits inside a lambda or a comprehension is refused (its
probes would need the comprehension's variables): write one assert per case. Test snippets are
trusted data (like the reward's configuration); they are evaluated here with only the safe
builtins, never with the program's objects.
"""

from __future__ import annotations

import ast
import builtins
import cmath
import dataclasses
import json
import math

SAFE_BUILTINS = {
  name: getattr(builtins, name)
  for name in (
    "abs all any ascii bin bool bytes chr complex dict divmod enumerate filter float format "
    "frozenset hex int isinstance iter len list map max min next oct ord pow range repr reversed "
    "round set slice sorted str sum tuple type zip True False None"
  ).split()
}
SAFE_MODULES = {"math": math, "cmath": cmath}
SAFE_NAMES = frozenset(SAFE_BUILTINS) | frozenset(SAFE_MODULES)
PLAIN_METHODS = frozenset(
  name
  for t in (str, bytes, list, tuple, dict, set, frozenset, int, float, complex)
  for name in dir(t)
  if not name.startswith("_")
)
_SCOPES = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.NamedExpr)


@dataclasses.dataclass(frozen=True)
class TestPlan:
  """Per test: the probe sources (evaluated in the sandbox) and the parent-side checks."""

  tests: tuple[str, ...]
  probes: list[list[str]]
  checks: tuple[tuple, ...]  # per test: compiled expressions over _p0, _p1, ...


def _dependent(node: ast.AST) -> bool:
  return any(isinstance(n, ast.Name) and n.id not in SAFE_NAMES for n in ast.walk(node))


class _Splitter(ast.NodeTransformer):
  def __init__(self, where: str):
    self.where = where
    self.probes: list[str] = []

  def probe(self, node: ast.AST) -> ast.Name:
    for n in ast.walk(node):
      if isinstance(n, _SCOPES):
        raise ValueError(
          f"{self.where}: program code inside a {type(n).__name__} cannot be checked outside the "
          "sandbox; write one assert per case"
        )
    source = ast.unparse(node)
    if source not in self.probes:
      self.probes.append(source)
    return ast.copy_location(ast.Name(f"_p{self.probes.index(source)}", ast.Load()), node)

  def visit_Name(self, node):  # noqa: N802
    return node if node.id in SAFE_NAMES else self.probe(node)

  def visit_Attribute(self, node):  # noqa: N802
    if isinstance(node.value, ast.Name) and node.value.id in SAFE_MODULES:
      return node
    return self.probe(node) if _dependent(node.value) else node

  def visit_Call(self, node):  # noqa: N802
    func = node.func
    if isinstance(func, ast.Attribute) and (
      isinstance(func.value, ast.Name)
      and func.value.id in SAFE_MODULES
      or func.attr in PLAIN_METHODS
      and not isinstance(func.value, ast.Name)
    ):
      # ``math.isclose(...)`` or a plain type's method on a computed value (``f(x).strip()``):
      # the base and the arguments are split, the method runs here on the plain value. Other
      # methods (``Solution().two_sum(...)``) are program code: one probe.
      func.value = self.visit(func.value)
    elif isinstance(func, ast.Name) and func.id in SAFE_BUILTINS:
      pass
    elif _dependent(func):
      return self.probe(node)
    node.args = [self.visit(a) for a in node.args]
    node.keywords = [self.visit(k) for k in node.keywords]
    return node

  def generic_visit(self, node):
    if isinstance(node, _SCOPES) and _dependent(node):
      self.probe(node)  # raises with a clear message
    return super().generic_visit(node)


def compile_tests(tests: list[str]) -> TestPlan:
  """Splits each ``assert`` snippet (one or more assert statements) into probes and checks."""
  if not tests:
    raise ValueError("a code problem needs at least one test")
  probes, checks = [], []
  for i, test in enumerate(tests):
    where = f"test {i} ({test[:80]!r})"
    if not isinstance(test, str):
      raise ValueError(f"{where}: assert tests must be strings")
    try:
      tree = ast.parse(test, mode="exec")
    except SyntaxError as e:
      raise ValueError(f"{where}: not valid Python: {e.msg}") from None
    if not tree.body or not all(isinstance(s, ast.Assert) for s in tree.body):
      raise ValueError(f"{where}: only `assert <expression>` statements are supported")
    splitter = _Splitter(where)
    exprs = []
    for statement in tree.body:
      expr = ast.Expression(splitter.visit(statement.test))
      exprs.append(compile(ast.fix_missing_locations(expr), f"<test {i}>", "eval"))
    probes.append(splitter.probes)
    checks.append(tuple(exprs))
  return TestPlan(tuple(tests), probes, tuple(checks))


_MISSING = object()


def _decode(v):
  tag = v[0]
  if tag == "N":
    return None
  if tag == "B":
    return bool(v[1])
  if tag == "i":
    return int(v[1], 16)
  if tag == "f":
    return float(v[1])
  if tag == "c":
    return complex(float(v[1]), float(v[2]))
  if tag == "s":
    return str(v[1])
  if tag in ("y", "Y"):
    return (bytes if tag == "y" else bytearray).fromhex(v[1])
  if tag == "r":
    return range(int(v[1], 16), int(v[2], 16), int(v[3], 16))
  if tag in ("l", "t", "S", "F", "it"):
    items = [_decode(x) for x in v[1]]
    return {"l": list, "t": tuple, "S": set, "F": frozenset, "it": iter}[tag](items)
  if tag == "d":
    return {_decode(k): _decode(x) for k, x in v[1]}
  raise ValueError(f"unknown value tag {tag!r}")


def parse_values(raw: bytes, counts: list[int]) -> list[list]:
  """Per test, per probe: the decoded value, or ``_MISSING`` (not reported, raised, or malformed).

  Lines are ``[test, probe, tagged value]`` JSON; the first well-formed line per probe counts."""
  values = [[_MISSING] * n for n in counts]
  seen = set()
  for line in raw.decode(errors="replace").splitlines():
    try:
      test, j, tagged = json.loads(line)
      if (test, j) in seen or not (0 <= test < len(counts) and 0 <= j < counts[test]):
        continue
      seen.add((test, j))
      if tagged[0] != "E":
        values[test][j] = _decode(tagged)
    except (ValueError, TypeError, IndexError, KeyError, OverflowError, RecursionError):
      continue
  return values


def decide(plan: TestPlan, values: list[list] | None) -> list[bool]:
  """One verdict per test: every probe has a value and every assert holds on those values."""
  verdicts = []
  for i, checks in enumerate(plan.checks):
    probe_values = values[i] if values is not None else []
    if len(probe_values) != len(plan.probes[i]) or any(v is _MISSING for v in probe_values):
      verdicts.append(False)
      continue
    scope = {"__builtins__": SAFE_BUILTINS, **SAFE_MODULES}
    scope.update({f"_p{j}": v for j, v in enumerate(probe_values)})
    try:
      verdicts.append(all(bool(eval(check, dict(scope))) for check in checks))  # noqa: S307
    except Exception:  # noqa: BLE001  (an assert that raises on the program's values fails)
      verdicts.append(False)
  return verdicts
