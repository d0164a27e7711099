"""Tool calls in the policy's text: parsing, execution (python sandbox, calculator), ToolEnv.

Two call formats are recognised (the first complete call in the action is executed):

  * tags: ``<python>print(1 + 1)</python>``, ``<calculator>3 * (4 + 5)</calculator>``;
  * the chat-template tool-call format (Hermes / Qwen / SmolLM3 style):
    ``<tool_call>{"name": "calculator", "arguments": {"expression": "3 * 4"}}</tool_call>``.

A malformed call (an unclosed tag, JSON that does not parse, an unknown tool name, missing
arguments) is not an exception: it yields an error observation that tells the policy what was
wrong, and ``info["tool_error"] = 1``. Python runs in ``rlvr_jax.rewards.code_sandbox`` (never in
this process); the calculator is ``rewards.tasks.evaluate_expression`` (exact, no ``eval``).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from fractions import Fraction

from rlvr_jax.envs.builtin import QuestionEnv

TOOL_NAMES = ("python", "calculator")
# The argument each tool reads when called in the JSON format.
_ARGUMENT = {"python": "code", "calculator": "expression"}
_TAG_RE = re.compile(r"<(python|calculator)>(.*?)</\1>", re.DOTALL)
_OPEN_RE = re.compile(r"<(python|calculator|tool_call)>")
_JSON_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

INSTRUCTIONS = {
  "python": "python: write <python>code</python>; what it prints is returned.",
  "calculator": "calculator: write <calculator>expression</calculator> (+ - * / and parentheses).",
}


@dataclasses.dataclass(frozen=True)
class ToolCall:
  """A parsed call: the tool's name and its arguments; ``error`` is set for a malformed call."""

  name: str
  arguments: dict
  error: str | None = None


def check_tool_names(names: Sequence[str]) -> None:
  from rlvr_jax.envs.registry import EnvConfigError

  unknown = [n for n in names if n not in TOOL_NAMES]
  if unknown:
    raise EnvConfigError(f"unknown tool(s) {unknown}; choices: {list(TOOL_NAMES)}")


def _from_json(body: str) -> ToolCall:
  try:
    call = json.loads(body)
  except json.JSONDecodeError as e:
    return ToolCall("", {}, f"tool call is not valid JSON ({e.msg} at char {e.pos})")
  if not isinstance(call, dict) or not isinstance(call.get("name"), str):
    return ToolCall("", {}, 'tool call must be a JSON object with a "name" string')
  args = call.get("arguments", call.get("parameters", {}))
  if isinstance(args, str):  # some templates serialise the arguments twice
    try:
      args = json.loads(args)
    except json.JSONDecodeError:
      pass
  if not isinstance(args, dict):
    return ToolCall(call["name"], {}, '"arguments" must be a JSON object')
  return ToolCall(call["name"], args)


def parse_tool_call(text: str) -> ToolCall | None:
  """The first tool call in ``text`` (tag or ``<tool_call>`` JSON), or None if there is none.

  A call that is opened but malformed comes back with ``error`` set.
  """
  tag, js = _TAG_RE.search(text), _JSON_RE.search(text)
  if tag is not None and (js is None or tag.start() < js.start()):
    return ToolCall(tag.group(1), {_ARGUMENT[tag.group(1)]: tag.group(2).strip()})
  if js is not None:
    return _from_json(js.group(1).strip())
  opened = _OPEN_RE.search(text)
  if opened is not None:
    return ToolCall(opened.group(1), {}, f"<{opened.group(1)}> is never closed")
  return None


def calculator(expression: str) -> str:
  """Exact arithmetic over integers with + - * / and parentheses (raises ValueError)."""
  from rlvr_jax.rewards.tasks import evaluate_expression

  try:
    value = evaluate_expression(expression)
  except SyntaxError as e:
    raise ValueError(f"cannot parse expression: {e.msg}") from None
  except RecursionError:
    raise ValueError("expression nested too deeply") from None
  if value.denominator == 1:
    return str(value.numerator)
  return f"{Fraction(value)} = {float(value):.10g}"


