"""Incremental chat templating: the token ids the agent loop appends between model turns.

The loop never re-tokenizes what the model sampled. Between two model turns it appends the tokens the chat
template puts there: the glue after the model's end-of-turn token (Qwen: the "\\n" after <|im_end|>), the tool
messages, and the next generation prompt ("<|im_start|>assistant\\n"). They are found by rendering the
conversation with and without the new messages on the same prefix and taking the text suffix:

    before = render(messages)                                  # ends "...</tool_call><|im_end|>\\n"
    after  = render(messages + tool_messages, generation_prompt=True)
    glue   = before[after the last end-of-turn marker:] + after[len(before):]

Strategies, recorded per turn in the episode metrics (`template_mode`):
- "full": `after` starts with `before` for the real conversation (append-only templates such as Qwen2.5,
  Llama 3, Hermes). Then prompt_ids + response_ids == render(final transcript) token for token, provided each
  model turn's ids are the tokenizer's own encoding of its text (the agent loop keeps call blocks written in
  another form than the template's verbatim, and counts the turns where the ids are not; docs/agent-loop.md).
- "minimal_base": the template rewrites earlier turns (e.g. Qwen3 drops past <think> content), so the full
  render is not a prefix. The new messages are rendered after a fixed two-message base conversation instead; the
  ids stay exactly what the model saw, but the final transcript rendered by the template differs from them.
- neither works: `TemplateError` (the template cannot be used for multi-turn RL as is).

The glue text begins right after a special token (the end-of-turn marker) and ends with the generation prompt,
so encoding it separately gives the same ids as encoding the whole conversation (special tokens split the
byte-level BPE pre-tokenization).

Cost. The rollout driver's main thread calls this module several times per model turn, on the core the rollout
engine also needs: a profile of GRPO steps of 304 episodes (~2 model turns each) spent ~1.3 s per step here, about
half in jinja rendering (`apply_chat_template`, which also re-serialises the tool schemas every time) and half in
`tokenizer.encode`. Much of it repeats: the 8 episodes of a GRPO group render and encode the same prompt, and each
render of a turn is made twice (`assistant_text`'s full transcript is the next `_glue`'s `before`; `_glue`'s
`after` is the next `assistant_text`'s `before`). So `ChatTemplate` keeps two bounded LRU memos, exact by
construction:
- renders, keyed by an exact image of the messages taken at call time (`_freeze`: every value with its type, dict
  keys in order, since templates write dicts with `tojson` in insertion order), so mutating a message afterwards
  never returns a stale render; messages holding anything but JSON-like values are rendered without the memo;
- prompt ids, keyed by the prompt's text (a fresh list is returned every time).
The memos assume the tokenizer and the tool list are not changed after construction. A template that reads the
clock or draws random values (`strftime_now`, `random`) is not memoised.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

_BASE = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]

# Key order of a rendered tool schema. The chat template writes each schema with `tojson`, which keeps the dict's
# key order, so the same tool read from two sources (the tool service's /tools, an SFT file written with sorted
# keys) would give the model two different prompts. Known keys come in the conventional order, any other key
# after them in sorted order.
_TOOL_KEYS = ("type", "function")
_FUNCTION_KEYS = ("name", "description", "parameters")
_SCHEMA_KEYS = ("type", "description")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")  # name -> schema
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")  # [schema, ...]
_SCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else")  # schema (or a bool)


def _ordered(d: dict, first: tuple[str, ...]) -> list[str]:
    return [k for k in first if k in d] + sorted(k for k in d if k not in first)


def _canonical_schema(node):
    if not isinstance(node, dict):
        return node
    out = {}
    for k in _ordered(node, _SCHEMA_KEYS):
        v = node[k]
        if k in _SCHEMA_MAPS and isinstance(v, dict):
            v = {name: _canonical_schema(v[name]) for name in sorted(v)}
        elif k in _SCHEMA_LISTS and isinstance(v, list):
            v = [_canonical_schema(x) for x in v]
        elif k in _SCHEMA_ONE:
            v = _canonical_schema(v)
        out[k] = v
    return out


def canonical_tools(tools: list[dict] | None) -> list[dict] | None:
    """The tool list as every path renders it: tools sorted by function name, keys in one fixed order
    (type, function; name, description, parameters; JSON Schema nodes type, description, then sorted; argument
    names sorted). SFT demonstrations and rollouts then see the same prompt tokens for the same set of tools,
    whatever order their source wrote the keys in."""
    if not tools:
        return None

    def one(tool: dict) -> dict:
        out = {}
        for k in _ordered(tool, _TOOL_KEYS):
            v = tool[k]
            if k == "function" and isinstance(v, dict):
                v = {fk: (_canonical_schema(v[fk]) if fk == "parameters" else v[fk])
                     for fk in _ordered(v, _FUNCTION_KEYS)}
            out[k] = v
        return out

    def name(tool: dict) -> str:
        fn = tool.get("function")
        return str(fn.get("name", "")) if isinstance(fn, dict) else str(tool.get("name", ""))

    return [one(t) for t in sorted(tools, key=name)]


# --- memos ---

_MISSING = object()


class _Unfreezable(TypeError):
    pass


def _freeze(value):
    """An exact, hashable image of a JSON-like value: two values get equal images only if they are the same
    types with the same contents in the same order (so 1, 1.0, True, "1" and -0.0 vs 0.0 stay apart, and so do
    {"a": 1, "b": 2} and {"b": 2, "a": 1}). Raises _Unfreezable for anything else (tuples, non-str keys, subclasses,
    objects), whose rendering the memo does not try to predict. Strings are shared, not copied."""
    kind = type(value)
    if kind is str:
        return value
    if kind is dict:
        image = [dict]
        for k, v in value.items():
            if type(k) is not str:
                raise _Unfreezable(k)
            image += (k, _freeze(v))
        return tuple(image)
    if kind is list:
        return (list, *map(_freeze, value))
    if kind is float:
        return (float, repr(value))  # by repr: -0.0 differs from 0.0 and nan equals nan, unlike float equality
    if kind is int or kind is bool or value is None:
        return (kind, value)
    raise _Unfreezable(kind)


class _LRU:
    """A map that keeps its `max_entries` most recently used entries, and at most `max_size` in total size."""

    def __init__(self, max_entries: int, max_size: int):
        self.max_entries, self.max_size = max_entries, max_size
        self._items: OrderedDict = OrderedDict()  # key -> (value, size)
        self._size = 0
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key):
        item = self._items.get(key)
        if item is None:
            self.misses += 1
            return _MISSING
        self.hits += 1
        self._items.move_to_end(key)
        return item[0]

    def put(self, key, value, size: int) -> None:
        if size > self.max_size:
            return
        old = self._items.pop(key, None)
        if old is not None:
            self._size -= old[1]
        self._items[key] = (value, size)
        self._size += size
        while len(self._items) > self.max_entries or self._size > self.max_size:
            self._size -= self._items.popitem(last=False)[1][1]

    def clear(self) -> None:
        self._items.clear()
        self._size = 0


class TemplateError(ValueError):
    """The tokenizer's chat template cannot produce the tokens between turns (not usable for multi-turn RL)."""


