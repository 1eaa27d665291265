"""``chorus checkpoint check``: open and validate every file of a checkpoint.

Each file is read the way loading reads it: the weight files' tensors are read and their keys
and shapes compared with the model's (:func:`chorus.models.checkpoint.compare_state_dict`), the
built-in voice ``conds.pt`` is read and turned into a :class:`chorus.voices.Voice` (keys, shapes,
token ranges), and the tokenizer files are loaded and used once. A file that cannot be read is
reported with its error (which names the file and the fix) and the check goes on.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from chorus.models.loading import Checkpoint


@dataclass(frozen=True)
class FileCheck:
    name: str
    status: str  # "ok", "absent", "MISMATCH" or "ERROR"
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("ok", "absent")

    def render(self) -> str:
        if self.status == "MISMATCH":
            return f"{self.name}: MISMATCH\n{self.detail}"
        return f"{self.name}: {self.status}" + (f" ({self.detail})" if self.detail else "")


def _weights(ckpt: Checkpoint, name: str, read: Callable, specs, optional=frozenset()) -> FileCheck:
    from chorus.models.checkpoint import compare_state_dict

    try:
        state = read()
    except (OSError, ValueError) as exc:
        return FileCheck(name, "ERROR", str(exc))
    report = compare_state_dict(state, {s.name: s.shape for s in specs}, str(ckpt.path(name)), optional)
    return FileCheck(name, "ok", f"{len(state)} tensors") if report.ok else FileCheck(name, "MISMATCH", report.render())


def _builtin_voice(ckpt: Checkpoint) -> FileCheck:
    from chorus.voices import Voice

    name = ckpt.variant.files.conds
    if not ckpt.has_builtin_voice():
        return FileCheck(name, "absent", "no built-in voice: synth needs --voice")
    try:
        voice = Voice.from_conditionals(ckpt.builtin_voice_state())
    except (OSError, ValueError) as exc:
        message = str(exc) if str(ckpt.path(name)) in str(exc) else f"{ckpt.path(name)}: {exc}"
        return FileCheck(name, "ERROR", message)
    limit = ckpt.variant.t3.speech_cond_prompt_len
    if voice.t3_prompt_tokens.shape[1] > limit:
        return FileCheck(name, "ERROR", f"{ckpt.path(name)}: {voice.t3_prompt_tokens.shape[1]} T3 prompt tokens, "
                                        f"{ckpt.variant.name} takes at most {limit}")
    return FileCheck(name, "ok", f"built-in voice, {voice.t3_prompt_tokens.shape[1]} T3 prompt tokens")


def _tokenizer(ckpt: Checkpoint) -> FileCheck:
    from chorus.text import load_text_encoder

    name = ", ".join(ckpt.variant.files.tokenizer)
    language = "en" if ckpt.variant.is_multilingual else None
    try:
        load_text_encoder(ckpt.variant, ckpt.directory).encode("Hello.", language=language)
    except (OSError, ValueError) as exc:
        return FileCheck(name, "ERROR", f"{exc}; download it again")
    return FileCheck(name, "ok")


def check_checkpoint(ckpt: Checkpoint) -> list[FileCheck]:
    """One :class:`FileCheck` per file of ``ckpt`` (weights, built-in voice, tokenizer)."""
    from chorus.models.random_checkpoint import reference_key_specs, t3_key_specs

    variant, files = ckpt.variant, ckpt.variant.files
    return [
        _weights(ckpt, files.t3, ckpt.t3_state, t3_key_specs(variant)),
        _weights(ckpt, files.voice_encoder, ckpt.voice_encoder_state, reference_key_specs("ve")),
        _weights(ckpt, files.s3gen, ckpt.s3gen_state,
                 reference_key_specs("s3genmf" if variant.s3gen.meanflow else "s3gen"),
                 frozenset({"tokenizer._mel_filters", "tokenizer.window"})),
        _builtin_voice(ckpt),
        _tokenizer(ckpt),
    ]
