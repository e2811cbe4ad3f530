#!/usr/bin/python3
"""Generate PyTorch conformance fixtures for selfattn::TransformerDecoderLayer.

Run with Debian's python3 (it has torch and numpy):

    /usr/bin/python3 tests/pytorch/make_decoder_fixtures.py

Writes tests/fixtures/decoder_<case>.txt (format: tests/pytorch/README.md). Everything is float64 and
deterministic (torch.manual_seed per case). The layers are PyTorch's nn.TransformerDecoderLayer
(batch_first=True, dropout=0.0, training mode), every parameter overwritten with random values, run on
a target x and a memory with a causal tgt_mask (or none), target and memory key padding. Parameters and
their autograd gradients are written under their state_dict names ("grad.<name>"), with the gradients
of the target ("grad.x") and of the memory ("grad.memory").

Before a case is written, an independent float64 reference written from the formulas (the three
residual sublayers, pre or post norm, self- and cross-attention with their masks) recomputes the output
and every gradient from the state dict tensors only, and must agree with PyTorch to 1e-12.
"""

import os
import sys

import torch
import torch.nn.functional as F

from make_layer_fixtures import (ACTIVATIONS, NORMS, causal_mask, check_reference, randomize, ref_activation,
                                 ref_attention, ref_linear, ref_norm, scaled_diff, write_case, write_cases)

torch.set_default_dtype(torch.float64)


def ref_decoder_layer(x, mem, sd, prefix, c, lengths, memory_lengths):
    def sa(y):
        return ref_attention(y, sd, prefix + "self_attn.", c["H"], c["causal"], lengths)

    def ca(y):
        return ref_attention(y, sd, prefix + "multihead_attn.", c["H"], False, memory_lengths, memory=mem)

    def ff(y):
        return ref_linear(ref_activation(ref_linear(y, sd, prefix + "linear1."), c["activation"], c["ffn"]), sd,
                          prefix + "linear2.")

    def norm(y, which):
        return ref_norm(y, sd, prefix + which + ".", c["norm"], c["eps"])

    if c["norm_first"]:
        x = x + sa(norm(x, "norm1"))
        x = x + ca(norm(x, "norm2"))
        return x + ff(norm(x, "norm3"))
    x = norm(x + sa(x), "norm1")
    x = norm(x + ca(x), "norm2")
    return norm(x + ff(x), "norm3")


def ref_model(x, mem, sd, c, lengths, memory_lengths):
    if c["num_layers"] == 0:
        return ref_decoder_layer(x, mem, sd, "", c, lengths, memory_lengths)
    for n in range(c["num_layers"]):
        x = ref_decoder_layer(x, mem, sd, f"layers.{n}.", c, lengths, memory_lengths)
    if c["final_norm"]:
        x = ref_norm(x, sd, "norm.", c["norm"], c["eps"])
    return x


def padding_mask(lengths, L):
    return None if lengths is None else torch.arange(L).view(1, L) >= torch.tensor(lengths).view(len(lengths), 1)


