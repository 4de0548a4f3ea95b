"""``_apply_liger_kernel_to_instance`` of the stand-in: the model's RMSNorms and gated MLPs get fused forwards,
bound to the module instances as Liger binds its own (``module.forward`` comes from this package).

The backward passes work in place as Liger's kernels do (the RMSNorm's input gradient in the output gradient's
storage, the SwiGLU's gradients in the saved gate and up projections), so that the simulated meter sees about the
temporaries Liger allocates, not those of a naive implementation."""

import types

import torch
import torch.nn.functional as F

APPLIED = []  # the keyword arguments of every call, for tests in the same process
ROWS_PER_CHUNK = 1024  # the weight gradient is summed over rows in chunks (Liger: one partial sum per SM)


class _FusedRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return ((x.float() * rstd) * weight.float()).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        grad = grad.float().contiguous()
        width = x.shape[-1]
        normed = x.float() * rstd
        grad_weight = None
        if ctx.needs_input_grad[1]:
            rows, normed_rows = grad.view(-1, width), normed.view(-1, width)
            grad_weight = torch.zeros(width, dtype=torch.float32, device=x.device)
            for start in range(0, rows.shape[0], ROWS_PER_CHUNK):
                grad_weight += (rows[start:start + ROWS_PER_CHUNK] * normed_rows[start:start + ROWS_PER_CHUNK]).sum(0)
            grad_weight = grad_weight.to(weight.dtype)
        grad.mul_(weight.float())
        dot = torch.bmm(grad.view(-1, 1, width), normed.view(-1, width, 1)).view(rstd.shape) / width
        grad_x = grad.sub_(normed.mul_(dot)).mul_(rstd)
        return grad_x.to(x.dtype), grad_weight, None


class _SiLUMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        sig = torch.sigmoid(gate)
        grad_up = torch.mul(gate, sig).mul_(grad)  # silu(gate) * grad
        grad_gate = up.mul_(grad).mul_(sig)  # in the saved up projection's storage
        grad_gate.mul_(sig.neg_().add_(1).mul_(gate).add_(1))  # silu'(gate) = sig * (1 + gate * (1 - sig))
        return grad_gate, grad_up


def _rms_norm_forward(self, hidden_states):
    eps = getattr(self, "variance_epsilon", getattr(self, "eps", 1e-6))
    return _FusedRMSNorm.apply(hidden_states, self.weight, eps)


def _swiglu_forward(self, x):
    return self.down_proj(_SiLUMul.apply(self.gate_proj(x), self.up_proj(x)))


def _apply_liger_kernel_to_instance(model, **kwargs):
    APPLIED.append(dict(kwargs))
    for module in model.modules():
        name = type(module).__name__
        if name.endswith("RMSNorm") and getattr(module, "weight", None) is not None and kwargs.get("rms_norm", True):
            module.forward = types.MethodType(_rms_norm_forward, module)
        elif all(hasattr(module, n) for n in ("gate_proj", "up_proj", "down_proj")) and kwargs.get("swiglu", True):
            module.forward = types.MethodType(_swiglu_forward, module)
