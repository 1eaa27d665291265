"""The speech pipeline: one floor above the T3 engine and the vocoder stage (see docs/pipeline.md)."""
