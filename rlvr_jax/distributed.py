"""Multi-process start-up: ``jax.distributed.initialize()`` driven by flags or the environment.

One Python process runs per host (TPU pod slice: one per TPU VM; GPU cluster: one per node or per
GPU). Every process runs the same program; ``jax.devices()`` then lists the devices of *all*
processes, ``jax.make_mesh`` builds a global mesh over them, and arrays sharded over it span hosts
(``rlvr_jax.train.sharded`` builds them from per-process data).

How the processes find each other (``initialize``; the first match wins):

1. explicit: ``coordinator_address`` + ``num_processes`` + ``process_id`` (arguments / absl
   flags ``--coordinator_address`` ..., or the environment ``RLVR_COORDINATOR_ADDRESS``,
   ``RLVR_NUM_PROCESSES``, ``RLVR_PROCESS_ID``; JAX's own ``JAX_COORDINATOR_ADDRESS`` is also read);
2. SLURM: ``srun`` sets ``SLURM_JOB_ID`` / ``SLURM_NTASKS`` / ``SLURM_PROCID`` ...; with more than one
   task JAX derives the coordinator (first node of the step) and the ranks from them;
3. Cloud TPU pod slice (several TPU VMs, ``TPU_WORKER_HOSTNAMES`` lists more than one host, or
   ``mode="auto_detect"``): JAX reads the worker list from the TPU metadata server;
4. otherwise: a single process, nothing to do (``initialize`` is a no-op).

On the CPU backend the cross-process collectives need an implementation: gloo is selected
(``jax_cpu_collectives_implementation``) before initialising. JAX 0.10.2 already defaults to gloo;
the explicit setting guards against other defaults. It does not affect GPUs or TPUs.
"""

from __future__ import annotations

import dataclasses
import os

import jax

MODES = ("auto", "auto_detect", "off")


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
  """What ``initialize`` did: ``source`` is 'explicit', 'slurm', 'tpu_pod', 'auto_detect' or
  'single' (no initialisation); the rest is read back from JAX afterwards."""

  source: str
  process_index: int
  process_count: int
  local_device_count: int
  device_count: int


def detect(
  coordinator_address: str | None = None,
  num_processes: int | None = None,
  process_id: int | None = None,
  *,
  mode: str = "auto",
  environ: dict | None = None,
) -> tuple[str, dict]:
  """Decides how to start: ``(source, kwargs for jax.distributed.initialize)``.

  Pure (reads ``environ``, default ``os.environ``); ``source == 'single'`` means no initialisation.
  Raises ``ValueError`` for a partial explicit set-up (e.g. an address without a process id).
  """
  if mode not in MODES:
    raise ValueError(f"distributed mode {mode!r} is not one of {MODES}")
  env = os.environ if environ is None else environ
  if mode == "off":
    return "single", {}

  def env_int(name):
    value = env.get(name)
    if value in (None, ""):
      return None
    try:
      return int(value)
    except ValueError as e:
      raise ValueError(f"environment variable {name}={value!r} is not an integer") from e

  address = (
    coordinator_address
    or env.get("RLVR_COORDINATOR_ADDRESS")
    or env.get("JAX_COORDINATOR_ADDRESS")
    or None
  )
  n = num_processes if num_processes is not None else env_int("RLVR_NUM_PROCESSES")
  n = n if n is not None else env_int("JAX_NUM_PROCESSES")
  pid = process_id if process_id is not None else env_int("RLVR_PROCESS_ID")
  pid = pid if pid is not None else env_int("JAX_PROCESS_ID")
  explicit = {"coordinator_address": address, "num_processes": n, "process_id": pid}
  given = [k for k, v in explicit.items() if v is not None]
  if address is not None and len(given) == 3:
    if n < 1 or not 0 <= pid < n:
      raise ValueError(f"process_id={pid} must be in [0, num_processes={n})")
    if n == 1:
      return "single", {}
    return "explicit", explicit
  slurm = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
  in_slurm = all(k in env for k in slurm) and (env_int("SLURM_NTASKS") or 1) > 1
  if given and not (in_slurm or mode == "auto_detect"):
    # A partial explicit set-up is almost always a launch-script bug: say which part is missing.
    missing = sorted(set(explicit) - set(given))
    raise ValueError(
      "explicit distributed set-up needs coordinator_address, num_processes and process_id; "
      f"missing {missing} (given {given})"
    )
  if in_slurm:
    return "slurm", {k: v for k, v in explicit.items() if v is not None}
  hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
  if len(hosts) > 1:
    return "tpu_pod", {}
  if mode == "auto_detect":
    return "auto_detect", {k: v for k, v in explicit.items() if v is not None}
  return "single", {}


def initialize(
  coordinator_address: str | None = None,
  num_processes: int | None = None,
  process_id: int | None = None,
  *,
  mode: str = "auto",
  local_device_ids=None,
  cpu_collectives: str | None = "gloo",
  initialization_timeout: int = 300,
) -> ProcessInfo:
  """Joins the multi-process JAX runtime if the flags or the environment ask for it.

  Must run before any other JAX call (JAX raises otherwise). Calling it again after a successful
  initialisation is a no-op. See the module docstring for the detection order; ``mode``:
  ``"auto"`` (default), ``"auto_detect"`` (always call ``jax.distributed.initialize`` and let JAX
  detect the cluster, e.g. a TPU pod whose environment lacks ``TPU_WORKER_HOSTNAMES``), ``"off"``.
  """
  source, kwargs = detect(coordinator_address, num_processes, process_id, mode=mode)
  if source != "single" and not jax.distributed.is_initialized():
    if cpu_collectives:
      jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    if local_device_ids is not None:
      kwargs["local_device_ids"] = local_device_ids
    jax.distributed.initialize(**kwargs, initialization_timeout=initialization_timeout)
  return ProcessInfo(
    source=source,
    process_index=jax.process_index(),
    process_count=jax.process_count(),
    local_device_count=jax.local_device_count(),
    device_count=jax.device_count(),
  )


def define_flags() -> None:
  """Registers ``--distributed``, ``--coordinator_address``, ``--num_processes``,
  ``--process_id`` (read by ``initialize_from_flags``) and ``--mesh``
  (``data,fsdp,tensor[,context]`` sizes for ``train.sharded.train``) with absl (idempotent)."""
  from absl import flags

  if "coordinator_address" in flags.FLAGS:
    return
  flags.DEFINE_enum("distributed", "auto", list(MODES), "multi-process start-up mode")
  flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (multi-process)")
  flags.DEFINE_integer("num_processes", None, "number of processes (multi-process)")
  flags.DEFINE_integer("process_id", None, "this process's index in [0, num_processes)")
  flags.DEFINE_string(
    "mesh",
    "",
    "data,fsdp,tensor[,context] mesh sizes over all devices (one may be -1; a context size > 1 "
    "splits the update's sequences, with --config.model.attention=ring); empty: a single device "
    "(one process) or FSDP over all devices (several processes)",
  )


def initialize_from_flags() -> ProcessInfo:
  """``initialize`` with the absl flags of ``define_flags`` (call from ``main`` before any JAX)."""
  from absl import flags

  f = flags.FLAGS
  return initialize(f.coordinator_address, f.num_processes, f.process_id, mode=f.distributed)


def is_primary() -> bool:
  """True on process 0 (the one that writes logs, plots and summaries)."""
  return jax.process_index() == 0
