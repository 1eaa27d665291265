"""Per-language text preparation of the multilingual tokenizer (the step after lower-casing and NFKD).

| language | step | needs |
|---|---|---|
| zh | segment words (spacy_pkuseg), spell table glyphs as ``[cj_*]`` | ``spacy-pkuseg`` and a pkuseg model, ``Cangjie5_TC.json`` |
| ja | kanji runs -> hiragana (pykakasi), then NFKD again | ``pykakasi`` |
| he | diacritics (dicta_onnx) | ``dicta-onnx``, Dicta's ONNX model and tokenizer |
| ko | Hangul syllables -> conjoining jamo, strip | nothing |
| ru | none (the reference's stress marker is not on PyPI) | nothing |

Model files are found as ``chorus/text/language_models.py`` says. A step that cannot run is, in
lenient mode (the default), skipped with one warning per process, so the text is prepared as the
reference prepares it without the package or model; in strict mode it raises, and
``load_text_encoder`` calls ``prepare`` for every such language so that this happens at start-up.
"""
from __future__ import annotations

import importlib
import json
import logging
import threading
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from chorus.text.errors import (
    LanguageModelMissingError,
    LanguagePreprocessingError,
    MissingLanguagePackageError,
    TokenizerFileError,
)
from chorus.text.language_models import (
    LanguageStepConfig,
    ensure_dicta_tokenizer,
    resolve_dicta_model,
    resolve_pkuseg_model,
)
from chorus.text.languages import LANGUAGE_PACKAGES

logger = logging.getLogger(__name__)

CANGJIE_FILE = "Cangjie5_TC.json"
TextTransform = Callable[[str], str]


@dataclass(frozen=True)
class CangjieTable:
    """Glyph -> Cangjie code, plus the order of glyphs sharing a code (it disambiguates them)."""

    code_of: dict[str, str]
    glyphs_by_code: dict[str, list[str]]

    @classmethod
    def from_entries(cls, entries: list[str], source: str = "<memory>") -> "CangjieTable":
        code_of: dict[str, str] = {}
        glyphs_by_code: dict[str, list[str]] = {}
        for position, entry in enumerate(entries):
            fields = entry.split("\t") if isinstance(entry, str) else []
            if len(fields) < 2:
                raise TokenizerFileError(
                    f"{source}: entry {position} is {entry!r}; expected a string 'glyph<TAB>code'"
                )
            glyph, code = fields[0], fields[1]
            code_of[glyph] = code  # a glyph listed twice keeps its last code, as in the reference
            glyphs_by_code.setdefault(code, []).append(glyph)
        return cls(code_of, glyphs_by_code)

    @classmethod
    def load(cls, path: str | Path) -> "CangjieTable":
        path = Path(path)
        if not path.is_file():
            raise TokenizerFileError(
                f"Chinese (zh) needs the Cangjie table {CANGJIE_FILE}, which is missing at {path}. "
                f"It ships in the multilingual checkpoint (hub repo ResembleAI/chatterbox); put it "
                f"next to the tokenizer file."
            )
        try:
            entries = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise TokenizerFileError(f"cannot read the Cangjie table {path}: {exc}") from exc
        if not isinstance(entries, list):
            raise TokenizerFileError(f"{path}: expected a JSON list of 'glyph<TAB>code' strings")
        return cls.from_entries(entries, str(path))

    def encode_glyph(self, glyph: str) -> str | None:
        """``[cj_x]...[cj_.]`` for a glyph in the table (with its rank among same-code glyphs
        when that rank is > 0), else None."""
        code = self.code_of.get(glyph)
        if code is None:
            return None
        rank = self.glyphs_by_code[code].index(glyph)
        letters = code + (str(rank) if rank > 0 else "")
        return "".join(f"[cj_{letter}]" for letter in letters) + "[cj_.]"


def cangjie_convert(text: str, table: CangjieTable, segment: Callable[[str], list[str]] | None) -> str:
    """Segment ``text`` into words joined by spaces, then spell table glyphs (category Lo) as
    Cangjie tokens; every other character passes through."""
    if segment is not None:
        text = " ".join(segment(text))
    pieces = []
    for char in text:
        spelled = table.encode_glyph(char) if unicodedata.category(char) == "Lo" else None
        pieces.append(char if spelled is None else spelled)
    return "".join(pieces)


def _is_kanji(char: str) -> bool:
    return "\u4e00" <= char <= "\u9fff"


def kanji_to_hiragana(text: str, kakasi) -> str:
    """Replace every pykakasi chunk containing kanji by its hiragana reading (a reading starting
    with the particles は/へ gets a leading space), keep everything else, then NFKD."""
    pieces = []
    for chunk in kakasi.convert(text):
        original, reading = chunk["orig"], chunk["hira"]
        if any(_is_kanji(c) for c in original):
            pieces.append(" " + reading if reading[:1] in ("は", "へ") else reading)
        else:
            pieces.append(original)  # all-katakana chunks and everything else stay as written
    return unicodedata.normalize("NFKD", "".join(pieces))


