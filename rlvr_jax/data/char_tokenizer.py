"""A character-level tokenizer for the tiny built-in tasks (arithmetic, countdown).

It has the same surface as ``rlvr_jax.model.Tokenizer`` that the trainer uses (``encode_batch``
returning left-padded ids and a mask, ``decode_batch``, ``apply_chat_template``, ``pad_id``,
``eos_ids``, ``vocab_size``), so a from-scratch model on a tiny vocabulary and a pretrained model
with a BPE tokenizer go through the same loop.
"""

from __future__ import annotations

import numpy as np

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
DEFAULT_ALPHABET = "0123456789+-*/=()., :?abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


class CharTokenizer:
  """One id per character; ids 0, 1, 2 are pad, bos, eos.

  Args:
    alphabet: the characters the tokenizer knows, in id order after the 3 special tokens.
  """

  def __init__(self, alphabet: str = DEFAULT_ALPHABET):
    if len(set(alphabet)) != len(alphabet):
      raise ValueError(f"CharTokenizer alphabet has repeated characters: {alphabet!r}")
    self.alphabet = alphabet
    self._to_id = {c: i + 3 for i, c in enumerate(alphabet)}
    self.pad_id, self.bos_id, self.eos_id = 0, 1, 2
    self.eos_ids = (self.eos_id,)
    self.vocab_size = len(alphabet) + 3

  def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
    """Ids of ``text`` (with a leading BOS when ``add_special_tokens``)."""
    try:
      ids = [self._to_id[c] for c in text]
    except KeyError as e:
      raise ValueError(
        f"CharTokenizer: character {e.args[0]!r} in {text!r} is not in the alphabet "
        f"{self.alphabet!r}"
      ) from None
    return [self.bos_id, *ids] if add_special_tokens else ids

  def encode_batch(self, texts, *, add_special_tokens: bool = True, pad_to: int | None = None):
    """Left-padded ids [B, S] int32 and mask [B, S] bool (S = longest, or ``pad_to``)."""
    rows = [self.encode(t, add_special_tokens=add_special_tokens) for t in texts]
    width = max(len(r) for r in rows) if pad_to is None else pad_to
    if any(len(r) > width for r in rows):
      raise ValueError(f"CharTokenizer: a text is longer than pad_to={pad_to}")
    ids = np.full((len(rows), width), self.pad_id, np.int32)
    mask = np.zeros((len(rows), width), bool)
    for i, r in enumerate(rows):
      if r:
        ids[i, width - len(r) :] = r
        mask[i, width - len(r) :] = True
    return ids, mask

  def decode(self, ids, *, skip_special_tokens: bool = True) -> str:
    out = []
    for i in ids:
      i = int(i)
      if i < 3:
        if not skip_special_tokens:
          out.append((PAD, BOS, EOS)[i])
        continue
      out.append(self.alphabet[i - 3])
    return "".join(out)

  def decode_batch(self, ids, mask=None) -> list[str]:
    """Decode each row of ids [B, T], keeping only positions where ``mask`` is True."""
    ids = np.asarray(ids)
    mask = np.ones(ids.shape, bool) if mask is None else np.asarray(mask, bool)
    return [self.decode(row[m]) for row, m in zip(ids, mask, strict=True)]

  def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
    """No chat format for character models: the user turns' text, concatenated."""
    del add_generation_prompt
    if messages and isinstance(messages[0], list):
      return [self.apply_chat_template(m) for m in messages]
    return "".join(m["content"] for m in messages if m["role"] == "user")
