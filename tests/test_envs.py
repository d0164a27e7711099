"""Environments: protocol checks, registry errors, EnvPool (GEM games, faults, seeding), tools,
rendering and the episode builder's token stream and masks."""

import itertools
import math
import re
import subprocess
import sys

import numpy as np
import pytest

from rlvr_jax import envs
from rlvr_jax.data.char_tokenizer import CharTokenizer
from rlvr_jax.envs import EnvSpec

FAULTY = EnvSpec("env_fixtures:FaultyEnv")


@pytest.fixture(scope="module")
def pool():
  """One pool for the module: worker start-ups cost about a second each on a loaded machine."""
  with envs.EnvPool(num_workers=2, timeout_s=3.0, reset_timeout_s=60.0) as p:
    yield p


# ----------------------------------------------------------------------------- protocol, registry


def test_envs_package_imports_no_jax():
  code = "import sys, rlvr_jax.envs; assert 'jax' not in sys.modules, 'jax imported'"
  subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
  "value, match",
  [
    (("o", 1.0), "step returned a tuple of length 2"),
    (("o", "x", False, False, {}), "reward of type str"),
    (("o", math.nan, False, False, {}), "reward nan"),
    ((3, 1.0, False, False, {}), "observation of type int"),
    (("o", 1.0, 1, False, {}), "terminated of type int"),
    (("o", 1.0, False, None, {}), "truncated of type NoneType"),
    (("o", 1.0, False, False, []), "info of type list"),
  ],
)
def test_check_step_names_env_and_field(value, match):
  with pytest.raises(envs.MalformedStepError, match=f"environment my_env: .*{match}"):
    envs.check_step("my_env", value)


def test_check_step_accepts_numpy_scalars_and_none_info():
  result = envs.check_step("e", ("o", np.float32(0.5), np.bool_(True), False, None))
  assert (result.reward, result.terminated, result.info) == (0.5, True, {})
  with pytest.raises(envs.MalformedStepError, match="expected \\(observation, info\\)"):
    envs.check_reset("e", "just text")


@pytest.mark.parametrize(
  "env_id, closest",
  [
    ("gem:game:GuessTheNumbr-v0-easy", "gem:game:GuessTheNumber-v0-easy"),
    ("guess_numbr", "guess_number"),
    ("env_fixtures:FaultEnv", "FaultyEnv"),
  ],
)
def test_unknown_id_names_closest_choices(env_id, closest):
  with pytest.raises(envs.EnvConfigError, match=re.escape(closest)):
    envs.check_spec(env_id)
  assert issubclass(envs.EnvConfigError, ValueError)


def test_unknown_id_lists_the_forms_and_bad_wrappers_and_tools():
  with pytest.raises(envs.EnvConfigError, match="built-ins.*'gem:<GEM id>'.*package.module:Class"):
    envs.check_spec("nothing_like_it")
  with pytest.raises(envs.EnvConfigError, match="closest: python_tool"):
    envs.check_spec(EnvSpec("gem:game:GuessTheNumber-v0-easy", gem_wrappers=("python_tol",)))
  with pytest.raises(envs.EnvConfigError, match="unknown tool"):
    envs.check_spec(EnvSpec("scripted", tools=("shell",)))
  with pytest.raises(envs.EnvConfigError, match="cannot import"):
    envs.check_spec("no_such_module_xyz:Env")


# ----------------------------------------------------------------------------- pool


def test_scripted_env_gives_expected_observations(pool):
  spec = EnvSpec("scripted", {"num_turns": 3, "rewards": [0.0, 0.5, 1.0]})
  starts = pool.reset([4, 5], [spec, spec])
  assert [s.observation for s in starts] == ["start 4", "start 5"]
  results = []
  for k, actions in enumerate([["a", "x"], ["b", "y"], ["c", None]], start=1):
    step = pool.step(actions)
    assert [r and r.observation for r in step] == [f"obs {k}: {a}" if a else None for a in actions]
    results.append(step)
  assert [r[0].reward for r in results] == [0.0, 0.5, 1.0]
  assert results[2][0].terminated and not results[1][0].terminated
  with pytest.raises(ValueError, match="episode 0 is done"):
    pool.step({0: "more"})
  assert pool.submit_step({1: "z"}).result()[1].terminated  # the future form


