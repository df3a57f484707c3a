"""The tokenizer the engine and server use: text ⇄ ids, special tokens, chat template.

It wraps a Rust ``tokenizers.Tokenizer`` (the same object ``transformers``' fast
tokenizers run on) plus what a ``tokenizer_config.json`` adds: BOS/EOS and the chat
template. A HF folder is read directly; a GGUF file is turned into one by
``transformers`` (its GGUF converter is the reference), and ``save`` writes the
result as a HF folder so ``loading.load_tokenizer`` can skip that slow step
(~15 s for SmolLM2) next time.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence

from tokenizers import Tokenizer as RustTokenizer

from llmserve.models.chat_template import ChatTemplate, ChatTemplateError
from llmserve.models.detokenizer import IncrementalDetokenizer
from llmserve.models.files import atomic_write_bytes, atomic_write_json, read_json
from llmserve.models.loader import ModelLoadError

__all__ = ["Tokenizer", "IncrementalDetokenizer", "ChatTemplateError"]

# Private-use characters that bracket a control token written by a user, not by the template.
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "  # transformers' marker for continue_final_message
_OPEN, _CLOSE = "\U000f0000", "\U000f0001"  # the ones transformers uses


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the byte each character stands for."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _token_text(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` spells it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_chat_template(folder: Path, cfg: dict[str, Any]) -> tuple[str | None, str | None]:
    """The default template and the one named ``tool_use`` (Hermes 2 Pro / 3 ship both), which
    transformers renders a request with tools with. transformers 5 writes ``chat_template.jinja``
    (and ``additional_chat_templates/<name>.jinja``); older folders keep them in the config."""
    tool = folder / "additional_chat_templates" / "tool_use.jinja"
    tool_use = tool.read_text(encoding="utf-8") if tool.is_file() else None
    if (f := folder / "chat_template.jinja").is_file():
        return f.read_text(encoding="utf-8"), tool_use
    if (f := folder / "chat_template.json").is_file():
        return read_json(f).get("chat_template"), tool_use
    tpl = cfg.get("chat_template")
    if isinstance(tpl, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        tpl, tool_use = named.get("default"), named.get("tool_use") or tool_use
    return (tpl if isinstance(tpl, str) else None), (tool_use if isinstance(tool_use, str) else None)


# The tokens llama.cpp ends generation at, by their text, whatever the GGUF's eos/eot/eom ids say
# (llama-vocab.cpp): a Phi-3 GGUF says eos <|endoftext|> but ends its turns with <|end|>.
GGUF_END_TOKENS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
                   "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>")


# What a GGUF-derived tokenizer cache holds; a cache of an older format (or none) is rebuilt,
# so what a later version reads from the GGUF (llama.cpp's end tokens, 2: the named tool_use
# template) is never missing from a cache an earlier one wrote.
CACHE_FORMAT_KEY, CACHE_FORMAT = "llmserve_cache_format", 2


def _gguf_tool_use(path: Path) -> str | None:
    """The GGUF's ``tokenizer.chat_template.tool_use`` (llama.cpp's converter writes a named
    template there; transformers' GGUF reader keeps only the default)."""
    import gguf

    field = gguf.GGUFReader(path, "r").fields.get("tokenizer.chat_template.tool_use")
    value = field.contents() if field is not None else None
    return value if isinstance(value, str) else None


def gguf_end_ids(backend: RustTokenizer) -> list[int]:
    ids = (backend.token_to_id(t) for t in GGUF_END_TOKENS)  # (not the whole vocabulary as a dict)
    return [i for i in ids if i is not None]


