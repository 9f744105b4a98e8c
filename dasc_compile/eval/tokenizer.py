"""The tokenizer of a model ``dasc eval`` runs: UTF-8 bytes, or the tokenizer files beside the weights.

:func:`load_tokenizer` refuses, in one :class:`~dasc_compile.errors.DascInputError` line naming the file(s),
a model folder whose tokenizer cannot be built (no ``tokenizer.json`` where transformers needs one, a file
that is not JSON, a JSON file transformers cannot read as a tokenizer), as a bad ``config.json`` is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

from dasc_compile.errors import DascInputError, short_text

#: The files a Hugging Face tokenizer is read from; the first two are JSON.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")
#: What a model folder is told it needs when its tokenizer cannot be built.
EXPECTED = ("expected the model's tokenizer.json (the tokenizers library's file) or, for a byte vocabulary, "
            "'dasc_tokenizer': 'bytes' in config.json")


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255 (the stand-in vocabulary of dasc's small trained models)."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A tokenizer shipped beside the checkpoint (``tokenizer.json`` etc.), read with transformers.

    Raises:
        DascInputError: transformers cannot build a tokenizer from the files (:func:`load_tokenizer` says which).
    """

    def __init__(self, path: Path):
        import transformers
        from transformers import AutoTokenizer

        from dasc_compile.eval.quiet import quiet_transformers

        quiet_transformers()
        try:
            self._tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except Exception as exc:    # noqa: BLE001 - transformers and tokenizers raise many kinds for a bad file
            present = [n for n in TOKENIZER_FILES if (path / n).is_file()]
            text = short_text(" ".join(ln.strip() for ln in str(exc).splitlines() if ln.strip()), 160)
            what = (f"{path}: transformers {transformers.__version__} cannot build a tokenizer from "
                    f"{', '.join(present)}" if "tokenizer.json" in present else
                    f"{path / 'tokenizer.json'}: not found, and transformers {transformers.__version__} cannot build a "
                    f"tokenizer from {', '.join(present)} alone")
            raise DascInputError(f"{what} ({type(exc).__name__}: {text}); {EXPECTED}") from None
        self.vocab_size = len(self._tok)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)


def _check_json_files(path: Path) -> None:
    """Refuse a ``tokenizer.json`` / ``tokenizer_config.json`` that is not a JSON object (garbage, empty,
    not UTF-8, unreadable), naming the file, before transformers reads it."""
    for name in TOKENIZER_FILES[:2]:
        f = path / name
        if not f.is_file():
            continue
        try:
            obj = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:      # UnicodeDecodeError and JSONDecodeError are ValueErrors
            raise DascInputError(f"{f}: not readable JSON ({exc}); {EXPECTED}") from None
        if not isinstance(obj, dict):
            raise DascInputError(f"{f}: a tokenizer file must be a JSON object, got {type(obj).__name__}; "
                                 f"{EXPECTED}")


def load_tokenizer(path: Path, cfg: dict):
    """The model's tokenizer: UTF-8 bytes when config.json sets ``dasc_tokenizer: bytes``, else the
    tokenizer files beside the weights (read with transformers).

    Raises:
        DascInputError: no tokenizer files and no byte vocabulary; a ``tokenizer.json`` or
            ``tokenizer_config.json`` that is not a JSON object; files transformers cannot build a tokenizer
            from (e.g. ``tokenizer_config.json`` without the ``tokenizer.json`` it needs). Each names the
            file(s) and what was expected.
    """
    if cfg.get("dasc_tokenizer") == "bytes":
        return ByteTokenizer()
    if any((path / n).is_file() for n in TOKENIZER_FILES):
        _check_json_files(path)
        return HFTokenizer(path)
    raise DascInputError(f"{path}: no tokenizer files (tokenizer.json) and config.json does not set "
                         f"'dasc_tokenizer': 'bytes'")
