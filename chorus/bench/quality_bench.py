"""``chorus bench quality``: a fixed text set through a running server or a pipeline in this
process, each request's audio checks and DNSMOS scores as JSON, and a plot that sets runs side
by side (two versions, bf16 against FP8; docs/quality.md, "chorus bench quality")."""
from __future__ import annotations

import base64
import json
import statistics
from dataclasses import dataclass
from typing import Callable

import numpy as np

from chorus.models.speech_tokens import TOKENS_PER_SECOND
from chorus.quality.checks import AudioCheck, REASONS, SAMPLE_RATE

# short and long, a question, numbers, a list, an exclamation: where runaway and truncated
# generations, loops and clipping show up
TEXTS = (
    "Hello.",
    "Thank you for calling. How can I help you today?",
    "The quick brown fox jumps over the lazy dog.",
    "Is this the right way to the train station, or should I turn left at the bridge?",
    "Your order number is 4 8 1 5, and it will arrive on Tuesday the 14th.",
    "Please bring three things: a flashlight, a warm jacket, and something to eat.",
    "That was absolutely incredible! I can't believe we actually made it to the top!",
    "The committee reviewed the proposal in detail and decided, after a long discussion, to postpone "
    "the vote until the next meeting, when more information would be available.",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old clockmaker "
    "who spent his days repairing watches and his nights looking at the stars. One evening, a stranger "
    "knocked at his door with a clock that had stopped at midnight and would not start again.",
)
METRICS = ("audio_seconds", "clipped_ratio", "silent_ratio", "rms_dbfs", "seconds_per_char", "loop_tokens")


@dataclass(frozen=True)
class QualityBenchConfig:
    texts: tuple[str, ...] = TEXTS
    seed: int = 0  # request i has seed + i
    max_new_tokens: int | None = None
    cfg_weight: float | None = None
    exaggeration: float | None = None
    tokens_per_char: float = 1.7  # in-process: the expected rate the length check judges against
    label: str | None = None

    def __post_init__(self):
        if not self.texts or not all(t.strip() for t in self.texts):
            raise ValueError("the text set must hold at least one non-empty text")


