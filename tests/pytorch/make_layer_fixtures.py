#!/usr/bin/python3
"""Generate PyTorch conformance fixtures for selfattn::TransformerLayer and TransformerStack.

Run with Debian's python3 (it has torch and numpy):

    /usr/bin/python3 tests/pytorch/make_layer_fixtures.py

Writes tests/fixtures/layer_<case>.txt and tests/fixtures/stack_<case>.txt (format: see
tests/pytorch/README.md). Everything is float64 and deterministic (torch.manual_seed per case).

The layers are PyTorch's nn.TransformerEncoderLayer / nn.TransformerEncoder (batch_first=True,
dropout=0.0, training mode, so the eval fast path is never taken), except three pre-norm layers
that PyTorch 1.13 cannot build (RMSNorm, a SwiGLU feed-forward, both), which are small torch
modules written here from the formulas with the same parameter names. Every parameter, norm
weights and biases included, is overwritten with random values. Parameters and their autograd
gradients are written under their state_dict names ("grad.<name>" for the gradients).

Before a case is written, an independent float64 reference written from the formulas (layer norm
or RMS norm, attention with the masks, the feed-forward, residuals, pre or post norm) recomputes
the output and every gradient from the state dict tensors only. It must agree with PyTorch to
1e-12 (relative to the largest magnitude of the tensor, at least 1), which proves the names,
the mask conversions and the conventions the C++ side relies on.
"""

import math
import os
import sys

import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)

TOL = 1e-12
HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.normpath(os.path.join(HERE, "..", "fixtures"))

# Integer codes written to the files (the format has only integers and tensors).
ACTIVATIONS = {"relu": 0, "gelu": 1, "gelu_tanh": 2, "swiglu": 3}
NORMS = {"layer_norm": 0, "rms_norm": 1}


# --------------------------------------------------------------------------
# Hand-written modules for what PyTorch 1.13 cannot build: RMSNorm and a
# SwiGLU feed-forward. Same parameter names as nn.TransformerEncoderLayer.
# --------------------------------------------------------------------------

class RMSNorm(torch.nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight over the last dimension; no bias."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + self.eps) * self.weight


class HandPreNormLayer(torch.nn.Module):
    """Pre-norm encoder layer: x = x + SA(norm1(x)); x = x + FFN(norm2(x)).

    norm: "layer_norm" (nn.LayerNorm) or "rms_norm" (RMSNorm above).
    activation: "relu", "gelu", "gelu_tanh" or "swiglu". For swiglu linear1 maps E -> 2F:
    rows [0, F) of its output are the gate a, rows [F, 2F) the value b; h = silu(a) * b.
    """

    def __init__(self, E, H, ffn, activation, norm, eps):
        super().__init__()
        self.activation = activation
        self.ffn = ffn
        self.self_attn = torch.nn.MultiheadAttention(E, H, dropout=0.0, batch_first=True)
        self.linear1 = torch.nn.Linear(E, 2 * ffn if activation == "swiglu" else ffn)
        self.linear2 = torch.nn.Linear(ffn, E)
        make_norm = (lambda: torch.nn.LayerNorm(E, eps=eps)) if norm == "layer_norm" else (lambda: RMSNorm(E, eps))
        self.norm1 = make_norm()
        self.norm2 = make_norm()

    def act(self, h):
        if self.activation == "relu":
            return F.relu(h)
        if self.activation == "gelu":
            return F.gelu(h)
        if self.activation == "gelu_tanh":
            return F.gelu(h, approximate="tanh")
        a, b = h[..., :self.ffn], h[..., self.ffn:]
        return a * torch.sigmoid(a) * b   # silu(a) * b

    def forward(self, src, src_mask=None, src_key_padding_mask=None):
        x = src
        y = self.norm1(x)
        x = x + self.self_attn(y, y, y, attn_mask=src_mask, key_padding_mask=src_key_padding_mask,
                               need_weights=False)[0]
        x = x + self.linear2(self.act(self.linear1(self.norm2(x))))
        return x


# --------------------------------------------------------------------------
# Reference implementation from the formulas, on state dict tensors only.
# --------------------------------------------------------------------------

def ref_norm(x, sd, prefix, kind, eps):
    w = sd[prefix + "weight"]
    if kind == "rms_norm":
        assert prefix + "bias" not in sd
        ms = (x * x).sum(dim=-1, keepdim=True) / x.shape[-1]
        return x * (1.0 / torch.sqrt(ms + eps)) * w
    n = x.shape[-1]
    mu = x.sum(dim=-1, keepdim=True) / n
    var = ((x - mu) * (x - mu)).sum(dim=-1, keepdim=True) / n      # biased, as LayerNorm
    return (x - mu) / torch.sqrt(var + eps) * w + sd[prefix + "bias"]


def ref_linear(x, sd, prefix):
    return x @ sd[prefix + "weight"].transpose(0, 1) + sd[prefix + "bias"]


def ref_attention(x, sd, prefix, H, causal, key_lengths, memory=None):
    """Attention of x (B, L, E) over memory (B, Lm, E; x itself by default): self-attention, or a decoder's
    cross-attention. Key j of batch b valid iff j < key_lengths[b]; causal: j <= i."""
    mem = x if memory is None else memory
    B, L, E = x.shape
    Lm = mem.shape[1]
    Dh = E // H
    w, bias = sd[prefix + "in_proj_weight"], sd[prefix + "in_proj_bias"]
    q = (x @ w[0:E].transpose(0, 1) + bias[0:E]).reshape(B, L, H, Dh).transpose(1, 2)   # (B, H, L, Dh)
    k = (mem @ w[E:2 * E].transpose(0, 1) + bias[E:2 * E]).reshape(B, Lm, H, Dh).transpose(1, 2)
    v = (mem @ w[2 * E:].transpose(0, 1) + bias[2 * E:]).reshape(B, Lm, H, Dh).transpose(1, 2)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(Dh)
    ok = torch.ones(B, 1, L, Lm, dtype=torch.bool)
    i = torch.arange(L).view(L, 1)
    j = torch.arange(Lm).view(1, Lm)
    if causal:
        ok = ok & (j <= i)
    if key_lengths is not None:
        ok = ok & (j.view(1, 1, 1, Lm) < torch.tensor(key_lengths).view(B, 1, 1, 1))
    assert bool(ok.any(dim=-1).all()), "a query row without keys"
    s = s.masked_fill(~ok, float("-inf"))
    e = torch.exp(s - s.amax(dim=-1, keepdim=True).detach())
    p = e / e.sum(dim=-1, keepdim=True)
    o = (p @ v).transpose(1, 2).reshape(B, L, E)
    return ref_linear(o, sd, prefix + "out_proj.")


def ref_activation(h, activation, ffn):
    if activation == "relu":
        return h * (h > 0)
    if activation == "gelu":
        return 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))
    if activation == "gelu_tanh":
        return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h * h * h)))
    assert activation in ("swiglu", "swiglu_swapped") and h.shape[-1] == 2 * ffn
    a, b = h[..., :ffn], h[..., ffn:]
    if activation == "swiglu_swapped":   # the other order of gate and value: only for the check below
        a, b = b, a
    return a / (1.0 + torch.exp(-a)) * b


