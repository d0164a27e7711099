"""Multi-turn rollout throughput against single-turn ``generate`` on the same token count.

Table: docs/benchmarks.md, "Multi-turn rollouts against single-turn `generate` on the same token
count (`tools/bench_multiturn.py`)".

Multi-turn: B episodes of the ``scripted`` env, K turns of exactly A action tokens each (no stop
token can be sampled: the stop table holds an id outside the vocabulary) and a fixed observation
of n_obs tokens between turns, decoded by ``sampling.multiturn_rollout.rollout_episodes`` (KV-cache
continuation, env steps in worker processes, chunked decode). Single-turn: ``sampling.generate``
of B rows with max_new_tokens = K * A + (K - 1) * n_obs, no stop, from the same prompts. Both produce
streams of the same length after the prompt; the table gives stream tokens per second (actions +
observations) and the ratio multi / single. Runs alternate (single, multi, single, multi, ...;
``harness.interleave``) after ``--warmup`` compile runs of each, so the machine's drift hits both;
medians over ``--rounds``. ``--json-out PATH``: the environment record and the samples as JSON.

``--slots N1,N2``: instead, the lockstep sampler against episodes on decode slots
(``sampling.multiturn_slots``, N slots each) on ragged episodes: episode b plays
1 + (b * 7 mod K) turns of A tokens, so the rows end at different turns; stream tokens per second,
slot-steps that sampled a token, and KV cache columns (lockstep: its cache length x B rows;
slots: N rows x prompt + ``max_tokens``).

Usage (the environment record, load included, is printed first: the 2-core machine is shared):
  .venv/bin/python tools/bench_multiturn.py --batch 16 --turns 4 --action-tokens 16 --rounds 5
  .venv/bin/python tools/bench_multiturn.py --batch 32 --turns 8 --action-tokens 16 --slots 32,16
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from rlvr_jax import envs  # noqa: E402
from rlvr_jax.data.char_tokenizer import CharTokenizer  # noqa: E402
from rlvr_jax.model import ModelConfig, init_params  # noqa: E402
from rlvr_jax.sampling import Temperature, generate  # noqa: E402
from rlvr_jax.sampling.multiturn_rollout import rollout_episodes  # noqa: E402
from rlvr_jax.sampling.multiturn_slots import rollout_episodes_on_slots  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--batch", type=int, default=16)
  ap.add_argument("--turns", type=int, default=4)
  ap.add_argument("--action-tokens", type=int, default=16)
  ap.add_argument("--hidden", type=int, default=256)
  ap.add_argument("--layers", type=int, default=4)
  ap.add_argument("--chunk-steps", type=int, default=8)
  ap.add_argument("--slots", default="", help="comma-separated slot counts: lockstep vs slots")
  harness.add_common_args(ap, rounds=5, warmup=1)
  args = ap.parse_args()
  env = harness.environment()
  print(harness.header(env))
  tok = CharTokenizer("0123456789 :,?abcdefghijklmnopqrstuvwxyz")
  config = ModelConfig.tiny(
    vocab_size=tok.vocab_size, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
    num_layers=args.layers, num_heads=8, num_kv_heads=4, head_dim=args.hidden // 8,
    eos_token_ids=(tok.eos_id,), max_position_embeddings=4096,
  )  # fmt: skip
  params = init_params(config, jax.random.key(0))
  B, K, A = args.batch, args.turns, args.action_tokens
  renderer = envs.PlainRenderer(tok, template=" {obs} ")
  obs = "x" * 10  # the scripted env's observation: fixed text, fixed token count
  spec = envs.EnvSpec("scripted", {"num_turns": K, "prompt": "start {seed}", "template": obs})
  n_obs = len(renderer.observation_ids(obs))
  total = K * A + (K - 1) * n_obs
  never = [[tok.vocab_size]]  # an id the model cannot sample: every turn runs to its budget
  prompts = [renderer.prompt_ids(f"start {s}") for s in range(B)]
  ids, mask = tok.encode_batch([""] * B, add_special_tokens=False, pad_to=16)
  for b, p in enumerate(prompts):
    ids[b, 16 - len(p) :], mask[b, 16 - len(p) :] = p, True
  strategy = Temperature(1.0)
  if args.slots:
    return ragged(args, env, tok, config, params, renderer, obs, n_obs, never, strategy)

  last = {}  # each contender's last output, checked after the rounds

  with envs.EnvPool(spec, num_workers=2) as pool:

    def multi():
      last["multi"] = rollout_episodes(
        params, pool, renderer, config=config, strategy=strategy, key=jax.random.key(1),
        seeds=list(range(B)), decode=tok.decode, max_tokens=total, turn_tokens=A,
        stop_sequences=never, pad_id=tok.pad_id, max_turns=K, chunk_steps=args.chunk_steps,
        buckets=(16,), obs_buckets=(n_obs,), cache_buckets=(16 + total + A,),
      )  # fmt: skip

    def single():
      last["single"] = generate(
        params, ids, mask, config=config, num_samples=1, strategy=strategy, key=jax.random.key(1),
        max_new_tokens=total, stop_tokens=[tok.vocab_size], pad_id=0, buckets=(16,),
      )  # fmt: skip
      return last["single"].tokens

    samples = harness.interleave({"single": single, "multi": multi}, rounds=args.rounds,
                                 warmup=args.warmup)  # fmt: skip
  n = last["multi"].collate(pad_id=0)["token_mask"].sum()
  assert n == B * total, (n, B * total)
  assert int(np.asarray(last["single"].lengths).sum()) == B * total
  s_times, m_times = samples["single"], samples["multi"]
  ratio = harness.ratio_summary(s_times, m_times)
  metrics = last["multi"].metrics
  tps = lambda t: B * total / t
  print(f"B={B} turns={K} action_tokens={A} obs_tokens={n_obs} stream_tokens/row={total} "
        f"model D={args.hidden} L={args.layers} V={tok.vocab_size}")  # fmt: skip
  print(f"single-turn generate : median {statistics.median(s_times):.3f} s  "
        f"{tps(statistics.median(s_times)):.0f} tok/s")  # fmt: skip
  print(f"multi-turn rollout   : median {statistics.median(m_times):.3f} s  "
        f"{tps(statistics.median(m_times)):.0f} tok/s")  # fmt: skip
  print(f"multi / single throughput: median {ratio['median']:.2f} "
        f"(range {ratio['min']:.2f}-{ratio['max']:.2f})")  # fmt: skip
  print(
    f"last multi-turn breakdown: decode {metrics['decode_s']:.3f} s, append "
    f"{metrics['append_s']:.3f} s, env wait {metrics['env_wait_s']:.3f} s, env step "
    f"{metrics['env_step_s']:.3f} s, cache slots {metrics['cache_slots']} (holes "
    f"{metrics['holes']} of {metrics['cache_slots'] * B})"
  )
  if args.json_out:
    harness.write_json(args.json_out, {
      "settings": vars(args), "obs_tokens": n_obs, "stream_tokens_per_row": total,
      "seconds": samples, "single_over_multi": ratio, "last_multi_metrics": metrics,
    }, env)  # fmt: skip


def ragged(args, env, tok, config, params, renderer, obs, n_obs, never, strategy):
  """Lockstep against slots on episodes of 1..K turns (see the module docstring)."""
  B, K, A = args.batch, args.turns, args.action_tokens
  turns = [1 + (b * 7) % K for b in range(B)]
  specs = [envs.EnvSpec("scripted", {"num_turns": n, "prompt": "start {seed}", "template": obs})
           for n in turns]  # fmt: skip
  total = K * A + (K - 1) * n_obs
  common = dict(
    config=config, strategy=strategy, key=jax.random.key(1), seeds=list(range(B)), specs=specs,
    decode=tok.decode, max_tokens=total, turn_tokens=A, stop_sequences=never, pad_id=tok.pad_id,
    max_turns=K, chunk_steps=args.chunk_steps, buckets=(16,), obs_buckets=(n_obs,),
    cache_buckets=(16 + total + A,),
  )  # fmt: skip
  last = {}
  with envs.EnvPool(num_workers=2) as pool:
    runs = {"lockstep": lambda: last.__setitem__("lockstep", rollout_episodes(params, pool, renderer, **common))}  # fmt: skip
    for N in (int(n) for n in args.slots.split(",")):
      runs[f"slots {N}"] = lambda N=N: last.__setitem__(
        f"slots {N}", rollout_episodes_on_slots(params, pool, renderer, num_slots=N, **common)
      )
    samples = harness.interleave(runs, rounds=args.rounds, warmup=args.warmup)
  ref = last["lockstep"].collate(pad_id=0)
  n = int(ref["token_mask"].sum())
  print(f"B={B} turns per episode 1..{K} (mean {np.mean(turns):.2f}) action_tokens={A} "
        f"obs_tokens={n_obs} stream tokens {n} model D={args.hidden} L={args.layers}")  # fmt: skip
  base = samples["lockstep"]
  out = {}
  for name, times in samples.items():
    got = last[name].collate(pad_id=0)
    np.testing.assert_array_equal(got["tokens"], ref["tokens"])  # the same episodes
    m = last[name].metrics
    rows = m.get("slots", B)
    # Slot-steps (row-steps for lockstep) that sampled an action token.
    useful = got["policy_mask"].sum() / (m["decode_steps"] * rows)
    ratio = harness.ratio_summary(base, times)
    out[name] = dict(metrics=m, ratio=ratio)
    print(f"{name:10s}: median {statistics.median(times):.3f} s  "
          f"{n / statistics.median(times):.0f} tok/s  x{ratio['median']:.2f} "
          f"({ratio['min']:.2f}-{ratio['max']:.2f}) of lockstep  useful {useful:.2f}  "
          f"KV columns {rows} x {m['cache_slots']} = {rows * m['cache_slots']}")  # fmt: skip
  if args.json_out:
    harness.write_json(args.json_out, {
      "settings": vars(args), "turns": turns, "stream_tokens": n, "seconds": samples,
      "results": out,
    }, env)  # fmt: skip


if __name__ == "__main__":
  main()
