"""A probe-server preload that makes the server look as if an import had initialized CUDA (what peft and
bitsandbytes do on a GPU machine). Only forked probes inherit the patch; spawned ones start clean."""

import torch

torch.cuda.is_initialized = lambda: True
