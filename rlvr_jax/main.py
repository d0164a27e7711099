"""Launch an experiment: ``python -m rlvr_jax.main --config=<name or file> [--config.a.b=v]``.

``--config=default`` is ``experiments/default.py``; ``--help`` lists every config field with its
value and meaning (``rlvr_jax.cli``). The config file's ``get_config()`` gives every field; any
field is overridable on the command line (``--config.objective.name=dapo
--config.objective.kwargs.clip_high=0.28``). An invalid configuration ends with one line
``error: config.<field>: ...`` and exit status 2 before anything is loaded.

The run writes ``<workdir>/metrics.jsonl``, TensorBoard events, checkpoints, ``config.json``,
``summary.json`` and ``curves.png``. The run directory's lifecycle (``train.rundir``): a workdir
with checkpoints resumes from the latest complete one; a finished run is reported and left
untouched; a larger ``rl.num_steps`` extends it; a change of any field that defines the experiment
is refused (``--config.workdir=<new dir>`` starts a new run, ``--config.checkpoint.resume=False``
starts over in place).

Several devices / processes (docs/launch.md): ``--mesh=data,fsdp,tensor`` (one size may be -1)
runs the trainer on that mesh (``--mesh=data,fsdp,tensor,context`` with
``--config.model.attention=ring`` also splits the update's sequences over ``context``);
``--coordinator_address``, ``--num_processes``, ``--process_id`` (or SLURM / a TPU pod slice,
detected) join several processes first (``rlvr_jax.distributed``).

Launched as ``python -m rlvr_jax.main`` on the CPU, the process re-executes itself once with
glibc tunables for ``malloc`` and runs XLA:CPU computations on the calling thread
(``rlvr_jax.host_memory``: huge pages, freed buffers kept for reuse; faster XLA:CPU steps, the
same numbers; ``RLVR_JAX_MALLOC=hugepages`` only the huge pages, ``RLVR_JAX_MALLOC=0`` neither).
A GPU or TPU launch does neither: the platform comes from ``JAX_PLATFORMS`` /
``JAX_PLATFORM_NAME`` when set, else from the accelerator plugins installed and the hardware
visible (``host_memory.jax_platform``), decided before jax starts.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # before anything allocates: malloc settings for XLA:CPU's buffers
  from rlvr_jax import host_memory  # both calls do nothing unless jax will compute on the CPU

  try:
    host_memory.reexec_with_malloc_tunables()
    host_memory.configure_jax()
  except ValueError as e:  # an unknown RLVR_JAX_MALLOC: one line, as for a bad config field
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from rlvr_jax import cli, distributed  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "experiment name or config file", lock_config=True
)
distributed.define_flags()  # --mesh, --distributed, --coordinator_address, ... (docs/launch.md)
_MACHINE_FLAGS = ("mesh", "distributed", "coordinator_address", "num_processes", "process_id")


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing behind ``rlvr_jax.cli``: experiment names, ``--help`` (exit 0), unknown
  fields and bad values as one ``error:`` line with exit status 2."""
  from rlvr_jax.train import config as config_lib

  config = None
  try:
    argv = cli.rewrite_argv(list(argv))
    spec = cli.config_arg(argv)
    config = cli.load_config(spec) if spec else None
    if cli.wants_help(argv):
      machine = [(n, flags.FLAGS[n].help, flags.FLAGS[n].default) for n in _MACHINE_FLAGS]
      print(cli.help_text(config or config_lib.base_config(), spec, machine))
      sys.exit(0)
    if config is None:
      names = ", ".join(cli.experiment_names())
      raise cli.UsageError(f"--config=<experiment name or file> is required (experiments: {names})")
    cli.check_overrides(config, argv)
  except (cli.UsageError, config_lib.ConfigError) as e:
    cli.fail(str(e))
  try:
    return flags.FLAGS(argv)
  except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as e:
    cli.fail(cli.explain_flag_error(e, config))


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  from rlvr_jax.data.files import DataError
  from rlvr_jax.train import config as config_lib

  config = _CONFIG.value
  try:
    config_lib.validate(config)  # before any JAX start-up or loading
    from rlvr_jax.train import sharded

    mesh_sizes = sharded.parse_mesh(flags.FLAGS.mesh)
  except (config_lib.ConfigError, ValueError) as e:
    cli.fail(cli.explain_config_error(e, config))
  distributed.initialize_from_flags()  # multi-process start-up; before any other JAX call
  try:
    sharded.train(config, mesh_sizes=mesh_sizes, log=lambda s: print(s, flush=True))
  except (config_lib.ConfigError, DataError) as e:  # e.g. a refused resume, a bad data row
    cli.fail(str(e))


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
