// examples/from_pytorch/from_pytorch.cpp — load a PyTorch nn.MultiheadAttention and its inputs, run
// selfattn's MultiHeadAttention on them, and compare with PyTorch's outputs.
//
//   /usr/bin/python3 examples/from_pytorch/save_mha.py          # optional: the data is committed
//   build/examples/from_pytorch examples/from_pytorch/data
//
// The state dicts come from .safetensors files (mha.safetensors: self-attention; mha_cross.safetensors:
// cross-attention with kdim/vdim, under the prefix "decoder.cross_attn.") and, once more, from a directory of
// .npy files (mha_npy/). Prints the maximum absolute difference of each output against PyTorch's and exits
// with 1 if any exceeds 1e-6 (float32 on both sides).
#include <selfattn/io/npy.hpp>
#include <selfattn/io/safetensors.hpp>
#include <selfattn/io/state_dict.hpp>
#include <selfattn/selfattn.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>

#ifndef SELFATTN_FROM_PYTORCH_DATA
#define SELFATTN_FROM_PYTORCH_DATA "data"
#endif

using namespace selfattn;

namespace {

constexpr double tolerance = 1e-6;

template <typename T>
double max_abs_diff(const Tensor<T, 3>& a, const Tensor<T, 3>& b) {
  if (a.shape() != b.shape()) return INFINITY;
  double worst = 0.0;
  for (Index n = 0; n < a.size(); ++n) {
    const double d = std::fabs(static_cast<double>(a.data()[n]) - static_cast<double>(b.data()[n]));
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
  }
  return worst;
}

bool report(const char* what, double diff) {
  const bool ok = diff <= tolerance;
  std::printf("  %-44s max |selfattn - pytorch| = %.3g %s\n", what, diff, ok ? "ok" : "FAIL (> 1e-6)");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : SELFATTN_FROM_PYTORCH_DATA;
  try {
    bool ok = true;

    // Self-attention, E = 32, H = 4, as saved by save_mha.py.
    MultiHeadAttentionConfig cfg;
    cfg.embed_dim = 32;
    cfg.num_heads = 4;
    MultiHeadAttention<float> mha(cfg);
    load_state_dict(mha, read_state_dict_safetensors<float>(dir + "/mha.safetensors"));
    const Tensor<float, 3> x = read_npy<float, 3>(dir + "/input.npy");  // (B, L, E) = (2, 7, 32)
    std::printf("self-attention: E = %td, H = %td, x (%td, %td, %td)\n", cfg.embed_dim, cfg.num_heads, x.dim(0), x.dim(1),
                x.dim(2));
    const Tensor<float, 3> expected = read_npy<float, 3>(dir + "/output.npy");
    ok &= report("forward (safetensors weights)", max_abs_diff(mha.forward(x).output, expected));

    AttentionOptions<float> causal;
    causal.causal = Causal::top_left;  // PyTorch: attn_mask = triu(ones, diagonal=1), True = masked
    ok &= report("forward, causal", max_abs_diff(mha.forward(x, causal).output, read_npy<float, 3>(dir + "/output_causal.npy")));

    // The same weights from one .npy file per key must give the same module.
    MultiHeadAttention<float> from_npy(cfg, 1);
    load_state_dict(from_npy, read_state_dict_npy_dir<float>(dir + "/mha_npy"));
    ok &= report("forward (.npy directory weights)", max_abs_diff(from_npy.forward(x).output, expected));

    // In double, the difference left is PyTorch's own float32 rounding.
    MultiHeadAttention<double> mha64(cfg);
    load_state_dict(mha64, read_state_dict_safetensors<double>(dir + "/mha.safetensors"));
    const Tensor<double, 3> out64 = mha64.forward(read_npy<double, 3>(dir + "/input.npy")).output;
    ok &= report("forward in double", max_abs_diff(out64, read_npy<double, 3>(dir + "/output.npy")));

    // Cross-attention with kdim = 24, vdim = 20 (q/k/v_proj_weight), under a prefix.
    MultiHeadAttentionConfig cross_cfg = cfg;
    cross_cfg.kdim = 24;
    cross_cfg.vdim = 20;
    MultiHeadAttention<float> cross(cross_cfg);
    const std::string prefix = "decoder.cross_attn.";
    load_state_dict(cross, read_state_dict_safetensors<float>(dir + "/mha_cross.safetensors", prefix), prefix);
    const Tensor<float, 3> q = read_npy<float, 3>(dir + "/cross_query.npy");
    const Tensor<float, 3> k = read_npy<float, 3>(dir + "/cross_key.npy");
    const Tensor<float, 3> v = read_npy<float, 3>(dir + "/cross_value.npy");
    ok &= report("cross-attention, kdim 24, vdim 20",
                 max_abs_diff(cross.forward(q, k, v).output, read_npy<float, 3>(dir + "/output_cross.npy")));

    std::printf(ok ? "all within 1e-6\n" : "some outputs differ by more than 1e-6\n");
    return ok ? 0 : 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "from_pytorch: %s\n", error.what());
    return 1;
  }
}
