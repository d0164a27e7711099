"""Prompt data: built-in procedural tasks, local JSONL/parquet files, chat formatting.

``build_sources(config.data)`` gives the train stream (a ``PromptSource`` with a resumable
position) and the held-out records; ``format_prompts`` applies chat templates; ``encode_prompts``
left-pads token ids into a bucketed width; ``CharTokenizer`` serves the tiny character-level tasks.
"""

from rlvr_jax.data.char_tokenizer import CharTokenizer
from rlvr_jax.data.files import DataError, load_records, template_fields
from rlvr_jax.data.source import (
  PromptSource,
  build_sources,
  encode_prompts,
  format_prompts,
  task_spec,
)
from rlvr_jax.data.tasks import TaskSpec, heldout_set, make_example, split_of

__all__ = [
  "CharTokenizer",
  "DataError",
  "PromptSource",
  "TaskSpec",
  "build_sources",
  "encode_prompts",
  "format_prompts",
  "heldout_set",
  "load_records",
  "make_example",
  "split_of",
  "task_spec",
  "template_fields",
]
