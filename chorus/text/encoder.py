"""Text -> T3 text ids for any variant: the one entry point the rest of Chorus calls."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Union

from chorus.models.variants import Variant, get_variant
from chorus.text.errors import TextInputError, TokenizerFileError, UnsupportedLanguageError
from chorus.text.gpt2 import Gpt2Tokenizer
from chorus.text.grapheme import EnglishTokenizer, MultilingualTokenizer
from chorus.text.language_models import LanguageStepConfig
from chorus.text.languages import LANGUAGES_NEEDING_OPTIONAL_PACKAGES, normalize_language
from chorus.text.normalize import normalize_punctuation

logger = logging.getLogger(__name__)

AnyTokenizer = Union[EnglishTokenizer, MultilingualTokenizer, Gpt2Tokenizer]


@dataclass
class TextEncoder:
    """Normalises, tokenises and frames text exactly as the variant's reference entry class does.

    ``encode(text, language)`` returns the tokenizer ids (with the ``[lang]`` tag for multilingual
    variants) that T3 takes; the model adds the ``[SOT] ... [EOT]`` framing of the original and
    multilingual variants itself (``T3Model.frame_text``), so it is never applied twice.
    ``encode_framed`` returns the whole T3 text input, framing included, for display and tests.
    Errors are ``TextError`` subclasses with messages meant for the end user.
    """

    variant: Variant
    tokenizer: AnyTokenizer

    @property
    def is_multilingual(self) -> bool:
        return isinstance(self.tokenizer, MultilingualTokenizer)

    def check_language(self, language: str | None) -> str | None:
        """The canonical language code for this variant (None for English-only variants).

        Multilingual variants require one of ``variant.languages``; English-only variants
        accept None or ``"en"`` and reject anything else rather than speak it as English.
        """
        if self.is_multilingual:
            return normalize_language(language, self.variant.languages)
        if language is None:
            return None
        if not isinstance(language, str) or language.strip().lower() != "en":
            raise UnsupportedLanguageError(
                f"the {self.variant.name} variant speaks English only and cannot take language "
                f"{language!r}; omit the language (or pass 'en'), or use a multilingual variant"
            )
        return None

    def prepare(self, language: str | None = None) -> None:
        """Load what ``language`` needs (optional packages, Cangjie table) now, so a missing
        dependency fails at start-up instead of on the first request."""
        code = self.check_language(language)
        if self.is_multilingual:
            self.tokenizer.preprocessor.prepare(code)

    def normalize(self, text: str) -> str:
        """The variant's punctuation clean-up (see ``normalize_punctuation``)."""
        return normalize_punctuation(_check_text(text), self.variant.punctuation)

    def encode(self, text: str, language: str | None = None) -> list[int]:
        """Text ids of ``text`` as T3 takes them, unframed (``language`` is required for
        multilingual variants)."""
        code = self.check_language(language)
        normalized = self.normalize(text)
        if isinstance(self.tokenizer, MultilingualTokenizer):
            return self.tokenizer.encode(normalized, code)
        return self.tokenizer.encode(normalized)

    def encode_framed(self, text: str, language: str | None = None) -> list[int]:
        """The whole T3 text input: ``[SOT] ids [EOT]`` for the original and multilingual
        variants, the raw ids for Turbo/Nano (what the reference entry classes feed T3)."""
        ids = self.encode(text, language)
        t3 = self.variant.t3
        if t3.start_text_token is None:
            return ids
        return [t3.start_text_token, *ids, t3.stop_text_token]


def _check_text(text: object) -> str:
    if not isinstance(text, str):
        raise TextInputError(f"text must be a string, got {type(text).__name__}")
    if not text.strip():
        # The reference would speak a stock sentence (or a lone "."); a service should refuse.
        raise TextInputError("text is empty; give at least one word to speak")
    return text


def _check_vocab_size(variant: Variant, size: int, source: str) -> None:
    expected = variant.t3.text_vocab_size
    if size > expected:
        raise TokenizerFileError(
            f"{source} has {size} tokens but the {variant.name} model has only {expected} text "
            f"embeddings; this tokenizer does not belong to this variant"
        )
    if size < expected:
        logger.warning("%s has %d tokens, the %s model expects %d", source, size, variant.name, expected)


def load_text_encoder(
    variant: Variant | str,
    checkpoint_dir: str | Path,
    *,
    language_steps: LanguageStepConfig | None = None,
    chinese_segmenter: Callable[[str], list[str]] | None = None,
) -> TextEncoder:
    """Build the ``TextEncoder`` of ``variant`` from the tokenizer files in ``checkpoint_dir``.

    ``language_steps`` (default: lenient, no model paths given) concerns multilingual variants.
    Lenient mimics the reference: a language step whose optional package, model file or the
    Cangjie table is missing is skipped with one warning per process. Strict loads every step
    here, so a missing piece raises now (``MissingLanguagePackageError``,
    ``LanguageModelMissingError``, ``TokenizerFileError``) instead of on a request.
    ``chinese_segmenter`` replaces spacy_pkuseg.
    """
    language_steps = language_steps if language_steps is not None else LanguageStepConfig()
    if isinstance(variant, str):
        variant = get_variant(variant)
    directory = Path(checkpoint_dir)
    if not directory.is_dir():
        raise TokenizerFileError(f"checkpoint directory not found: {directory}")
    tokenizer: AnyTokenizer
    if variant.tokenizer_kind == "en":
        tokenizer = EnglishTokenizer.from_file(directory / variant.files.tokenizer[0])
        size, source = tokenizer.vocab_size, tokenizer.source
    elif variant.tokenizer_kind == "mtl":
        tokenizer = MultilingualTokenizer.from_file(
            directory / variant.files.tokenizer[0], lenient=not language_steps.strict,
            languages=variant.languages, segmenter=chinese_segmenter, models=language_steps,
        )
        size, source = tokenizer.vocab_size, tokenizer.source
    elif variant.tokenizer_kind == "gpt2":
        tokenizer = Gpt2Tokenizer.from_dir(directory)
        size, source = len(tokenizer), tokenizer.source
    else:  # pragma: no cover - the registry only has these three
        raise ValueError(f"unknown tokenizer kind {variant.tokenizer_kind!r}")
    _check_vocab_size(variant, size, source)
    if variant.t3.start_text_token is not None:
        framing = (tokenizer.start_id, tokenizer.stop_id)
        if framing != (variant.t3.start_text_token, variant.t3.stop_text_token):
            logger.warning("%s puts [START]/[STOP] at %s; the model uses %s", source, framing,
                           (variant.t3.start_text_token, variant.t3.stop_text_token))
    encoder = TextEncoder(variant, tokenizer)
    if language_steps.strict and encoder.is_multilingual:
        for language in LANGUAGES_NEEDING_OPTIONAL_PACKAGES:
            if language in variant.languages:
                encoder.prepare(language)  # start-up, not the first request, is where strict refuses
    return encoder
