"""Language codes of the multilingual variants and the optional packages some of them need."""
from __future__ import annotations

from dataclasses import dataclass

from chorus.text.errors import UnsupportedLanguageError

# The 23 codes the multilingual checkpoints were trained on, with their English names.
LANGUAGE_NAMES: dict[str, str] = {
    "ar": "Arabic", "da": "Danish", "de": "German", "el": "Greek", "en": "English",
    "es": "Spanish", "fi": "Finnish", "fr": "French", "he": "Hebrew", "hi": "Hindi",
    "it": "Italian", "ja": "Japanese", "ko": "Korean", "ms": "Malay", "nl": "Dutch",
    "no": "Norwegian", "pl": "Polish", "pt": "Portuguese", "ru": "Russian", "sv": "Swedish",
    "sw": "Swahili", "tr": "Turkish", "zh": "Chinese",
}
SUPPORTED_LANGUAGES: tuple[str, ...] = tuple(LANGUAGE_NAMES)


@dataclass(frozen=True)
class LanguagePackage:
    """An optional dependency of one language's preprocessing step."""

    language: str
    module: str  # what Chorus imports
    install: str  # what the user installs (a pip requirement or instructions)
    purpose: str


LANGUAGE_PACKAGES: dict[str, LanguagePackage] = {
    p.language: p
    for p in (
        LanguagePackage("zh", "spacy_pkuseg", "pip install spacy-pkuseg  (or: pip install chorus-tts[zh])",
                        "Chinese word segmentation before the Cangjie conversion"),
        LanguagePackage("ja", "pykakasi", "pip install pykakasi  (or: pip install chorus-tts[ja])",
                        "Japanese kanji -> hiragana"),
        LanguagePackage("he", "dicta_onnx", "pip install dicta-onnx  (or: pip install chorus-tts[he])",
                        "Hebrew diacritics (niqqud); it also needs Dicta's ONNX model"),
    )
}
# Languages whose step needs an extra package. Russian is not among them: the reference's stress
# marker (russian_text_stresser) is not on PyPI, so Chorus, like a PyPI install of the reference,
# speaks Russian text as written (docs/text.md).
LANGUAGES_NEEDING_OPTIONAL_PACKAGES: tuple[str, ...] = tuple(sorted(LANGUAGE_PACKAGES))


def normalize_language(language: object, supported: tuple[str, ...] = SUPPORTED_LANGUAGES) -> str:
    """Validate a language code against ``supported`` and return it lower-cased.

    Codes are matched case-insensitively (the reference lower-cases them too). Raises
    ``UnsupportedLanguageError`` naming every supported code otherwise.
    """
    if language is None or (isinstance(language, str) and not language.strip()):
        raise UnsupportedLanguageError(
            f"a language code is required for this variant; choose one of: {', '.join(supported)}"
        )
    if not isinstance(language, str):
        raise UnsupportedLanguageError(
            f"language must be a string code such as 'fr', got {type(language).__name__}"
        )
    code = language.strip().lower()
    if code not in supported:
        raise UnsupportedLanguageError(
            f"unsupported language {language!r}; choose one of: {', '.join(supported)}"
        )
    return code