def _binary_search(text, low, high):
  """Next (low, high) after GEM's guess-the-number feedback."""
  guess = (low + high) // 2
  if "higher" in text:
    return guess + 1, high
  return low, guess - 1


def test_gem_guess_the_number_binary_search_wins(pool):
  seeds = [0, 1, 2, 3]
  pool.reset(seeds, [EnvSpec("gem:game:GuessTheNumber-v0-easy")] * len(seeds))
  bounds = {e: (1, 10) for e in range(len(seeds))}
  finals = {}
  for _ in range(4):
    actions = {e: f"My guess: \\boxed{{{(lo + hi) // 2}}}" for e, (lo, hi) in bounds.items()}
    for e, r in pool.step(actions).items():
      assert not r.failed, r.failure
      if r.done:
        finals[e] = r
        del bounds[e]
      else:
        bounds[e] = _binary_search(r.observation, *bounds[e])
    if not bounds:
      break
  assert sorted(finals) == [0, 1, 2, 3]
  assert all("Congratulations" in r.observation and r.reward == 1.0 for r in finals.values())


def test_gem_mastermind_and_hanoi_solved_through_pool(pool):
  specs = [EnvSpec("gem:game:Mastermind-v0-easy"), EnvSpec("gem:game:TowerofHanoi-v0-easy")]
  pool.reset([11, 12], specs)
  candidates = list(itertools.permutations(range(1, 7), 2))
  hanoi = [("A", "C"), ("A", "B"), ("C", "B"), ("A", "C"), ("B", "A"), ("B", "C"), ("A", "C")]
  done = {}
  for turn in range(10):
    actions = {}
    if 0 not in done:
      actions[0] = "\\boxed{" + " ".join(map(str, candidates[0])) + "}"
    if 1 not in done:
      actions[1] = "\\boxed{{{} {}}}".format(*hanoi[turn])
    for e, r in pool.step(actions).items():
      assert not r.failed, r.failure
      if r.done:
        done[e] = r
      elif e == 0:  # keep the codes consistent with the pegs
        guess = candidates[0]
        black, white = map(
          int, re.search(r"(\d+) black peg\(s\) and (\d+) white", r.observation).groups()
        )
        candidates = [
          c for c in candidates
          if sum(x == y for x, y in zip(c, guess, strict=True)) == black
          and len(set(c) & set(guess)) - black == white
        ]  # fmt: skip
    if len(done) == 2:
      break
  assert "Congratulations" in done[0].observation and not done[0].truncated
  assert done[1].reward == 1.0 and done[1].terminated


def test_faults_fail_only_their_episode_and_survivors_are_replayed(pool):
  """hang / crash / raise / malformed fail their own episode with the cause; the episodes that
  shared a killed worker are rebuilt by replay and continue with their state."""
  faults = ["hang", "crash", "raise", "malformed", "badreward", "ok", "ok", "ok"]
  pool.reset(list(range(len(faults))), [FAULTY] * len(faults))
  assert all(r.observation == "turn 1" for r in pool.step(["ok"] * len(faults)))
  restarts, before = pool.worker_restarts, pool.metrics()
  results = pool.step(faults)
  causes = [r.failure.cause if r.failed else None for r in results]
  assert causes == ["timeout", "crash", "exception", "malformed", "malformed", None, None, None]
  assert "boom in step" in results[2].failure.message
  assert "env_fixtures:FaultyEnv" in results[3].failure.message
  assert "length 2" in results[3].failure.message
  assert "reward of type str" in results[4].failure.message
  assert "exited with code 7" in results[1].failure.message
  assert all(math.isnan(r.reward) and r.terminated for r in results[:5])
  assert [r.observation for r in results[5:]] == ["turn 2"] * 3  # state survived the replacements
  assert "<function" in results[5].info["unpicklable"]  # info made picklable, not dropped
  assert pool.worker_restarts == restarts + 2
  after = pool.metrics()
  for cause, n in {"timeout": 1, "crash": 1, "exception": 1, "malformed": 2}.items():
    assert after[f"env/fail/{cause}"] - before[f"env/fail/{cause}"] == n
  with pytest.raises(ValueError, match="failed \\(timeout\\)"):
    pool.step({0: "ok"})
  assert [r.observation for r in pool.step({5: "ok", 6: "ok"}).values()] == ["turn 3"] * 2


