"""A GGUF's tokenizer without torch: llama.cpp's tokenization rebuilt from the GGUF metadata.

The gateway (and the swarm demo) call it to turn prompts into token ids and generated ids back
into text. The vocabulary is read with `gguf`; byte-level BPE runs in the Rust `tokenizers`
library. Nothing here imports torch or transformers.

Invariant: `encode` gives the ids llama.cpp's llama_tokenize gives for the same GGUF and text
(special=True is parse_special=true), and `decode` the concatenated llama_token_to_piece bytes;
tokenizer_test.py checks both against the pinned llama.cpp (//cpp/engine:tokenize). Mirrored
from llama.cpp (src/llama-vocab.cpp and src/unicode.cpp at the pin):
- special tokens: CONTROL, USER_DEFINED and UNKNOWN tokens are cut out of the text before
  anything else, longest first, each as one id (CONTROL and UNKNOWN only when special=True);
  the tokens llama.cpp recognises by their text (end of turn or of generation, fill in the
  middle) count as CONTROL even where the GGUF types them NORMAL;
- each supported `tokenizer.ggml.pre`: its split regexes in sequence, then GPT-2 byte-level BPE
  over the merge ranks (whole words found in the vocabulary first where llama.cpp does so);
- add_bos: false for BPE except the llama3 family, then `tokenizer.ggml.add_bos_token`.
Known gaps: a run of unassigned code points is one word here (one word per code point in
llama.cpp); special tokens of equal length that overlap in the text (llama.cpp's order among
them is unspecified); the GGUF's add_eos_token is not applied (a prompt never ends in EOS).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional, Sequence, Union

import gguf
from tokenizers import Regex, Tokenizer, models, pre_tokenizers

# llama_token_attr bits (llama.h), and the GGUF token types (llama_token_type) mapped onto them.
_UNKNOWN, _UNUSED, _NORMAL, _CONTROL, _USER_DEFINED, _BYTE = (1 << bit for bit in range(6))
_ATTR_OF_TYPE = {1: _NORMAL, 2: _UNKNOWN, 3: _CONTROL, 4: _USER_DEFINED, 5: _UNUSED, 6: _BYTE}
_SPECIAL = _CONTROL | _UNKNOWN  # rendered by decode only with skip_special=False

# The split regexes llama.cpp uses (llm_tokenizer_bpe), written as the regexes its hand-written
# splitters implement (unicode_regex_split_custom_gpt2 also ends in "|\s+").
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


@dataclasses.dataclass(frozen=True)
class _Flavor:
    regexes: tuple[str, ...]     # applied in order; each splits the pieces the previous one left
    ignore_merges: bool = False  # a word that is a vocabulary entry is one token, merges unused
    add_bos: bool = False        # default when the GGUF has no tokenizer.ggml.add_bos_token


# tokenizer.ggml.pre values with the llama.cpp settings above and no other special handling.
_FLAVORS: dict[str, _Flavor] = {}
for _names, _flavor in (
    (("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b", "mellum2"),
     _Flavor((r"\p{N}", _GPT2))),
    (("gpt-2", "phi-2", "gigachat", "a.x-4.0", "mellum", "exaone4", "mpt", "olmo", "jais", "trillion",
      "granite-docling"), _Flavor((_GPT2,))),
    (("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
      "jina-v5-nano"), _Flavor((_LLAMA3,), ignore_merges=True, add_bos=True)),
    (("dbrx", "smaug-bpe"), _Flavor((_LLAMA3,))),
    (("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open"),
     _Flavor((_QWEN2,))),
):
    _FLAVORS.update(dict.fromkeys(_names, _flavor))

# Token texts llama.cpp takes for a role the GGUF does not name (the first found gets the role
# and counts as CONTROL), and those that end generation (all count as CONTROL).
_ROLE_TEXTS = {
    "eot": ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
            "<EOT>", "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<end_of_utterance>"),
    "eom": ("<|eom_id|>",),
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>",
                "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>",
                "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>",
                "\u2581<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_DEPRECATED_ROLE_KEYS = {"fim_pre": "prefix", "fim_suf": "suffix", "fim_mid": "middle"}
_EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
))
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # gpt-oss


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte (llama.cpp unicode_utf8_to_byte)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1),
                 *range(ord("\xae"), ord("\xff") + 1)]
    shifted = (b for b in range(256) if b not in printable)
    table = {chr(b): b for b in printable}
    table.update((chr(256 + n), b) for n, b in enumerate(shifted))
    return table


def _piece_of_normal(text: str, table: dict[str, int]) -> bytes:
    """The bytes a NORMAL token stands for (llama.cpp llama_decode_text)."""
    out = bytearray()
    for char in text:
        byte = table.get(char)
        if byte is None:
            out += b"[UNK_BYTE_0x" + char.encode().hex().encode() + text.encode() + b"]"
        else:
            out.append(byte)
    return bytes(out)


class GgufTokenizer:
    """Encode and decode like llama.cpp for one GGUF vocabulary. Immutable once built: safe to
    share across threads."""

    def __init__(self, fields: dict[str, object], source: str = "GGUF") -> None:
        model = fields.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise ValueError(f"{source}: tokenizer model {model!r} is not supported (supported: 'gpt2', "
                             "byte-level BPE)")
        pre = fields.get("tokenizer.ggml.pre")
        flavor = _FLAVORS.get(pre)
        if flavor is None:
            raise ValueError(f"{source}: pre-tokenizer {pre!r} is not supported (supported: "
                             f"{', '.join(sorted(_FLAVORS))})")
        name = str(fields.get("general.name", "")).lower()
        if any(s in name for s in ("phi-3", "phi3", "modern-bert")):
            raise ValueError(f"{source}: model {name!r} strips spaces around special tokens in llama.cpp; "
                             "not supported")
        if not fields.get("tokenizer.ggml.tokens"):
            raise ValueError(f"{source}: no tokenizer.ggml.tokens")
        tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(fields["tokenizer.ggml.tokens"])]
        token_to_id = {t: i for i, t in enumerate(tokens)}
        if len(token_to_id) != len(tokens):
            raise ValueError(f"{source}: the vocabulary has duplicate tokens")
        types = fields.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        if len(types) < len(tokens):
            raise ValueError(f"{source}: fewer token types ({len(types)}) than tokens ({len(tokens)})")
        self._tokens = tokens
        self._attrs = [_ATTR_OF_TYPE.get(t, 0) for t in types[:len(tokens)]]
        self._bpe = self._build_bpe(token_to_id, fields.get("tokenizer.ggml.merges") or [], flavor, source)
        roles = self._special_roles(fields, token_to_id)
        self._bos, self._eos, self._eot = roles["bos"], roles["eos"], roles["eot"]
        self._eog = self._end_of_generation(token_to_id, roles)
        add_bos = fields.get("tokenizer.ggml.add_bos_token")
        self._add_bos = flavor.add_bos if add_bos is None else bool(add_bos)
        self._chat_template = fields.get("tokenizer.chat_template")
        specials = [i for i, a in enumerate(self._attrs) if a & (_CONTROL | _USER_DEFINED | _UNKNOWN)]
        self._specials = sorted(specials, key=lambda i: -len(tokens[i].encode()))
        table = _byte_decoder()
        self._pieces = [self._piece(t, a, table) for t, a in zip(tokens, self._attrs)]

    @classmethod
    def from_gguf(cls, path: Union[str, Path]) -> "GgufTokenizer":
        """Reads the tokenizer of a GGUF file (metadata only; a few seconds for a large vocabulary)."""
        try:
            reader = gguf.GGUFReader(path, "r")
        except OSError:
            raise
        except Exception as err:  # GGUFReader reports malformed input with assorted exception types
            raise ValueError(f"{path}: cannot read GGUF metadata: {err}") from err
        wanted = ("general.name", "tokenizer.")
        fields = {key: field.contents() for key, field in reader.fields.items() if key.startswith(wanted)}
        return cls(fields, source=str(path))

    @staticmethod
    def _build_bpe(token_to_id: dict[str, int], merges: Sequence[str], flavor: _Flavor, source: str) -> Tokenizer:
        pairs: dict[tuple[str, str], None] = {}  # first occurrence keeps its rank, as in llama.cpp
        for merge in merges:
            cut = merge.find(" ", 1)
            if cut < 0:
                continue
            pair = (merge[:cut], merge[cut + 1:])
            if any(part not in token_to_id for part in (*pair, pair[0] + pair[1])):
                raise ValueError(f"{source}: merge {merge!r} uses or makes a token outside the vocabulary")
            pairs.setdefault(pair)
        bpe = Tokenizer(models.BPE(vocab=token_to_id, merges=list(pairs), ignore_merges=flavor.ignore_merges))
        bpe.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in flavor.regexes]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        return bpe

    def _special_roles(self, fields: dict[str, object], token_to_id: dict[str, int]) -> dict[str, Optional[int]]:
        """bos, eos and the _ROLE_TEXTS roles: the GGUF's ids, else (but bos and eos) the first
        token with a known text, which then counts as CONTROL."""
        n_tokens = len(self._tokens)

        def named(key: str, default: Optional[int] = None) -> Optional[int]:
            value = fields.get(f"tokenizer.ggml.{key}_token_id")
            if isinstance(value, int) and 0 <= value < n_tokens:
                return value
            return default if default is not None and default < n_tokens else None

        roles = {"bos": named("bos", 11), "eos": named("eos", 11)}  # llama.cpp's gpt2 defaults
        for role, texts in _ROLE_TEXTS.items():
            # A deprecated key (tokenizer.ggml.prefix_token_id...) is read last in llama.cpp: it wins.
            roles[role] = named(_DEPRECATED_ROLE_KEYS.get(role, role), named(role))
            found = [token_to_id[t] for t in texts if t in token_to_id]
            if roles[role] is None and found:
                roles[role] = min(found)
                self._attrs[roles[role]] |= _CONTROL
        return roles

    def _end_of_generation(self, token_to_id: dict[str, int], roles: dict[str, Optional[int]]) -> set[int]:
        """The ids llama.cpp's llama_vocab_is_eog accepts; adjusts attrs as llama.cpp does."""
        attrs = self._attrs
        eog = {roles[r] for r in ("fim_pad", "fim_rep", "fim_sep") if roles[r] is not None}
        for text in _EOG_TEXTS & token_to_id.keys():
            eog.add(token_to_id[text])
            attrs[token_to_id[text]] |= _CONTROL
        for text in _ALWAYS_RENDERED:
            if text in token_to_id:
                attrs[token_to_id[text]] = _USER_DEFINED
        eog.update(i for i in (self._eos, roles["eot"], roles["eom"]) if i is not None)
        texts = {self._tokens[i]: i for i in eog}
        # o200k_harmony and solar-open: "<|end|>" ends a message, not the generation.
        if "<|end|>" in texts and ("<|call|>" in texts or "<|calls|>" in texts) and (
                "<|return|>" in texts or "<|flush|>" in texts):
            eog.discard(texts["<|end|>"])
            attrs[texts["<|end|>"]] = _USER_DEFINED
        # gemma4 and plamo: "</s>" is an ordinary token.
        if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
            eog.discard(texts["</s>"])
            attrs[texts["</s>"]] = _NORMAL
        return eog

    def _piece(self, text: str, attr: int, table: dict[str, int]) -> bytes:
        if attr & (_SPECIAL | _USER_DEFINED):
            return text.encode()
        if attr & _NORMAL:
            return _piece_of_normal(text, table)
        if attr & _BYTE:  # "<0xNN>"
            try:
                return bytes([int(text[3:5], 16)])
            except ValueError:
                return b"\0"  # llama.cpp's strtol of a malformed byte token
        return b""

    # ---- the interface -------------------------------------------------------------------

    def encode(self, text: str, *, add_bos: Optional[bool] = None, special: bool = True) -> list[int]:
        """Token ids of `text`. add_bos None: as the GGUF asks. special: control tokens written in
        the text are single ids (llama.cpp parse_special); user-defined tokens always are."""
        try:
            text.encode()
        except UnicodeEncodeError as err:
            raise ValueError(f"text is not valid Unicode: {err.reason} at {err.start}") from None
        ids = []
        if self._add_bos if add_bos is None else add_bos:
            if self._bos is None:
                raise ValueError("this vocabulary has no BOS token")
            ids.append(self._bos)
        for fragment in self._partition(text, special):
            if isinstance(fragment, int):
                ids.append(fragment)
            else:
                ids.extend(self._bpe.encode(fragment, add_special_tokens=False).ids)
        return ids

    def _partition(self, text: str, special: bool) -> list[Union[str, int]]:
        """Text cut at special tokens, longest token first (llama.cpp tokenizer_st_partition)."""
        fragments: list[Union[str, int]] = [text] if text else []
        for token_id in self._specials:
            piece = self._tokens[token_id]
            if (not special and self._attrs[token_id] & _SPECIAL) or piece not in text:
                continue
            cut: list[Union[str, int]] = []
            for fragment in fragments:
                if isinstance(fragment, int) or piece not in fragment:
                    cut.append(fragment)
                    continue
                for n, part in enumerate(fragment.split(piece)):
                    if n:
                        cut.append(token_id)
                    if part:
                        cut.append(part)
            fragments = cut
        return fragments

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        """The text of `ids`: llama.cpp's pieces joined; control tokens only with skip_special=False.
        Bytes that are not (yet) valid UTF-8 come out as U+FFFD."""
        pieces = self._pieces
        out = []
        for token_id in ids:
            if not 0 <= token_id < len(pieces):
                raise ValueError(f"token id {token_id} is outside the vocabulary (0..{len(pieces) - 1})")
            if not (skip_special and self._attrs[token_id] & _SPECIAL):
                out.append(pieces[token_id])
        return b"".join(out).decode("utf-8", errors="replace")

    @property
    def bos_token_id(self) -> Optional[int]:
        return self._bos

    @property
    def eos_token_id(self) -> Optional[int]:
        return self._eos

    @property
    def bos_token(self) -> str:
        return "" if self._bos is None else self._tokens[self._bos]

    @property
    def eos_token(self) -> str:
        return "" if self._eos is None else self._tokens[self._eos]

    @property
    def eot_token_id(self) -> Optional[int]:
        return self._eot

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Every id that ends a generation in llama.cpp (llama_vocab_is_eog): EOS first, then
        the end-of-turn id and the rest in id order."""
        first = [i for i in (self._eos, self._eot) if i in self._eog]
        return tuple(dict.fromkeys(first + sorted(self._eog - set(first))))

    @property
    def add_bos(self) -> bool:
        return self._add_bos

    @property
    def chat_template(self) -> Optional[str]:
        return self._chat_template

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)
