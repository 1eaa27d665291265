"""Text front end: punctuation clean-up, English normalisation, tokenizers, long-text chunking.

Most callers need only::

    encoder = load_text_encoder(variant, checkpoint_dir)
    ids = encoder.encode("Bonjour !", language="fr")   # T3 text ids (the model adds SOT/EOT)
    text = normalize_for_speech(text, language)        # English: "$5" -> "five dollars"
    chunks = split_into_chunks(text, language=language) # sentence-aligned pieces

See docs/text.md.
"""
from chorus.text.chunking import DEFAULT_MAX_CHARS, split_into_chunks, split_sentences
from chorus.text.encoder import TextEncoder, load_text_encoder
from chorus.text.english import normalize_for_speech
from chorus.text.errors import (
    LanguageModelMissingError,
    LanguagePreprocessingError,
    MissingLanguagePackageError,
    TextError,
    TextInputError,
    TokenizerFileError,
    UnsupportedLanguageError,
)
from chorus.text.gpt2 import GPT2_TOKENIZER_FILES, Gpt2Tokenizer
from chorus.text.grapheme import EnglishTokenizer, MultilingualTokenizer
from chorus.text.language_models import LanguageStepConfig
from chorus.text.language_steps import CANGJIE_FILE, CangjieTable, LanguagePreprocessor
from chorus.text.languages import (
    LANGUAGE_NAMES,
    LANGUAGE_PACKAGES,
    LANGUAGES_NEEDING_OPTIONAL_PACKAGES,
    SUPPORTED_LANGUAGES,
    normalize_language,
)
from chorus.text.normalize import PUNCTUATION_STYLES, PunctuationStyle, normalize_punctuation
from chorus.text.standin import write_standin_tokenizer_files
from chorus.text.standin_gpt2 import PARALINGUISTIC_TAGS

__all__ = [
    "CANGJIE_FILE", "CangjieTable", "DEFAULT_MAX_CHARS", "EnglishTokenizer", "GPT2_TOKENIZER_FILES",
    "Gpt2Tokenizer", "LANGUAGES_NEEDING_OPTIONAL_PACKAGES", "LANGUAGE_NAMES", "LANGUAGE_PACKAGES",
    "LanguageModelMissingError", "LanguagePreprocessingError", "LanguagePreprocessor", "LanguageStepConfig", "MissingLanguagePackageError",
    "MultilingualTokenizer", "PARALINGUISTIC_TAGS", "PUNCTUATION_STYLES", "PunctuationStyle",
    "SUPPORTED_LANGUAGES", "TextEncoder", "TextError", "TextInputError", "TokenizerFileError",
    "UnsupportedLanguageError", "load_text_encoder", "normalize_for_speech", "normalize_language", "normalize_punctuation",
    "split_into_chunks", "split_sentences", "write_standin_tokenizer_files",
]