def test_gem_reasoning_gym_and_python_tool_wrappers(pool):
  """GEM's reasoning-gym env and its python_tool wrapper run unchanged; the worker's episode seeding
  reproduces the question a local replica draws with the same seed."""
  import random

  import gem

  replica = gem.make("rg:basic_arithmetic")
  random.seed(3)
  question, _ = replica.reset(seed=3)
  specs = [
    EnvSpec("gem:rg:basic_arithmetic"),
    EnvSpec("gem:rg:basic_arithmetic", gem_wrappers=("python_tool",)),
  ]
  starts = pool.reset([3, 4], specs)
  assert starts[0].observation == question and "<python>" in starts[1].observation
  results = pool.step([f"\\boxed{{{replica.data['answer']}}}", "<python>print(6 * 7)</python>"])
  assert results[0].reward == 1.0 and results[0].terminated
  assert "42" in results[1].observation and results[1].info["tool_type"] == "python_code"
  assert not results[1].done


def test_submit_step_overlaps_the_caller(pool):
  pool.reset([0, 1], [FAULTY] * 2)
  future = pool.submit_step(["sleep", "ok"])
  assert not future.done()  # the caller keeps working (device decode) while envs step
  assert [r.observation for r in future.result()] == ["turn 1", "turn 1"]


def test_worker_killed_between_steps_is_replaced_and_replayed(pool):
  pool.reset([0, 1, 2], [FAULTY] * 3)
  pool.step(["ok", "ok", "ok"])
  restarts = pool.worker_restarts
  pool._workers[0].proc.kill()  # episodes 0 and 2 live on worker slot 0
  pool._workers[0].proc.wait()
  assert [r.observation for r in pool.step(["ok", "ok", "ok"])] == ["turn 2"] * 3
  assert pool.worker_restarts == restarts + 1


def test_failed_reset_and_plain_class_by_path(pool):
  specs = [FAULTY, EnvSpec("env_fixtures:FaultyEnv", {"fail_reset": True}), FAULTY]
  starts = pool.reset([1, 2, 3], specs)
  assert [s.failed for s in starts] == [False, True, False]
  assert starts[1].failure.cause == "exception" and "cannot build" in starts[1].failure.message
  assert starts[2].observation == "ready 3"


def test_episodes_have_independent_seeded_global_random(pool):
  """Same seed -> same draws, whether the episodes share a worker (0, 2) or not (1); interleaved
  steps of other episodes do not shift them."""
  spec = EnvSpec("env_fixtures:RandomEnv")
  pool.reset([7, 7, 7, 8], [spec] * 4)
  first = pool.step({0: "a", 1: "a", 3: "a"})
  second = pool.step({0: "a", 1: "a", 2: "a", 3: "a"})
  third = pool.step({2: "a"})
  assert first[0].observation == first[1].observation == second[2].observation
  assert second[0].observation == second[1].observation == third[2].observation
  assert first[3].observation != first[0].observation


# ----------------------------------------------------------------------------- tools


@pytest.mark.parametrize(
  "text, name, args",
  [
    (
      "let me <calculator>3 * (4 + 5)</calculator> then",
      "calculator",
      {"expression": "3 * (4 + 5)"},
    ),
    ("<python>\nprint(2)\n</python>", "python", {"code": "print(2)"}),
    (
      '<tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}</tool_call>',
      "calculator",
      {"expression": "1+2"},
    ),
    (
      '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}</tool_call>',
      "python",
      {"code": "print(1)"},
    ),
  ],
)
def test_parse_tool_call_formats(text, name, args):
  call = envs.parse_tool_call(text)
  assert (call.name, call.arguments, call.error) == (name, args, None)


@pytest.mark.parametrize(
  "text, error",
  [
    ("<python>print(1)", "<python> is never closed"),
    ("<tool_call>{not json}</tool_call>", "not valid JSON"),
    ('<tool_call>{"arguments": {}}</tool_call>', '"name" string'),
    ('<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>', '"arguments" must be'),
  ],
)
def test_malformed_tool_calls_give_error_observations(text, error):
  call = envs.parse_tool_call(text)
  assert error in call.error
  text_out, ok = envs.execute(call, allowed=("calculator",))
  assert not ok and text_out.startswith("tool error:")


