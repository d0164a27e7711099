"""Launch an experiment: ``python -m rlvr_jax.main --config=experiments/<name>.py [--config.a.b=v]``.

The config file's ``get_config()`` gives every field; any field is overridable on the command line
(``--config.objective.name=dapo --config.objective.kwargs.clip_high=0.28``). The run writes
``<workdir>/metrics.jsonl``, TensorBoard events, checkpoints, ``summary.json`` and ``curves.png``.
A run whose workdir has checkpoints resumes from the latest complete one
(``--config.checkpoint.resume=False`` starts over).

Several devices / processes (docs/launch.md): ``--mesh=data,fsdp,tensor`` (one size may be -1)
runs the trainer on that mesh; ``--coordinator_address``, ``--num_processes``, ``--process_id`` (or
SLURM / a TPU pod slice, detected) join several processes first (``rlvr_jax.distributed``).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from rlvr_jax import distributed  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "experiment config file", lock_config=True
)
distributed.define_flags()  # --mesh, --distributed, --coordinator_address, ... (docs/launch.md)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  distributed.initialize_from_flags()  # multi-process start-up; before any other JAX call
  from rlvr_jax.train import sharded

  config = _CONFIG.value
  if config is None:
    raise app.UsageError("--config=experiments/<name>.py is required")
  mesh_sizes = sharded.parse_mesh(flags.FLAGS.mesh)
  sharded.train(config, mesh_sizes=mesh_sizes, log=lambda s: print(s, flush=True))


if __name__ == "__main__":
  app.run(main)
