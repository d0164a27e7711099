"""rlvr_jax: reinforcement learning with verifiable rewards for language models, in JAX.

The pure math (advantages, losses, regularizers, logprobs) is importable on its own:

    from rlvr_jax import advantages, losses, regularizers, logprobs

The submodules are imported lazily on first attribute access (``rlvr_jax.losses``), so
``import rlvr_jax`` stays cheap and does not pull in the model, sampler or trainer.
"""

import importlib

__version__ = "0.1.0"

_LAZY_SUBMODULES = ("advantages", "losses", "regularizers", "logprobs")


def __getattr__(name):
  if name in _LAZY_SUBMODULES:
    return importlib.import_module(f"{__name__}.{name}")
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
  return sorted(set(globals()) | set(_LAZY_SUBMODULES))
