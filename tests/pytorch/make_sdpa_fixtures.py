#!/usr/bin/python3
"""Generate PyTorch conformance fixtures for scaled_dot_product_attention with soft-capping and sinks.

Run with Debian's python3 (it has torch and numpy):

    /usr/bin/python3 tests/pytorch/make_sdpa_fixtures.py

Writes tests/fixtures/sdpa_<case>.txt (format: tests/pytorch/README.md). Everything is float64 and
deterministic (torch.manual_seed per case).

Shapes: q (B, H, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv); query head h reads key/value head
h // (H // Hkv). With off = Lk - Lq the scores of query row i and key j are

    raw_ij = scale * q_i . k_j                       (scale = 1/sqrt(D) unless the case gives one)
    s_ij   = c * tanh(raw_ij / c)                    (soft-capping, only with softcap c > 0)
    s_ij  += bias_ij - slope_h * |i + off - j|       (optional additive bias, optional ALiBi)
    s_ij   = -inf for a masked key                   (key padding, causal top_left / bottom_right)

and, with an optional learned sink logit sink_h per query head that joins the softmax but has no value,

    P_ij  = exp(s_ij) / (sum_{allowed j'} exp(s_ij') + exp(sink_h)),   out_i = sum_j P_ij v_j,
    lse_i = log(sum_{allowed j} exp(s_ij) + exp(sink_h)).

PyTorch 1.13 has none of this built in, so the "PyTorch" side is these formulas written with torch
tensor operations (the sink as an extra logit column, softmax, the column dropped) and the gradients
come from autograd of the loss (out * dout).sum().

Before a case is written, an independent float64 reference written from the formulas with plain
numpy loops (one query row at a time, no sink column) must reproduce out, lse and weights to 1e-12,
and central finite differences of the reference's loss on a few entries of q, k, v, bias and every
sink must match the autograd gradients to 1e-7. Each case must also be discriminating: without the
soft-capping, without the sinks, or with the cap applied after the additive terms, the output
changes by more than 1e-3.
"""

import math
import os
import sys

import numpy as np
import torch

from make_layer_fixtures import OUT_DIR, scaled_diff

torch.set_default_dtype(torch.float64)

TOL = 1e-12        # reference vs torch, forward
FD_STEP = 1e-6     # central differences
FD_TOL = 1e-7      # finite differences vs autograd, |fd - ag| / max(1, |ag|)
DISCRIMINATE = 1e-3

CAUSAL = {None: 0, "top_left": 1, "bottom_right": 2}


# --------------------------------------------------------------------------
# The "PyTorch" side: the formulas as torch tensor operations, autograd for the gradients.
# --------------------------------------------------------------------------

def allowed_mask(B, Lq, Lk, causal, key_lengths):
    """(B, 1, Lq, Lk) bool, true = may attend."""
    i = torch.arange(Lq).view(1, 1, Lq, 1)
    j = torch.arange(Lk).view(1, 1, 1, Lk)
    ok = torch.ones(B, 1, Lq, Lk, dtype=torch.bool)
    if key_lengths is not None:
        ok = ok & (j < torch.tensor(key_lengths).view(B, 1, 1, 1))
    if causal == "top_left":
        ok = ok & (j <= i)
    elif causal == "bottom_right":
        ok = ok & (j <= i + (Lk - Lq))
    else:
        assert causal is None
    return ok


def torch_sdpa(q, k, v, scale, softcap=None, bias=None, alibi_slopes=None, key_lengths=None, causal=None,
               sinks=None):
    """Returns out (B, H, Lq, Dv), lse (B, H, Lq), weights (B, H, Lq, Lk). scale is a float."""
    B, H, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    assert H % Hkv == 0
    kv_head = torch.arange(H) // (H // Hkv)
    k, v = k[:, kv_head], v[:, kv_head]          # (B, H, Lk, .): autograd sums over the query heads of a group
    s = scale * (q @ k.transpose(-1, -2))
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias                               # broadcast (1|B, 1|H, 1|Lq, 1|Lk)
    if alibi_slopes is not None:
        distance = (torch.arange(Lq).view(Lq, 1) + (Lk - Lq) - torch.arange(Lk).view(1, Lk)).abs()
        s = s - alibi_slopes.view(1, H, 1, 1) * distance
    s = s.masked_fill(~allowed_mask(B, Lq, Lk, causal, key_lengths), float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.view(1, H, 1, 1).expand(B, H, Lq, 1)], dim=-1)
    p = torch.softmax(s, dim=-1)[..., :Lk]
    lse = torch.logsumexp(s, dim=-1)
    return p @ v, lse, p


# --------------------------------------------------------------------------
# Independent reference: plain numpy loops, one query row at a time.
# --------------------------------------------------------------------------

