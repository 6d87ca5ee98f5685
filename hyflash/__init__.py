"""hyflash: lossless speculative decoding with compact HyFlash drafters, and relaxed on-policy distillation."""

from hyflash.decoding import GenerationResult, generate
from hyflash.errors import HyflashError
from hyflash.sampling import SamplingConfig
from hyflash.targets import HFTarget, load_target

__all__ = ["GenerationResult", "HFTarget", "HyflashError", "SamplingConfig", "generate", "load_target"]
__version__ = "0.1.0"
