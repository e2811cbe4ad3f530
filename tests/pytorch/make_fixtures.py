#!/usr/bin/python3
"""Generate PyTorch conformance fixtures for selfattn::MultiHeadAttention.

Run with Debian's python3 (it has torch and numpy):

    /usr/bin/python3 tests/pytorch/make_fixtures.py

Writes tests/fixtures/mha_<case>.txt (format: see tests/pytorch/README.md).
Everything is float64 and deterministic (torch.manual_seed per case).

Before a case is written, its tensors are converted to selfattn's conventions
(nn.Linear-layout q/k/v/out weights, key_lengths, `allowed` with true = may
attend, additive `bias_mask` of shape (B or 1, H or 1, Lq, Lk)) and an
independent float64 reference written from the formulas of API.md recomputes
output, per-head weights and every gradient from the converted tensors only.
It must agree with PyTorch to 1e-12, which proves the conversions.
"""

import math
import os
import sys

import torch

torch.set_default_dtype(torch.float64)

TOL = 1e-12
HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.normpath(os.path.join(HERE, "..", "fixtures"))


# --------------------------------------------------------------------------
# Reference implementation, in selfattn's conventions (API.md), from formulas.
# --------------------------------------------------------------------------

def reference_mha(query, key, value, P, H, allowed=None, bias_mask=None,
                  key_lengths=None, causal=0):
    """query (B,Lq,E), key (B,Lk,kdim), value (B,Lk,vdim); P dict of params.

    Returns output (B,Lq,E) and per-head weights (B,H,Lq,Lk)."""
    B, Lq, E = query.shape
    Lk = key.shape[1]
    Dh = E // H

    def linear(x, w, b):
        y = x @ w.transpose(0, 1)
        return y if b is None else y + b

    q = linear(query, P["q_weight"], P.get("q_bias"))
    k = linear(key, P["k_weight"], P.get("k_bias"))
    v = linear(value, P["v_weight"], P.get("v_bias"))
    q = q.reshape(B, Lq, H, Dh).transpose(1, 2)   # (B,H,Lq,Dh)
    k = k.reshape(B, Lk, H, Dh).transpose(1, 2)   # (B,H,Lk,Dh)
    v = v.reshape(B, Lk, H, Dh).transpose(1, 2)

    # s_ij = scale * q_i . k_j + bias_ij
    s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(Dh))
    if bias_mask is not None:
        s = s + bias_mask                       # broadcast (1|B, 1|H, Lq, Lk)

    ok = torch.ones(B, H, Lq, Lk, dtype=torch.bool)
    if allowed is not None:
        ok = ok & (allowed != 0)
    if key_lengths is not None:
        j = torch.arange(Lk).view(1, 1, 1, Lk)
        ok = ok & (j < key_lengths.to(torch.int64).view(B, 1, 1, 1))
    if causal == 1:  # top_left: j <= i
        i = torch.arange(Lq).view(Lq, 1)
        j = torch.arange(Lk).view(1, Lk)
        ok = ok & (j <= i)

    s = s.masked_fill(~ok, float("-inf"))
    m = s.amax(dim=-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m) * ok
    den = e.sum(dim=-1, keepdim=True)
    p = e / torch.where(den > 0, den, torch.ones_like(den))   # empty row -> 0

    o = (p @ v).transpose(1, 2).reshape(B, Lq, E)
    out = linear(o, P["out_weight"], P.get("out_bias"))
    return out, p


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------

def maxdiff(a, b):
    return (a.detach() - b.detach()).abs().max().item() if a.numel() else 0.0


def random_bool_block(Lq, Lk, lengths, p_block=0.4):
    """PyTorch-convention bool attn_mask (True = NOT allowed), shape (Lq, Lk).

    Random, but every query row keeps at least one allowed *valid* key in every
    batch (valid = j < lengths[b]), so PyTorch never produces a NaN row."""
    block = torch.rand(Lq, Lk) < p_block
    for i in range(Lq):
        for L in lengths:
            if bool(block[i, :L].all()):
                j = int(torch.randint(0, L, (1,)).item())
                block[i, j] = False
    return block


def suffix_padding(lengths, Lk):
    """key_padding_mask (B, Lk), True = padding, padding is a suffix."""
    j = torch.arange(Lk).view(1, Lk)
    return j >= torch.tensor(lengths).view(-1, 1)


# --------------------------------------------------------------------------
# One case
# --------------------------------------------------------------------------

