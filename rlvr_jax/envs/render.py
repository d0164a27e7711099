"""Observation rendering: environment text -> the token ids appended after the policy's action.

The token stream is continued, never re-tokenised (re-tokenising the history changes token
boundaries and breaks the sampler / trainer log-prob parity). A renderer only produces the ids of
the new piece: the observation turn and, for chat models, the header of the next assistant turn.

  * :class:`ChatRenderer` (instruct models): the piece is what the tokenizer's chat template adds
    after the assistant message when a user (or tool) message and the generation prompt follow:
    ``template(history + [assistant, obs], add_generation_prompt=True)`` minus
    ``template(history + [assistant])`` up to the end of the assistant's text. If the action ended
    with the end-of-turn token (the sampler's stop token), that token is already in the stream and
    is not repeated; if the action was cut without it, the template's end-of-turn text comes first.
  * :class:`PlainRenderer` (character models, no chat format): ``template.format(obs=...)``,
    ``"\\n{obs}\\n"`` by default; characters the tokenizer does not know become ``replacement``
    (white space, e.g. the newlines of the default template, becomes a space if the tokenizer knows
    one: the built-in character alphabet has no newline).
"""

from __future__ import annotations

from collections.abc import Sequence

_ASSISTANT_TEXT = "ASSISTANT_TEXT_7f3a"  # stands for the action: found once in the rendered text


class ChatRenderer:
  """Renders observations as chat turns with the tokenizer's chat template.

  Args:
    tokenizer: ``rlvr_jax.model.Tokenizer`` (or anything with ``apply_chat_template``, ``encode``
      and ``eos_ids``).
    prompt_messages: the conversation before the first action (default: one user message); only
      its presence matters for templates that treat the first turn specially.
    tool_role: role used for observations marked ``role="tool"`` by the environment.
  """

  def __init__(self, tokenizer, *, prompt_messages: Sequence[dict] | None = None, tool_role="tool"):
    self.tokenizer = tokenizer
    self.prompt_messages = list(prompt_messages or [{"role": "user", "content": "question"}])
    self.tool_role = tool_role
    base = self._template([{"role": "assistant", "content": _ASSISTANT_TEXT}], False)
    if base.count(_ASSISTANT_TEXT) != 1:
      raise ValueError("chat template does not render the assistant message verbatim")
    self._content_end = base.index(_ASSISTANT_TEXT) + len(_ASSISTANT_TEXT)
    self._prefix = base[: self._content_end]
    # The template's end-of-turn text after the assistant content, e.g. "<|im_end|>\n".
    self._end_of_turn = base[self._content_end :]

  def _template(self, extra: list[dict], add_generation_prompt: bool) -> str:
    return self.tokenizer.apply_chat_template(self.prompt_messages + extra, add_generation_prompt)

  def observation_text(
    self, observation: str, *, role: str = "user", action_ended: bool = True
  ) -> str:
    """The text appended after the action: end of turn (unless emitted), obs turn, next header."""
    role = self.tool_role if role == "tool" else role
    full = self._template(
      [{"role": "assistant", "content": _ASSISTANT_TEXT}, {"role": role, "content": observation}],
      True,
    )
    if not full.startswith(self._prefix):
      raise ValueError(
        "chat template renders earlier turns differently once a message follows them; a token "
        "stream cannot be continued with it (use a template that does not rewrite history)"
      )
    piece = full[self._content_end :]
    if action_ended:
      # The stop token that ended the action is in the stream already: skip its text.
      eos_text = self._eos_text(piece)
      piece = piece[len(eos_text) :]
    return piece

  def _eos_text(self, piece: str) -> str:
    for eos in self.tokenizer.eos_ids:
      text = self.tokenizer.decode([eos], skip_special_tokens=False)
      if text and piece.startswith(text):
        return text
    raise ValueError(
      f"chat template ends the assistant turn with {self._end_of_turn!r}, which does not start "
      f"with an eos token ({self.tokenizer.eos_ids}); pass action_ended=False"
    )

  def prompt_ids(self, observation: str) -> list[int]:
    """Ids of the first prompt: the reset observation as a user turn plus the generation prompt."""
    text = self.tokenizer.apply_chat_template([{"role": "user", "content": observation}], True)
    return list(self.tokenizer.encode(text, add_special_tokens=False))

  def observation_ids(
    self, observation: str, *, role: str = "user", action_ended: bool = True
  ) -> list[int]:
    """Token ids to append after the action (see ``observation_text``)."""
    text = self.observation_text(observation, role=role, action_ended=action_ended)
    return list(self.tokenizer.encode(text, add_special_tokens=False))


class PlainRenderer:
  """Renders observations as plain text for models without a chat format (character models).

  Args:
    tokenizer: anything with ``encode(text, add_special_tokens=False)``; a tokenizer with an
      ``alphabet`` (``CharTokenizer``) gets unknown characters replaced.
    template: format string with ``{obs}``.
    replacement: stands for characters outside the tokenizer's alphabet (white space: a space).
  """

  def __init__(self, tokenizer, *, template: str = "\n{obs}\n", replacement: str = "?"):
    self.tokenizer, self.template, self.replacement = tokenizer, template, replacement
    alphabet = getattr(tokenizer, "alphabet", None)
    self._known = None if alphabet is None else set(alphabet)
    if self._known is not None and replacement not in self._known:
      raise ValueError(f"replacement {replacement!r} is not in the tokenizer's alphabet")

  def observation_text(
    self, observation: str, *, role: str = "user", action_ended: bool = True
  ) -> str:
    del role, action_ended  # no roles and no end-of-turn text in a plain stream
    return self._filter(self.template.format(obs=observation))

  def _filter(self, text: str) -> str:
    if self._known is None:
      return text
    space = " " if " " in self._known else self.replacement
    return "".join(
      c if c in self._known else (space if c.isspace() else self.replacement) for c in text
    )

  def prompt_ids(self, observation: str) -> list[int]:
    """Ids of the first prompt: the reset observation (with the tokenizer's BOS, if any)."""
    return list(self.tokenizer.encode(self._filter(observation)))

  def observation_ids(
    self, observation: str, *, role: str = "user", action_ended: bool = True
  ) -> list[int]:
    text = self.observation_text(observation, role=role, action_ended=action_ended)
    return list(self.tokenizer.encode(text, add_special_tokens=False))