def reference_sdpa(q, k, v, scale, softcap=None, bias=None, alibi_slopes=None, key_lengths=None, causal=None,
                   sinks=None, cap_last=False):
    """numpy float64 arrays in, (out, lse, weights) out. A row with no allowed key and no sink has out 0 and
    lse -inf. cap_last applies the cap after the additive terms (wrong; only for the discrimination check)."""
    B, H, Lq, D = q.shape
    Hkv, Lk, Dv = k.shape[1], k.shape[2], v.shape[3]
    group = H // Hkv
    off = Lk - Lq
    out = np.zeros((B, H, Lq, Dv))
    lse = np.full((B, H, Lq), -np.inf)
    weights = np.zeros((B, H, Lq, Lk))

    def cap(x):
        return softcap * math.tanh(x / softcap) if softcap is not None else x

    for b in range(B):
        for h in range(H):
            g = h // group
            for i in range(Lq):
                logits = {}
                for j in range(Lk):
                    if key_lengths is not None and not j < key_lengths[b]:
                        continue
                    if causal == "top_left" and j > i:
                        continue
                    if causal == "bottom_right" and j > i + off:
                        continue
                    s = scale * float(np.dot(q[b, h, i], k[b, g, j]))
                    if not cap_last:
                        s = cap(s)
                    if bias is not None:
                        s += bias[tuple(x if n > 1 else 0 for x, n in zip((b, h, i, j), bias.shape))]
                    if alibi_slopes is not None:
                        s -= alibi_slopes[h] * abs(i + off - j)
                    if cap_last:
                        s = cap(s)
                    logits[j] = s
                terms = list(logits.values()) + ([sinks[h]] if sinks is not None else [])
                if not terms:
                    continue
                m = max(terms)
                den = sum(math.exp(t - m) for t in terms)
                lse[b, h, i] = m + math.log(den)
                for j, s in logits.items():
                    weights[b, h, i, j] = math.exp(s - m) / den
                    out[b, h, i] += weights[b, h, i, j] * v[b, g, j]
    return out, lse, weights


# --------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------

def forward_diff(actual, expected):
    """scaled_diff that also accepts equal infinities (lse of an empty row)."""
    a, e = torch.as_tensor(actual), torch.as_tensor(expected)
    assert torch.equal(torch.isinf(a), torch.isinf(e)) and torch.equal(a[torch.isinf(a)], e[torch.isinf(e)])
    fin = torch.isfinite(e)
    return scaled_diff(a[fin], e[fin])


def check_forward(name, out, lse, weights, ref):
    """torch's out, lse and weights against the reference's (a tuple of the same three); returns the worst."""
    checks = {"out": forward_diff(out, ref[0]), "lse": forward_diff(lse, ref[1]),
              "weights": forward_diff(weights, ref[2])}
    bad = {n: d for n, d in checks.items() if not d <= TOL}
    if bad:
        raise AssertionError(f"{name}: reference mismatch {bad}")
    return max(checks.values())


def fd_entries(grad, rng, count=5):
    """The entry with the largest |gradient| and `count` random entries (all entries if fewer)."""
    n = grad.numel()
    if n <= count + 1:
        return list(range(n))
    picks = [int(grad.abs().reshape(-1).argmax())] + [int(x) for x in rng.choice(n, count, replace=False)]
    return sorted(set(picks))


def check_gradients(name, inputs, grads, dout, kw, seed):
    """Central differences of the reference loss sum(out * dout) against autograd, on a few entries of each
    differentiable input (every entry of sinks). inputs, grads: name -> numpy array. Returns the worst
    |fd - ag| / max(1, |ag|) and the number of entries checked."""
    rng = np.random.RandomState(seed)

    def loss(values):
        out = reference_sdpa(values["q"], values["k"], values["v"], bias=values.get("bias"),
                             sinks=values.get("sinks"), **kw)[0]
        return float((out * dout).sum())

    worst, count = 0.0, 0
    for n, g in grads.items():
        flat_g = g.reshape(-1)
        for e in fd_entries(torch.from_numpy(g), rng, count=g.size if n == "sinks" else 5):
            values = {m: x.copy() for m, x in inputs.items()}
            values[n].reshape(-1)[e] += FD_STEP
            up = loss(values)
            values[n].reshape(-1)[e] -= 2 * FD_STEP
            down = loss(values)
            fd = (up - down) / (2 * FD_STEP)
            err = abs(fd - flat_g[e]) / max(1.0, abs(flat_g[e]))
            if not err <= FD_TOL:
                raise AssertionError(f"{name}: d{n}[{e}] autograd {flat_g[e]!r} finite difference {fd!r}")
            worst, count = max(worst, err), count + 1
    return worst, count


