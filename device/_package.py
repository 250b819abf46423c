"""What ``import saturn`` does (``saturn/__init__.py`` runs it): build and load the C++
extension, register the device module, the eager kernels and the public names."""

from __future__ import annotations

import torch

from . import _runtime

_runtime.load()

from . import device_module  # noqa: E402
from ._array_interface import install as _install_array_interface  # noqa: E402

torch._register_device_module("saturn", device_module)
torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
_install_array_interface()

# registering kernels for saturn tensors: clone and fill_, elementwise ops on GPUs,
# convolutions (on the host), fused LSTM/GRU cells, the custom op saturn::attention and
# scaled_dot_product_attention's fused path (sdpa)
from . import (  # noqa: E402, F401
    eager_conv,
    eager_kernels,
    eager_matmul,
    eager_pointwise,
    eager_reduce,
    eager_rnn,
    fused_attention,
    sdpa,
)
from .backend import NotCompiledError, stats  # noqa: E402
from .custom_ops import custom_op  # noqa: E402
from .explain import explain  # noqa: E402

device_count = device_module.device_count
fallback_counts = device_module.fallback_counts
memory_stats = device_module.memory_stats

__all__ = [
    "NotCompiledError",
    "custom_op",
    "device_count",
    "device_module",
    "explain",
    "fallback_counts",
    "memory_stats",
    "stats",
]
