"""tiny: a pure-Python test kernel."""

import torch


def scale(x: torch.Tensor, factor: float = 2.0) -> torch.Tensor:
    """x times factor."""
    return x * factor


__all__ = ["scale"]
