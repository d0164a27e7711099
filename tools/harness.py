"""The benchmark suite's shared harness: timing, child processes, environment record, JSON out.

Every tool in tools/ that times something uses it, so each reruns the same way and records the
same things (the tools and their tables: docs/benchmarks.md; this module's behaviour is pinned
by tests/test_harness.py):

* ``time_calls``: one callable timed in this process: ``warmup`` calls (compiling ones) discarded,
  then ``repeats`` timed calls, each waited for (``jax.block_until_ready`` on what it returns, or
  the caller's ``block``, e.g. ``torch.cuda.synchronize``); a ``Timing`` (samples, median, min,
  max, spread).
* ``interleave``: several callables in one process, after their warm-up one timed call of each
  per round, in turn (A, B, A, B, ...), so the machine's drift hits all of them alike.
* ``alternate``: settings / contenders in fresh child processes, one process per (round,
  contender), in turn over interleaved rounds (A, B, A, B, ...). A ``Child`` names a function of a
  tool (``"tools/x.py:function"``), its keyword arguments and its environment changes; the
  function runs in the child (usually ``time_calls`` with its warm-up) and returns a dict (the
  samples); ``alternate`` returns the dicts per contender, one per round. Processes, not one
  process alternating two compiled programs, where the two disturb each other (allocator state).
* ``Worker`` / ``Channel``: a long-lived child process driven one command at a time over a pipe
  (a JSON line per reply), for sides too dear to build once per round (a trainer, a model).
* ``environment``: the record of when and where: date (UTC), git commit and dirty flag, machine
  (host, CPU model, cores, memory, load), python, package versions (jax, jaxlib, ...), jax's
  platform and devices, and the environment variables that change what is measured (XLA_FLAGS,
  JAX_PLATFORMS, GLIBC_TUNABLES, ...; none whose name says token, key, secret or password).
* ``write_json`` / ``read_json``: the ``--json-out PATH`` document, {tool, argv, environment,
  ...the tool's results}.
* ``ratio_summary`` / ``ratio_text`` / ``table_header`` / ``table_row`` / ``markdown_table``:
  per-round ratios with their range (min / median / max over rounds), and markdown tables.
* ``add_common_args``: the common flags ``--rounds``, ``--warmup``, ``--json-out``.
* ``matmul_peak`` / ``torch_matmul_peak``: the best FLOP/s of a square matmul, the peak the
  tools divide an achieved FLOP/s by.

Nothing here imports jax or torch until a function needs it.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.util
import json
import os
import platform
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULT_MARK = "HARNESS_RESULT "  # the line of a child's stdout that holds its result
PACKAGES = ("jax", "jaxlib", "numpy")  # versions every record holds
# Environment variables recorded (by prefix), unless their name looks like a credential.
ENV_PREFIXES = (
  "XLA_", "JAX_", "TPU_", "CUDA_", "NVIDIA_", "HIP_", "ROCR_", "NCCL_", "OMP_", "MKL_",
  "OPENBLAS_", "GLIBC_", "RLVR_JAX_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "TORCH",
)  # fmt: skip
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "CREDENTIAL", "AUTH")


# ------------------------------------------------------------------------ timing in one process
@dataclasses.dataclass
class Timing:
  """Timed calls of one callable: ``samples`` (seconds, warm-up excluded), ``warmup`` (the
  discarded calls' seconds) and, when asked for, ``last`` (the last call's output)."""

  samples: list[float]
  warmup: list[float] = dataclasses.field(default_factory=list)
  last: Any = None

  @property
  def median(self) -> float:
    return statistics.median(self.samples)

  @property
  def min(self) -> float:
    return min(self.samples)

  @property
  def max(self) -> float:
    return max(self.samples)

  @property
  def spread(self) -> float:
    """(max - min) / median."""
    return (self.max - self.min) / self.median

  def text(self, fmt: str = ".3f") -> str:
    """``median (min-max)``."""
    return spread_text(self.samples, fmt)

  def to_dict(self) -> dict:
    return {"samples": self.samples, "warmup": self.warmup, "median": self.median,
            "min": self.min, "max": self.max}  # fmt: skip


def wait(out, block: bool | Callable[[], Any] = True):
  """Waits for ``out``: ``block`` True: ``jax.block_until_ready`` (when jax is loaded); a
  function: calls it (``torch.cuda.synchronize``); False: nothing (the call waited itself)."""
  if callable(block):
    block()
  elif block and "jax" in sys.modules:
    sys.modules["jax"].block_until_ready(out)


def timed(fn: Callable[[], Any], block=True, clock=time.perf_counter) -> tuple[float, Any]:
  """(seconds, output) of one call of ``fn``, waited for (``wait``)."""
  t0 = clock()
  out = fn()
  wait(out, block)
  return clock() - t0, out


def time_calls(
  fn: Callable[[], Any],
  *,
  warmup: int = 1,
  repeats: int = 5,
  budget_s: float | None = None,
  block=True,
  keep_last: bool = False,
  clock: Callable[[], float] = time.perf_counter,
) -> Timing:
  """``warmup`` untimed calls, then ``repeats`` timed ones (fewer once the timed ones add up to
  ``budget_s``; at least one); each waited for (``wait``). No call's output is held while the
  next runs (memory stays what one call needs), unless ``keep_last``: then each is held until
  the next returns, and the last one is ``Timing.last``."""
  warm = [timed(fn, block, clock)[0] for _ in range(warmup)]
  samples, last = [], None
  while len(samples) < max(1, repeats) and (
    not samples or budget_s is None or sum(samples) < budget_s
  ):
    seconds, out = timed(fn, block, clock)
    samples.append(seconds)
    last = out if keep_last else None
    del out
  return Timing(samples, warm, last)


def interleave(
  fns: Mapping[str, Callable[[], Any]],
  *,
  rounds: int,
  warmup: int = 1,
  block=True,
  clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
  """Seconds per round of each of ``fns``: ``warmup`` untimed calls of each, then ``rounds``
  rounds of one timed call of each, in the order given."""
  for _ in range(warmup):
    for fn in fns.values():
      timed(fn, block, clock)
  samples = {name: [] for name in fns}
  for _ in range(rounds):
    for name, fn in fns.items():
      samples[name].append(timed(fn, block, clock)[0])
  return samples


# ------------------------------------------------------------------------ child processes
@dataclasses.dataclass(frozen=True)
class Child:
  """A function run in a fresh process: ``target`` ``"path/to/tool.py:function"`` (a path
  relative to the repository root, or absolute) called with ``kwargs`` (JSON values); ``env``:
  changes to this process's environment (None unsets a variable). The function returns a
  JSON-able dict."""

  target: str
  kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  env: Mapping[str, str | None] = dataclasses.field(default_factory=dict)


class ChildFailed(RuntimeError):
  def __init__(self, target: str, returncode: int, output: str):
    super().__init__(f"{target} failed ({returncode}):\n{output[-3000:]}")
    self.target, self.returncode, self.output = target, returncode, output


def child_env(changes: Mapping[str, str | None] | None = None) -> dict:
  """This process's environment with the repository root first on PYTHONPATH, and ``changes``."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
    p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p))  # fmt: skip
  for name, value in (changes or {}).items():
    if value is None:
      env.pop(name, None)
    else:
      env[name] = value
  return env


