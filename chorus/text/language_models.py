"""Where the model files of the optional language steps come from (Hebrew Dicta, Chinese pkuseg).

| step | file | configured by | else |
|---|---|---|---|
| he | Dicta's ONNX model (``dicta-1.0.onnx``) | ``dicta_model`` / ``--dicta-model`` / ``CHORUS_DICTA_MODEL`` | the cached copy in ``<cache>/dicta-onnx/``, downloaded from dicta-onnx's release on first use when downloads are allowed |
| he | Dicta's tokenizer (``tokenizer.json`` of the hub repo ``dicta-il/dictabert-large-char-menaked``; dicta-onnx reads it from the Hugging Face cache itself) | the Hugging Face cache (``HF_HOME``) | fetched into that cache when downloads are allowed |
| zh | a spacy-pkuseg model directory (``features.msgpack``, ``weights.npz``) | ``pkuseg_model`` / ``--pkuseg-model`` / ``CHORUS_PKUSEG_MODEL`` | spacy-pkuseg's default model ``spacy_ontonotes`` in its cache (``PKUSEG_HOME``, default ``~/.pkuseg``), downloaded by spacy-pkuseg from its release when downloads are allowed |

Downloads are allowed unless ``HF_HUB_OFFLINE`` is set (the switch that keeps checkpoints offline
too). ``<cache>`` is ``CHORUS_CACHE_DIR``, else ``$XDG_CACHE_HOME/chorus``, else ``~/.cache/chorus``.
A file that cannot be had raises :class:`LanguageModelMissingError` naming the file, the option
and the extra; the caller decides whether that refuses start-up (strict) or is warned about once
(lenient).
"""
from __future__ import annotations

import logging
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from chorus.atomic import atomic_file
from chorus.text.errors import LanguageModelMissingError

logger = logging.getLogger(__name__)

ENV_DICTA_MODEL = "CHORUS_DICTA_MODEL"
ENV_PKUSEG_MODEL = "CHORUS_PKUSEG_MODEL"
ENV_LANGUAGE_STEPS = "CHORUS_LANGUAGE_STEPS"
ENV_CACHE_DIR = "CHORUS_CACHE_DIR"
LANGUAGE_STEP_MODES = ("lenient", "strict")

DICTA_MODEL_FILE = "dicta-1.0.onnx"
DICTA_MODEL_URL = f"https://github.com/thewh1teagle/dicta-onnx/releases/download/model-files-v1.0/{DICTA_MODEL_FILE}"
DICTA_TOKENIZER_REPO = "dicta-il/dictabert-large-char-menaked"  # hard-wired in dicta-onnx
PKUSEG_DEFAULT_MODEL = "spacy_ontonotes"  # what spacy_pkuseg.pkuseg() loads
PKUSEG_MODEL_FILES = ("features.msgpack", "weights.npz")
DOWNLOAD_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class LanguageStepConfig:
    """How the multilingual language steps find their models and what a missing one means.

    ``strict=False`` (lenient, the default) speaks a language whose step cannot run as the
    reference does (the plain text; one warning per process); ``strict=True`` makes
    :func:`chorus.text.load_text_encoder` refuse to build the encoder instead.
    """

    strict: bool = False
    dicta_model: Path | None = None  # Dicta's ONNX file
    pkuseg_model: Path | None = None  # a spacy-pkuseg model directory

    def __post_init__(self):
        for name in ("dicta_model", "pkuseg_model"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, name, Path(os.path.expanduser(os.fspath(value))) if str(value) else None)

    @property
    def mode(self) -> str:
        return "strict" if self.strict else "lenient"

    @classmethod
    def from_options(cls, mode: str | None = None, dicta_model: str | os.PathLike | None = None,
                     pkuseg_model: str | os.PathLike | None = None,
                     env: Mapping[str, str] | None = None) -> "LanguageStepConfig":
        """Options given win; unset ones come from ``CHORUS_LANGUAGE_STEPS``,
        ``CHORUS_DICTA_MODEL`` and ``CHORUS_PKUSEG_MODEL``."""
        env = os.environ if env is None else env
        mode = mode or env.get(ENV_LANGUAGE_STEPS) or "lenient"
        return cls(strict=parse_language_step_mode(mode),
                   dicta_model=dicta_model or env.get(ENV_DICTA_MODEL) or None,
                   pkuseg_model=pkuseg_model or env.get(ENV_PKUSEG_MODEL) or None)


def parse_language_step_mode(mode: str) -> bool:
    """``"lenient" | "strict"`` -> strict?"""
    value = str(mode).strip().lower()
    if value not in LANGUAGE_STEP_MODES:
        raise ValueError(f"language steps mode must be 'lenient' or 'strict', got {mode!r}")
    return value == "strict"


def downloads_allowed(env: Mapping[str, str] | None = None) -> bool:
    """False when ``HF_HUB_OFFLINE`` is set to a true value (read now, not at import)."""
    env = os.environ if env is None else env
    return env.get("HF_HUB_OFFLINE", "").strip().upper() not in ("1", "ON", "YES", "TRUE")


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get(ENV_CACHE_DIR):
        return Path(os.path.expanduser(env[ENV_CACHE_DIR]))
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "chorus"


