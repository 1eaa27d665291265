"""T3: the text -> speech-token transformer of every Chatterbox variant."""
from chorus.models.t3.attention import AttentionCache, ContiguousKVCache, KVCacheFullError
from chorus.models.t3.model import T3Model
from chorus.models.t3.runner import T3SingleSequence

__all__ = ["AttentionCache", "ContiguousKVCache", "KVCacheFullError", "T3Model", "T3SingleSequence"]
