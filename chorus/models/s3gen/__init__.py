"""S3Gen: speech tokens -> mel (the flow) -> 24 kHz waveform (HiFT).

``S3Gen`` (in ``chorus.models.s3gen.s3gen``) assembles the parts and loads the official file;
it is imported from there so that using the flow or HiFT alone does not load the voice models.
"""
from chorus.models.s3gen.encoder import EncoderConfig, UpsampleConformerEncoder
from chorus.models.s3gen.estimator import ConditionalDecoder, EstimatorConfig
from chorus.models.s3gen.flow import FlowConfig, FlowDecoder
from chorus.models.s3gen.flow_matching import ConditionalFlowMatching, time_grid
from chorus.models.s3gen.hift import HiFTConfig, HiFTGenerator

__all__ = [
    "ConditionalDecoder",
    "ConditionalFlowMatching",
    "EncoderConfig",
    "EstimatorConfig",
    "FlowConfig",
    "FlowDecoder",
    "HiFTConfig",
    "HiFTGenerator",
    "UpsampleConformerEncoder",
    "time_grid",
]
