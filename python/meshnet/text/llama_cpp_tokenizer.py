"""A GGUF's tokenizer run by llama.cpp itself (//cpp/engine:tokenize), for vocabularies the
torch-free GgufTokenizer does not rebuild (SentencePiece models such as Gemma's).

Exact by construction: encode is llama_tokenize and decode concatenates llama_token_to_piece,
both from the pinned llama.cpp. One short process per encode call (the vocabulary is loaded each
time, about a second for a 262k-token vocabulary), so it suits command-line jobs and
certification, not a gateway's request path. `tokenizer_for` picks GgufTokenizer where it can.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Optional, Sequence, Union

from meshnet.text.tokenizer import GgufTokenizer


class LlamaCppTokenizer:
    def __init__(self, gguf: Union[str, Path], binary: Union[str, Path]) -> None:
        self._gguf, self._binary = str(Path(gguf).resolve()), str(Path(binary).resolve())
        vocab = json.loads(self._run("--vocab", text_input=None))
        self._eos: int = vocab["eos"]
        self._eog = tuple(vocab["eog"])
        self._pieces = [bytes.fromhex(p) for p in vocab["pieces"]]
        self._plain = [bytes.fromhex(p) for p in vocab["plain_pieces"]]

    def _run(self, *flags: str, text_input: Optional[str]) -> str:
        proc = subprocess.run([self._binary, self._gguf, *flags], input=text_input, capture_output=True, text=True,
                              timeout=300)
        if proc.returncode != 0:
            raise ValueError(f"tokenize {self._gguf} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
        return proc.stdout

    def encode_many(self, texts: Sequence[str], *, add_special: bool = True) -> list[list[int]]:
        """Token ids of each text (llama_tokenize; control tokens in the text are parsed)."""
        lines = "".join(json.dumps(t) + "\n" for t in texts)
        out = self._run(*(["--add-special"] if add_special else []), text_input=lines)
        return [json.loads(line) for line in out.splitlines()]

    def encode(self, text: str, *, add_special: bool = True) -> list[int]:
        return self.encode_many([text], add_special=add_special)[0]

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        table = self._plain if skip_special else self._pieces
        return b"".join(table[i] for i in ids).decode("utf-8", errors="replace")

    @property
    def eos_token_id(self) -> int:
        return self._eos

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys((self._eos, *self._eog)))


def tokenizer_for(gguf: Union[str, Path], binary: Optional[Union[str, Path]]) -> Union[GgufTokenizer, LlamaCppTokenizer]:
    """GgufTokenizer when it supports the GGUF's vocabulary, else llama.cpp's own (needs `binary`)."""
    try:
        return GgufTokenizer.from_gguf(gguf)
    except ValueError as unsupported:
        if binary is None:
            raise ValueError(f"{unsupported}; llama.cpp's tokenizer (//cpp/engine:tokenize) would do, "
                             "but no tokenize binary was given") from unsupported
        return LlamaCppTokenizer(gguf, binary)
