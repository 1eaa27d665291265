"""The rate of Chatterbox's S3 speech tokens, the same for every variant: the one owner of the
conversion between speech tokens and seconds of audio (no imports, so any floor may use it)."""

TOKENS_PER_SECOND = 25  # S3 speech tokens per second of audio
