"""Multi-turn RL on guess-the-number (issue 16): a tiny character model learns to search.

Game (``envs.GuessNumberEnv``): a hidden integer in 1..16, up to 5 guesses, feedback "higher:" /
"lower:" after each; reward 1 on the correct guess (the episode terminates), else 0. The stream is
``guess 1 to 16: 8<eos> higher: 12<eos> lower: 10<eos>`` (plain renderer, no chat template).

Warm start: 60 SFT steps (64 episodes each) on the action tokens of a *flawed* teacher that guesses
uniformly inside the interval the hints allow (consistent but slow: success within 5 turns 0.77,
3.81 turns on average; simulated over 20000 episodes) -- a short warm start, so the model plays
the format but not yet well. RL: GRPO on the discounted episode return (gamma = 0.7 per turn: a
faster find is worth more), G = 8 episodes of the same number per group, 8 groups per step,
400 steps, AdamW lr 3e-4; only action tokens are trained. The optimum, binary search with midpoints
(lo + hi) // 2, finds every number within 5 turns in 54 / 16 = 3.375 turns on average.

Run:  python -m rlvr_jax.main --config=experiments/multiturn_guess.py
Expected: held-out success and mean turns move towards binary search's (docs/results.md).
"""

from rlvr_jax.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/multiturn_guess"
  c.tokenizer.alphabet = "0123456789 :,?abcdefghijklmnopqrstuvwxyz"
  c.model.update(hidden_size=64, intermediate_size=256, num_layers=2, num_heads=4, num_kv_heads=2)
  c.env.update(
    id="guess_number",
    max_turns=5,
    max_tokens=64,
    turn_tokens=4,
    plain_template=" {obs} ",
    return_mode="discounted",
    gamma=0.7,
    num_workers=2,
    chunk_steps=4,
    num_eval=128,
    teacher="rlvr_jax.envs.teachers:guess_number_teacher",
  )
  c.env.kwargs.update(low=1, high=16, max_turns=5)
  c.env.teacher_kwargs.update(low=1, high=16, mode="random", seed=0)
  c.warm_start.update(num_steps=60, batch_size=64, learning_rate=3e-3)
  c.sampling.update(num_samples=8, temperature=1.0)
  c.rl.update(num_steps=400, prompts_per_step=8, advantage="grpo", zero_variance="mask")
  c.optim.update(learning_rate=3e-4)
  c.eval.update(every=100, temperature=1.0)
  c.checkpoint.update(every=0)
  return c
