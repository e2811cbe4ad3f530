#!/usr/bin/python3
"""Writes the float16/bfloat16 fixtures of tests/safetensors_test.cpp into tests/fixtures/half/.

Run from anywhere with Debian's Python (python3-torch, python3-numpy; torch 1.13 was used):

    /usr/bin/python3 tests/pytorch/make_half_fixtures.py

Deterministic (torch.manual_seed(0)): a second run gives the same bytes on the same torch and NumPy builds.

half_bf16.safetensors holds source tensors and what PyTorch or NumPy make of them, so the C++ test can check
that reading a source into Eigen::half / Eigen::bfloat16 gives the bits the Python side gives:

    f16.specials, bf16.specials   torch float16 / bfloat16 tensors: zeros of both signs, subnormals, the
                                  largest finite values, infinities, NaN, 1/3, pi
    f32.source                    float32: ties of both formats built from bit patterns, values next to them,
                                  overflow, underflow, random values over many binades
    f32.as_f16, f32.as_bf16       torch: f32.source.to(torch.float16) / .to(torch.bfloat16)
    f16.as_bf16, bf16.as_f16      torch: f16.specials.to(torch.bfloat16), bf16.specials.to(torch.float16)
    f64.source                    float64: values just off the ties of both formats (where rounding through
                                  float32 first would round twice), out of range values, random values
    f64.as_f16                    NumPy: f64.source.astype(np.float16), which rounds once
    f64.as_bf16                   an exact rational rounding (fractions.Fraction) below: NumPy has no
                                  bfloat16 and torch rounds float64 -> bfloat16 through float32
    f64.as_f16_torch              torch: f64.source.to(torch.float16), which rounds through float32: kept so
                                  the test shows where it differs (the double-rounding values)

Before writing, the script asserts that every torch and NumPy result above equals the exact rational
rounding (NaN excepted), so each expected tensor is the correctly rounded one, not just "what torch does".
f64.as_f16_torch is the exception: it must differ from it on the double-rounding values.

The safetensors Python package is not needed (nor installed here): write_safetensors writes the format as
examples/from_pytorch/save_mha.py does, keys sorted, compact JSON, header padded with spaces to 8 bytes.

f2_specials.npy is f16.specials saved by np.save ('<f2'), and bf16_specials_as_f4.npy is bf16.specials as
PyTorch users save it (t.float().numpy(), '<f4', exact), the layout encode_npy writes for bfloat16.
"""
import json
import math
import os
import struct
from fractions import Fraction

import numpy as np
import torch

here = os.path.dirname(os.path.abspath(__file__))
out = os.path.join(here, "..", "fixtures", "half")

# (significand bits, exponent bias, bits of +infinity) of the two 16-bit formats.
FLOAT16 = (10, 15, 0x7C00)
BFLOAT16 = (7, 127, 0x7F80)


def format_value(fmt, p):
    """Exact value of a non-negative pattern p <= infinity; infinity stands for 2^(emax + 1)."""
    mbits, bias, _ = fmt
    exponent, mantissa = p >> mbits, p & ((1 << mbits) - 1)
    if exponent == 0:
        return Fraction(mantissa) * Fraction(2) ** (1 - bias - mbits)
    return Fraction((1 << mbits) + mantissa) * Fraction(2) ** (exponent - bias - mbits)


def round_exact(fmt, x):
    """x (a Python float, not NaN) rounded to nearest, ties to even, as a 16-bit pattern."""
    sign = 0x8000 if math.copysign(1.0, x) < 0 else 0
    if math.isinf(x):
        return sign | fmt[2]
    magnitude = abs(Fraction(x))
    if magnitude >= format_value(fmt, fmt[2]):
        return sign | fmt[2]
    low, high = 0, fmt[2]  # value(low) <= magnitude < value(high)
    while high - low > 1:
        middle = (low + high) // 2
        if format_value(fmt, middle) <= magnitude:
            low = middle
        else:
            high = middle
    below, above = magnitude - format_value(fmt, low), format_value(fmt, high) - magnitude
    nearer = low if below < above else high if above < below else (low if low % 2 == 0 else high)
    return sign | nearer


def bits16(t):
    return [int(v) & 0xFFFF for v in t.contiguous().view(torch.int16).tolist()]


def from_bits32(bits):
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def is_nan16(fmt, p):
    return (p & 0x7FFF) > fmt[2]


def check_against_exact(name, fmt, source, got, expect_equal=True):
    mismatches = [i for i, (x, p) in enumerate(zip(source, got))
                  if not math.isnan(x) and round_exact(fmt, x) != p]
    nan_ok = all(is_nan16(fmt, p) for x, p in zip(source, got) if math.isnan(x))
    assert nan_ok, name + ": a NaN did not stay NaN"
    if expect_equal:
        assert not mismatches, "%s differs from the exact rounding at %s" % (name, mismatches[:5])
    else:
        assert mismatches, name + " was expected to differ from the exact rounding somewhere"
    return mismatches


def write_safetensors(path, tensors, metadata):
    """tensors: name -> (dtype, shape, bytes)."""
    header = {"__metadata__": metadata}
    blobs, offset = [], 0
    for name in sorted(tensors):
        dtype, shape, blob = tensors[name]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":"), sort_keys=True).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def entry16(dtype, t):
    return dtype, tuple(t.shape), np.array(bits16(t), dtype="<u2").tobytes()