def check_discriminating(name, inputs, out, kw):
    """Without the cap, without the sinks, or with the cap after the additive terms, out changes by > 1e-3.
    Returns {what was changed: max |change of out|}."""
    def change(**wrong):
        args = dict(kw, bias=inputs.get("bias"), sinks=inputs.get("sinks"))
        args.update(wrong)
        o = reference_sdpa(inputs["q"], inputs["k"], inputs["v"], **args)[0]
        return float(np.abs(o - out).max())

    changes = {}
    if kw["softcap"] is not None:
        changes["no softcap"] = change(softcap=None)
        if "bias" in inputs or kw["alibi_slopes"] is not None:
            changes["cap after bias/ALiBi"] = change(cap_last=True)
    if "sinks" in inputs:
        changes["no sinks"] = change(sinks=None)
    assert changes, name
    bad = {n: d for n, d in changes.items() if not d > DISCRIMINATE}
    if bad:
        raise AssertionError(f"{name}: not discriminating {bad}")
    return changes


def check_empty_rows(name, out, lse, ok, sinks):
    """Rows without an allowed key: out 0 and lse = sink_h with sinks; the cases without sinks have none.
    Returns the number of such rows."""
    empty = ~ok.any(dim=-1).expand(lse.shape)                    # (B, H, Lq)
    if sinks is None:
        assert not empty.any(), f"{name}: a row without keys and without a sink"
        return 0
    assert torch.equal(out[empty], torch.zeros_like(out[empty])), name
    assert torch.equal(lse[empty], sinks.view(1, -1, 1).expand(lse.shape)[empty]), name
    return int(empty.sum())


def write_fixture(path, name, ints, tensors):
    """File format v1; like make_layer_fixtures.write_fixture, but lse may hold -inf (printed "-inf")."""
    with open(path, "w") as f:
        f.write(f"# selfattn fixture v1 {name}\n")
        for n, v in ints:
            f.write(f"int {n} {int(v)}\n")
        for n, t in tensors:
            t = t.detach().to(torch.float64).contiguous()
            if n == "lse":
                assert not (torch.isnan(t) | (t == float("inf"))).any(), (name, n)
            else:
                assert torch.isfinite(t).all(), (name, n)
            dims = " ".join(str(d) for d in t.shape)
            f.write(f"tensor {n} {t.dim()} {dims}\n")
            f.write(" ".join("%.17g" % x for x in t.reshape(-1).tolist()))
            f.write("\n")
    return os.path.getsize(path)


# --------------------------------------------------------------------------
# One case
# --------------------------------------------------------------------------

