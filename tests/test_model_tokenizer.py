"""Tokenizer wrapper on a tiny local word-level tokenizer: left padding, masks, decode, chat."""

import numpy as np
import pytest

from rlvr_jax.model import Tokenizer
from rlvr_jax.model.tokenizer import positions_from_mask

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

VOCAB = ["<pad>", "<eos>", "<s>", "hello", "world", "a", "b", "c", "user:", "bot:"]
TEMPLATE = (
  "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + ' <eos> ' }}{% endfor %}"
  "{% if add_generation_prompt %}{{ 'bot:' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  model = tokenizers.models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<pad>")
  raw = tokenizers.Tokenizer(model)
  raw.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  raw.decoder = tokenizers.decoders.WordPiece(prefix="##")  # joins words with spaces
  hf = transformers.PreTrainedTokenizerFast(
    tokenizer_object=raw, pad_token="<pad>", eos_token="<eos>", bos_token="<s>"
  )
  hf.chat_template = TEMPLATE
  folder = tmp_path_factory.mktemp("tok")
  hf.save_pretrained(folder)
  return Tokenizer.from_pretrained(folder)


def test_special_ids(tok):
  assert tok.pad_id == 0 and tok.eos_ids == (1,)


def test_encode_batch_left_pads(tok):
  ids, mask = tok.encode_batch(["hello world a", "b", ""])
  np.testing.assert_array_equal(ids, [[3, 4, 5], [0, 0, 6], [0, 0, 0]])
  np.testing.assert_array_equal(mask, [[1, 1, 1], [0, 0, 1], [0, 0, 0]])
  assert ids.dtype == np.int32 and mask.dtype == bool
  np.testing.assert_array_equal(positions_from_mask(mask), [[0, 1, 2], [-1, -1, 0], [-1, -1, -1]])
  ids, mask = tok.encode_batch(["hello world a b", "c"], max_length=2)  # keeps the last tokens
  np.testing.assert_array_equal(ids, [[5, 6], [0, 7]])
  with pytest.raises(TypeError, match="list of strings"):
    tok.encode_batch("hello")


def test_decode_batch_uses_mask(tok):
  ids = np.array([[3, 4, 1, 0], [5, 5, 5, 5]])
  mask = np.array([[1, 1, 1, 0], [1, 0, 1, 0]], bool)
  assert tok.decode_batch(ids, mask) == ["hello world", "a a"]
  assert tok.decode_batch(ids, mask, skip_special_tokens=False)[0] == "hello world <eos>"
  with pytest.raises(ValueError, match=r"ids \(2, 4\) and mask \(2, 3\)"):
    tok.decode_batch(ids, mask[:, :3])


def test_chat_template(tok):
  conv = [{"role": "user", "content": "hello"}]
  assert tok.apply_chat_template(conv) == "user: hello <eos> bot:"
  assert tok.apply_chat_template(conv, add_generation_prompt=False) == "user: hello <eos> "
  both = tok.apply_chat_template([conv, [{"role": "user", "content": "a b"}]])
  assert both == ["user: hello <eos> bot:", "user: a b <eos> bot:"]
