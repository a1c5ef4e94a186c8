"""Numerical sources: the versions, devices and determinism settings that shape the numbers."""
from __future__ import annotations

import importlib.metadata as md
import platform


def _version(pkg: str) -> str | None:
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return None


def numerical_sources(seed: int) -> dict:
    import torch

    cuda = torch.cuda.is_available()
    out = {
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "machine": platform.machine(),
        "packages": {p: _version(p) for p in ("torch", "transformers", "accelerate", "tokenizers",
                                              "safetensors", "mlflow", "numpy", "chitchat-dataset")},
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda
        else [f"cpu:{platform.processor() or platform.machine()}"],
        "determinism": {
            "use_deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        },
        "seeds": {"study": seed, "python_random": f"random.Random('{seed}/<purpose>')",
                  "torch": seed},
    }
    return out


def set_determinism(enabled: bool) -> None:
    import torch

    torch.use_deterministic_algorithms(enabled, warn_only=True)
    torch.backends.cudnn.benchmark = not enabled
    torch.backends.cudnn.deterministic = enabled
