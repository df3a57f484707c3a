"""torch.compile on a decoder layer's non-attention work (RMSNorm + SwiGLU MLP + residual, 30 layers of SmolLM2's shapes, fp32), eager vs compiled.

    python benchmarks/engine/compile_probe.py
"""
import time, torch, torch.nn.functional as F
torch.set_num_threads(2)
H, I, L = 576, 1536, 30
ws = [(torch.randn(2 * I, H) * 0.02, torch.randn(H, I) * 0.02, torch.ones(H)) for _ in range(L)]
def mlp(x, gu, down, nw):
    h = F.rms_norm(x, (H,), nw, 1e-5)
    g, u = F.linear(h, gu).chunk(2, dim=-1)
    return x + F.linear(F.silu(g) * u, down)
cmlp = torch.compile(mlp, dynamic=True)
def run(f, x):
    for gu, d, nw in ws: x = f(x, gu, d, nw)
    return x
def bench(f, x, n=10):
    run(f, x); run(f, x)
    t = time.perf_counter()
    for _ in range(n): run(f, x)
    return (time.perf_counter() - t) / n * 1e3
t0 = time.perf_counter()
for M in (1, 16, 64):
    x = torch.randn(M, H)
    e, c = bench(mlp, x), bench(cmlp, x)
    err = (run(mlp, x) - run(cmlp, x)).abs().max().item()
    print(f"M={M}: eager {e:.2f} ms, compiled {c:.2f} ms ({e / c:.2f}x), max diff {err:.1e}", flush=True)
print(f"total incl. compile {time.perf_counter() - t0:.0f} s")