def run_child(child: Child, *, timeout: float | None = None) -> dict:
  """``child``'s function in a fresh process; its returned dict (``ChildFailed`` if it fails)."""
  cmd = [sys.executable, os.path.abspath(__file__), "--child", child.target]
  cmd.append(json.dumps(dict(child.kwargs)))
  proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env(child.env),
                        timeout=timeout, check=False)  # fmt: skip
  results = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_MARK)]
  if proc.returncode != 0 or not results:
    raise ChildFailed(child.target, proc.returncode, proc.stderr or proc.stdout)
  return json.loads(results[-1][len(RESULT_MARK) :])


def alternate(
  children: Mapping[str, Child],
  *,
  rounds: int,
  timeout: float | None = None,
  log: Callable[[str], Any] | None = None,
) -> dict[str, list[dict]]:
  """Each child once per round, in the order given, a fresh process each (A, B, A, B, ...): per
  child its results, one per round."""
  results = {name: [] for name in children}
  for r in range(rounds):
    for name, child in children.items():
      results[name].append(run_child(child, timeout=timeout))
      if log:
        log(f"# round {r}: {name} done")
  return results


def load_target(target: str) -> Callable:
  """The function ``"path/to/file.py:function"`` names; the file is imported under its own name
  (its folder first on ``sys.path``, so a tool's ``import harness`` finds this module)."""
  path, _, name = target.rpartition(":")
  path = path if os.path.isabs(path) else os.path.join(ROOT, path)
  module_name = os.path.splitext(os.path.basename(path))[0]
  sys.path.insert(0, os.path.dirname(path))
  spec = importlib.util.spec_from_file_location(module_name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[module_name] = module  # dataclasses look their module up there
  spec.loader.exec_module(module)
  return getattr(module, name)


def round_medians(results: Sequence[Mapping], key: str = "samples") -> list[float]:
  """The median of each round's ``key`` samples (``alternate``'s results of one child)."""
  return [statistics.median(r[key]) for r in results]


# ------------------------------------------------------------------------ long-lived workers
class Channel:
  """The worker's side of a ``Worker``: commands from stdin, one JSON line per reply on the
  original stdout; file descriptor 1 then points at stderr, so what libraries print goes to the
  worker's log."""

  def __init__(self):
    self.out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

  def send(self, obj: Mapping):
    self.out.write(json.dumps(obj, default=_jsonable) + "\n")
    self.out.flush()

  def serve(self, handlers: Mapping[str, Callable[[], Mapping]]) -> str:
    """Answers commands in ``handlers`` until one that is not: returns it (end of input:
    "quit")."""
    while True:
      cmd = sys.stdin.readline().strip() or "quit"
      if cmd not in handlers:
        return cmd
      self.send(handlers[cmd]())


class WorkerExited(RuntimeError):
  def __init__(self, returncode: int, log_tail: str):
    super().__init__(f"worker exited ({returncode}): {log_tail}")
    self.returncode, self.log_tail = returncode, log_tail


class WorkerTimeout(RuntimeError):
  pass


class Worker:
  """A child process (``cmd``, its own process group) answering commands with JSON lines;
  its stderr goes to ``log_path``. A reply not in by ``deadline`` (``time.time()``; None: no
  limit) stops the process group and raises ``WorkerTimeout``; a worker that exits raises
  ``WorkerExited`` with the end of its log."""

  def __init__(self, cmd: Sequence[str], *, log_path: str, env: Mapping | None = None,
               deadline: float | None = None):  # fmt: skip
    self.deadline, self.log_path = deadline, log_path
    self.log = open(log_path, "w")
    self.proc = subprocess.Popen(
      list(cmd), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
      env=dict(env) if env is not None else child_env(), process_group=0,
    )  # fmt: skip
    self.lines = queue.Queue()
    threading.Thread(target=self._pump, daemon=True).start()

  def _pump(self):
    for line in self.proc.stdout:
      self.lines.put(line)
    self.lines.put(None)

  def log_tail(self, chars: int = 3000) -> str:
    self.log.flush()
    with open(self.log_path) as f:
      return f.read()[-chars:]

  def read(self) -> dict:
    timeout = None if self.deadline is None else max(1.0, self.deadline - time.time())
    try:
      line = self.lines.get(timeout=timeout)
    except queue.Empty:
      self.kill()
      raise WorkerTimeout("stopped at the budget's end") from None
    if line is None:
      self.proc.wait()
      raise WorkerExited(self.proc.returncode, self.log_tail())
    return json.loads(line)

  def ask(self, command: str) -> dict:
    try:
      self.proc.stdin.write(command + "\n")
      self.proc.stdin.flush()
    except BrokenPipeError:
      pass  # it exited: read() says how
    return self.read()

  def close(self, timeout: float = 120.0):
    if self.proc.poll() is None:
      try:
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        self.proc.wait(timeout=timeout)
      except (BrokenPipeError, subprocess.TimeoutExpired):
        self.kill()
    self.log.close()

  def kill(self):
    try:
      os.killpg(self.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    self.proc.wait()


# ------------------------------------------------------------------------ environment record
def git_state(root: str = ROOT) -> dict:
  """{"commit": HEAD or None, "dirty": tracked files changed (None when git cannot say)}."""

  def git(*args):
    # --no-optional-locks: a status never takes the index lock from someone else's git
    out = subprocess.run(["git", "--no-optional-locks", "-C", root, *args], capture_output=True,
                         text=True, check=False)  # fmt: skip
    return out.stdout.strip() if out.returncode == 0 else None

  try:
    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
  except OSError:  # no git
    return {"commit": None, "dirty": None}
  return {"commit": commit, "dirty": None if status is None else bool(status)}


def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.split(":")[0].strip() in ("model name", "Model", "cpu model"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def _memory_bytes() -> int | None:
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemTotal:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  try:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):
    return None


def machine() -> dict:
  usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return {"hostname": platform.node(), "os": platform.platform(), "arch": platform.machine(),
          "cpu_model": _cpu_model(), "cores": os.cpu_count(), "usable_cores": usable,
          "memory_bytes": _memory_bytes(), "load_avg": list(os.getloadavg())}  # fmt: skip


def versions(names: Sequence[str]) -> dict[str, str | None]:
  """Installed versions of ``names`` (None: not installed); nothing is imported."""
  from importlib.metadata import PackageNotFoundError, version

  out = {}
  for name in names:
    try:
      out[name] = version(name)
    except PackageNotFoundError:
      out[name] = None
  return out


def relevant_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
  """The variables that change what a benchmark measures (``ENV_PREFIXES``), credentials left
  out."""
  return {k: v for k, v in sorted(environ.items()) if k.startswith(ENV_PREFIXES)
          and not any(w in k.upper() for w in SECRET_WORDS)}  # fmt: skip


def _device_info() -> dict:
  import jax

  devs = jax.devices()
  return {"platform": jax.default_backend(), "device_count": len(devs),
          "devices": [f"{d.platform}:{d.id} {d.device_kind}" for d in devs],
          "process_count": jax.process_count()}  # fmt: skip


def jax_devices(where: str = "here") -> dict | None:
  """jax's platform and devices: ``where`` "here" (this process; starts jax's backends),
  "subprocess" (a short child process with this environment: leaves this process without a
  backend, e.g. a parent whose workers need all of a GPU's memory), "none" (None)."""
  if where == "none":
    return None
  if where == "here":
    return _device_info()
  code = f"import json, sys; sys.path.insert(0, {HERE!r}); import harness; "
  code += "print(json.dumps(harness._device_info()))"
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        env=child_env(), check=False)  # fmt: skip
  if proc.returncode != 0:
    return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
  return json.loads(proc.stdout.strip().splitlines()[-1])


def environment(*, packages: Sequence[str] = (), devices: str = "here") -> dict:
  """The record of when and where a benchmark ran (module docstring); ``packages``: versions to
  record besides ``PACKAGES``; ``devices``: where to ask jax (``jax_devices``)."""
  return {
    "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "git": git_state(),
    "machine": machine(),
    "python": platform.python_version(),
    "packages": versions(list(dict.fromkeys([*PACKAGES, *packages]))),
    "jax": jax_devices(devices),
    "env": relevant_env(),
  }


def header(env: Mapping, extra: str = "") -> str:
  """A one-line summary of ``environment()``'s record, as a markdown comment."""
  git, m, jx = env["git"], env["machine"], env.get("jax") or {}
  commit = (git["commit"] or "no commit")[:10] + ("+dirty" if git["dirty"] else "")
  mem = f", {m['memory_bytes'] / 2**30:.0f} GiB" if m.get("memory_bytes") else ""
  devs = f" {jx['platform']} x {jx['device_count']}" if "platform" in jx else ""
  date = env["date_utc"].replace("T", " ")[:16] + " UTC"
  flags = "".join(f", {k}={env['env'][k]}" for k in ("JAX_PLATFORMS", "XLA_FLAGS")
                  if k in env["env"])  # fmt: skip
  return (f"# {date}; {commit}; {m['cores']}-core {m['cpu_model']}{mem}; python {env['python']}"
          f", jax {env['packages'].get('jax')}{devs}{flags}; load {load_text()}"
          + (f"; {extra}" if extra else ""))  # fmt: skip


def load_text() -> str:
  return " ".join(f"{x:.2f}" for x in os.getloadavg())


# ------------------------------------------------------------------------ JSON out
RESERVED = ("tool", "argv", "environment")


def document(results: Mapping, env: Mapping | None = None, *, tool: str | None = None,
             argv: Sequence[str] | None = None) -> dict:  # fmt: skip
  """{tool, argv, environment, **results}: the JSON document of one benchmark run."""
  clash = sorted(set(results) & set(RESERVED))
  if clash:
    raise ValueError(f"result keys {clash} are the document's own")
  if tool is None:
    tool = os.path.relpath(os.path.abspath(sys.argv[0]), ROOT) if sys.argv[0] else "?"
  return {"tool": tool, "argv": list(sys.argv[1:] if argv is None else argv),
          "environment": dict(env) if env is not None else environment(), **results}  # fmt: skip


def write_json(path: str, results: Mapping, env: Mapping | None = None, **kw) -> dict:
  """Writes ``document(results, env, **kw)`` to ``path``; returns it."""
  doc = document(results, env, **kw)
  if os.path.dirname(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump(doc, f, indent=2, default=_jsonable)
  return doc


def read_json(path: str) -> dict:
  with open(path) as f:
    return json.load(f)


def _jsonable(x):
  if hasattr(x, "tolist"):  # numpy arrays and scalars
    return x.tolist()
  if dataclasses.is_dataclass(x) and not isinstance(x, type):
    return dataclasses.asdict(x)
  return str(x)


# ------------------------------------------------------------------------ summaries and tables
def ratio_summary(numerators: Sequence[float], denominators: Sequence[float]) -> dict:
  """Per-round ratios numerator / denominator and their min, median and max."""
  ratios = [float(a) / float(b) for a, b in zip(numerators, denominators, strict=True)]
  return {"ratios": ratios, "min": min(ratios), "median": statistics.median(ratios),
          "max": max(ratios)}  # fmt: skip


def ratio_text(summary: Mapping, fmt: str = ".2f", suffix: str = "x") -> str:
  """``median{suffix} (min-max)``; the range left out for one round."""
  rng = f" ({summary['min']:{fmt}}-{summary['max']:{fmt}})" if len(summary["ratios"]) > 1 else ""
  return f"{summary['median']:{fmt}}{suffix}{rng}"


def spread_text(values: Sequence[float], fmt: str = ".3f") -> str:
  """``median (min-max)`` of ``values``."""
  return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def table_row(cells: Sequence[Any]) -> str:
  return "| " + " | ".join(str(c) for c in cells) + " |"


def table_header(headers: Sequence[str]) -> str:
  return table_row(headers) + "\n" + "|" + "---|" * len(headers)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
  return "\n".join([table_header(headers), *(table_row(r) for r in rows)])


# ------------------------------------------------------------------------ common flags
def add_common_args(
  parser,
  *,
  rounds: int | None = None,
  warmup: int | None = None,
  json_out: bool = True,
  rounds_help: str = "interleaved measured rounds",
  warmup_help: str = "untimed calls first (compilation)",
):
  """``--rounds`` / ``--warmup`` (each when given a default) and ``--json-out``."""
  if rounds is not None:
    parser.add_argument("--rounds", type=int, default=rounds, help=rounds_help)
  if warmup is not None:
    parser.add_argument("--warmup", type=int, default=warmup, help=warmup_help)
  if json_out:
    help_ = "also write the environment record and the results as JSON here"
    parser.add_argument("--json-out", default="", help=help_)
  return parser


# ------------------------------------------------------------------------ matmul peaks
def matmul_peak(n: int = 1024, repeats: int = 10, dtype="float32") -> float:
  """Best FLOP/s of a jitted [n, n] @ [n, n] product in ``dtype`` (2 n^3 FLOPs per call, float32
  accumulation), one warm-up call."""
  import jax
  import jax.numpy as jnp

  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
  f = jax.jit(lambda x: jnp.matmul(x, x, preferred_element_type=jnp.float32))
  return 2 * n**3 / time_calls(lambda: f(a), warmup=1, repeats=repeats).min


def torch_matmul_peak(n: int, repeats: int = 10, dtype: str = "bfloat16", device: str = "cpu"):
  """Best FLOP/s of a ``torch.matmul`` [n, n] @ [n, n] in ``dtype`` on ``device``, timed as
  ``matmul_peak`` (synchronised on CUDA)."""
  import torch

  sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
  a = torch.randn(n, n, device=device).to(getattr(torch, dtype))
  return 2 * n**3 / time_calls(lambda: torch.matmul(a, a), warmup=1, repeats=repeats,
                               block=sync).min  # fmt: skip


def _child_main(target: str, kwargs_json: str):
  result = load_target(target)(**json.loads(kwargs_json))
  print(RESULT_MARK + json.dumps(result, default=_jsonable), flush=True)


if __name__ == "__main__":
  if len(sys.argv) != 4 or sys.argv[1] != "--child":
    sys.exit(f"usage: {sys.argv[0]} --child PATH.py:FUNCTION KWARGS_JSON (run by run_child)")
  _child_main(sys.argv[2], sys.argv[3])
