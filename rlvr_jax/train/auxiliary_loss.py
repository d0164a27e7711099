"""An auxiliary loss added to the policy loss in the train step: ``config.auxiliary_loss``.

Config section::

  name     '' (off) or a name in ``losses.AUXILIARY_LOSSES`` (e.g. the last-token self-reward of
           arXiv 2510.14943: an MSE between β_v (log π(z_c | x, y) − c_ref) and the verifier
           reward, read at the state after each completion's last token)
  token    text of the pre-specified token z_c for specs that take one (``takes_token``):
           encoded by the tokenizer, it must be exactly one token
  kwargs   the spec's keyword settings (``coef``, ``beta``, ``ref_logp`` for the self-reward)

The loss runs on the same forward pass as the policy loss, in every micro-batch, normalised by
the step batch's global number of sequences (so it does not depend on the micro-batch split).
Its per-row inputs (``AuxiliarySpec.reads``: the training rewards) come with the minibatch
(``TrainBatch.aux``); its metrics go to the step metrics. What it computes is read from the spec:
this module names no method.
"""

from __future__ import annotations

from ml_collections import ConfigDict, config_dict

from rlvr_jax import losses


def auxiliary_loss_section() -> ConfigDict:
  kwargs = {}
  for spec in losses.AUXILIARY_LOSSES.values():
    for k, v in spec.hyperparameters().items():
      kwargs.setdefault(
        k, config_dict.placeholder(float if isinstance(v, int | float) else type(v))
      )
  return ConfigDict(dict(name="", token="", kwargs=ConfigDict(kwargs)))


def validate_auxiliary_loss(c, error) -> None:
  """Raises ``error(field, message)`` for a bad ``config.auxiliary_loss``."""
  a = c.auxiliary_loss
  if not a.name:
    return
  if a.name not in losses.AUXILIARY_LOSSES:
    raise error("auxiliary_loss.name", f"{a.name!r} not in {sorted(losses.AUXILIARY_LOSSES)}")
  spec = losses.AUXILIARY_LOSSES[a.name]
  if spec.takes_token and not a.token:
    raise error("auxiliary_loss.token", f"{a.name!r} reads a pre-specified token: set its text")
  known = spec.hyperparameters()
  unknown = sorted(k for k, v in a.kwargs.items() if v is not None and k not in known)
  if unknown:
    raise error(
      "auxiliary_loss.kwargs", f"{unknown} are not settings of {a.name!r}: {sorted(known)}"
    )


def step_arguments(c, tokenizer) -> dict:
  """``make_train_step`` keywords: ``auxiliary`` (the spec or None) and ``auxiliary_kwargs``
  (with ``token_id``, the one id of ``auxiliary_loss.token``, for specs that take a token)."""
  a = c.auxiliary_loss
  if not a.name:
    return {}
  spec = losses.AUXILIARY_LOSSES[a.name]
  kwargs = {k: v for k, v in a.kwargs.items() if v is not None and k in spec.hyperparameters()}
  if spec.takes_token:
    ids = list(tokenizer.encode(a.token, add_special_tokens=False))
    if len(ids) != 1:
      raise ValueError(
        f"config.auxiliary_loss.token={a.token!r} is {len(ids)} tokens ({ids}); it must be one"
      )
    kwargs["token_id"] = int(ids[0])
  return {"auxiliary": spec, "auxiliary_kwargs": kwargs}


def row_inputs(spec, rewards) -> dict | None:
  """The per-row arrays ``spec.reads`` for one minibatch's rows (``TrainBatch.aux``)."""
  if spec is None:
    return None
  available = {"rewards": rewards}
  return {k: available[k] for k in spec.reads}