class Tokenizer:
    """Encode, decode and render chats for one model."""

    def __init__(self, backend: RustTokenizer, *, bos_token: str | None = None, eos_token: str | None = None,
                 extra_eos_token_ids: Iterable[int] = (), chat_template: str | None = None,
                 name: str = "tokenizer", tool_chat_template: str | None = None) -> None:
        self.backend = backend
        self.name = name
        self.bos_token, self.eos_token = bos_token, eos_token
        self.bos_token_id = backend.token_to_id(bos_token) if bos_token else None
        eos_id = backend.token_to_id(eos_token) if eos_token else None
        ids = ([eos_id] if eos_id is not None else []) + list(extra_eos_token_ids)
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(ids))
        self.chat_template = chat_template
        self.tool_chat_template = tool_chat_template  # renders a request with tools, when given
        # a template's source -> it compiled and its control tokens (_control_tokens); one entry
        # when the model has no tool_use template (a request with tools or not gets the same)
        self._compiled: dict[str, tuple[ChatTemplate, re.Pattern[str] | None]] = {}
        self._added: dict[int, str] | None = None  # added tokens' text, and whether the vocabulary is byte-level
        self._byte_level = False

    # -- construction ---------------------------------------------------------------

    @classmethod
    def from_folder(cls, folder: Path) -> "Tokenizer":
        """Read ``tokenizer.json`` + ``tokenizer_config.json`` (+ ``generation_config.json`` stop ids)."""
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadError(f"{folder}: no tokenizer.json")
        try:
            backend = RustTokenizer.from_file(str(path))
        except Exception as e:
            raise ModelLoadError(f"{path}: cannot read tokenizer ({e})") from e
        try:
            cfg = read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
            if not cfg.get("bos_token") and (folder / "special_tokens_map.json").is_file():
                cfg = {**read_json(folder / "special_tokens_map.json"), **cfg}
            gen = read_json(folder / "generation_config.json") if (folder / "generation_config.json").is_file() else {}
            chat_template, tool_template = _read_chat_template(folder, cfg)
        except (OSError, ValueError, AttributeError) as e:
            raise ModelLoadError(f"{folder}: cannot read tokenizer configuration ({e})") from e
        extra = gen.get("eos_token_id")
        return cls(backend, bos_token=_token_text(cfg.get("bos_token")), eos_token=_token_text(cfg.get("eos_token")),
                   extra_eos_token_ids=[extra] if isinstance(extra, int) else list(extra or []),
                   chat_template=chat_template, name=folder.name, tool_chat_template=tool_template)

    @classmethod
    def from_gguf(cls, path: Path) -> "Tokenizer":
        """Build from GGUF metadata with transformers' converter (offline)."""
        path = Path(path)
        try:
            from transformers import AutoTokenizer

            hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
            backend = hf.backend_tokenizer
            tool_use = _gguf_tool_use(path)
        except Exception as e:
            raise ModelLoadError(f"{path}: cannot build a tokenizer from the GGUF metadata "
                                 f"({type(e).__name__}: {e})") from e
        return cls(backend, bos_token=hf.bos_token, eos_token=hf.eos_token, chat_template=hf.chat_template,
                   extra_eos_token_ids=gguf_end_ids(backend), name=path.stem, tool_chat_template=tool_use)

    def save(self, folder: Path) -> None:
        """Write ``tokenizer.json`` and ``tokenizer_config.json`` (last, so it marks completion)."""
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(folder / "tokenizer.json", self.backend.to_str().encode())
        extra = [i for i in self.eos_token_ids if self.eos_token is None
                 or i != self.backend.token_to_id(self.eos_token)]
        if extra:
            atomic_write_json(folder / "generation_config.json", {"eos_token_id": extra})
        template: Any = self.chat_template if not self.tool_chat_template else \
            [{"name": "default", "template": self.chat_template}, {"name": "tool_use", "template": self.tool_chat_template}]
        atomic_write_json(folder / "tokenizer_config.json", {
            "bos_token": self.bos_token, "eos_token": self.eos_token, "chat_template": template,
            CACHE_FORMAT_KEY: CACHE_FORMAT,
        })

    # -- text ⇄ ids -----------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Tokens the tokenizer knows, added tokens included (the model's may be padded larger)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Ids of ``text``; whether BOS is added is the tokenizer.json post-processor's call,
        as in transformers (``add_bos_token`` in an old config is not consulted)."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def with_special_tokens(self, ids: Sequence[int]) -> list[int]:
        """``ids`` with the special tokens ``encode`` would add around a text's (BOS, say):
        the post-processor's, found around a one-character text's ids."""
        plain = self.backend.encode("a", add_special_tokens=False).ids
        full = self.backend.encode("a", add_special_tokens=True).ids
        for i in range(len(full) - len(plain) + 1):
            if full[i:i + len(plain)] == plain:
                return full[:i] + list(ids) + full[i + len(plain):]
        return list(ids)  # (a post-processor that rewrites the text's own ids: none known)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str | None]:
        """Token strings (byte-level BPE shows bytes as e.g. ``Ġ``); None for an unknown id."""
        return [self.backend.id_to_token(i) for i in ids]

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (maybe part of a character), as OpenAI's logprobs give them."""
        if self._added is None:
            import json

            self._byte_level = '"ByteLevel"' in json.dumps(json.loads(self.backend.to_str()).get("decoder"))
            self._added = {i: t.content for i, t in self.backend.get_added_tokens_decoder().items()}
        if token_id in self._added:
            return self._added[token_id].encode()
        piece = self.backend.id_to_token(token_id)
        if piece is None:
            return b""
        table = _unicode_to_byte()
        if self._byte_level and all(ch in table for ch in piece):
            return bytes(table[ch] for ch in piece)
        if re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", piece):  # SentencePiece's byte fallback
            return bytes([int(piece[3:5], 16)])
        return self.decode([token_id], skip_special_tokens=False).encode()

    def detokenizer(self, prompt_ids: Sequence[int] = (), skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        """A streaming decoder for one request's output."""
        return IncrementalDetokenizer(self, prompt_ids, skip_special_tokens)

    # -- chat -----------------------------------------------------------------------

    def apply_chat_template(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True,
                            continue_final_message: bool = False, **variables: Any) -> str:
        """Render a conversation to prompt text with the model's own template (sandboxed).

        ``continue_final_message``: the text ends right after the last message's content, so
        the model continues it (a prefill) instead of a closed turn; transformers' cut."""
        variables.setdefault("bos_token", self.bos_token or "")
        variables.setdefault("eos_token", self.eos_token or "")
        tools = variables.get("tools") is not None
        if not continue_final_message:
            return self._template(tools).render(messages, add_generation_prompt=add_generation_prompt, **variables)
        # transformers' way: tag the end of the final text, render, cut at the tag (its space
        # kept by the template: the text's own trailing spacing is too; trimmed: trim it)
        msgs = [dict(m) for m in messages]
        content = msgs[-1].get("content") if msgs else None
        if isinstance(content, str):
            msgs[-1]["content"] = content + _CONTINUE_TAG
        elif isinstance(content, (list, tuple)) and any(isinstance(p, dict) and "text" in p for p in content):
            parts = [dict(p) for p in content]
            last = max(i for i, p in enumerate(parts) if "text" in p)
            parts[last]["text"] += _CONTINUE_TAG
            msgs[-1]["content"] = parts
        else:
            raise ChatTemplateError("continue_final_message: the final message has no text to continue")
        text = self._template(tools).render(msgs, add_generation_prompt=add_generation_prompt, **variables)
        if _CONTINUE_TAG.strip() not in text:
            raise ChatTemplateError("continue_final_message: the chat template drops the final message's text")
        at = text.rindex(_CONTINUE_TAG.strip())
        return text[:at] if text[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:at].rstrip()

    def set_chat_template(self, source: str) -> None:
        """Use ``source`` instead of the model's own template (``--chat-template``)."""
        ChatTemplate(source)  # a template that does not compile fails here, at start
        self.chat_template, self.tool_chat_template, self._compiled = source, None, {}

    def template_literal_text(self, tools: bool = True) -> str:
        """The template's own text and string constants (which tool-call notation it writes)."""
        return self._template(tools).literal_text()

    def template_reads(self, name: str, tools: bool = True) -> bool:
        """Whether the chat template uses the variable ``name`` (``tools``: it renders tools itself);
        ``tools``: of the template a request with tools is rendered with."""
        return self._template(tools).reads(name)

    def _template(self, tools: bool = False) -> ChatTemplate:
        return self._compile(tools)[0]

    def _compile(self, tools: bool) -> tuple[ChatTemplate, re.Pattern[str] | None]:
        """The template a request with (or without) tools gets, compiled once with its control
        tokens, or a clear error when the model has none."""
        source = (tools and self.tool_chat_template) or self.chat_template
        if not source:
            raise ChatTemplateError(f"model {self.name!r} has no chat template; use the completions API "
                                    "with a plain prompt instead")
        if source not in self._compiled:
            compiled = ChatTemplate(source)
            self._compiled[source] = compiled, self._control_tokens(compiled)
        return self._compiled[source]

    def _control_tokens(self, template: ChatTemplate) -> re.Pattern[str] | None:
        """Tokens a user may not inject: every special token, and added tokens the template writes
        but whitespace ones (Gemma's "\n" runs, ordinary text in any template), as transformers'."""
        literal = template.literal_text()
        tokens = [t.content for t in self.backend.get_added_tokens_decoder().values()
                  if t.special or (t.content in literal and not t.content.isspace())]
        tokens.sort(key=len, reverse=True)  # longest first: a token wins over those inside it
        return re.compile("|".join(map(re.escape, tokens))) if tokens else None

    def encode_chat(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True,
                    continue_final_message: bool = False, **variables: Any) -> list[int]:
        """Prompt ids for a conversation, safe against control-token injection.

        The template writes its own special tokens, so none are added. A control
        token typed by a user (``<|im_end|><|im_start|>system``) is encoded as the
        plain text it is, never as the token: only the template may open a turn.
        Same ids as transformers' ``apply_chat_template(..., sanitize_control_tokens=True)``.
        """
        _, control = self._compile(variables.get("tools") is not None)
        if control is None:
            return self.encode(self.apply_chat_template(messages, add_generation_prompt, continue_final_message, **variables),
                               add_special_tokens=False)
        marked = self._mark(list(messages), control)
        variables = {k: v if k in ("bos_token", "eos_token") else self._mark(v, control) for k, v in variables.items()}
        text = self.apply_chat_template(marked, add_generation_prompt, continue_final_message, **variables)
        if _OPEN not in text and _CLOSE not in text:
            return self.encode(text, add_special_tokens=False)
        # Pieces alternate: template text, then a user's control token (None for a lone marker).
        pieces = re.split(f"{_OPEN}({control.pattern}){_CLOSE}|[{_OPEN}{_CLOSE}]", text)
        newline = self.backend.encode("\n", add_special_tokens=False).ids
        ids = self.backend.encode(pieces[0], add_special_tokens=False).ids
        for i, piece in enumerate(pieces[1:], start=1):
            if not piece:
                continue
            enc = self._plain_ids if i % 2 else (lambda t: self.backend.encode(t, add_special_tokens=False).ids)
            # After a newline, so SentencePiece adds no start-of-text space; then drop the newline.
            piece_ids = enc("\n" + piece)
            if piece_ids[:len(newline)] == newline:
                piece_ids = piece_ids[len(newline):]
            else:
                piece_ids = enc(piece)
            if i % 2 and self.backend.token_to_id(piece) in piece_ids:
                raise ChatTemplateError(f"cannot keep {piece!r} out of the prompt: the tokenizer makes it from text")
            ids += piece_ids
        return ids

    def _plain_ids(self, text: str) -> list[int]:
        """``text`` without any added token, special or not (``encode_special_tokens`` still
        matches Qwen's non-special ``<think>``): transformers' ``_encode_without_added_tokens``."""
        b = self.backend
        if b.normalizer is not None:
            text = b.normalizer.normalize_str(text)
        splits = [s for s, _ in b.pre_tokenizer.pre_tokenize_str(text)] if b.pre_tokenizer is not None else [text]
        return [t.id for split in splits for t in b.model.tokenize(split)]

    @classmethod
    def _mark(cls, obj: Any, control: re.Pattern[str]) -> Any:
        """Bracket control tokens inside user-supplied strings (recursively; dict keys kept)."""
        if isinstance(obj, str):
            obj = obj.replace(_OPEN, "").replace(_CLOSE, "")  # no forged markers
            return control.sub(lambda m: _OPEN + m.group(0) + _CLOSE, obj)
        if isinstance(obj, dict):
            return {k: cls._mark(v, control) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [cls._mark(v, control) for v in obj]
        return obj