def ref_layer(x, sd, prefix, c, key_lengths):
    def sa(y):
        return ref_attention(y, sd, prefix + "self_attn.", c["H"], c["causal"], key_lengths)

    def ff(y):
        h = ref_activation(ref_linear(y, sd, prefix + "linear1."), c["activation"], c["ffn"])
        return ref_linear(h, sd, prefix + "linear2.")

    def norm(y, which):
        return ref_norm(y, sd, prefix + which + ".", c["norm"], c["eps"])

    if c["norm_first"]:
        x = x + sa(norm(x, "norm1"))
        return x + ff(norm(x, "norm2"))
    x = norm(x + sa(x), "norm1")
    return norm(x + ff(x), "norm2")


def ref_model(x, sd, c, key_lengths):
    if c["num_layers"] == 0:   # a single layer, names without "layers.<i>."
        return ref_layer(x, sd, "", c, key_lengths)
    for n in range(c["num_layers"]):
        x = ref_layer(x, sd, f"layers.{n}.", c, key_lengths)
    if c["final_norm"]:
        x = ref_norm(x, sd, "norm.", c["norm"], c["eps"])
    return x


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------

def scaled_diff(actual, expected):
    """max |a - e| / max(1, max |e|): the C++ side's all_close measure."""
    a, e = actual.detach(), expected.detach()
    if e.numel() == 0:
        return 0.0
    return (a - e).abs().max().item() / max(1.0, e.abs().max().item())


