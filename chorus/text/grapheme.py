"""The grapheme BPE tokenizers of the original (English) and multilingual variants.

Both read a ``tokenizers`` JSON file whose spaces are spelled as the token ``[SPACE]``. They
return the bare text ids; the ``[START]``/``[STOP]`` framing is added by ``TextEncoder``.
"""
from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Callable

from tokenizers import Tokenizer

from chorus.text.errors import TokenizerFileError, UnsupportedLanguageError
from chorus.text.language_models import LanguageStepConfig
from chorus.text.language_steps import CANGJIE_FILE, LanguagePreprocessor
from chorus.text.languages import SUPPORTED_LANGUAGES, normalize_language

START_TOKEN = "[START]"
STOP_TOKEN = "[STOP]"
UNK_TOKEN = "[UNK]"
SPACE_TOKEN = "[SPACE]"


def load_tokenizer_file(path: str | Path) -> Tokenizer:
    """Read a ``tokenizers`` JSON file, turning failures into ``TokenizerFileError``."""
    path = Path(path)
    if not path.is_file():
        raise TokenizerFileError(f"tokenizer file not found: {path}")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises a plain Exception
        raise TokenizerFileError(f"cannot read tokenizer file {path}: {exc}") from exc


class GraphemeTokenizer:
    """A grapheme BPE vocabulary with ``[SPACE]`` for spaces and ``[START]``/``[STOP]`` framing."""

    def __init__(self, tokenizer: Tokenizer, source: str = "<memory>"):
        self.tokenizer = tokenizer
        self.source = source
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        missing = [t for t in (START_TOKEN, STOP_TOKEN, SPACE_TOKEN) if t not in vocab]
        if missing:
            raise TokenizerFileError(f"{source} lacks the special token(s) {', '.join(missing)}")
        self.start_id = vocab[START_TOKEN]
        self.stop_id = vocab[STOP_TOKEN]
        self.space_id = vocab[SPACE_TOKEN]
        self.unk_id = vocab.get(UNK_TOKEN)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def _encode_spaced(self, text: str) -> list[int]:
        return self.tokenizer.encode(text.replace(" ", SPACE_TOKEN)).ids

    def decode(self, ids: list[int]) -> str:
        """Readable text for ids (``[SPACE]`` back to spaces, ``[STOP]``/``[UNK]`` dropped)."""
        text = self.tokenizer.decode(list(ids), skip_special_tokens=False).replace(" ", "")
        return text.replace(SPACE_TOKEN, " ").replace(STOP_TOKEN, "").replace(UNK_TOKEN, "")


class EnglishTokenizer(GraphemeTokenizer):
    """``tokenizer.json`` of the original variant: case-sensitive, no preprocessing."""

    @classmethod
    def from_file(cls, path: str | Path) -> "EnglishTokenizer":
        return cls(load_tokenizer_file(path), str(path))

    def encode(self, text: str) -> list[int]:
        """Text ids (no framing) of already punctuation-normalised ``text``."""
        return self._encode_spaced(text)


class MultilingualTokenizer(GraphemeTokenizer):
    """``grapheme_mtl_merged_expanded_v1.json``: lower-case, NFKD, language step, ``[lang]`` tag."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        preprocessor: LanguagePreprocessor,
        source: str = "<memory>",
        languages: tuple[str, ...] = SUPPORTED_LANGUAGES,
    ):
        super().__init__(tokenizer, source)
        self.preprocessor = preprocessor
        self.languages = languages

    @classmethod
    def from_file(
        cls,
        path: str | Path,
        cangjie_path: str | Path | None = None,
        *,
        lenient: bool = False,
        languages: tuple[str, ...] = SUPPORTED_LANGUAGES,
        segmenter: Callable[[str], list[str]] | None = None,
        models: LanguageStepConfig | None = None,
    ) -> "MultilingualTokenizer":
        """Load the vocabulary; the Cangjie table defaults to ``Cangjie5_TC.json`` beside it and
        is read only when Chinese text arrives. ``lenient`` skips language steps whose package
        or model is missing (the reference's behaviour) instead of raising; ``models`` says where
        the language steps' model files are (``chorus/text/language_models.py``)."""
        path = Path(path)
        preprocessor = LanguagePreprocessor(
            cangjie_path=Path(cangjie_path) if cangjie_path is not None else path.parent / CANGJIE_FILE,
            lenient=lenient,
            segmenter=segmenter,
            models=models if models is not None else LanguageStepConfig(),
        )
        return cls(load_tokenizer_file(path), preprocessor, str(path), languages)

    def prepare_text(self, text: str, language: str) -> str:
        """The string handed to the BPE model, before spaces become ``[SPACE]``."""
        code = normalize_language(language, self.languages)
        text = unicodedata.normalize("NFKD", text.lower())
        text = self.preprocessor.apply(text, code)
        return f"[{code}]{text}"

    def encode(self, text: str, language: str) -> list[int]:
        """Text ids (no framing) of already punctuation-normalised ``text`` in ``language``."""
        code = normalize_language(language, self.languages)
        if self.token_id(f"[{code}]") is None:
            raise UnsupportedLanguageError(
                f"{self.source} has no language token [{code}]; this tokenizer cannot encode {code!r}"
            )
        return self._encode_spaced(self.prepare_text(text, code))
