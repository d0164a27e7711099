"""How ``rlvr_jax.distributed`` decides to start: explicit, SLURM, TPU pod, single process."""

import pytest

from rlvr_jax import distributed

SLURM = {
  "SLURM_JOB_ID": "42",
  "SLURM_STEP_NODELIST": "node[1-2]",
  "SLURM_NTASKS": "2",
  "SLURM_PROCID": "1",
  "SLURM_LOCALID": "0",
}


def test_single_process_is_a_no_op():
  assert distributed.detect(environ={}) == ("single", {})
  assert distributed.detect(mode="off", environ=SLURM) == ("single", {})
  # One SLURM task or one TPU host: nothing to join.
  assert distributed.detect(environ={**SLURM, "SLURM_NTASKS": "1"}) == ("single", {})
  assert distributed.detect(environ={"TPU_WORKER_HOSTNAMES": "localhost"}) == ("single", {})
  info = distributed.initialize(mode="auto")  # the test process: no cluster environment
  assert info.source == "single" and info.process_count == 1
  assert info.device_count == info.local_device_count


def test_explicit_arguments_and_environment():
  src, kw = distributed.detect("10.0.0.1:1234", 4, 3, environ={})
  assert src == "explicit"
  assert kw == {"coordinator_address": "10.0.0.1:1234", "num_processes": 4, "process_id": 3}
  env = {"RLVR_COORDINATOR_ADDRESS": "h:1", "RLVR_NUM_PROCESSES": "2", "RLVR_PROCESS_ID": "0"}
  assert distributed.detect(environ=env)[1] == {
    "coordinator_address": "h:1",
    "num_processes": 2,
    "process_id": 0,
  }
  # Arguments win over the environment; JAX's own variables are read too.
  assert distributed.detect(process_id=1, environ=env)[1]["process_id"] == 1
  jax_env = {"JAX_COORDINATOR_ADDRESS": "c:9", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"}
  assert distributed.detect(environ=jax_env)[0] == "explicit"
  assert distributed.detect("h:1", 1, 0, environ={}) == ("single", {})


def test_bad_explicit_set_ups_name_the_problem():
  with pytest.raises(ValueError, match=r"missing \['num_processes', 'process_id'\]"):
    distributed.detect("h:1", environ={})
  with pytest.raises(ValueError, match="process_id=2 must be in"):
    distributed.detect("h:1", 2, 2, environ={})
  with pytest.raises(ValueError, match="RLVR_PROCESS_ID='x' is not an integer"):
    distributed.detect(environ={"RLVR_PROCESS_ID": "x"})
  with pytest.raises(ValueError, match="mode 'mpi' is not one of"):
    distributed.detect(mode="mpi", environ={})


def test_cluster_detection():
  assert distributed.detect(environ=SLURM) == ("slurm", {})
  # Under SLURM an explicit port/address override is passed through, the rest is auto-detected.
  assert distributed.detect("node1:5555", environ=SLURM) == (
    "slurm",
    {"coordinator_address": "node1:5555"},
  )
  assert distributed.detect(environ={"TPU_WORKER_HOSTNAMES": "t0,t1,t2,t3"}) == ("tpu_pod", {})
  assert distributed.detect(mode="auto_detect", environ={}) == ("auto_detect", {})
