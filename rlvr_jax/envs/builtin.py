"""Built-in environments: a scripted one for tests, a guess-the-number game sized for a
character-level model, and a one-question environment for tool-using episodes.

All follow the gym form of :mod:`rlvr_jax.envs.protocol` and draw randomness only from their own
``random.Random(seed)``, so an episode depends on its seed and nothing else.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from rlvr_jax.rewards.math_reward import extract_answer, math_equal

_INT_RE = re.compile(r"-?\d+")


class ScriptedEnv:
  """Deterministic env for tests: observation k is ``template`` filled with the turn and action.

  Args:
    prompt: the first observation (``{seed}`` is filled in).
    num_turns: the episode terminates on the action of this turn.
    rewards: reward of each turn (default 0 except 1 on the last).
    template: observation after turn k, formatted with ``turn`` and ``action``.
  """

  def __init__(
    self,
    prompt: str = "start {seed}",
    num_turns: int = 3,
    rewards: Sequence[float] | None = None,
    template: str = "obs {turn}: {action}",
  ):
    self.prompt, self.num_turns, self.template = prompt, int(num_turns), template
    self.rewards = list(rewards) if rewards is not None else [0.0] * (num_turns - 1) + [1.0]
    if len(self.rewards) != self.num_turns:
      raise ValueError(f"ScriptedEnv: {len(self.rewards)} rewards for {num_turns} turns")
    self.turn = 0

  def reset(self, seed: int | None = None):
    self.turn = 0
    return self.prompt.format(seed=seed), {"seed": seed}

  def step(self, action: str):
    self.turn += 1
    done = self.turn >= self.num_turns
    obs = self.template.format(turn=self.turn, action=action)
    return obs, float(self.rewards[self.turn - 1]), done, False, {"turn": self.turn}


class GuessNumberEnv:
  """Guess a hidden integer in [low, high] with ``higher`` / ``lower`` feedback.

  Observations use only lowercase letters, digits, space, ':' and ',' (the default alphabet of
  ``rlvr_jax.data.char_tokenizer``). The first integer of the action is the guess; an action
  without one costs the turn and gets ``invalid_reward``. Correct: reward 1 and terminated.
  Running out of turns: reward 0 and truncated (a time limit, in gymnasium's sense).

  ``prompt`` (filled with ``low``, ``high``, ``max_turns``), ``higher``, ``lower`` and ``invalid``
  are the texts of the observations: the defaults suit a character model; an instruct model gets
  sentences (``experiments/multiturn_smollm2.py``).
  """

  def __init__(
    self,
    low: int = 1,
    high: int = 16,
    max_turns: int = 5,
    invalid_reward: float = 0.0,
    prompt: str = "guess {low} to {high}:",
    higher: str = "higher:",
    lower: str = "lower:",
    invalid: str = "no number:",
  ):
    if high <= low:
      raise ValueError(f"GuessNumberEnv: high={high} must exceed low={low}")
    self.low, self.high, self.max_turns = int(low), int(high), int(max_turns)
    self.invalid_reward = float(invalid_reward)
    self.prompt = prompt.format(low=self.low, high=self.high, max_turns=self.max_turns)
    self.texts = {"higher": higher, "lower": lower, "invalid": invalid}
    self.target, self.turn = low, 0

  def reset(self, seed: int | None = None):
    rng = random.Random(seed) if seed is not None else random
    self.target, self.turn = rng.randint(self.low, self.high), 0
    return self.prompt, {}

  def step(self, action: str):
    self.turn += 1
    out_of_turns = self.turn >= self.max_turns
    match = _INT_RE.search(action)
    if match is None:
      return self.texts["invalid"], self.invalid_reward, False, out_of_turns, {"valid": False}
    guess = int(match.group())
    if guess == self.target:
      return "correct", 1.0, True, False, {"valid": True}
    hint = "higher" if guess < self.target else "lower"
    return self.texts[hint], 0.0, False, out_of_turns, {"valid": True}


class QuestionEnv:
  """One question, answered once: the episode ends on the first action that is not a tool call
  (wrap in ``ToolEnv`` to allow tool calls before it). Reward 1 if the extracted answer
  (``<answer>`` tag, ``\\boxed{}``, else the last number) equals ``answer``, else 0.
  """

  def __init__(
    self,
    question: str,
    answer: str,
    extract: Sequence[str] = ("answer_tag", "boxed", "last_number"),
  ):
    self.question, self.answer, self.extract = question, str(answer), tuple(extract)

  def reset(self, seed: int | None = None):
    return self.question, {}

  def step(self, action: str):
    pred = extract_answer(action, self.extract)
    correct = pred is not None and math_equal(pred, self.answer)
    return "", float(correct), True, False, {"correct": float(correct)}
