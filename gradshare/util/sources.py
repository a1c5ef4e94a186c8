"""Numerical sources: the versions, devices and determinism settings that shape the numbers."""
from __future__ import annotations

import importlib.metadata as md
import platform


def package_version(pkg: str) -> str | None:
    """An installed distribution's version, None where it is not installed."""
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
        "packages": {p: package_version(p) for p in ("torch", "transformers", "accelerate", "tokenizers",
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


def set_determinism(enabled: bool, compiles: bool) -> None:
    """Deterministic algorithms on or off (a warning, not an error, where an op has none).

    `compiles`: whether this process runs `torch.compile`. PyTorch's switch
    (`torch.use_deterministic_algorithms`) also sets Inductor's own `deterministic` flag, and
    so imports `torch._inductor`: about 2 CPU-s in every process that calls it (each rank of
    each arm, each prepare), for a flag that only compiled code reads. A process that compiles
    nothing sets the same switch of the eager ops alone (the one `use_deterministic_algorithms`
    sets beside Inductor's)."""
    import torch

    if compiles:
        torch.use_deterministic_algorithms(enabled, warn_only=True)
    else:
        torch._C._set_deterministic_algorithms(enabled, warn_only=True)
    torch.backends.cudnn.benchmark = not enabled
    torch.backends.cudnn.deterministic = enabled