def test_no_tool_call_and_calculator():
  assert envs.parse_tool_call("the answer is 4") is None
  assert envs.calculator("3 * (4 + 5)") == "27"
  assert envs.calculator("7 / 2") == "7/2 = 3.5"
  for bad in ("__import__('os')", "2 ** 10", "1 / 0", "1 +"):
    text, ok = envs.execute(
      envs.ToolCall("calculator", {"expression": bad}), allowed=("calculator",)
    )
    assert not ok and text.startswith("tool error:"), (bad, text)
  text, ok = envs.execute(envs.ToolCall("python", {"code": "1"}), allowed=("calculator",))
  assert not ok and "unknown tool 'python'" in text


def test_tool_env_question_through_pool(pool):
  """A plain question with tools: two tool turns (one malformed) then the final answer."""
  spec = EnvSpec(
    "tool_question",
    {"question": "what is 17 * 23?", "answer": "391"},
    tools=("python", "calculator"),
  )
  (start,) = pool.reset([0], [spec])
  assert "<calculator>" in start.observation and "<python>" in start.observation
  r = pool.step(["<calculator>17 * 23</calculator>"])[0]
  assert (r.observation, r.info["tool_error"], r.info["role"], r.done) == (
    "391",
    0.0,
    "tool",
    False,
  )
  r = pool.step(["<calculator>17 *</calculator>"])[0]
  assert r.info["tool_error"] == 1.0 and r.observation.startswith("tool error:") and not r.done
  r = pool.step(["<python>print(sum(range(5)))</python>"])[0]
  assert r.observation.strip() == "10" and r.info["tool_error"] == 0.0
  r = pool.step(["so <answer>391</answer>"])[0]
  assert r.reward == 1.0 and r.terminated and r.info["tool_error"] == 0.0


def test_python_tool_errors_and_limit():
  env = envs.ToolEnv.from_question(
    "q", "1", tools=("python",), max_tool_calls=2, max_output_chars=20
  )
  env.reset(seed=0)
  obs, _, _, _, info = env.step("<python>raise ValueError('bad')</python>")
  assert obs.endswith("ValueError: bad") and info["tool_error"] == 1.0
  obs, *_ = env.step("<python>print('x' * 100)</python>")
  assert obs == "x" * 20 + "...(truncated)"
  obs, _, _, _, info = env.step("<python>print(1)</python>")
  assert "no tool calls left" in obs and info["tool_error"] == 1.0


# ----------------------------------------------------------------------------- render, episode


def _scripted_episode(renderer, tok, obs_texts, actions, rewards, *, max_tokens=200, eos=None):
  episode = envs.Episode(renderer.prompt_ids("q"), max_tokens=max_tokens)
  for k, (action, obs) in enumerate(zip(actions, obs_texts, strict=True)):
    ids = tok.encode(action, add_special_tokens=False) + ([] if eos is None else [eos])
    assert episode.add_action(ids, [-0.5] * len(ids))
    last = k == len(actions) - 1
    result = envs.StepResult(obs, rewards[k], last, False, {})
    episode.add_step(result, renderer.observation_ids(obs))
  return episode


def test_episode_stream_and_masks_char_tokenizer():
  tok = CharTokenizer()
  renderer = envs.PlainRenderer(tok)
  episode = _scripted_episode(
    renderer, tok, ["lower", "higher", "correct"], ["8", "4", "6"], [0, 0, 1]
  )
  assert renderer.prompt_ids("q") == tok.encode("q")
  batch = envs.collate([episode], pad_id=tok.pad_id, num_tokens=24)
  # "\n{obs}\n" with the newlines made spaces (not in the alphabet); o_3 dropped: the episode
  # ended on a_3.
  text = "8" + " lower " + "4" + " higher " + "6"
  L = len(text)
  np.testing.assert_array_equal(batch["tokens"][0, :L], tok.encode(text, add_special_tokens=False))
  np.testing.assert_array_equal(batch["tokens"][0, L:], tok.pad_id)
  expect_index = np.zeros(24, np.int32)
  expect_index[[0, 8, 17]] = [1, 2, 3]
  np.testing.assert_array_equal(batch["turn_index"][0], expect_index)
  np.testing.assert_array_equal(batch["policy_mask"][0], expect_index > 0)
  np.testing.assert_array_equal(batch["token_mask"][0], np.arange(24) < L)
  np.testing.assert_array_equal(batch["sampler_logp"][0], np.where(expect_index > 0, -0.5, 0.0))
  np.testing.assert_array_equal(batch["turn_rewards"], [[0, 0, 1]])
  assert batch["terminated"][0] and not batch["truncated"][0] and batch["num_turns"][0] == 3


