"""LiveKit Agents + Chorus: text streamed into the plugin's ``stream()`` the way an agent session
does it (LLM tokens in, audio frames out), written to a WAV file.

    pip install 'chorus-tts[livekit]'
    chorus serve --variant turbo --checkpoint ckpt/turbo --port 8000      # in another shell
    python examples/livekit_tts.py --url http://localhost:8000 --out reply.wav

In an agent, give the plugin to the session; an interruption closes the stream, which cancels the
turn on the server::

    from chorus.integrations import livekit as chorus_livekit
    session = AgentSession(stt=..., llm=..., vad=...,
                           tts=chorus_livekit.TTS(base_url="http://localhost:8000",
                                                  config=StreamConfig(model="chatterbox-turbo")))
"""
from __future__ import annotations

import argparse
import asyncio
import os
import wave

from chorus.integrations import livekit as chorus_livekit
from chorus.integrations.ws_client import StreamConfig

REPLY = "Sure! I can help with that. Your order shipped this morning, and it should arrive on Thursday."


async def speak(args) -> float:
    tts = chorus_livekit.TTS(base_url=args.url, api_key=args.api_key, sample_rate=args.sample_rate,
                             config=StreamConfig(model=args.model, voice=args.voice, seed=args.seed))
    seconds = 0.0
    async with tts, tts.stream() as stream:
        for word in args.text.split():  # an LLM's tokens, as they come
            stream.push_text(word + " ")
        stream.end_input()
        with wave.open(args.out, "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(args.sample_rate)
            async for event in stream:  # livekit.rtc.AudioFrame, ready for a room's audio track
                wav.writeframes(event.frame.data.tobytes())
                seconds += event.frame.duration
    return seconds


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://localhost:8000", help="the chorus server")
    parser.add_argument("--api-key", default=os.environ.get("CHORUS_API_KEY"), help="default: $CHORUS_API_KEY")
    parser.add_argument("--model", default="chatterbox-turbo")
    parser.add_argument("--voice", default="default")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--sample-rate", type=int, default=24_000, choices=[24_000, 16_000, 8_000])
    parser.add_argument("--text", default=REPLY)
    parser.add_argument("--out", default="reply.wav")
    args = parser.parse_args(argv)
    seconds = asyncio.run(speak(args))
    print(f"{seconds:.2f} s of speech -> {args.out}")
    return seconds


if __name__ == "__main__":
    main()