def randomize(module):
    """Overwrite every parameter: weights ~ N(0, 1/fan_in), norm weights 1 + N(0, 0.3^2), biases N(0, 0.5^2)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape) / math.sqrt(p.shape[1]))
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape))
            else:
                p.copy_(0.5 * torch.randn(p.shape))


def causal_mask(L, kind):
    """PyTorch attn_mask for top-left causal attention (j <= i): bool True = masked, or float -inf."""
    if kind == "bool":
        return torch.triu(torch.ones(L, L, dtype=torch.bool), diagonal=1)
    assert kind == "float"
    return torch.triu(torch.full((L, L), float("-inf")), diagonal=1)


def check_reference(name, checks):
    """checks: name -> scaled difference between the reference and PyTorch; all within TOL. Returns the largest."""
    bad = {k: v for k, v in checks.items() if not v <= TOL}
    if bad:
        raise AssertionError(f"{name}: reference mismatch {bad}")
    return max(checks.values())


def write_case(kind, name, ints, tensors, params, grads, worst, shapes):
    """Writes <kind>_<name>.txt: the data tensors, then every parameter and its gradient under its state dict name."""
    tensors = tensors + [(n, params[n]) for n in params] + [("grad." + n, grads[n]) for n in params]
    size = write_fixture(os.path.join(OUT_DIR, f"{kind}_{name}.txt"), name, ints, tensors)
    print(f"{kind + '_' + name:36s} {shapes} {len(params)} params  max scaled |ref-torch| = {worst:.2e}  {size} bytes")
    return size, worst


def write_fixture(path, name, ints, tensors):
    with open(path, "w") as f:
        f.write(f"# selfattn fixture v1 {name}\n")
        for n, v in ints:
            f.write(f"int {n} {int(v)}\n")
        for n, t in tensors:
            t = t.detach().to(torch.float64).contiguous()
            assert torch.isfinite(t).all(), (name, n)
            dims = " ".join(str(d) for d in t.shape)
            f.write(f"tensor {n} {t.dim()} {dims}\n")
            f.write(" ".join("%.17g" % x for x in t.reshape(-1).tolist()))
            f.write("\n")
    return os.path.getsize(path)


# --------------------------------------------------------------------------
# One case
# --------------------------------------------------------------------------

def run_case(name, seed, B, L, E, H, ffn, norm_first, activation, norm="layer_norm", eps=1e-5,
             causal=None, key_lengths=None, num_layers=0, final_norm=False, hand=False):
    """num_layers = 0: one layer (layer_<name>.txt); > 0: an encoder stack (stack_<name>.txt).
    causal: None, "bool" or "float" (the PyTorch mask's kind; both are top-left causal).
    hand: use HandPreNormLayer instead of nn.TransformerEncoderLayer."""
    torch.manual_seed(seed)
    if hand:
        assert norm_first and num_layers == 0
        model = HandPreNormLayer(E, H, ffn, activation, norm, eps)
    else:
        assert norm == "layer_norm" and activation != "swiglu"
        act = {"relu": "relu", "gelu": "gelu",
               "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[activation]
        layer = torch.nn.TransformerEncoderLayer(
            E, H, dim_feedforward=ffn, dropout=0.0, activation=act, layer_norm_eps=eps,
            batch_first=True, norm_first=norm_first)
        if num_layers == 0:
            model = layer
        else:
            model = torch.nn.TransformerEncoder(
                layer, num_layers=num_layers,
                norm=torch.nn.LayerNorm(E, eps=eps) if final_norm else None,
                enable_nested_tensor=False)
    randomize(model)     # after the clones of a stack: every layer gets its own values
    model.train()        # dropout is 0; training mode keeps PyTorch off its eval fast path
    for p in model.parameters():
        p.requires_grad_(True)

    x = torch.randn(B, L, E)
    src = x.clone().requires_grad_(True)
    src_mask = causal_mask(L, causal) if causal is not None else None
    kpm = None
    if key_lengths is not None:
        assert len(key_lengths) == B and all(1 <= n <= L for n in key_lengths)
        kpm = torch.arange(L).view(1, L) >= torch.tensor(key_lengths).view(B, 1)   # True = padding

    if num_layers == 0:
        out = model(src, src_mask=src_mask, src_key_padding_mask=kpm)
    else:
        out = model(src, mask=src_mask, src_key_padding_mask=kpm)
    assert out.shape == (B, L, E) and torch.isfinite(out).all()
    dout = torch.randn(B, L, E)
    (out * dout).sum().backward()

    params = {n: p.detach().clone() for n, p in model.state_dict().items()}
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    assert set(params) == set(grads), (name, set(params) ^ set(grads))
    for n in params:
        assert not torch.all(params[n] == params[n].reshape(-1)[0]), f"{name}: {n} is constant"
        if n.startswith("layers.") and not n.startswith("layers.0."):   # distinct values per layer
            assert not torch.equal(params[n], params["layers.0." + n.split(".", 2)[2]]), f"{name}: {n}"

    # ---- self-check: the reference from the state dict tensors only ----
    c = dict(H=H, ffn=ffn, norm_first=norm_first, activation=activation, norm=norm, eps=eps,
             causal=causal is not None, num_layers=num_layers, final_norm=final_norm)
    rsd = {n: t.clone().requires_grad_(True) for n, t in params.items()}
    rx = x.clone().requires_grad_(True)
    r_out = ref_model(rx, rsd, c, key_lengths)
    (r_out * dout).sum().backward()
    checks = {"output": scaled_diff(r_out, out), "grad.x": scaled_diff(rx.grad, src.grad)}
    for n in params:
        checks["grad." + n] = scaled_diff(rsd[n].grad, grads[n])
    worst = check_reference(name, checks)

    # The case must discriminate what it is about: a wrong choice must change the output.
    def differs(lengths=key_lengths, **change):
        with torch.no_grad():
            return scaled_diff(ref_model(x, params, dict(c, **change), lengths), out) > 1e-6
    assert differs(norm_first=not norm_first), name
    if causal is not None:
        assert differs(causal=False), name
    if key_lengths is not None:
        assert differs(lengths=None), name
    if activation == "swiglu":
        assert differs(activation="swiglu_swapped"), name
    if activation == "gelu_tanh":
        assert differs(activation="gelu"), name
    if activation == "gelu":
        assert differs(activation="gelu_tanh"), name
    if eps != 1e-5:
        assert differs(eps=1e-5), name

    # ---- write ----
    ints = [("embed_dim", E), ("num_heads", H), ("ffn_dim", ffn), ("norm_first", int(norm_first)),
            ("causal", int(causal is not None)), ("num_layers", max(num_layers, 1)),
            ("final_norm", int(final_norm)), ("activation", ACTIVATIONS[activation]),
            ("norm_kind", NORMS[norm]), ("bias", 1)]
    tensors = [("norm_eps", torch.tensor([eps]))]
    if key_lengths is not None:
        tensors.append(("key_lengths", torch.tensor(key_lengths, dtype=torch.float64)))
    tensors += [("x", x), ("dout", dout), ("output", out), ("grad.x", src.grad)]
    return write_case("layer" if num_layers == 0 else "stack", name, ints, tensors, params, grads, worst,
                      f"B={B} L={L} E={E} H={H} F={ffn}")


CASES = [
    # name, keyword arguments (small: the files hold every value in full precision)
    ("post_relu", dict(seed=101, B=2, L=5, E=8, H=2, ffn=16, norm_first=False, activation="relu")),
    ("post_gelu_causal", dict(seed=102, B=2, L=6, E=8, H=4, ffn=12, norm_first=False, activation="gelu",
                              causal="float")),
    ("pre_relu_padding", dict(seed=103, B=2, L=7, E=6, H=3, ffn=10, norm_first=True, activation="relu",
                              key_lengths=[7, 3])),
    ("pre_gelu_causal_padding", dict(seed=104, B=3, L=5, E=8, H=2, ffn=16, norm_first=True, activation="gelu",
                                     causal="bool", key_lengths=[5, 2, 1])),
    ("post_relu_causal_padding", dict(seed=105, B=2, L=6, E=8, H=2, ffn=16, norm_first=False, activation="relu",
                                      causal="bool", key_lengths=[4, 6])),
    ("pre_gelu_tanh_eps", dict(seed=106, B=2, L=5, E=8, H=2, ffn=16, norm_first=True, activation="gelu_tanh",
                               eps=1e-3, causal="float")),
    ("post_gelu_tanh_eps_padding", dict(seed=107, B=2, L=6, E=4, H=1, ffn=8, norm_first=False,
                                        activation="gelu_tanh", eps=0.05, key_lengths=[3, 6])),
    ("rms_norm", dict(seed=108, B=2, L=6, E=8, H=2, ffn=16, norm_first=True, activation="gelu",
                      norm="rms_norm", eps=1e-6, causal="bool", key_lengths=[6, 2], hand=True)),
    ("swiglu", dict(seed=109, B=2, L=5, E=8, H=2, ffn=12, norm_first=True, activation="swiglu",
                    key_lengths=[5, 3], hand=True)),
    ("rms_norm_swiglu", dict(seed=110, B=2, L=7, E=8, H=4, ffn=10, norm_first=True, activation="swiglu",
                             norm="rms_norm", eps=1e-5, causal="bool", hand=True)),
    # encoder stacks
    ("pre_final_norm", dict(seed=201, B=2, L=6, E=8, H=2, ffn=16, norm_first=True, activation="gelu",
                            causal="bool", key_lengths=[6, 3], num_layers=2, final_norm=True)),
    ("post", dict(seed=202, B=3, L=5, E=6, H=2, ffn=12, norm_first=False, activation="relu",
                  key_lengths=[5, 1, 4], num_layers=2)),
]


def write_cases(cases, run):
    """Runs run(name, **keywords) for every case; each writes its file and returns (bytes, worst difference)."""
    os.makedirs(OUT_DIR, exist_ok=True)
    print(f"torch {torch.__version__}, writing to {OUT_DIR}")
    total, worst = 0, 0.0
    for name, kw in cases:
        size, w = run(name, **kw)
        total += size
        worst = max(worst, w)
    print(f"all {len(cases)} cases match the reference to {worst:.2e} (<= {TOL:g}); total {total} bytes")
    return 0


def main():
    return write_cases(CASES, run_case)


if __name__ == "__main__":
    sys.exit(main())
