"""Host-side rewards: protocol, process-pool runtime, math / format / length / task / code rewards.

Plain Python and numpy only (no jax). Typical use::

  from rlvr_jax import rewards
  runtime = rewards.RewardRuntime(num_workers=2, timeout_s=10.0)
  reward_fn = rewards.CombinedReward({"math": rewards.MathReward(),
                                      "overlong": rewards.OverlongReward(max_len=1024, buffer_len=256)})
  future = runtime.submit(reward_fn, prompts, completions, answer=answers,
                          completion_lengths=lengths, group_size=G)   # overlaps device work
  result = future.result()  # RewardResult: rewards [B] (NaN where failed), failures, metrics, info
"""

from rlvr_jax.rewards.code_reward import CodeReward, extract_code, run_tests, verpo_rewards
from rlvr_jax.rewards.code_sandbox import (
  SandboxLimits,
  SandboxResult,
  run_python,
  sandbox_capabilities,
)
from rlvr_jax.rewards.combine import CombinedReward
from rlvr_jax.rewards.format_reward import FormatReward, format_ok
from rlvr_jax.rewards.humaneval_reward import HumanEvalReward
from rlvr_jax.rewards.label_free import CoReward, MajorityVoteReward, answer_key, majority
from rlvr_jax.rewards.length import (
  CosineReward,
  LaserReward,
  OverlongReward,
  RepetitionReward,
  cosine_length_reward,
  laser_d_buckets,
  laser_d_choose_targets,
  laser_reward,
  overlong_penalty,
  repeated_ngram_token_penalty,
  word_ngram_repetition,
)
from rlvr_jax.rewards.math_reward import (
  MathReward,
  extract_answer,
  extract_boxed,
  math_equal,
  normalize_answer,
)
from rlvr_jax.rewards.protocol import (
  FunctionReward,
  ItemReward,
  ItemTimeout,
  RewardFn,
  RewardOutput,
  as_item_reward,
  pad_token_rewards,
)
from rlvr_jax.rewards.reasoning_gym_reward import ReasoningGymReward
from rlvr_jax.rewards.registry import REWARDS, build_library_reward, import_reward
from rlvr_jax.rewards.runtime import RewardFailure, RewardResult, RewardRuntime
from rlvr_jax.rewards.tasks import (
  ArithmeticReward,
  CountdownReward,
  check_countdown,
  evaluate_expression,
)

__all__ = [
  "ArithmeticReward",
  "CoReward",
  "CodeReward",
  "CombinedReward",
  "CosineReward",
  "CountdownReward",
  "FormatReward",
  "FunctionReward",
  "HumanEvalReward",
  "ItemReward",
  "ItemTimeout",
  "LaserReward",
  "MajorityVoteReward",
  "MathReward",
  "OverlongReward",
  "RepetitionReward",
  "ReasoningGymReward",
  "RewardFailure",
  "RewardFn",
  "RewardOutput",
  "RewardResult",
  "REWARDS",
  "RewardRuntime",
  "SandboxLimits",
  "SandboxResult",
  "answer_key",
  "as_item_reward",
  "build_library_reward",
  "check_countdown",
  "cosine_length_reward",
  "extract_answer",
  "extract_boxed",
  "extract_code",
  "format_ok",
  "import_reward",
  "laser_d_buckets",
  "laser_d_choose_targets",
  "laser_reward",
  "evaluate_expression",
  "majority",
  "math_equal",
  "normalize_answer",
  "overlong_penalty",
  "pad_token_rewards",
  "repeated_ngram_token_penalty",
  "run_python",
  "run_tests",
  "sandbox_capabilities",
  "verpo_rewards",
  "word_ngram_repetition",
]
