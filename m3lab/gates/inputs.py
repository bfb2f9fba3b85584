"""Fresh random inputs for the gates (never zeros, never a fixed seed)."""
import torch


def blocky(rows: int, k: int, device: torch.device, dtype=torch.float32, spread: int = 8) -> torch.Tensor:
    """[rows, k] normal values whose 32-element blocks span 2**-spread … 2**spread in magnitude."""
    x = torch.randn(rows, k, device=device)
    nb = (k + 31) // 32
    e = torch.randint(-spread, spread + 1, (rows, nb), device=device).float()
    return (x * torch.exp2(e).repeat_interleave(32, 1)[:, :k]).to(dtype)


def act_dtype(device: torch.device) -> torch.dtype:
    """bf16 on a GPU; fp16 in the CPU interpreter (whose bf16 tl.dot is wrong)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float16
