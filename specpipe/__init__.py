"""specpipe: a staged, lossless speculative decoding pipeline on MLX."""

__version__ = "0.1.0"