@dataclass
class Delta:
    ids: list[int]
    mode: str  # "full" | "minimal_base"


class ChatTemplate:
    """Renders conversations with one tokenizer and one tool list (OpenAI function schemas or None), in the
    canonical order of `canonical_tools`. Renders and prompt ids are memoised (module docstring, "Cost"); one
    instance serves every episode with the same tools."""

    RENDER_MEMO_ENTRIES = 4096  # > 2 renders x episodes in flight, the distance at which a render is reused
    PROMPT_MEMO_ENTRIES = 1024
    MEMO_MAX_CHARS = 1 << 26  # per memo: characters of rendered text, or prompt ids

    def __init__(self, tokenizer, tools: list[dict] | None = None):
        self.tokenizer = tokenizer
        self.tools = canonical_tools(tools)
        self._renders = _LRU(self.RENDER_MEMO_ENTRIES, self.MEMO_MAX_CHARS)
        self._prompts = _LRU(self.PROMPT_MEMO_ENTRIES, self.MEMO_MAX_CHARS)
        source = str(getattr(tokenizer, "chat_template", None))
        self._memoise_renders = "strftime_now" not in source and "random" not in source
        self.end_of_turn = self._find_end_of_turn()
        self.end_of_turn_id = self._single_token_id(self.end_of_turn)

    # --- rendering ---

    def render(self, messages: list[dict], *, add_generation_prompt: bool = False) -> str:
        key = None
        if self._memoise_renders:
            try:
                key = (_freeze(add_generation_prompt), _freeze(messages))
            except _Unfreezable:
                pass
            else:
                text = self._renders.get(key)
                if text is not _MISSING:
                    return text
        text = self.tokenizer.apply_chat_template(messages, tools=self.tools, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)
        if key is not None:
            self._renders.put(key, text, len(text))
        return text

    def encode(self, text: str) -> list[int]:
        # The template text already holds every special token (BOS included when the template writes one).
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        text = self.render(messages, add_generation_prompt=True)
        ids = self._prompts.get(text)
        if ids is _MISSING:
            ids = tuple(self.encode(text))
            self._prompts.put(text, ids, len(ids))
        return list(ids)

    def assistant_text(self, messages: list[dict], message: dict) -> str | None:
        """The text the template writes for the assistant `message` after `messages`: what lies between the
        generation prompt and the end-of-turn marker. None when it cannot be isolated (the template rewrites
        earlier turns when the message is added)."""
        before = self.render(messages, add_generation_prompt=True)
        after = self.render([*messages, message])
        if not after.startswith(before):
            return None
        body = after[len(before):]
        end = body.find(self.end_of_turn)
        return body[:end] if end >= 0 else None

    # --- the tokens between model turns ---

    def delta_ids(self, messages: list[dict], new_messages: list[dict]) -> Delta:
        """Ids to append after an assistant turn that ended with the end-of-turn token.

        `messages` is the transcript so far, ending with that assistant message; `new_messages` (tool results,
        possibly a user message) follow it. The result ends with the next generation prompt.
        """
        glue = self._glue(messages, new_messages)
        if glue is not None:
            return Delta(self.encode(glue), "full")
        glue = self._glue(list(_BASE), new_messages)
        if glue is not None:
            return Delta(self.encode(glue), "minimal_base")
        raise TemplateError(
            "the chat template is not append-only even after a fixed base conversation: rendering "
            f"{[m['role'] for m in new_messages]} after the transcript rewrites earlier text. Use an append-only "
            "template (e.g. Qwen2.5's) or one that keeps past assistant turns unchanged.")

    def _glue(self, messages: list[dict], new_messages: list[dict]) -> str | None:
        before = self.render(messages)
        after = self.render(messages + new_messages, add_generation_prompt=True)
        if not after.startswith(before):
            return None
        end = before.rfind(self.end_of_turn)
        if end < 0:
            return None
        return before[end + len(self.end_of_turn):] + after[len(before):]

    def boundary_problem(self) -> str | None:
        """None when ids built turn by turn (prompt, model turn, glue) equal encoding the whole rendering for a
        probe conversation; else a description. A mismatch (e.g. a SentencePiece tokenizer adding a prefix space
        to the glue) does not misalign masks or logprobs, but the model then sees token sequences it would
        not see in the template's own rendering."""
        user = [{"role": "user", "content": "Hi."}]
        turn = user + [{"role": "assistant", "content": "Hello."}]
        tool = [{"role": "tool", "content": "ok"}]
        pieces = (self.prompt_ids(user) + self.encode("Hello.") + [self.end_of_turn_id]
                  + self.delta_ids(turn, tool).ids)
        whole = self.encode(self.render(turn + tool, add_generation_prompt=True))
        if pieces == whole:
            return None
        return (f"turn-by-turn ids differ from the template's whole rendering: {self.tokenizer.decode(pieces)!r} "
                f"vs {self.tokenizer.decode(whole)!r}")

    # --- template probing ---

    def _find_end_of_turn(self) -> str:
        """The marker the template writes right after an assistant message's content (ChatML: <|im_end|>)."""
        marker = "\x1fAGENTRL\x1f"
        text = self.render([{"role": "user", "content": "Hi."}, {"role": "assistant", "content": marker}])
        tail = text[text.rindex(marker) + len(marker):]
        specials = sorted(set(self.tokenizer.all_special_tokens) | set(self.tokenizer.get_added_vocab()),
                          key=len, reverse=True)
        for token in specials:
            if token and tail.startswith(token):
                return token
        raise TemplateError(
            f"the chat template ends an assistant message with {tail!r}, which does not start with a special "
            "token: the end of a model turn cannot be detected (agentrl needs ChatML-style <|im_end|> or an eos).")

    def _single_token_id(self, token: str) -> int:
        ids = self.tokenizer.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            raise TemplateError(f"end-of-turn marker {token!r} encodes to {len(ids)} tokens, expected 1")
        return ids[0]


__all__ = ["ChatTemplate", "Delta", "TemplateError"]