def test_episode_truncation_failure_and_collate_nan():
  tok = CharTokenizer()
  renderer = envs.PlainRenderer(tok)
  cut = envs.Episode([1], max_tokens=6)
  assert cut.add_action(tok.encode("12", add_special_tokens=False))
  cut.add_step(envs.StepResult("lower", 0.0, False, False, {}), renderer.observation_ids("lower"))
  assert cut.truncated and cut.truncation == "context" and cut.length == 2  # obs did not fit
  long = envs.Episode([1], max_tokens=4)
  assert not long.add_action(tok.encode("123456", add_special_tokens=False))
  assert long.truncated and long.length == 4 and math.isnan(long.turn_rewards()[0])
  turns = envs.Episode([1], max_tokens=50, max_turns=1)
  turns.add_action([5])
  turns.add_step(envs.StepResult("x", 0.25, False, False, {}), [6])
  assert turns.truncation == "turns"
  failed = envs.Episode([1], max_tokens=50)
  failed.add_action([5])
  failed.add_step(envs.protocol.failed_step(envs.EnvFailure("crash", "worker died")))
  with pytest.raises(ValueError, match="done"):
    failed.add_action([5])
  batch = envs.collate([cut, long, turns, failed], pad_id=0)
  np.testing.assert_array_equal(batch["failed"], [False, False, False, True])
  np.testing.assert_array_equal(batch["truncated"], [True, True, True, False])
  np.testing.assert_allclose(batch["turn_rewards"][:, 0], [0.0, np.nan, 0.25, np.nan])
  assert batch["tokens"].shape == (4, 4)
  np.testing.assert_array_equal(batch["policy_mask"].sum(1), [2, 4, 1, 1])


def test_plain_renderer_replaces_unknown_characters():
  renderer = envs.PlainRenderer(CharTokenizer())
  assert renderer.observation_text("Hi! é\tx") == " Hi? ? x "
  assert envs.PlainRenderer(CharTokenizer("ab?\n")).observation_text("ab c") == "\nab??\n"


@pytest.mark.slow
def test_chat_renderer_smollm2_continues_the_template_stream():
  """prompt + a_1 <eos> + o_1 + a_2 <eos> + tool o_2 + a_3 <eos> equals the template's rendering
  of the whole conversation, token for token (loading the tokenizer takes ~10 s)."""
  from rlvr_jax.model.smollm2 import smollm2_tokenizer

  tok = smollm2_tokenizer()
  renderer = envs.ChatRenderer(tok)
  eos = tok.eos_ids[0]
  ids = renderer.prompt_ids("What is 2+3?")
  messages = [{"role": "user", "content": "What is 2+3?"}]
  for action, obs, role in [
    ("Let me check.", "higher", "user"),
    ("<calculator>2+3</calculator>", "5", "tool"),
  ]:
    ids += tok.encode(action) + [eos] + renderer.observation_ids(obs, role=role)
    messages += [{"role": "assistant", "content": action}, {"role": role, "content": obs}]
  ids += tok.encode("It is 5.") + [eos]
  messages.append({"role": "assistant", "content": "It is 5."})
  full = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=False))
  assert ids == full[: len(ids)] and tok.decode(full[len(ids) :], skip_special_tokens=False) == "\n"
  # An action cut without its stop token gets the template's end of turn from the renderer.
  assert renderer.observation_text("o", action_ended=False).startswith(
    "<|im_end|>\n<|im_start|>user"
  )


