"""S3Gen: speech tokens -> mel (the flow) -> 24 kHz waveform (HiFT)."""
from chorus.models.s3gen.encoder import EncoderConfig, UpsampleConformerEncoder
from chorus.models.s3gen.estimator import ConditionalDecoder, EstimatorConfig
from chorus.models.s3gen.flow import FlowConfig, FlowDecoder
from chorus.models.s3gen.flow_matching import ConditionalFlowMatching, time_grid

__all__ = [
    "ConditionalDecoder",
    "ConditionalFlowMatching",
    "EncoderConfig",
    "EstimatorConfig",
    "FlowConfig",
    "FlowDecoder",
    "UpsampleConformerEncoder",
    "time_grid",
]
