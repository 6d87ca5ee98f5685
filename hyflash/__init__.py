"""hyflash: lossless speculative decoding with compact HyFlash drafters, and relaxed on-policy distillation."""

from hyflash.decoding import GenerationResult, generate
from hyflash.errors import HyflashError
from hyflash.sampling import SamplingConfig
from hyflash.targets import Target

__all__ = ["GenerationResult", "HyflashError", "SamplingConfig", "Target", "generate"]
__version__ = "0.1.0"