def hangul_to_jamo(text: str) -> str:
    """Split Hangul syllables into conjoining jamo and strip surrounding whitespace.

    The range deliberately runs to U+D7AF like the reference's, not to the last syllable U+D7A3.
    """
    out = []
    for char in text:
        if "\uac00" <= char <= "\ud7af":
            index = ord(char) - 0xAC00
            lead, rest = divmod(index, 21 * 28)
            vowel, tail = divmod(rest, 28)
            out.append(chr(0x1100 + lead) + chr(0x1161 + vowel) + (chr(0x11A7 + tail) if tail else ""))
        else:
            out.append(char)
    return "".join(out).strip()


def _import_package(language: str):
    package = LANGUAGE_PACKAGES[language]
    try:
        return importlib.import_module(package.module)
    except ImportError as exc:
        raise MissingLanguagePackageError(
            f"language {language!r} needs the optional package '{package.module}' "
            f"({package.purpose}), which is not installed: {package.install}"
        ) from exc


def _load_segmenter(models: LanguageStepConfig) -> Callable[[str], list[str]]:
    module = _import_package("zh")
    model = resolve_pkuseg_model(models)
    try:
        segmenter = module.pkuseg(model_name=model)
    except Exception as exc:  # a corrupt directory, a failed download
        raise LanguagePreprocessingError(
            f"spacy_pkuseg could not load its model {model}: {exc} (give another with --pkuseg-model DIR)") from exc
    return segmenter.cut


def _load_kakasi(models: LanguageStepConfig):
    return _import_package("ja").kakasi()


def _load_hebrew(models: LanguageStepConfig) -> TextTransform:
    module = _import_package("he")
    model = resolve_dicta_model(models)
    ensure_dicta_tokenizer()
    try:
        return module.Dicta(str(model)).add_diacritics
    except Exception as exc:  # not an ONNX file, an incompatible model
        raise LanguagePreprocessingError(
            f"dicta_onnx could not load the Hebrew model {model}: {exc} (give another with --dicta-model FILE)"
        ) from exc


_warned: set[tuple[str, str]] = set()  # (language, step part) warned about in this process
_warned_lock = threading.Lock()


def _warn_once(language: str, part: str, exc: Exception) -> None:
    with _warned_lock:
        if (language, part) in _warned:
            return
        _warned.add((language, part))
    logger.warning("%s; speaking %r text without this step, as the reference does (lenient mode; "
                   "--language-steps strict refuses to start instead)", exc, language)


@dataclass
class LanguagePreprocessor:
    """Runs the language step of the multilingual tokenizer.

    Tools are loaded on first use (or by ``prepare``); callables passed in replace the optional
    packages (tests, or a caller that has its own segmenter/diacritizer).
    """

    cangjie_path: Path | None = None
    lenient: bool = False
    models: LanguageStepConfig = field(default_factory=LanguageStepConfig)
    segmenter: Callable[[str], list[str]] | None = None
    kakasi: object | None = None
    hebrew_diacritizer: TextTransform | None = None
    cangjie_table: CangjieTable | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _skipped: set[tuple[str, str]] = field(default_factory=set, repr=False)

    def prepare(self, language: str) -> None:
        """Load what ``language`` needs now, raising the error a later ``apply`` would raise."""
        self.apply("", language)

    def apply(self, text: str, language: str) -> str:
        """Run ``language``'s step on lower-cased, NFKD-normalised ``text``."""
        if language == "ko":
            return hangul_to_jamo(text)
        if language == "zh":
            return self._chinese(text)
        if language == "ja":
            kakasi = self._tool("kakasi", _load_kakasi, language)
            return text if kakasi is None else kanji_to_hiragana(text, kakasi)
        if language == "he":
            return self._run_tool("hebrew_diacritizer", _load_hebrew, language, text)
        return text

    def _chinese(self, text: str) -> str:
        table = self._tool("cangjie_table", self._load_cangjie, "zh")
        segment = self._tool("segmenter", _load_segmenter, "zh")
        if table is None:  # lenient mode: like the reference, still segment
            return " ".join(segment(text)) if segment is not None else text
        return cangjie_convert(text, table, segment)

    def _load_cangjie(self, models: LanguageStepConfig) -> CangjieTable:
        if self.cangjie_path is None:
            raise TokenizerFileError(f"Chinese (zh) needs the Cangjie table {CANGJIE_FILE}; none was given")
        return CangjieTable.load(self.cangjie_path)

    def _tool(self, attribute: str, loader: Callable[[LanguageStepConfig], object], language: str):
        tool = getattr(self, attribute)
        if tool is not None or (attribute, language) in self._skipped:
            return tool
        with self._lock:
            if getattr(self, attribute) is None and (attribute, language) not in self._skipped:
                try:
                    setattr(self, attribute, loader(self.models))
                except (MissingLanguagePackageError, LanguageModelMissingError, TokenizerFileError,
                        LanguagePreprocessingError) as exc:
                    if not self.lenient:
                        raise
                    _warn_once(language, attribute, exc)
                    self._skipped.add((attribute, language))
        return getattr(self, attribute)

    def _run_tool(self, attribute: str, loader: Callable[[LanguageStepConfig], TextTransform], language: str,
                  text: str) -> str:
        transform = self._tool(attribute, loader, language)
        if transform is None or not text:
            return text
        try:
            return transform(text)
        except Exception as exc:
            if not self.lenient:
                raise LanguagePreprocessingError(f"the {language!r} text step failed: {exc}") from exc
            logger.warning("the %s preprocessing step failed (%s); text left unchanged", language, exc)
            return text
