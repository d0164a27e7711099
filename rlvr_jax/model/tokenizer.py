"""A thin wrapper over a ``transformers`` fast tokenizer loaded from local files (never the hub).

Batch encoding is left-padded and returns numpy ``(ids [B, S] int32, mask [B, S] bool)``; the
decoder's positions for such a batch are ``positions_from_mask(mask)`` (padding gets -1).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np


def positions_from_mask(mask: np.ndarray) -> np.ndarray:
  """Positions [B, S] int32 for a left-padded mask: 0, 1, ... on real tokens, -1 on padding."""
  mask = np.asarray(mask, bool)
  return np.where(mask, np.cumsum(mask, axis=-1) - 1, -1).astype(np.int32)


class Tokenizer:
  """Chat template, special ids, left-padded batch encode and batch decode.

  Build with ``Tokenizer.from_pretrained(folder)`` (tokenizer.json / tokenizer_config.json),
  ``Tokenizer.from_gguf(file)`` (the tokenizer embedded in a GGUF file), or wrap an existing
  ``transformers`` tokenizer with ``Tokenizer(hf_tokenizer)``.

  Attributes:
    hf: the wrapped ``transformers`` tokenizer.
    pad_id: padding id (the tokenizer's pad token, else its first eos id).
    eos_ids: tuple of ids that end a completion.
  """

  def __init__(self, hf_tokenizer, *, eos_ids: Sequence[int] | None = None):
    self.hf = hf_tokenizer
    if eos_ids is None:
      eos_ids = [] if hf_tokenizer.eos_token_id is None else [hf_tokenizer.eos_token_id]
    self.eos_ids = tuple(int(i) for i in eos_ids)
    pad = hf_tokenizer.pad_token_id
    if pad is None:
      if not self.eos_ids:
        raise ValueError("tokenizer has neither a pad token nor an eos token")
      pad = self.eos_ids[0]
    self.pad_id = int(pad)

  @classmethod
  def from_pretrained(cls, path: str | os.PathLike, **kwargs) -> Tokenizer:
    from transformers import AutoTokenizer

    path = os.fspath(path)
    if not os.path.isdir(path):
      raise FileNotFoundError(f"tokenizer folder {path} does not exist")
    return cls(AutoTokenizer.from_pretrained(path, local_files_only=True, **kwargs))

  @classmethod
  def from_gguf(cls, file: str | os.PathLike) -> Tokenizer:
    """The tokenizer (and chat template) stored in a GGUF file, via transformers' GGUF support."""
    from transformers import AutoTokenizer

    file = os.fspath(file)
    if not os.path.exists(file):
      raise FileNotFoundError(f"no GGUF file at {file}")
    folder, name = os.path.split(os.path.abspath(file))
    hf = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    return cls(hf)

  @property
  def vocab_size(self) -> int:
    return len(self.hf)

  def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
    return list(self.hf(text, add_special_tokens=add_special_tokens)["input_ids"])

  def encode_batch(
    self, texts: Sequence[str], *, add_special_tokens: bool = False, max_length: int | None = None
  ) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded ids [B, S] int32 and mask [B, S] bool (S = longest, or ``max_length``).

    Chat-formatted text already contains its special tokens, hence ``add_special_tokens=False``
    by default. With ``max_length`` longer texts keep their last ``max_length`` tokens.
    """
    if isinstance(texts, str):
      raise TypeError("encode_batch takes a list of strings, got one string")
    texts = list(texts)
    rows = self.hf(texts, add_special_tokens=add_special_tokens)["input_ids"] if texts else []
    if max_length is not None:
      rows = [r[-max_length:] if max_length > 0 else [] for r in rows]
    S = max_length if max_length is not None else max((len(r) for r in rows), default=0)
    ids = np.full((len(rows), S), self.pad_id, np.int32)
    mask = np.zeros((len(rows), S), bool)
    for b, r in enumerate(rows):
      if r:
        ids[b, S - len(r) :] = r
        mask[b, S - len(r) :] = True
    return ids, mask

  def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
    return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

  def decode_batch(
    self, ids: np.ndarray, mask: np.ndarray | None = None, *, skip_special_tokens: bool = True
  ) -> list[str]:
    """Decodes each row of ids [B, T], keeping only tokens where ``mask`` is True."""
    ids = np.asarray(ids)
    if mask is None:
      mask = np.ones(ids.shape, bool)
    mask = np.asarray(mask, bool)
    if ids.shape != mask.shape:
      raise ValueError(f"decode_batch: ids {ids.shape} and mask {mask.shape} differ")
    rows = [row[m].tolist() for row, m in zip(ids, mask, strict=True)]
    return self.hf.batch_decode(rows, skip_special_tokens=skip_special_tokens)

  def apply_chat_template(
    self, messages: list[dict[str, Any]] | list[list[dict[str, Any]]], add_generation_prompt=True
  ) -> str | list[str]:
    """The chat-formatted string of one conversation, or a list of strings for a list of them."""
    if not messages:
      raise ValueError("apply_chat_template: empty message list")
    if isinstance(messages[0], list | tuple):
      return [self.apply_chat_template(list(m), add_generation_prompt) for m in messages]
    if getattr(self.hf, "chat_template", None) is None:
      raise ValueError("this tokenizer has no chat template")
    return self.hf.apply_chat_template(
      messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
