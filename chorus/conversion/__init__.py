"""Voice conversion: speech in, the same words in another voice out (docs/voice-conversion.md).

The source clip is tokenized by the S3 speech tokenizer and its tokens are vocoded by S3Gen with
the target voice's S3Gen conditioning, as the reference's ``ChatterboxVC`` does; in Chorus the
tokens go through the pipeline's vocoder stage, batched with text-to-speech jobs
(``Pipeline.convert``), or through a stage of their own in ``chorus vc``.

Modules load lazily so that importing the package costs nothing.
"""
_EXPORTS = {
    "ConversionConfig": "config",
    "SourceAudio": "source", "SourceAudioError": "source", "prepare_source": "source",
    "ConversionRequest": "request",
    "ConversionPlan": "planner", "ConversionPlanner": "planner", "check_s3gen_kind": "planner",
    "convert_on_stage": "runner",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'chorus.conversion' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"chorus.conversion.{module}"), name)
