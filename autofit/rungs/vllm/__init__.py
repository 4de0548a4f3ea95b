"""vLLM's settings as rungs (``_rung``: its context, its share of the card, its sleep between generations;
``_server``: its placement on some of the node's GPUs as a server) and its probe step (``_probe``, the child's:
vLLM started in the probe as TRL starts it, its tensors held apart from the trainer's, what it holds read back from
vLLM itself; in server mode, ``trl vllm-serve`` started beside the probe and stopped with everything it started)."""

from autofit.rungs.vllm._rung import VllmContext, VllmShare, VllmSleep
from autofit.rungs.vllm._server import VllmServer

__all__ = ["VllmContext", "VllmServer", "VllmShare", "VllmSleep"]
