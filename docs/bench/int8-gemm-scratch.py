"""Scratch: int8 GEMM paths vs bf16 on this AMX CPU, shapes M x K x N."""
import time, torch
torch.manual_seed(0)
def best(f, n=3):
    f(); b = 1e9
    for _ in range(n):
        s = time.perf_counter(); f(); b = min(b, time.perf_counter() - s)
    return b
for M, K, N in ((7200, 1024, 4096), (300, 2048, 6144)):
    x = torch.randn(M, K); w = torch.randn(N, K) * 0.05
    xb, lin = x.bfloat16(), torch.nn.Linear(K, N, bias=False)
    lin.weight.data = w
    linb = torch.nn.Linear(K, N, bias=False).bfloat16(); linb.weight.data = w.bfloat16()
    dyn = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear}, dtype=torch.qint8)
    # oneDNN qlinear: u8 activations (per-tensor, zero point 128 -> here symmetric s8 range via u8), s8 weights per channel
    w_scale = w.abs().amax(1) / 127; qw = torch.round(w / w_scale[:, None]).clamp(-128, 127).to(torch.int8)
    packed = torch.ops.onednn.qlinear_prepack(qw, [M, K])
    zp = torch.zeros(N, dtype=torch.int64)
    def q_onednn():  # quantize x (dynamic per-tensor), int8 GEMM, bf16 out
        scale = float(x.abs().max()) / 127
        qx = torch.clamp(torch.round(x / scale) + 128, 0, 255).to(torch.uint8)
        return torch.ops.onednn.qlinear_pointwise(qx, scale, 128, packed, w_scale, zp, None, 1.0, 0, torch.bfloat16, "none", [], "")
    def q_onednn_from_bf16():
        scale = float(xb.abs().max()) / 127
        qx = torch.clamp(torch.round(xb.float() / scale) + 128, 0, 255).to(torch.uint8)
        return torch.ops.onednn.qlinear_pointwise(qx, scale, 128, packed, w_scale, zp, None, 1.0, 0, torch.bfloat16, "none", [], "")
    qx_pre = torch.clamp(torch.round(x / (float(x.abs().max()) / 127)) + 128, 0, 255).to(torch.uint8)
    def q_gemm_only():
        return torch.ops.onednn.qlinear_pointwise(qx_pre, float(x.abs().max()) / 127, 128, packed, w_scale, zp, None, 1.0, 0, torch.bfloat16, "none", [], "")
    ref = x @ w.T
    err = (q_onednn().float() - ref).norm() / ref.norm()
    with torch.inference_mode():
        r = {"bf16": best(lambda: linb(xb)), "fp32": best(lambda: lin(x)), "dyn_int8": best(lambda: dyn(x)),
             "onednn_int8+quant": best(q_onednn), "onednn_int8 gemm only": best(q_gemm_only),
             "bf16 again": best(lambda: linb(xb))}
    print(f"{M}x{K}x{N} rel err onednn {err:.4f}", {k: round(v, 4) for k, v in r.items()},
          {k: round(r['bf16'] / v, 2) for k, v in r.items()})
