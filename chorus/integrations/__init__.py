"""Clients of a running ``chorus serve`` for voice-agent frameworks (docs/voice-agents.md,
"Pipecat and LiveKit"): ``ws_client`` speaks the voice-agent WebSocket; ``pipecat`` and
``livekit`` adapt it to those frameworks (extras ``chorus-tts[pipecat]``, ``[livekit]``).
Nothing here imports the engine, so an agent process needs no model code."""
