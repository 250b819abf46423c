"""What ``import saturn`` does (``saturn/__init__.py`` runs it): build and load the C++
extension, register the device module and the eager kernels."""

from __future__ import annotations

import torch

from . import _runtime, cuda_autograd

_runtime.load()
# naming the device made it torch's accelerator, which breaks a CUDA backward: give CUDA
# backwards the accelerator back while they run (decision 0094)
cuda_autograd.install()

from . import device_module  # noqa: E402
from ._array_interface import install as _install_array_interface  # noqa: E402

torch._register_device_module("saturn", device_module)
torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
_install_array_interface()

# registering kernels for saturn tensors: clone and fill_, elementwise ops on GPUs,
# convolutions (on the host), ops whose CUDA kernel takes what the CPU's refuses (on the
# host, eager_host), fused LSTM/GRU cells, the custom op saturn::attention and
# scaled_dot_product_attention's fused path and its float32 gradient (sdpa, sdpa_grad)
from . import (  # noqa: E402, F401
    eager_conv,
    eager_host,
    eager_kernels,
    eager_matmul,
    eager_pointwise,
    eager_reduce,
    eager_rnn,
    fused_attention,
    sdpa,
    sdpa_grad,
)

# torch.distributed's backend for the saturn device (init_process_group("saturn")), where
# torch was built with distributed
if torch.distributed.is_available():
    from .distributed import register as _register_process_group

    _register_process_group()

# The public names live in their modules; ``saturn/__init__.py`` binds them (or, after an
# import of the compiler core alone, looks them up on first use): this module registers
# the device and imports nothing that imports it back, so torch's device autoload may run
# it while a saturn module that imports torch is itself being imported.