def run_case(name, seed, B, L, Lm, E, H, ffn, norm_first, activation, eps=1e-5, causal="bool", key_lengths=None,
             memory_lengths=None, num_layers=0, final_norm=False):
    """num_layers = 0: one nn.TransformerDecoderLayer (decoder_<name>.txt); > 0: an nn.TransformerDecoder
    (decoder_stack_<name>.txt). causal: None, "bool" or "float" (the tgt_mask's kind)."""
    torch.manual_seed(seed)
    act = {"relu": "relu", "gelu": "gelu", "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[activation]
    layer = torch.nn.TransformerDecoderLayer(E, H, dim_feedforward=ffn, dropout=0.0, activation=act,
                                             layer_norm_eps=eps, batch_first=True, norm_first=norm_first)
    if num_layers == 0:
        model = layer
    else:
        model = torch.nn.TransformerDecoder(layer, num_layers=num_layers,
                                            norm=torch.nn.LayerNorm(E, eps=eps) if final_norm else None)
    randomize(model)
    model.train()  # dropout is 0
    x = torch.randn(B, L, E)
    memory = torch.randn(B, Lm, E)
    tgt = x.clone().requires_grad_(True)
    mem = memory.clone().requires_grad_(True)
    tgt_mask = causal_mask(L, causal) if causal is not None else None
    for lengths, n in ((key_lengths, L), (memory_lengths, Lm)):
        assert lengths is None or (len(lengths) == B and all(1 <= k <= n for k in lengths))
    out = model(tgt, mem, tgt_mask=tgt_mask, tgt_key_padding_mask=padding_mask(key_lengths, L),
                memory_key_padding_mask=padding_mask(memory_lengths, Lm))
    assert out.shape == (B, L, E) and torch.isfinite(out).all()
    dout = torch.randn(B, L, E)
    (out * dout).sum().backward()

    params = {n: p.detach().clone() for n, p in model.state_dict().items()}
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    assert set(params) == set(grads), (name, set(params) ^ set(grads))
    for n in params:
        assert not torch.all(params[n] == params[n].reshape(-1)[0]), f"{name}: {n} is constant"

    # ---- self-check: the reference from the state dict tensors only ----
    c = dict(H=H, ffn=ffn, norm_first=norm_first, activation=activation, norm="layer_norm", eps=eps,
             causal=causal is not None, num_layers=num_layers, final_norm=final_norm)
    rsd = {n: t.clone().requires_grad_(True) for n, t in params.items()}
    rx = x.clone().requires_grad_(True)
    rm = memory.clone().requires_grad_(True)
    r_out = ref_model(rx, rm, rsd, c, key_lengths, memory_lengths)
    (r_out * dout).sum().backward()
    checks = {"output": scaled_diff(r_out, out), "grad.x": scaled_diff(rx.grad, tgt.grad),
              "grad.memory": scaled_diff(rm.grad, mem.grad)}
    for n in params:
        checks["grad." + n] = scaled_diff(rsd[n].grad, grads[n])
    worst = check_reference(name, checks)

    # The case must discriminate what it is about: a wrong choice must change the output.
    def differs(lengths=key_lengths, mlengths=memory_lengths, **change):
        with torch.no_grad():
            return scaled_diff(ref_model(x, memory, params, dict(c, **change), lengths, mlengths), out) > 1e-6
    assert differs(norm_first=not norm_first), name
    if causal is not None:
        assert differs(causal=False), name
    if key_lengths is not None:
        assert differs(lengths=None), name
    if memory_lengths is not None:
        assert differs(mlengths=None), name

    ints = [("embed_dim", E), ("num_heads", H), ("ffn_dim", ffn), ("norm_first", int(norm_first)),
            ("causal", int(causal is not None)), ("num_layers", max(num_layers, 1)),
            ("final_norm", int(final_norm)), ("activation", ACTIVATIONS[activation]),
            ("norm_kind", NORMS["layer_norm"]), ("bias", 1)]
    tensors = [("norm_eps", torch.tensor([eps]))]
    if key_lengths is not None:
        tensors.append(("key_lengths", torch.tensor(key_lengths, dtype=torch.float64)))
    if memory_lengths is not None:
        tensors.append(("memory_key_lengths", torch.tensor(memory_lengths, dtype=torch.float64)))
    tensors += [("x", x), ("memory", memory), ("dout", dout), ("output", out), ("grad.x", tgt.grad),
                ("grad.memory", mem.grad)]
    return write_case("decoder" if num_layers == 0 else "decoder_stack", name, ints, tensors, params, grads, worst,
                      f"B={B} L={L} Lm={Lm} E={E} H={H} F={ffn}")


CASES = [
    ("post_relu_memory_padding", dict(seed=301, B=2, L=5, Lm=4, E=8, H=2, ffn=16, norm_first=False,
                                      activation="relu", memory_lengths=[4, 2])),
    ("pre_gelu_padding", dict(seed=302, B=2, L=6, Lm=7, E=8, H=4, ffn=12, norm_first=True, activation="gelu",
                              causal="float", key_lengths=[6, 3], memory_lengths=[5, 7])),
    ("post_gelu_tanh_eps_unmasked", dict(seed=303, B=3, L=4, Lm=3, E=6, H=3, ffn=10, norm_first=False,
                                         activation="gelu_tanh", eps=1e-3, causal=None)),
    ("pre_relu_long_memory", dict(seed=304, B=1, L=3, Lm=9, E=4, H=1, ffn=8, norm_first=True, activation="relu",
                                  memory_lengths=[6])),
    # decoder stacks (nn.TransformerDecoder)
    ("pre_final_norm", dict(seed=401, B=2, L=5, Lm=6, E=8, H=2, ffn=16, norm_first=True, activation="gelu",
                            key_lengths=[5, 3], memory_lengths=[6, 4], num_layers=2, final_norm=True)),
    ("post", dict(seed=402, B=2, L=4, Lm=5, E=6, H=2, ffn=12, norm_first=False, activation="relu",
                  memory_lengths=[5, 2], num_layers=2)),
]


if __name__ == "__main__":
    sys.exit(write_cases(CASES, run_case))
