"""The speech pipeline: one floor above the T3 engine and the vocoder stage (docs/pipeline.md).

    from chorus.pipeline import Pipeline, SpeechRequest

    with Pipeline.load("turbo", "ckpt/turbo", device="cuda") as pipe:
        result = pipe.synthesize("Hello there.", seed=7)              # SpeechResult
        for piece in pipe.submit(SpeechRequest("Hi!", stream=True)):  # AudioPiece, in order
            ...
        results = pipe.generate(["First text.", "Second text."])      # batch job

Modules load lazily so that ``chorus.pipeline.conditioning`` stays importable on its own.
"""
_EXPORTS = {
    "Pipeline": "pipeline", "PipelineConfig": "config", "Progress": "request_state",
    "SpeechRequest": "request", "SpeechResult": "request", "ChunkResult": "request",
    "SpeechStream": "stream", "AudioPiece": "stream", "PipelineError": "errors",
    "RequestPlanner": "planner", "SpeechPlan": "planner", "SpeechModels": "models",
    "ConditioningCache": "conditioning",
}
# voice conversion (Pipeline.convert) lives in chorus.conversion; its request type is here too
_CONVERSION = {"ConversionRequest": "request", "ConversionConfig": "config"}

__all__ = sorted([*_EXPORTS, *_CONVERSION])


def __getattr__(name: str):
    import importlib

    if name in _CONVERSION:
        return getattr(importlib.import_module(f"chorus.conversion.{_CONVERSION[name]}"), name)
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'chorus.pipeline' has no attribute {name!r}")
    return getattr(importlib.import_module(f"chorus.pipeline.{module}"), name)