def main():
    torch.manual_seed(0)
    os.makedirs(out, exist_ok=True)
    inf, nan = float("inf"), float("nan")

    f16_specials = torch.tensor([0.0, -0.0, 2.0**-24, -(2.0**-24), 2.0**-14 - 2.0**-24, 2.0**-14, 1.0, -2.0,
                                 65504.0, -65504.0, inf, -inf, nan, 1 / 3, math.pi], dtype=torch.float16)
    bf16_specials = torch.tensor([0.0, -0.0, 2.0**-133, -(2.0**-133), 2.0**-126, 1.0, -3.0,
                                  from_bits32(0x7F7F0000), inf, -inf, nan, 1 / 3, math.pi], dtype=torch.bfloat16)

    f32_values = [from_bits32(b) for b in (
        0x3F801000, 0x3F803000, 0x3F801001, 0x3F800FFF,  # float16 ties at 1 and their neighbours
        0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF,  # bfloat16 ties at 1 and their neighbours
        0x7F7F8000, 0x7F7F7FFF, 0x80008000, 0x00018000,  # bfloat16 overflow tie, subnormal ties
        0x477FF000, 0x477FEFFF,                          # 65520 (float16 overflow tie), just below
        0x33000000, 0xB3400000, 0x32800000,              # 2^-25, -1.5 * 2^-25, 2^-26 (float16 subnormal ties)
    )] + [0.0, -0.0, inf, -inf, nan, 1e30, -1e-30]
    scales = torch.pow(2.0, torch.randint(-30, 20, (64,)).double())
    f32_values += (torch.randn(64, dtype=torch.float64) * scales).float().tolist()
    f32_source = torch.tensor(f32_values, dtype=torch.float32)

    f64_values = [1 + 2.0**-11 + 2.0**-40, 1 + 2.0**-8 + 2.0**-40, -(1 + 2.0**-11 - 2.0**-40),
                  1e39, 1e-50, -1e-50, -0.0, inf, -inf, nan]
    # Just above and below random float16 and bfloat16 ties, by 2^-30 of a step: float32 cannot hold the offset.
    for fmt, count in ((FLOAT16, 24), (BFLOAT16, 24)):
        for p in torch.randint(1, fmt[2] - 1, (count,)).tolist():
            low, high = format_value(fmt, p), format_value(fmt, p + 1)
            tie = (low + high) / 2
            offset = (high - low) / 2**30
            f64_values += [float(tie + offset), float(tie - offset)]
    f64_values += (torch.randn(32, dtype=torch.float64) * torch.pow(2.0, torch.randint(-30, 20, (32,)).double())).tolist()
    f64_source = torch.tensor(f64_values, dtype=torch.float64)

    f32_as_f16 = f32_source.to(torch.float16)
    f32_as_bf16 = f32_source.to(torch.bfloat16)
    f16_as_bf16 = f16_specials.to(torch.bfloat16)
    bf16_as_f16 = bf16_specials.to(torch.float16)
    with np.errstate(over="ignore"):  # 1e39 and the infinities overflow to inf, as they should
        f64_as_f16 = torch.from_numpy(f64_source.numpy().astype(np.float16))
    f64_as_f16_torch = f64_source.to(torch.float16)
    f64_as_bf16_bits = [0x7FC0 if math.isnan(x) else round_exact(BFLOAT16, x) for x in f64_values]

    check_against_exact("torch float32 -> float16", FLOAT16, f32_values, bits16(f32_as_f16))
    check_against_exact("torch float32 -> bfloat16", BFLOAT16, f32_values, bits16(f32_as_bf16))
    check_against_exact("torch float16 -> bfloat16", BFLOAT16, f16_specials.float().tolist(), bits16(f16_as_bf16))
    check_against_exact("torch bfloat16 -> float16", FLOAT16, bf16_specials.float().tolist(), bits16(bf16_as_f16))
    check_against_exact("numpy float64 -> float16", FLOAT16, f64_values, bits16(f64_as_f16))
    differ = check_against_exact("torch float64 -> float16", FLOAT16, f64_values, bits16(f64_as_f16_torch),
                                 expect_equal=False)
    print("torch float64 -> float16 rounds twice at %d of %d values, first at index %d"
          % (len(differ), len(f64_values), differ[0]))

    tensors = {
        "f16.specials": entry16("F16", f16_specials),
        "bf16.specials": entry16("BF16", bf16_specials),
        "f32.source": ("F32", (len(f32_values),), f32_source.numpy().astype("<f4").tobytes()),
        "f32.as_f16": entry16("F16", f32_as_f16),
        "f32.as_bf16": entry16("BF16", f32_as_bf16),
        "f16.as_bf16": entry16("BF16", f16_as_bf16),
        "bf16.as_f16": entry16("F16", bf16_as_f16),
        "f64.source": ("F64", (len(f64_values),), f64_source.numpy().astype("<f8").tobytes()),
        "f64.as_f16": entry16("F16", f64_as_f16),
        "f64.as_bf16": ("BF16", (len(f64_values),), np.array(f64_as_bf16_bits, dtype="<u2").tobytes()),
        "f64.as_f16_torch": entry16("F16", f64_as_f16_torch),
    }
    write_safetensors(os.path.join(out, "half_bf16.safetensors"), tensors,
                      {"format": "pt", "source": "make_half_fixtures.py"})
    np.save(os.path.join(out, "f2_specials.npy"), f16_specials.numpy())
    np.save(os.path.join(out, "bf16_specials_as_f4.npy"), bf16_specials.float().numpy())
    print("wrote", sorted(os.listdir(out)))


if __name__ == "__main__":
    main()
