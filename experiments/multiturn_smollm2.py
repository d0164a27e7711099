"""Multi-turn RL with SmolLM2-135M-Instruct on guess-the-number (issue 16): a real instruct model
playing several turns through its chat template.

Purpose: a short real run of the episode collector with pretrained weights, to show the machinery
end to end on a chat model and to measure where an RL step's time goes (sampling with environment
steps overlapped / environment steps / update). SmolLM2 does not write ``\\boxed{}``, so GEM's
games (which parse only boxed actions) end at once on its output; the built-in
``GuessNumberEnv`` takes the first integer of the action, which SmolLM2 writes when asked for one
number. The env's texts are sentences here (its defaults suit the character model of
``multiturn_guess.py``), rendered as user turns of the ChatML template; a guess is one assistant
turn of at most 16 tokens. Hidden integer 1..16, 4 guesses, reward 1 on the correct guess.
RL: a turn-level estimator (``rl.advantage="mapo"``: per-turn-index z-score of the turn returns
mixed with the batch z-score) on per-turn rewards -0.5 for a turn without a number, 0 for a wrong
number, 1 for the right one; 2 groups of G = 4 episodes per step, 3 steps, lr 2e-6 (a smoke run
of the machinery, not a learning curve).

Command (8 min 43 s wall on the 2-core CPU shared with other jobs, load average 11-15, compiles
and both evaluations included; peak RSS 7.4 GB):
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 .venv/bin/python -m rlvr_jax.main \
    --config=experiments/multiturn_smollm2.py
  # GRPO on the final reward instead (13 min 33 s there):  --config.rl.advantage=grpo \
  #   --config.env.return_mode=final --config.env.kwargs.invalid_reward=0.0

Expected result (measured, docs/results.md): episodes of several turns (3.75-4 of 4 on average:
SmolLM2 rarely finds the number), training-batch success 0-0.25, no env failures, non-zero
per-turn advantages at every step; held-out success 0 before and after (8 episodes: 3 steps do
not teach the game). Step time split (after step 1's compiles): sampling 9-40 s, almost all
decoding; env steps a few ms, overlapped with decoding; update 20-115 s.
"""

from rlvr_jax.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/multiturn_smollm2"
  c.model.source = "smollm2"
  c.model.remat = True
  c.tokenizer.kind = "model"
  c.env.update(
    id="guess_number",
    max_turns=4,
    max_tokens=128,
    turn_tokens=16,
    renderer="chat",
    return_mode="sum",
    num_workers=2,
    chunk_steps=8,
    num_eval=8,
  )
  c.env.kwargs.update(
    low=1,
    high=16,
    max_turns=4,
    invalid_reward=-0.5,
    prompt=(
      "Let's play a game. I am thinking of a whole number from {low} to {high}. You have "
      "{max_turns} guesses. Reply with one number only, for example: 7"
    ),
    higher="Higher. Guess again with one number.",
    lower="Lower. Guess again with one number.",
    invalid="That is not a number. Reply with one number only.",
  )
  c.sampling.update(num_samples=4, temperature=0.7)
  c.rl.update(
    num_steps=3, prompts_per_step=2, num_microbatches=2, advantage="mapo", zero_variance="keep",
    logprob_chunk=32,
  )  # fmt: skip
  c.objective.name = "grpo"
  c.optim.update(learning_rate=2e-6, b2=0.99, weight_decay=0.0, grad_clip=1.0)
  c.eval.update(every=0, temperature=0.7)
  c.checkpoint.update(every=0)
  return c