def run_case(name, seed, E, H, B, Lq, Lk, kdim=None, vdim=None, bias=True,
             self_attention=False, mask_kind=None, key_lengths=None):
    torch.manual_seed(seed)
    kdim = E if kdim is None else kdim
    vdim = E if vdim is None else vdim
    if self_attention:
        assert Lq == Lk and kdim == E and vdim == E

    mha = torch.nn.MultiheadAttention(
        E, H, dropout=0.0, bias=bias, batch_first=True,
        kdim=kdim, vdim=vdim, dtype=torch.float64)
    mha.eval()
    with torch.no_grad():
        # PyTorch initialises the biases to 0: make them non-zero.
        if bias:
            mha.in_proj_bias.copy_(0.5 * torch.randn(3 * E))
            mha.out_proj.bias.copy_(0.5 * torch.randn(E))

    x_q = torch.randn(B, Lq, E)
    if self_attention:
        x_k = x_q.clone()
        x_v = x_q.clone()
    else:
        x_k = torch.randn(B, Lk, kdim)
        x_v = torch.randn(B, Lk, vdim)
    # three separate leaves, so each input gets its own gradient
    query = x_q.clone().requires_grad_(True)
    key = x_k.clone().requires_grad_(True)
    value = x_v.clone().requires_grad_(True)

    # ---- masks, PyTorch convention + our convention ----
    kpm = None            # PyTorch key_padding_mask
    attn_mask = None      # PyTorch attn_mask
    ours = {}             # our-convention mask tensors
    causal = 0
    lengths = key_lengths if key_lengths is not None else [Lk] * B
    if key_lengths is not None:
        kpm = suffix_padding(key_lengths, Lk)
        ours["key_lengths"] = torch.tensor(key_lengths, dtype=torch.float64)
        # conversion check: our key_lengths reproduce the padding mask
        assert torch.equal(~kpm, torch.arange(Lk).view(1, Lk)
                           < ours["key_lengths"].view(B, 1))
    if mask_kind == "bool":
        attn_mask = random_bool_block(Lq, Lk, lengths)
        ours["allowed"] = (~attn_mask).to(torch.float64).view(1, 1, Lq, Lk)
    elif mask_kind == "float":
        attn_mask = torch.randn(Lq, Lk)
        ours["bias_mask"] = attn_mask.clone().view(1, 1, Lq, Lk)
    elif mask_kind == "float3d":
        attn_mask = torch.randn(B * H, Lq, Lk)
        # PyTorch orders the first dim as b * H + h (it views (L, B, E) as
        # (L, B*H, Dh)); so a plain reshape gives (B, H, Lq, Lk).
        ours["bias_mask"] = attn_mask.clone().view(B, H, Lq, Lk)
        for b in range(B):
            for h in range(H):
                assert torch.equal(ours["bias_mask"][b, h], attn_mask[b * H + h])
    elif mask_kind == "causal":
        attn_mask = torch.triu(torch.ones(Lq, Lk, dtype=torch.bool), diagonal=1)
        causal = 1
    else:
        assert mask_kind is None

    # ---- PyTorch forward / backward ----
    out, weights = mha(query, key, value, key_padding_mask=kpm,
                       attn_mask=attn_mask, need_weights=True,
                       average_attn_weights=False)
    assert out.shape == (B, Lq, E) and weights.shape == (B, H, Lq, Lk)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    dout = torch.randn(B, Lq, E)
    out.backward(dout)

    # ---- parameters and their gradients, our names / nn.Linear layout ----
    def split_params(get):
        P = {}
        if mha._qkv_same_embed_dim:
            P["q_weight"], P["k_weight"], P["v_weight"] = get(mha.in_proj_weight).chunk(3, dim=0)
        else:
            P["q_weight"] = get(mha.q_proj_weight)
            P["k_weight"] = get(mha.k_proj_weight)
            P["v_weight"] = get(mha.v_proj_weight)
        P["out_weight"] = get(mha.out_proj.weight)
        if bias:
            P["q_bias"], P["k_bias"], P["v_bias"] = get(mha.in_proj_bias).chunk(3, dim=0)
            P["out_bias"] = get(mha.out_proj.bias)
        else:
            assert mha.in_proj_bias is None and mha.out_proj.bias is None
        return {k: v.detach().clone().contiguous() for k, v in P.items()}

    params = split_params(lambda t: t.data)
    grads = split_params(lambda t: t.grad)
    assert params["q_weight"].shape == (E, E)
    assert params["k_weight"].shape == (E, kdim)
    assert params["v_weight"].shape == (E, vdim)
    assert params["out_weight"].shape == (E, E)

    # ---- self-check: reference from converted tensors only ----
    rP = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    rq = x_q.clone().requires_grad_(True)
    rk = x_k.clone().requires_grad_(True)
    rv = x_v.clone().requires_grad_(True)
    r_out, r_w = reference_mha(rq, rk, rv, rP, H,
                               allowed=ours.get("allowed"),
                               bias_mask=ours.get("bias_mask"),
                               key_lengths=ours.get("key_lengths"),
                               causal=causal)
    r_out.backward(dout)
    checks = {
        "output": maxdiff(r_out, out),
        "weights": maxdiff(r_w, weights),
        "d_query": maxdiff(rq.grad, query.grad),
        "d_key": maxdiff(rk.grad, key.grad),
        "d_value": maxdiff(rv.grad, value.grad),
    }
    for k in params:
        checks["d_" + k] = maxdiff(rP[k].grad, grads[k])
    worst = max(checks.values())
    bad = {k: v for k, v in checks.items() if not v <= TOL}
    if bad:
        raise AssertionError(f"{name}: reference mismatch {bad}")

    if mask_kind == "float3d":
        # The ordering check must be discriminating: the other ordering
        # (h * B + b) must NOT reproduce PyTorch.
        wrong = attn_mask.clone().view(H, B, Lq, Lk).transpose(0, 1)
        w_out, w_w = reference_mha(x_q, x_k, x_v, params, H, bias_mask=wrong)
        assert maxdiff(w_w, weights) > 1e-3, "3-D mask ordering check is not discriminating"

    # ---- write ----
    ints = [("embed_dim", E), ("num_heads", H), ("kdim", kdim), ("vdim", vdim),
            ("bias", int(bias)), ("causal", causal),
            ("self_attention", int(self_attention))]
    tensors = [("query", x_q), ("key", x_k), ("value", x_v)]
    for pname in ("q_weight", "k_weight", "v_weight", "out_weight",
                  "q_bias", "k_bias", "v_bias", "out_bias"):
        if pname in params:
            tensors.append((pname, params[pname]))
    for mname in ("key_lengths", "allowed", "bias_mask"):
        if mname in ours:
            tensors.append((mname, ours[mname]))
    tensors += [("output", out), ("weights", weights), ("dout", dout),
                ("d_query", query.grad), ("d_key", key.grad), ("d_value", value.grad)]
    for pname in ("q_weight", "k_weight", "v_weight", "out_weight",
                  "q_bias", "k_bias", "v_bias", "out_bias"):
        if pname in grads:
            tensors.append(("d_" + pname, grads[pname]))

    path = os.path.join(OUT_DIR, f"mha_{name}.txt")
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
    size = os.path.getsize(path)
    print(f"{name:18s} B={B} Lq={Lq} Lk={Lk} E={E} H={H} kdim={kdim} vdim={vdim} "
          f"bias={int(bias)}  max|ref-torch|={worst:.2e}  {size} bytes")
    return size


