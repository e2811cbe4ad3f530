#!/usr/bin/python3
"""Saves PyTorch nn.MultiheadAttention modules, their inputs and their outputs for from_pytorch.cpp.

Run with Debian's Python (python3-torch, python3-numpy):

    /usr/bin/python3 examples/from_pytorch/save_mha.py [output_dir]   # default: examples/from_pytorch/data

Writes, all float32:
  mha.safetensors        state dict of a self-attention module (E=32, H=4, batch_first=True, seed 0),
                         keys in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias
  mha_npy/<key>.npy      the same state dict, one .npy file per key
  input.npy              x (2, 7, 32)
  output.npy             mha(x, x, x) (2, 7, 32)
  output_causal.npy      mha(x, x, x, attn_mask=causal) (2, 7, 32)
  mha_cross.safetensors  a cross-attention module (E=32, H=4, kdim=24, vdim=20) under the prefix
                         "decoder.cross_attn.": q_proj_weight, k_proj_weight, v_proj_weight, in_proj_bias, out_proj.*
  cross_query.npy (2, 5, 32), cross_key.npy (2, 9, 24), cross_value.npy (2, 9, 20), output_cross.npy (2, 5, 32)

The `safetensors` Python package is not needed: write_safetensors below is the format in 20 lines
(8-byte little-endian header length, JSON header, raw little-endian data, tensors in key order).
"""
import json
import os
import struct
import sys

import numpy as np
import torch


def write_safetensors(path, tensors, metadata=None):
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    blobs, offset = [], 0
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name].detach().cpu().numpy().astype("<f4"))
        blob = array.tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)  # the reference writer pads the header to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def save_npy(path, tensor):
    np.save(path, tensor.detach().cpu().numpy().astype("<f4"))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
    os.makedirs(os.path.join(out, "mha_npy"), exist_ok=True)
    torch.manual_seed(0)

    # Self-attention. Biases are zero after PyTorch's init: draw them so that the test sees them.
    mha = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()
    with torch.no_grad():
        mha.in_proj_bias.normal_(0.0, 0.1)
        mha.out_proj.bias.normal_(0.0, 0.1)
        x = torch.randn(2, 7, 32)
        y, _ = mha(x, x, x, need_weights=False)
        causal = torch.triu(torch.ones(7, 7, dtype=torch.bool), diagonal=1)  # True = may NOT attend
        y_causal, _ = mha(x, x, x, attn_mask=causal, need_weights=False)
    state = mha.state_dict()
    write_safetensors(os.path.join(out, "mha.safetensors"), state, {"format": "pt", "source": "save_mha.py"})
    for key, value in state.items():
        save_npy(os.path.join(out, "mha_npy", key + ".npy"), value)
    save_npy(os.path.join(out, "input.npy"), x)
    save_npy(os.path.join(out, "output.npy"), y)
    save_npy(os.path.join(out, "output_causal.npy"), y_causal)

    # Cross-attention with kdim != vdim != E: PyTorch stores q/k/v_proj_weight separately.
    cross = torch.nn.MultiheadAttention(32, 4, kdim=24, vdim=20, batch_first=True).eval()
    with torch.no_grad():
        cross.in_proj_bias.normal_(0.0, 0.1)
        cross.out_proj.bias.normal_(0.0, 0.1)
        q, k, v = torch.randn(2, 5, 32), torch.randn(2, 9, 24), torch.randn(2, 9, 20)
        y_cross, _ = cross(q, k, v, need_weights=False)
    write_safetensors(os.path.join(out, "mha_cross.safetensors"),
                      {"decoder.cross_attn." + key: value for key, value in cross.state_dict().items()})
    for name, tensor in (("cross_query", q), ("cross_key", k), ("cross_value", v), ("output_cross", y_cross)):
        save_npy(os.path.join(out, name + ".npy"), tensor)

    print("wrote", sorted(os.listdir(out)), "to", out)
    print("self-attention keys:", list(state.keys()))
    print("cross-attention keys:", list(cross.state_dict().keys()))


if __name__ == "__main__":
    main()
