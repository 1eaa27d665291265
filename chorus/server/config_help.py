"""What ``chorus serve --help`` says of each ``ServerConfig`` field (every field needs its entry),
and the defaults it shows in words where the field's own default means more."""
from __future__ import annotations

FIELD_HELP = {
    "variant": "model variant (original, multilingual, multilingual-v3, turbo, nano)",
    "checkpoint": "checkpoint directory in the official layout or a Hugging Face repo id "
                  "(default: the variant's official repo)",
    "t3_weights": "the T3 weights' file name in the checkpoint when it is not the variant's official one "
                  "(NAME.safetensors: a multilingual finetune such as a Single Language Pack; docs/checkpoints.md)",
    "device": "auto (CUDA when present), cpu, cuda or cuda:N",
    "dtype": "auto (bf16 on CUDA, fp32 on the CPU), fp32, bf16 or fp16",
    "voice_models": "load the models that build voices from uploaded clips (off: built-in voice only)",
    "language_steps": "multilingual language steps (Chinese segmentation, Japanese readings, Hebrew diacritics): "
                      "lenient speaks a language whose package or model is missing as the reference does "
                      "(plain text, one warning); strict refuses to start instead (docs/text.md)",
    "dicta_model": "Hebrew: Dicta's ONNX model file dicta-1.0.onnx, needs chorus-tts[he] (default: the cached "
                   "copy, downloaded once unless HF_HUB_OFFLINE is set)",
    "pkuseg_model": "Chinese: a spacy-pkuseg model directory, needs chorus-tts[zh] (default: spacy-pkuseg's "
                    "spacy_ontonotes model in PKUSEG_HOME, downloaded once unless HF_HUB_OFFLINE is set)",
    "replicas": "engine replicas (of each model version unless its models entry sets its own): a number, or "
                "auto for one per visible GPU; above 1 runs on a local Ray Serve cluster (needs chorus-tts[ray]; "
                "docs/scaling.md)",
    "models": "several models in one server: entries separated by ';', each a comma-separated list of "
              "id=..., variant=..., and optionally checkpoint, version, weight, memory_share, kv_cache_bytes, "
              "max_num_seqs, vocoder_max_batch_items (and on Ray Serve replicas, min_replicas, max_replicas); "
              "in a config file an array of [[models]] tables (default: one model, variant and checkpoint, as "
              "chatterbox-<variant>; docs/models.md)",
    "host": "address to listen on",
    "port": "port to listen on",
    "api_keys": "comma-separated bearer tokens clients must send (default: none, no authentication)",
    "admin_keys": "comma-separated bearer tokens of the admin API (/v1/admin: load, swap and unload model "
                  "versions, set A/B weights), at least 16 characters each (default: none, the admin API is off)",
    "cors_origins": "comma-separated origins allowed by CORS (default: none)",
    "grpc_port": "also serve NVIDIA Riva's speech-synthesis API over gRPC on this port, with the gRPC health "
                 "service and reflection (needs chorus-tts[grpc]; docs/grpc.md) (default: none, no gRPC)",
    "grpc_tls_cert": "PEM certificate chain for TLS on the gRPC port (with grpc_tls_key) (default: none, "
                     "plaintext)",
    "grpc_tls_key": "PEM private key of grpc_tls_cert (default: none)",
    "voices_dir": "directory where uploaded voices are kept (created if missing); with voices_url, the local "
                  "cache of the voices this server uses",
    "voices_url": "object-store URL where uploaded voices are kept, shared by every replica: s3://bucket/prefix, "
                  "gs://..., az://..., any fsspec URL (needs the backend's package, e.g. pip install s3fs)",
    "voice_cache_size": "voices kept in memory (LRU)",
    "max_upload_bytes": "largest voice upload in bytes (and largest clip of a voice conversion)",
    "max_source_s": "voice conversion: the longest source clip in seconds (longer ones get 413)",
    "max_queue": "requests in flight (queued or running) before new ones get 429",
    "admission": "predicted (also refuse at once, 429 overloaded, a request predicted not to reach its first "
                 "audio within its start deadline) or queue (only max_queue and memory pressure)",
    "tokens_per_char": "admission's first guess of speech tokens per input character, until it has measured it",
    "max_input_chars": "longest input text in characters",
    "max_new_tokens": "cap on speech tokens per text chunk, 25 per second of audio (default: the variant's; "
                      "100 on a random-weight checkpoint)",
    "max_body_bytes": "largest JSON request body in bytes",
    "max_header_bytes": "largest request line plus headers in bytes (larger: 431 and the connection is closed)",
    "http_parser": "uvicorn's HTTP/1.1 parser: httptools (C; bounded by max_header_bytes here) or h11 (pure "
                   "Python, about 100 us more of event-loop CPU per request)",
    "body_timeout_s": "seconds within which a request body must arrive in full (slower: 408)",
    "start_deadline_s": "seconds a request may wait for its first audio byte (then 504 deadline_exceeded); "
                        "admission refuses requests predicted to miss it",
    "default_deadline_s": "total seconds a request may take, even while its audio flows, unless it asks for "
                          "another (none: a stream that flows and is read is never cut)",
    "max_deadline_s": "the longest total deadline a request may ask for",
    "write_stall_s": "seconds a response may wait for its client to read before the client is dropped and "
                     "its work freed",
    "memory_pressure": "KV-cache use (0-1) above which new requests get 503 while others wait for memory",
    "retry_after_s": "the least Retry-After of 429 and 503 answers (429s derive theirs from the server's "
                     "estimates)",
    "max_retry_after_s": "the largest Retry-After of a 429",
    "realtime_headroom": "admission refuses (429 overloaded) a request that would slow the streams in flight "
                         "below this multiple of real time on average, judged by the audio the server delivers "
                         "per second; 0 turns it off",
    "ws_max_connections": "WebSocket connections (WS /v1/audio/speech/stream) open at once; more are refused "
                          "with 503",
    "ws_max_message_bytes": "largest WebSocket message from a client in bytes (larger: closed with 1009)",
    "ws_max_turns": "turns open at once on one WebSocket connection (more: error too_many_turns)",
    "ws_text_buffer_chars": "characters of a WebSocket turn's text received and not yet sent to synthesis "
                            "(more: error text_buffer_full)",
    "ws_idle_timeout_s": "a WebSocket connection with no message and no open turn for this long is closed",
    "ws_chunk_min_chars": "text threshold: the shortest piece cut at a sentence end (docs/voice-agents.md)",
    "ws_chunk_max_chars": "text threshold: the longest piece; half of it is the shortest cut at a clause mark",
    "ws_chunk_max_wait_ms": "text threshold: after this long in the buffer, text of at least two words is "
                            "spoken without waiting for a boundary",
    "max_num_seqs": "rows of the T3 batch (a CFG request takes two)",
    "max_chars": "longest text chunk in characters (long texts are split at sentences)",
    "kv_cache_bytes": "bytes of the KV-cache pool (default: from gpu_memory_utilization on CUDA, 1 GiB on the CPU)",
    "kv_cache_dtype": "auto (K/V in the model's dtype) or fp8_e4m3 (half the bytes per block, so about twice "
                      "the cached positions, at a small measured accuracy cost; needs compute capability 8.9+)",
    "fp8": "comma list of stages whose GEMMs run in FP8 E4M3 with per-row scales: t3 (T3's layer projections, "
           "EngineConfig.fp8_linears; needs compute capability 8.9+; its accuracy cost is measured, its speed not yet: "
           "docs/engine.md, \"FP8 linears\"); flow is not implemented yet (default: none)",
    "gpu_memory_utilization": "fraction of GPU memory the process may use",
    "cuda_graphs": "capture CUDA graphs (T3's decode steps, its admitting steps up to t3_mixed_graph_tokens "
                   "and its sampling, and the S3Gen solver)",
    "t3_admit_ahead": "admit a request arriving while others decode in the T3 step queued ahead, instead of "
                      "waiting for the step in flight and launching the admitting step while the GPU idles; "
                      "tokens are the same either way; on by default, as measured with voice agents (docs/engine.md, "
                      "\"One-step lookahead\")",
    "t3_mixed_graph_tokens": "with cuda_graphs, a T3 step that admits up to 8 prompts beside the decoding rows with "
                             "at most this many prompt positions replays a CUDA graph instead of running eagerly "
                             "(0: they run eagerly; else at least 64, the smallest bucket; docs/engine.md, "
                             "\"CUDA graphs\")",
    "timestamp_alignment": "let requests on Llama variants (original, multilingual) that ask for timestamps time "
                           "their words from T3's aligned attention heads (method alignment); every T3 step then "
                           "keeps those heads' queries (EngineConfig.alignment). Off: they get the estimate method "
                           "(docs/timestamps.md)",
    "t3_admit_within_graphs": "with t3_mixed_graph_tokens, a T3 step that decodes admits only what the largest mixed "
                              "CUDA graph holds (8 prompt rows, t3_mixed_graph_tokens positions); the rest waits for "
                              "the next steps, so a burst of arrivals is admitted over a few graph replays instead of "
                              "one eager step that every running stream waits for (docs/engine.md, \"CUDA graphs\")",
    "vocoder_max_pass_seconds": "while streams are playing, fill a vocoder pass only while its predicted time stays "
                                "under this, so a new stream's first audio waits for a shorter pass (default: no "
                                "limit but the batch size; docs/vocoder.md, \"Pass sizing while streams run\")",
    "vocoder_first_window_tokens": "the first vocoder window of a stream, in speech tokens (25 per second): its "
                                   "first audio waits for this many of T3's tokens (and 3 more of right "
                                   "context); fewer give first audio sooner and cost a vocoder pass more per "
                                   "stream, each re-reading the voice prompt (docs/vocoder.md, \"Windows\")",
    "vocoder_first_window_prompt_tokens": "a stream's first vocoder pass (its first second of audio) reads only "
                                          "the last this many tokens of the voice prompt (25 per second), so "
                                          "first audio comes sooner under load, with less voice context in that "
                                          "second (default: the whole prompt; docs/vocoder.md, "
                                          "\"First-window prompt\")",
    "vocoder_follower_first_window_tokens": "the first vocoder window, in speech tokens (25 per second), of a "
                                            "stream added while its listener still has audio to hear (a "
                                            "voice-agent turn's later piece, a long text's later chunk): fewer "
                                            "passes per piece, its first audio needing more tokens (default 100; "
                                            "none: the first window of every stream, 20; docs/vocoder.md, "
                                            "\"Listeners\")",
    "vocoder_graph_cover_work": "a vocoder call whose shape has no CUDA graph of its own (a voice prompt shorter "
                                "than warm-up's 10 s, a shape before its capture) replays the held graph of more "
                                "rows and frames with the least padded work, if at most this many times its own, "
                                "instead of launching its kernels eagerly; none: eagerly (docs/vocoder.md, "
                                "\"CUDA graphs of the whole pass\")",
    "vocoder_encoder_attention_ops": "the flow encoder's relative-position attention: torch (the plain ops and "
                                     "SDPA), auto (one fused Triton kernel on CUDA) or triton; opt-in, not "
                                     "measured on a GPU yet (docs/vocoder.md, \"Fused encoder attention\")",
    "warmup": "warm up (capture CUDA graphs) before reporting ready",
    "canary_interval_s": "seconds between canary syntheses; one that fails in a model step makes /ready fail "
                         "until one passes (one that is late under load does not)",
    "canary_timeout_s": "deadline of a canary synthesis",
    "canary_action": "what a canary whose speech tokens or audio do not match the fingerprint its first run "
                     "recorded does: warn (default: /ready stays 200 and names it) or unready (/ready fails, the "
                     "model is degraded); both count it in chorus_canary_mismatches_total and log both fingerprints "
                     "(docs/quality.md)",
    "quality_sample_rate": "share of requests (0-1) whose audio DNSMOS scores in a background worker, when "
                           "chorus-tts[quality] is installed; 0 turns it off (docs/quality.md)",
    "stall_timeout_s": "a T3 step or S3Gen pass running longer than this, or requests in the pipeline and no "
                       "T3 token nor S3Gen pass for this long, makes /ready fail",
    "switch_interval_ms": "the interpreter's GIL switch interval in milliseconds, set at start-up (Python's "
                          "own is 5): how long a model thread waiting for the GIL may wait while the event "
                          "loop or the other stage runs Python; every eager PyTorch call of a T3 admission "
                          "takes the GIL back",
    "gc_freeze": "once the models are loaded and warm, move every object alive out of the cyclic garbage "
                 "collector's sight (gc.freeze): its full collections, which stop every thread, then traverse "
                 "only what requests created",
    "shutdown_grace_s": "on SIGTERM, seconds the streams in flight get to finish before they are cut",
    "log_format": "json (one object per line) or text",
    "log_level": "debug, info, warning or error",
    "playground": "serve the browser playground (a page to try models, voices and streamed speech) at GET /; "
                  "off: GET / answers 404",
}


# what --help shows as the default where the field's own default (None) means more
SHOWN_DEFAULTS = {"start_deadline_s": "10 on CUDA, 60 on the CPU",
                  "realtime_headroom": "1.25 on CUDA, 0 (off) on the CPU"}
