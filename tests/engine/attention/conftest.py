"""Without a GPU, run the Triton kernels under the Triton interpreter.

Must happen before ``chorus.engine.attention.triton_paged`` is first imported: ``triton.jit``
reads ``TRITON_INTERPRET`` when it decorates a kernel. With a GPU the kernels compile for
real, and only the ``gpu`` tests exercise them.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
