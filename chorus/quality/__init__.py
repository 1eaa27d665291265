"""What the server's audio sounded like: per-request checks (``checks``), the canary's integrity
fingerprint (``fingerprint``) and the sampled perceptual score (``dnsmos``, scored in a worker
process by ``sampler`` and ``worker``; needs ``chorus-tts[quality]``). docs/quality.md explains
every signal and its threshold."""
