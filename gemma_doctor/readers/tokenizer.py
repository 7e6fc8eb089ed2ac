"""What tokenizer_config.json says about special tokens and the chat template, as a frozen fact.

Reads tokenizer_config.json (bounded strict JSON through the ModelSource), never tokenizer.json, which is 33 MB for
Gemma 3: the added tokens and their ids are in ``added_tokens_decoder``, which is all the rules need. The chat
template is where transformers put it: in tokenizer_config.json, or, since transformers writes it apart (every
``save_pretrained`` of 5.x, and Gemma 4's published repos), in ``chat_template.jinja`` (or a processor's
``chat_template.json``) beside it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping  # isinstance in C (typing.Mapping's checks through Python per call)
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gemma_doctor.source import ModelSource

FILE = "tokenizer_config.json"
# Where a template saved apart from tokenizer_config.json lives: raw Jinja, or {"chat_template": ...}.
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
# The chat template writes the BOS token itself: "{{ bos_token }}" (Gemma 2/3/3n templates) or a literal "<bos>".
_EMITS_BOS = re.compile(r"\{\{-?\s*bos_token\s*-?\}\}|<bos>")
# transformers' return_assistant_tokens_mask marks only text inside {% generation %} ... {% endgeneration %}.
_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


@dataclass(frozen=True)
class TokenizerFacts:
    """Special tokens, added-token ids and the chat template's BOS habit; ``error`` when the file is unusable."""

    exists: bool
    error: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    add_bos_token: bool | None = None
    has_chat_template: bool = False
    template_emits_bos: bool = False
    # The chat template marks assistant text with {% generation %} (what assistant-only loss masks need).
    template_has_generation: bool = False
    # Added-token content -> id (``added_tokens_decoder``), e.g. {"<end_of_turn>": 106, "<pad>": 0}.
    added: Mapping[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when tokenizer_config.json was read."""
        return self.exists and self.error is None

    def id_of(self, token: str | None) -> int | None:
        """The id of an added (special) token, when tokenizer_config.json lists it."""
        return self.added.get(token) if token is not None else None

    @property
    def max_added_id(self) -> int | None:
        """The largest id of an added token: the tokenizer produces ids up to here."""
        return max(self.added.values(), default=None)


def _token(value: Any) -> str | None:
    """A special token as written: "<eos>" or {"content": "<eos>", ...} (AddedToken serialised)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _template_text(value: Any) -> str:
    """The chat template(s): one string, or a list of {"name", "template"} (named templates)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(t["template"] for t in value if isinstance(t, Mapping) and isinstance(t.get("template"), str))
    return ""


def parse(data: Mapping[str, Any], template_apart: str = "") -> TokenizerFacts:
    """The facts of a parsed tokenizer_config.json (``template_apart``: the template saved beside it, used when the
    file itself has none)."""
    added: dict[str, int] = {}
    decoder = data.get("added_tokens_decoder")
    if isinstance(decoder, Mapping):
        for key, entry in decoder.items():
            content = _token(entry)
            if content is not None and isinstance(key, str) and key.isascii() and key.isdigit() and len(key) < 12:
                added.setdefault(content, int(key))
    template = _template_text(data.get("chat_template")) or template_apart
    add_bos = data.get("add_bos_token")
    return TokenizerFacts(exists=True, bos_token=_token(data.get("bos_token")), eos_token=_token(data.get("eos_token")),
                          pad_token=_token(data.get("pad_token")),
                          add_bos_token=add_bos if isinstance(add_bos, bool) else None,
                          has_chat_template=bool(template), template_emits_bos=bool(_EMITS_BOS.search(template)),
                          template_has_generation=bool(_GENERATION.search(template)),
                          added=added)


def read(source: ModelSource) -> TokenizerFacts:
    """tokenizer_config.json of a model, read through its source; a missing or bad file is a fact, never a raise."""
    jf = source.read_json(FILE)
    if not jf.exists:
        return TokenizerFacts(exists=False)
    if not jf.ok:
        return TokenizerFacts(exists=True, error=jf.error or "unreadable")
    if not isinstance(jf.data, Mapping):
        return TokenizerFacts(exists=True, error="not a JSON object")
    if _template_text(jf.data.get("chat_template")):
        return parse(jf.data)
    return parse(jf.data, _template_apart(source))


def _template_apart(source: ModelSource) -> str:
    """The chat template saved beside tokenizer_config.json, or "". Read through ``read_json`` for its confinement
    (a link out of the repo folder is refused unread) and its size bound; a .jinja file is not JSON, and the bytes
    read are kept either way."""
    for name in TEMPLATE_FILES:
        if not source.has(name):
            continue
        jf = source.read_json(name)
        if name.endswith(".json"):
            return _template_text(jf.data.get("chat_template")) if jf.ok and isinstance(jf.data, Mapping) else ""
        if jf.raw is not None:
            return jf.raw.decode("utf-8", "replace")
        return ""
    return ""
