"""Launch an experiment: ``python -m rlvr_jax.main --config=experiments/<name>.py [--config.a.b=v]``.

The config file's ``get_config()`` gives every field; any field is overridable on the command line
(``--config.objective.name=dapo --config.objective.kwargs.clip_high=0.28``). The run writes
``<workdir>/metrics.jsonl``, TensorBoard events, checkpoints, ``summary.json`` and ``curves.png``.
A run whose workdir has checkpoints resumes from the latest complete one
(``--config.checkpoint.resume=False`` starts over).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from absl import app, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "experiment config file", lock_config=True
)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  from rlvr_jax.train import loop

  config = _CONFIG.value
  if config is None:
    raise app.UsageError("--config=experiments/<name>.py is required")
  loop.train(config, log=lambda s: print(s, flush=True))


if __name__ == "__main__":
  app.run(main)