def _offline_note() -> str:
    return " (HF_HUB_OFFLINE is set, so nothing is downloaded)" if not downloads_allowed() else ""


def dicta_missing_message(what: str) -> str:
    return (f"Hebrew (he) diacritics need {what}{_offline_note()}. Give the ONNX file with --dicta-model FILE "
            f"(config dicta_model, env {ENV_DICTA_MODEL}; it is {DICTA_MODEL_FILE} of dicta-onnx's release "
            f"model-files-v1.0), or allow downloads (unset HF_HUB_OFFLINE); the package comes with "
            f"pip install chorus-tts[he]")


def resolve_dicta_model(config: LanguageStepConfig) -> Path:
    """The Dicta ONNX file: the configured one, else the cached copy, else a download."""
    if config.dicta_model is not None:
        if not config.dicta_model.is_file():
            raise LanguageModelMissingError(dicta_missing_message(
                f"Dicta's ONNX model, which is missing at {config.dicta_model}"))
        return config.dicta_model
    cached = cache_dir() / "dicta-onnx" / DICTA_MODEL_FILE
    if cached.is_file():
        return cached
    if not downloads_allowed():
        raise LanguageModelMissingError(dicta_missing_message(
            f"Dicta's ONNX model {DICTA_MODEL_FILE}, which is neither configured nor cached at {cached}"))
    logger.warning("downloading Dicta's Hebrew model %s to %s (once)", DICTA_MODEL_URL, cached)
    cached.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_file(cached) as tmp, urllib.request.urlopen(DICTA_MODEL_URL, timeout=DOWNLOAD_TIMEOUT_S) as answer:
            with open(tmp, "wb") as out:
                while block := answer.read(1 << 20):
                    out.write(block)
    except OSError as exc:
        raise LanguageModelMissingError(dicta_missing_message(
            f"Dicta's ONNX model {DICTA_MODEL_FILE}, whose download from {DICTA_MODEL_URL} failed ({exc})")) from exc
    return cached


def ensure_dicta_tokenizer() -> Path:
    """Put Dicta's ``tokenizer.json`` in the Hugging Face cache (dicta-onnx reads it from there
    by repo id); only the cache is searched when downloads are not allowed."""
    from huggingface_hub import hf_hub_download

    try:
        # the default cache, the one dicta-onnx's own lookup (through huggingface_hub) reads
        return Path(hf_hub_download(DICTA_TOKENIZER_REPO, "tokenizer.json", local_files_only=not downloads_allowed()))
    except Exception as exc:  # LocalEntryNotFoundError, HTTP errors, OSError
        raise LanguageModelMissingError(dicta_missing_message(
            f"Dicta's tokenizer (tokenizer.json of the hub repo {DICTA_TOKENIZER_REPO}), which is not in the "
            f"Hugging Face cache ({type(exc).__name__})")) from exc


def pkuseg_missing_message(what: str) -> str:
    return (f"Chinese (zh) word segmentation needs {what}{_offline_note()}. Give a spacy-pkuseg model "
            f"directory (holding {' and '.join(PKUSEG_MODEL_FILES)}) with --pkuseg-model DIR (config "
            f"pkuseg_model, env {ENV_PKUSEG_MODEL}), or allow downloads (unset HF_HUB_OFFLINE); the package "
            f"comes with pip install chorus-tts[zh]")


def pkuseg_home(env: Mapping[str, str] | None = None) -> Path:
    """spacy-pkuseg's own cache (it reads ``PKUSEG_HOME`` the same way)."""
    env = os.environ if env is None else env
    return Path(os.path.expanduser(env.get("PKUSEG_HOME", "~/.pkuseg")))


def _is_pkuseg_model(directory: Path) -> bool:
    return all((directory / name).is_file() for name in PKUSEG_MODEL_FILES)


def resolve_pkuseg_model(config: LanguageStepConfig) -> str:
    """What to pass as spacy_pkuseg's ``model_name``: a model directory, or the default model's
    name when spacy-pkuseg may download it."""
    if config.pkuseg_model is not None:
        if not _is_pkuseg_model(config.pkuseg_model):
            raise LanguageModelMissingError(pkuseg_missing_message(
                f"a spacy-pkuseg model, which is missing at {config.pkuseg_model}"))
        return str(config.pkuseg_model)
    cached = pkuseg_home() / PKUSEG_DEFAULT_MODEL
    if _is_pkuseg_model(cached):
        return str(cached)  # the directory itself: spacy-pkuseg then never checks for its zip
    if not downloads_allowed():
        raise LanguageModelMissingError(pkuseg_missing_message(
            f"spacy-pkuseg's default model {PKUSEG_DEFAULT_MODEL}, which is neither configured nor cached "
            f"at {cached}"))
    return PKUSEG_DEFAULT_MODEL  # spacy-pkuseg downloads it into PKUSEG_HOME