CASES = [
    # name, keyword arguments (kept small: the files hold every value in full precision)
    ("self_basic", dict(seed=1, E=8, H=2, B=2, Lq=5, Lk=5, self_attention=True)),
    ("key_padding", dict(seed=2, E=4, H=2, B=3, Lq=6, Lk=6, self_attention=True,
                         key_lengths=[6, 4, 1])),
    ("attn_mask_bool", dict(seed=3, E=4, H=2, B=2, Lq=5, Lk=7, mask_kind="bool")),
    ("attn_mask_float", dict(seed=4, E=4, H=2, B=2, Lq=6, Lk=6, self_attention=True,
                             mask_kind="float")),
    ("attn_mask_float3d", dict(seed=5, E=4, H=2, B=3, Lq=4, Lk=5, mask_kind="float3d")),
    ("cross_kdim_vdim", dict(seed=6, E=6, H=3, B=2, Lq=4, Lk=7, kdim=5, vdim=7)),
    ("no_bias", dict(seed=7, E=6, H=3, B=2, Lq=3, Lk=5, bias=False)),
    ("combined", dict(seed=8, E=4, H=2, B=3, Lq=4, Lk=6, key_lengths=[6, 4, 2],
                      mask_kind="bool")),
    ("causal", dict(seed=9, E=4, H=2, B=2, Lq=6, Lk=6, self_attention=True,
                    mask_kind="causal")),
]


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    print(f"torch {torch.__version__}, writing to {OUT_DIR}")
    total = 0
    for name, kw in CASES:
        total += run_case(name, **kw)
    print(f"all {len(CASES)} cases match the reference to <= {TOL:g}; total {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