def run_case(name, seed, B, H, Hkv, Lq, Lk, D, Dv, causal=None, key_lengths=None, bias_shape=None,
             alibi_slopes=None, softcap=None, sinks=False, scale=None, qk_gain=1.0):
    """qk_gain multiplies q and k, so that with a softcap many raw scores exceed the cap."""
    torch.manual_seed(seed)
    q = qk_gain * torch.randn(B, H, Lq, D)
    k = qk_gain * torch.randn(B, Hkv, Lk, D)
    v = torch.randn(B, Hkv, Lk, Dv)
    inputs = {"q": q, "k": k, "v": v}
    if bias_shape is not None:
        assert len(bias_shape) == 4
        inputs["bias"] = torch.randn(*bias_shape)
    if sinks:
        inputs["sinks"] = torch.randn(H)
    if key_lengths is not None:
        assert len(key_lengths) == B and all(0 <= n <= Lk for n in key_lengths)
    slopes = torch.tensor(alibi_slopes) if alibi_slopes is not None else None
    dout = torch.randn(B, H, Lq, Dv)
    used_scale = scale if scale is not None else 1.0 / math.sqrt(D)
    kw = dict(scale=used_scale, softcap=softcap, key_lengths=key_lengths, causal=causal,
              alibi_slopes=None if alibi_slopes is None else list(alibi_slopes))

    # ---- torch forward, autograd backward ----
    leaves = {n: t.clone().requires_grad_(True) for n, t in inputs.items()}
    out, lse, weights = torch_sdpa(leaves["q"], leaves["k"], leaves["v"], used_scale, softcap=softcap,
                                   bias=leaves.get("bias"), alibi_slopes=slopes, key_lengths=key_lengths,
                                   causal=causal, sinks=leaves.get("sinks"))
    assert torch.isfinite(out).all() and torch.isfinite(weights).all(), name
    (out * dout).sum().backward()
    grads = {n: t.grad.detach().clone() for n, t in leaves.items()}
    for n, g in grads.items():
        assert g.shape == inputs[n].shape and torch.isfinite(g).all(), (name, n)

    # ---- self-check ----
    np_inputs = {n: t.numpy().copy() for n, t in inputs.items()}
    ref = reference_sdpa(np_inputs["q"], np_inputs["k"], np_inputs["v"], bias=np_inputs.get("bias"),
                         sinks=np_inputs.get("sinks"), **kw)
    worst = check_forward(name, out.detach(), lse.detach(), weights.detach(), [torch.from_numpy(x) for x in ref])
    fd_worst, fd_count = check_gradients(name, np_inputs, {n: g.numpy() for n, g in grads.items()},
                                         dout.numpy(), kw, seed)
    changes = check_discriminating(name, np_inputs, ref[0], kw)
    ok = allowed_mask(B, Lq, Lk, causal, key_lengths)
    empty = check_empty_rows(name, out.detach(), lse.detach(), ok, inputs.get("sinks"))
    notes = [f"{n} {d:.2g}" for n, d in changes.items()]
    if empty:
        notes.append(f"{empty} empty rows")
    if softcap is not None:
        raw = (used_scale * (q @ k[:, torch.arange(H) // (H // Hkv)].transpose(-1, -2))).abs()
        frac = (raw > softcap)[ok.expand(raw.shape)].double().mean().item()
        assert frac >= 0.25, f"{name}: only {frac:.0%} of the allowed raw scores exceed the cap"
        notes.append(f"|raw| > cap {frac:.0%}")

    # ---- write ----
    ints = [("causal", CAUSAL[causal])]
    tensors = [("q", q), ("k", k), ("v", v)]
    if scale is not None:
        tensors.append(("scale", torch.tensor([scale])))
    if softcap is not None:
        tensors.append(("softcap", torch.tensor([softcap])))
    if sinks:
        tensors.append(("sinks", inputs["sinks"]))
    if slopes is not None:
        tensors.append(("alibi_slopes", slopes))
    if key_lengths is not None:
        tensors.append(("key_lengths", torch.tensor(key_lengths, dtype=torch.float64)))
    if bias_shape is not None:
        tensors.append(("bias", inputs["bias"]))
    tensors += [("dout", dout), ("out", out), ("lse", lse), ("weights", weights),
                ("dq", grads["q"]), ("dk", grads["k"]), ("dv", grads["v"])]
    if bias_shape is not None:
        tensors.append(("dbias", grads["bias"]))
    if sinks:
        tensors.append(("dsinks", grads["sinks"]))
    size = write_fixture(os.path.join(OUT_DIR, f"sdpa_{name}.txt"), name, ints, tensors)
    print(f"sdpa_{name:28s} {size:6d} bytes  ref {worst:.1e}  fd {fd_worst:.1e} ({fd_count} entries)  "
          + ", ".join(notes))
    return size, worst, fd_worst


CASES = [
    # name, keyword arguments (small: the files hold every value in full precision)
    ("softcap_plain", dict(seed=301, B=2, H=2, Hkv=2, Lq=7, Lk=7, D=5, Dv=4, softcap=0.8, qk_gain=1.5)),
    ("softcap_causal_bias_padding", dict(seed=302, B=2, H=4, Hkv=2, Lq=9, Lk=9, D=6, Dv=6, causal="top_left",
                                         key_lengths=[9, 5], bias_shape=(1, 4, 9, 9), softcap=2.0, qk_gain=2.0)),
    ("sinks_plain", dict(seed=303, B=2, H=3, Hkv=1, Lq=6, Lk=8, D=4, Dv=5, sinks=True)),
    ("sinks_empty_rows", dict(seed=304, B=2, H=2, Hkv=2, Lq=4, Lk=6, D=4, Dv=4, causal="bottom_right",
                              key_lengths=[6, 0], sinks=True)),
    ("softcap_sinks_alibi_gqa", dict(seed=305, B=1, H=4, Hkv=2, Lq=3, Lk=11, D=8, Dv=8, causal="bottom_right",
                                     alibi_slopes=[0.5, 0.25, 0.125, 0.0625], softcap=1.5, sinks=True, scale=0.3,
                                     qk_gain=2.0)),
    ("softcap_sinks_long", dict(seed=306, B=1, H=2, Hkv=1, Lq=40, Lk=40, D=16, Dv=12, causal="top_left",
                                key_lengths=[23], softcap=3.0, sinks=True, qk_gain=2.5)),
]


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    print(f"torch {torch.__version__}, numpy {np.__version__}, writing to {OUT_DIR}")
    total, worst, fd_worst = 0, 0.0, 0.0
    for name, kw in CASES:
        size, w, fd = run_case(name, **kw)
        total, worst, fd_worst = total + size, max(worst, w), max(fd_worst, fd)
    print(f"all {len(CASES)} cases: reference {worst:.1e} (<= {TOL:g}), finite differences {fd_worst:.1e} "
          f"(<= {FD_TOL:g}); total {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