def test_play_episodes_guess_number_char_level(pool):
  """The whole host loop on the built-in char-level game: rows 0, 2 binary-search, rows 1, 3 guess
  1, 2, 3, ... (so episodes end at different turns, some truncated at max_turns); the collated
  policy tokens are exactly the actions, and turn credit broadcasts onto them only."""
  import jax.numpy as jnp

  from rlvr_jax import advantages

  tok = CharTokenizer()
  renderer = envs.PlainRenderer(tok)
  actions_sent = {b: [] for b in range(4)}

  def policy_fn(contexts, budgets):
    out = {}
    for b, ids in contexts.items():
      text = tok.decode(ids)
      lo, hi = 1, 16
      for guess, hint in re.findall(r"(\d+) (higher|lower):", text):
        lo, hi = (int(guess) + 1, hi) if hint == "higher" else (lo, int(guess) - 1)
      guess = (lo + hi) // 2 if b % 2 == 0 else len(actions_sent[b]) + 1
      actions_sent[b].append(str(guess))
      action = tok.encode(str(guess), add_special_tokens=False) + [tok.eos_id]
      out[b] = (action[: budgets[b]], [-0.25] * min(len(action), budgets[b]))
    return out

  spec = EnvSpec("guess_number", {"low": 1, "high": 16, "max_turns": 5})
  episodes = envs.play_episodes(
    pool, renderer, policy_fn, seeds=[5, 5, 9, 9], specs=[spec] * 4, decode=tok.decode,
    eos_ids=tok.eos_ids, max_tokens=64,
  )  # fmt: skip
  batch = envs.collate(episodes, pad_id=tok.pad_id)
  assert batch["terminated"][[0, 2]].all()
  np.testing.assert_array_equal(np.nanmax(batch["turn_rewards"][[0, 2]], axis=1), [1.0, 1.0])
  # Targets 9 (seed 5) and 15 (seed 9): binary search needs 4 turns; 1, 2, 3, ... hits max_turns.
  np.testing.assert_array_equal(batch["num_turns"], [4, 5, 4, 5])
  np.testing.assert_array_equal(batch["truncated"], [False, True, False, True])
  for b in range(4):
    policy_ids = batch["tokens"][b][batch["policy_mask"][b]]
    assert tok.decode(policy_ids) == "".join(actions_sent[b])
    assert (policy_ids == tok.eos_id).sum() == batch["num_turns"][b]  # each action kept its stop
    k = batch["num_turns"][b]
    assert np.isfinite(batch["turn_rewards"][b, :k]).all()
    assert np.isnan(batch["turn_rewards"][b, k:]).all()
  assert (~batch["terminated"] == batch["truncated"]).all()
  adv = advantages.turn_group_normalize(jnp.asarray(batch["turn_rewards"]), group_size=2)
  token_adv = np.asarray(advantages.turn_values_to_tokens(adv, jnp.asarray(batch["turn_index"])))
  assert (token_adv[~batch["policy_mask"]] == 0).all() and (
    token_adv[batch["policy_mask"]] != 0
  ).any()


@pytest.mark.slow
def test_every_offline_gem_game_resets_and_steps(pool):
  """GEM's games that need no download (Wordle, Hangman, WordSearch need NLTK's word list) reset and
  step through the pool with well-formed tuples."""
  games = [
    "GuessTheNumber", "Mastermind", "Minesweeper", "FifteenPuzzle", "Sudoku", "TowerofHanoi",
    "Game2048", "Sokoban", "Crosswords",
  ]  # fmt: skip
  specs = [EnvSpec(f"gem:game:{g}-v0-easy") for g in games]
  starts = pool.reset(range(len(games)), specs)
  assert not any(s.failed for s in starts), [s.failure for s in starts]
  results = pool.step(["\\boxed{1}"] * len(games))
  assert not any(r.failed for r in results), [r.failure for r in results]
  assert all(r.observation and isinstance(r.reward, float) for r in results)


def test_guess_number_texts_are_settings():
  """``GuessNumberEnv``'s observations can be sentences for an instruct model; the defaults stay
  the character model's."""
  env = envs.GuessNumberEnv(low=1, high=8, max_turns=3, prompt="Guess {low}-{high} in {max_turns}.",
                            higher="Up.", lower="Down.", invalid="Number?", invalid_reward=-0.5)  # fmt: skip
  assert env.reset(seed=3)[0] == "Guess 1-8 in 3."
  target = env.target
  assert env.step("no idea") == ("Number?", -0.5, False, False, {"valid": False})
  assert env.step(f"I say {target - 1 if target > 1 else target + 1}")[0] in ("Up.", "Down.")
  assert env.step(f"{target}")[1:3] == (1.0, True)
  default = envs.GuessNumberEnv()
  assert default.reset(seed=0)[0] == "guess 1 to 16:" and default.step("x")[0] == "no number:"
