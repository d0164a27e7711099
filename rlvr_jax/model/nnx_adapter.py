"""Bring your own Flax NNX model: split it once into a graph and a params pytree.

The trainer only sees ``adapter.params`` (a nested dict of arrays, the ``nnx.Param`` state) and
calls ``adapter.forward`` with the same signature as ``rlvr_jax.model.forward``; inside, the module
is rebuilt with ``nnx.merge`` (cheap, trace-time only under ``jax.jit``). Nothing else of NNX leaks
into the training code, so optax, orbax and the sharding rules work on the params as on ours.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


def _default_call(module, tokens, positions):
  return module(tokens, positions)


class NNXAdapter:
  """Wraps an ``nnx.Module`` as (graph, params) with a ``forward`` like ``rlvr_jax.model``'s.

  Args:
    model: the NNX module.
    call: ``call(module, tokens [B, S], positions [B, S]) -> out``; default ``module(tokens,
      positions)``. ``out`` is the final hidden states [B, S, D] when ``unembed`` is given, else
      the logits [B, S, V].
    unembed: optional ``unembed(module) -> [D, V]`` unembedding, enabling hidden-state outputs
      (chunked log-probs) like the built-in model.
    params_filter: which state is trainable (default ``nnx.Param``); other state (RNG counters,
      batch stats) is kept fixed in ``adapter.rest``.

  Attributes:
    graphdef: the module graph (static).
    params: nested dict of arrays (the params pytree the trainer optimises).
    rest: the non-trainable state.
  """

  def __init__(
    self,
    model,
    *,
    call: Callable[..., jax.Array] | None = None,
    unembed: Callable[[Any], jax.Array] | None = None,
    params_filter: Any = None,
  ):
    from flax import nnx

    params_filter = nnx.Param if params_filter is None else params_filter
    self.graphdef, state, self.rest = nnx.split(model, params_filter, ...)
    self._state_template = state
    self.params = state.to_pure_dict()
    self._call = call or _default_call
    self._unembed = unembed

  def merge(self, params) -> Any:
    """The module with ``params`` (e.g. after training) substituted."""
    from flax import nnx

    state = jax.tree.map(lambda x: x, self._state_template)  # a fresh copy of the State
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(self.graphdef, state, self.rest, copy=True)

  def forward(
    self,
    params,
    tokens: jax.Array,
    positions: jax.Array,
    *,
    config: Any = None,
    cache: Any = None,
    return_logits: bool = False,
  ) -> tuple[jax.Array, None]:
    """Same contract as ``rlvr_jax.model.forward`` without a KV cache (``cache`` must be None)."""
    del config
    if cache is not None:
      raise NotImplementedError("NNXAdapter has no KV cache; pass cache=None")
    if tokens.ndim != 2 or positions.shape != tokens.shape:
      raise ValueError(f"tokens {tokens.shape} and positions {positions.shape} must both be [B, S]")
    module = self.merge(params)
    out = self._call(module, tokens, positions)
    if return_logits:
      out = self._logits(module, out)
    return out, None

  def _logits(self, module, out):
    if self._unembed is None:
      return out.astype(jnp.float32)
    w = self._unembed(module)
    return jnp.einsum("...d,dv->...v", out, w.astype(out.dtype), preferred_element_type=jnp.float32)

  def unembed_matrix(self, params, config: Any = None) -> jax.Array:
    """The [D, V] unembedding (requires ``unembed``)."""
    if self._unembed is None:
      raise ValueError("this NNXAdapter was built without `unembed`: its outputs are logits")
    return self._unembed(self.merge(params))

  def logits_from_hidden(self, params, hidden: jax.Array, config: Any = None) -> jax.Array:
    """Logits float32 from the outputs of ``forward(..., return_logits=False)``."""
    return self._logits(self.merge(params) if self._unembed else None, hidden)