def run_python_tool(code: str, *, timeout_s: float = 5.0) -> tuple[str, bool]:
  """Runs code in the sandbox; (output text, ok). Output = stdout, plus stderr's last line on error."""
  from rlvr_jax.rewards import code_sandbox

  limits = code_sandbox.SandboxLimits(timeout_s=timeout_s, cpu_s=max(1, int(timeout_s)))
  result = code_sandbox.run_python(code, limits=limits)
  if result.status == "ok":
    return result.stdout, True
  last = result.stderr.strip().splitlines()[-1:] or [result.status]
  return (result.stdout + f"error ({result.status}): {last[0]}").strip(), False


def execute(
  call: ToolCall, *, allowed: Sequence[str], python_timeout_s: float = 5.0
) -> tuple[str, bool]:
  """Runs a parsed call; (observation text, ok). Never raises for a bad call."""
  if call.error is not None:
    return f"tool error: {call.error}", False
  if call.name not in allowed:
    return f"tool error: unknown tool {call.name!r}; available: {', '.join(allowed)}", False
  key = _ARGUMENT[call.name]
  arg = call.arguments.get(key)
  if not isinstance(arg, str):
    return f"tool error: {call.name} needs a string argument {key!r}", False
  if call.name == "calculator":
    try:
      return calculator(arg), True
    except ValueError as e:
      return f"tool error: {e}", False
  return run_python_tool(arg, timeout_s=python_timeout_s)


def _truncate(text: str, limit: int, *, keep_end: bool) -> str:
  """Cuts a tool result to ``limit`` characters: the start of an output, the end of an error
  (where the exception's message is)."""
  if len(text) <= limit:
    return text
  return "(truncated)..." + text[-limit:] if keep_end else text[:limit] + "...(truncated)"


class ToolEnv:
  """Wraps any environment (or a plain question) into a tool-using episode.

  An action containing a tool call is executed and its (truncated) result is the next observation,
  with reward ``tool_reward`` and ``info = {"tool": name, "tool_error": 0 | 1, "role": "tool"}``
  (``role`` tells the renderer to format it as a tool message). An action without a call goes to
  the wrapped env's ``step``. After ``max_tool_calls`` calls, further calls get an error
  observation asking for the final answer.

  Args:
    env: the wrapped environment (any object with ``reset`` / ``step``).
    tools: tool names out of ``TOOL_NAMES``.
    max_tool_calls: calls per episode.
    max_output_chars: tool results are cut to this many characters (the start of an output, the
      end of an error message).
    python_timeout_s: wall-clock limit of one python call.
    tool_reward: reward of a turn that called a tool.
    instructions: append a line per tool to the first observation.
  """

  def __init__(
    self,
    env,
    tools: Sequence[str] = TOOL_NAMES,
    *,
    max_tool_calls: int = 5,
    max_output_chars: int = 1000,
    python_timeout_s: float = 5.0,
    tool_reward: float = 0.0,
    instructions: bool = True,
  ):
    check_tool_names(tools)
    self.env, self.tools = env, tuple(tools)
    self.max_tool_calls, self.max_output_chars = int(max_tool_calls), int(max_output_chars)
    self.python_timeout_s, self.tool_reward = float(python_timeout_s), float(tool_reward)
    self.instructions = instructions
    self.num_calls = 0

  @classmethod
  def from_question(cls, question: str, answer: str, **kwargs) -> ToolEnv:
    return cls(QuestionEnv(question, answer), **kwargs)

  def reset(self, seed: int | None = None):
    self.num_calls = 0
    obs, info = self.env.reset(seed=seed)
    if self.instructions:
      obs = obs + "\n" + "\n".join(INSTRUCTIONS[t] for t in self.tools)
    return obs, info

  def step(self, action: str):
    call = parse_tool_call(action)
    if call is None:
      obs, reward, terminated, truncated, info = self.env.step(action)
      info = dict(info or {})
      info.setdefault("tool_error", 0.0)
      return obs, reward, terminated, truncated, info
    self.num_calls += 1
    if self.num_calls > self.max_tool_calls:
      text, ok = f"tool error: no tool calls left (limit {self.max_tool_calls}); answer now", False
    else:
      text, ok = execute(call, allowed=self.tools, python_timeout_s=self.python_timeout_s)
      text = _truncate(text, self.max_output_chars, keep_end=not ok)
    info = {"tool": call.name, "tool_error": float(not ok), "role": "tool"}
    return text, self.tool_reward, False, False, info

  def close(self):
    close = getattr(self.env, "close", None)
    if callable(close):
      close()