def run_server(cfg: QualityBenchConfig, url: str, *, model: str | None = None, api_key: str | None = None,
               timeout_s: float = 300.0) -> dict:
    """Each text as a streamed SSE request of pcm audio to ``url``; the checks are the server's
    (its ``done`` event), DNSMOS runs here on the audio received."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(base_url=url.rstrip("/"), timeout=timeout_s, headers=headers) as client:
        if model is None:
            models = client.get("/v1/models")
            models.raise_for_status()
            model = models.json()["data"][0]["id"]
        rows = []
        for i, text in enumerate(cfg.texts):
            body = {"model": model, "input": text, "response_format": "pcm", "stream_format": "sse",
                    "seed": cfg.seed + i, **_overrides(cfg)}
            answer = client.post("/v1/audio/speech", json=body)
            if answer.status_code != 200:
                raise RuntimeError(f"request {i} failed: {answer.status_code} {answer.text[:300]}")
            audio, done = bytearray(), None
            for line in answer.text.splitlines():
                if line.startswith("data: "):
                    event = json.loads(line[6:])
                    if event["type"] == "speech.audio.delta":
                        audio += base64.b64decode(event["audio"])
                    elif event["type"] == "speech.audio.done":
                        done = event
            if done is None:
                raise RuntimeError(f"request {i}: the stream ended without its done event")
            wav = np.frombuffer(bytes(audio), dtype="<i2").astype(np.float32) / 32767.0
            rows.append(_row(text, cfg.seed + i, done["quality"], wav))
    return _report(cfg, rows, source=url, model=model)


def run_pipeline(cfg: QualityBenchConfig, pipeline, source: str) -> dict:
    """Each text through ``pipeline`` (a started ``chorus.pipeline.Pipeline``), one at a time; the
    checks are computed here as the server computes them."""
    from chorus.pipeline.request import SpeechRequest

    rows = []
    for i, text in enumerate(cfg.texts):
        request = SpeechRequest(text, seed=cfg.seed + i, stream=True, **_overrides(cfg))
        stream = pipeline.submit(request)
        check = AudioCheck()
        for piece in stream:
            if not check.add(piece.samples):
                break
        result = stream.result()
        report = check.report(text_chars=len(text), tokens=[c.tokens for c in result.chunks],
                              expected_seconds_per_char=cfg.tokens_per_char / TOKENS_PER_SECOND)
        rows.append(_row(text, cfg.seed + i, report.as_dict(), result.wav))
    return _report(cfg, rows, source=source, model=pipeline.models.variant.name)


def _overrides(cfg: QualityBenchConfig) -> dict:
    fields = {"max_new_tokens": cfg.max_new_tokens, "cfg_weight": cfg.cfg_weight, "exaggeration": cfg.exaggeration}
    return {k: v for k, v in fields.items() if v is not None}


_scorer: Callable | None = None


def _dnsmos(wav: np.ndarray) -> dict | None:
    """DNSMOS P.835 of ``wav`` (None without chorus-tts[quality] or without audio)."""
    global _scorer
    from chorus.quality import dnsmos

    if wav.size == 0 or not dnsmos.available():
        return None
    if _scorer is None:
        _scorer = dnsmos.DNSMOS().score
    scores = _scorer(wav, SAMPLE_RATE)
    return {"sig": round(scores.sig, 4), "bak": round(scores.bak, 4), "ovrl": round(scores.ovrl, 4)}


def _row(text: str, seed: int, quality: dict, wav: np.ndarray) -> dict:
    return {"text": text, "chars": len(text), "seed": seed, "quality": quality, "dnsmos": _dnsmos(wav)}


def _report(cfg: QualityBenchConfig, rows: list[dict], *, source: str, model: str) -> dict:
    summary: dict = {"requests": len(rows), "flagged_requests": sum(1 for r in rows if r["quality"]["flags"]),
                     "flags": {reason: sum(reason in r["quality"]["flags"] for r in rows) for reason in REASONS}}
    for name in METRICS:
        values = [r["quality"][name] for r in rows if r["quality"].get(name) is not None]
        summary[f"median_{name}"] = statistics.median(values) if values else None
    scored = [r["dnsmos"] for r in rows if r["dnsmos"] is not None]
    summary["dnsmos_median"] = ({s: statistics.median(d[s] for d in scored) for s in ("sig", "bak", "ovrl")}
                                if scored else None)
    return {"bench": "quality", "label": cfg.label or model, "source": source, "model": model,
            "settings": {"seed": cfg.seed, **_overrides(cfg)}, "summary": summary, "requests": rows}


def plot(reports: list[dict], path: str) -> None:
    """Per text, each report's DNSMOS OVRL, seconds per character, silent share and RMS level,
    side by side (the reports must speak the same texts)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    texts = [r["text"] for r in reports[0]["requests"]]
    for report in reports[1:]:
        if [r["text"] for r in report["requests"]] != texts:
            raise ValueError(f"report {report['label']!r} spoke other texts than {reports[0]['label']!r}")
    panels = (("DNSMOS OVRL", lambda r: (r["dnsmos"] or {}).get("ovrl")),
              ("audio seconds per character", lambda r: r["quality"]["seconds_per_char"]),
              ("silent share", lambda r: r["quality"]["silent_ratio"]),
              ("RMS level (dBFS)", lambda r: r["quality"]["rms_dbfs"]))
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 2.6 * len(panels)), sharex=True)
    x = np.arange(len(texts))
    width = 0.8 / len(reports)
    for ax, (title, value) in zip(axes, panels):
        for k, report in enumerate(reports):
            values = [value(r) for r in report["requests"]]
            heights = [np.nan if v is None else v for v in values]
            ax.bar(x + (k - (len(reports) - 1) / 2) * width, heights, width, label=report["label"])
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[-1].set_xticks(x, [f"{i}: {len(t)} ch" for i, t in enumerate(texts)], fontsize=8)
    axes[-1].set_xlabel("text (index: characters)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
