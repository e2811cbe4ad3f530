// oversmoothing.cpp — stacked attention averages the tokens into one; the residual stops it, the FFN, the value
// projection and LayerNorm alone do not.
//
// Each self-attention layer mixes the tokens with a row-stochastic matrix (every output row is a weighted mean
// of the value rows), and a product of such matrices tends to rank one: every token the same vector (Dong,
// Cordonnier & Loukas 2021, "Attention is not all you need: pure attention loses rank doubly exponentially with
// depth"). Part 1 stacks 1 to 32 layers with random weights at initialisation, each depth with its own weights
// (seed 1000 * seed + depth), on 32 tokens of E = 32 (N(0, 1) embeddings plus the sinusoidal positions), in
// five wirings:
//   (a) attention only           x <- attn(x)
//   (b) + residual               x <- x + attn(x)
//   (c) + residual + LayerNorm   x <- LayerNorm(x + attn(x))                        (post-norm, no FFN)
//   (d) full layer, pre-norm     TransformerLayer, norm_first: x + attn(LN x), then + FFN(LN .)
//   (e) full layer, post-norm    TransformerLayer, PyTorch's default: LN(x + attn(x)), then LN(. + FFN(.))
// All five use the same attention weights at a given depth; (d) and (e) also share the FFN. After each depth it
// prints how far the tokens are from one vector: spread = ||X - 1 mean(X)||_F / ||X||_F (0 when every row is the
// mean row) and sigma2 / sigma1 (0 when X has rank one).
// Part 2 runs the post-norm and the pre-norm stack (with its final LayerNorm) backward from a random upstream
// gradient, loss = sum(G * Y), and prints each layer's gradient norms (Xiong et al. 2020, "On Layer
// Normalization in the Transformer Architecture"), and the last layer's for stacks of 1 to 32 layers.
// Part 3 adds each remedy alone to attention only, with the same attention at each depth as part 1:
//   residual only      x <- x + attn(x)              (part 1's (b))
//   FFN only           x <- FFN(attn(x))             (the FFN of (d) and (e); no residual, no norm)
//   W_V = W_O = I      attention with the identity as value and output projection: only the mixing
//   LayerNorm only     x <- LayerNorm(attn(x))
//   all but residual   x <- LN(FFN(LN(attn(x))))     (the post-norm layer (e) without its two skips)
// and FFN only with W1 and W2 scaled by g = 4, 8, 32 (its Lipschitz bound by g^2), to depth 16. It prints
// the spread per depth and the first depth at which it is <= 1e-12 ("collapsed").
//
// Usage: oversmoothing [--seed N]     (default seed 1; the same seed prints the same output)
// Writes oversmoothing.svg, oversmoothing_gradients.svg and oversmoothing_remedies.svg in the current directory.
// Exits 1 unless
//   attention only collapses: spread at depth 32 <= 1e-6 x its value at depth 1 (it reaches rounding),
//   the residual wirings (b)-(e) keep spread >= 0.05 x the input's at depth 32, the pre-norm layer >= 0.4 x,
//   the last layer's W2 gradient, post-norm over pre-norm, is >= 1.25x larger in a stack of 32 layers than of 1
//   (Xiong et al.'s Theorem 1: post-norm's does not depend on the depth, pre-norm's shrinks), and pre-norm's
//   W2 gradient in the 32-layer stack is at most 0.8x as large in the last layer as in the first;
//   and (part 3) FFN only, W_V = W_O = I, LayerNorm only and all but residual each collapse (spread at depth 32
//   <= 1e-6 x depth 1), none of them later than one layer after attention only, the scaled FFNs collapse at
//   least two layers later than g = 1 at some g, and every g collapses all the same (<= 1e-6 x at depth 16).
// Walk-through and measured tables: docs/oversmoothing.md.
#include <selfattn/plot/line_chart.hpp>
#include <selfattn/selfattn.hpp>

#include "example_args.hpp"

#include <Eigen/SVD>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

using namespace selfattn;

namespace {

using T = double;             // the collapse goes down to rounding: double shows how far
using Rng = std::mt19937_64;  // its raw output is fixed by the standard; the distributions are not

constexpr Index kLength = 32;  // L tokens, batch B = 1
constexpr Index kEmbed = 32;   // E
constexpr Index kHeads = 4;    // H, head dim 8
constexpr Index kFfn = 128;    // F = 4E
constexpr int kDepth = 32;     // layers stacked
constexpr std::array<int, 13> kPrintedDepths{0, 1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 28, 32};
constexpr std::array<int, 6> kStackSizes{1, 2, 4, 8, 16, 32};  // part 2: the last layer's gradient vs depth

double uniform01(Rng& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }
double normal(Rng& rng) {  // Box-Muller
  const double u = std::max(uniform01(rng), 0x1.0p-53), v = uniform01(rng);
  return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
}

Tensor<T, 3> random_normal(Rng& rng) {
  Tensor<T, 3> x({1, kLength, kEmbed});
  for (Index n = 0; n < x.size(); ++n) x.data()[n] = normal(rng);
  return x;
}

std::uint64_t layer_seed(std::uint64_t seed, int depth) { return 1000 * seed + static_cast<std::uint64_t>(depth); }

TransformerLayerConfig layer_config(bool norm_first) {
  TransformerLayerConfig cfg;
  cfg.attention.embed_dim = kEmbed;
  cfg.attention.num_heads = kHeads;
  cfg.ffn_dim = kFfn;
  cfg.activation = Activation::relu;  // nn.TransformerEncoderLayer's default
  cfg.dropout = 0.0;                  // at initialisation, as at inference
  cfg.norm_first = norm_first;
  return cfg;
}

// ---- 1. The measures -----------------------------------------------------------------------------------

// ||X - 1 mean(X)||_F / ||X||_F over the L rows of batch entry 0: 0 when every token is the same vector.
double spread(const Tensor<T, 3>& x) {
  const auto m = as_matrix(x[0]);
  const Eigen::RowVectorXd mean = m.colwise().mean();
  return (m.rowwise() - mean).norm() / m.norm();
}

// sigma2 / sigma1 of X (L, E): 0 when X has rank one.
double sigma_ratio(const Tensor<T, 3>& x) {
  const Eigen::MatrixXd m = as_matrix(x[0]);
  const Eigen::VectorXd s = Eigen::JacobiSVD<Eigen::MatrixXd>(m).singularValues();
  return s(1) / s(0);
}

template <typename Tn>
double squared_norm(const Tn& t) {
  double sum = 0;
  for (Index n = 0; n < t.size(); ++n) sum += t.data()[n] * t.data()[n];
  return sum;
}

// Frobenius norms of one layer's weight gradients (biases and norm parameters left out).
struct LayerGradNorms {
  double attention = 0;  // q, k, v and output projection weights together
  double linear1 = 0;    // W1 (F, E)
  double linear2 = 0;    // W2 (E, F): Xiong et al.'s W^2
};

LayerGradNorms grad_norms(const TransformerLayerParams<T>& g) {
  const MhaParams<T>& a = g.self_attn;
  return {std::sqrt(squared_norm(a.q_weight) + squared_norm(a.k_weight) + squared_norm(a.v_weight) +
                    squared_norm(a.out_weight)),
          std::sqrt(squared_norm(g.linear1_weight)), std::sqrt(squared_norm(g.linear2_weight))};
}

// ---- 2. Part 1: five wirings, 32 depths ----------------------------------------------------------------

constexpr std::size_t kWirings = 5;
const std::array<const char*, kWirings> kNames{"attention only", "+ residual", "+ residual + LayerNorm",
                                               "full layer, pre-norm", "full layer, post-norm"};
const std::array<const char*, kWirings> kColours{"#d62728", "#ff7f0e", "#2ca02c", "#1f77b4", "#9467bd"};
constexpr std::size_t kPre = 3, kPost = 4;  // the full layers' indices in kNames

struct Stacks {
  std::vector<TransformerLayer<T>> pre, post;                 // depth d + 1 at index d: the part 2 stacks
  std::vector<TransformerLayerForward<T>> pre_fwd, post_fwd;  // their forwards, kept for the backward
  std::array<std::vector<double>, kWirings> spread;           // per wiring, depths 0..32
  std::array<std::vector<double>, kWirings> sigma;            // per wiring, the depths of kPrintedDepths only
};

Stacks run_depths(std::uint64_t seed, const Tensor<T, 3>& input) {
  Stacks s;
  const LayerNorm<T> norm(kEmbed);  // weight 1, bias 0, as at initialisation
  std::array<Tensor<T, 3>, kWirings> x;
  for (std::size_t w = 0; w < kWirings; ++w) {
    x[w] = input;
    s.spread[w].push_back(spread(input));
    s.sigma[w].push_back(sigma_ratio(input));  // depth 0 is printed
  }
  for (int d = 1; d <= kDepth; ++d) {
    // TransformerLayer(cfg, s) draws its attention as MultiHeadAttention(cfg.attention, s): one set of attention
    // weights per depth for all five wirings.
    s.pre.emplace_back(layer_config(true), layer_seed(seed, d));
    s.post.emplace_back(layer_config(false), layer_seed(seed, d));
    const MultiHeadAttention<T> attention(layer_config(false).attention, layer_seed(seed, d));
    x[0] = attention.forward(x[0]).output;                              // (a) attn(x)
    x[1] = attention.forward(x[1]).output + x[1];                       // (b) x + attn(x)
    x[2] = norm.forward(attention.forward(x[2]).output + x[2]).output;  // (c) LN(x + attn(x))
    // (d), (e): the input passed as a temporary copy, so each forward owns it for the backward
    s.pre_fwd.push_back(s.pre.back().forward(Tensor<T, 3>(x[kPre])));
    s.post_fwd.push_back(s.post.back().forward(Tensor<T, 3>(x[kPost])));
    x[kPre] = s.pre_fwd.back().output;
    x[kPost] = s.post_fwd.back().output;
    for (std::size_t w = 0; w < kWirings; ++w) {
      s.spread[w].push_back(spread(x[w]));
      // an SVD takes tens of ms at -O0 under the sanitizers: only at the printed depths
      if (std::find(kPrintedDepths.begin(), kPrintedDepths.end(), d) != kPrintedDepths.end())
        s.sigma[w].push_back(sigma_ratio(x[w]));
    }
  }
  return s;
}

// values[w][d] for every depth d, or (every_depth false) values[w][row] for the rows of kPrintedDepths; one
// column per name, as wide as the name and two spaces.
template <std::size_t N>
void print_depth_table(const char* title, const std::array<const char*, N>& names,
                       const std::array<std::vector<double>, N>& values, bool every_depth) {
  std::printf("%s\n  depth", title);
  for (std::size_t w = 0; w < N; ++w) std::printf("  %s", names[w]);
  std::printf("\n");
  for (std::size_t row = 0; row < kPrintedDepths.size(); ++row) {
    const int d = kPrintedDepths[row];
    std::printf("  %5d", d);
    for (std::size_t w = 0; w < N; ++w)
      std::printf("%*.3g", static_cast<int>(std::strlen(names[w])) + 2,
                  values[w][every_depth ? static_cast<std::size_t>(d) : row]);
    std::printf("\n");
  }
}

// ---- 3. Part 2: gradients, post-norm against pre-norm ---------------------------------------------------

struct Gradients {
  std::vector<LayerGradNorms> post, pre;  // the 32-layer stacks, layer 1 (input side) first
  std::vector<double> top_post, top_pre;  // the last layer's W2 gradient norm, stacks of kStackSizes layers
  std::vector<double> pre_rms;            // RMS of the pre-norm residual stream there: the final norm divides by it
};

// Backward of a stack made of the first `n` layers, from d loss / d output = g; the pre-norm stack ends with a
// LayerNorm (weight 1, bias 0), as pre-norm models do. `all`: down to layer 1, else the last layer only.
std::vector<LayerGradNorms> backward(const std::vector<TransformerLayer<T>>& layers,
                                     const std::vector<TransformerLayerForward<T>>& forwards, bool final_norm, int n,
                                     const Tensor<T, 3>& g, bool all) {
  Tensor<T, 3> dy = g;
  if (final_norm) {
    const LayerNorm<T> norm(kEmbed);
    const NormForward<T> top = norm.forward(forwards[static_cast<std::size_t>(n - 1)].output);
    dy = norm.backward(g, top).d_input;
  }
  std::vector<LayerGradNorms> norms(static_cast<std::size_t>(n));
  for (int i = n - 1; i >= (all ? 0 : n - 1); --i) {
    const auto k = static_cast<std::size_t>(i);
    TransformerLayerGradients<T> grads = layers[k].backward(dy, forwards[k]);
    norms[k] = grad_norms(grads.params);
    dy = std::move(grads.d_input);
  }
  return norms;
}

Gradients run_gradients(const Stacks& s, const Tensor<T, 3>& g) {
  Gradients r;
  r.post = backward(s.post, s.post_fwd, false, kDepth, g, true);
  r.pre = backward(s.pre, s.pre_fwd, true, kDepth, g, true);
  for (int n : kStackSizes) {        // a stack of n layers is the first n of the 32: the forward is shared
    const bool whole = n == kDepth;  // the 32-layer stacks' gradients are in r already
    r.top_post.push_back((whole ? r.post : backward(s.post, s.post_fwd, false, n, g, false)).back().linear2);
    r.top_pre.push_back((whole ? r.pre : backward(s.pre, s.pre_fwd, true, n, g, false)).back().linear2);
    const Tensor<T, 3>& stream = s.pre_fwd[static_cast<std::size_t>(n - 1)].output;
    r.pre_rms.push_back(std::sqrt(squared_norm(stream) / static_cast<double>(stream.size())));
  }
  return r;
}

// ---- 4. Part 3: each remedy alone, on top of attention only ---------------------------------------------

// (a) and (b) are part 1's columns; the others are computed here with the same attention at each depth.
constexpr std::size_t kRemedies = 6;
const std::array<const char*, kRemedies> kRemedyNames{"attention only", "residual only",  "FFN only",
                                                      "W_V = W_O = I",  "LayerNorm only", "all but residual"};
const std::array<const char*, kRemedies> kRemedyColours{kColours[0], kColours[1], "#8c564b",
                                                        "#e377c2",   "#17becf",   "#7f7f7f"};
constexpr std::size_t kFfnOnly = 2, kIdentityVO = 3, kNormOnly = 4, kNoResidual = 5;
// FFN only with W1 and W2 scaled by g, to depth kGainDepth: every stack of seeds 1 to 16 collapsed by depth 9. g = 1
// is the FFN only column (its colour in the picture).
constexpr std::array<double, 4> kGains{1, 4, 8, 32};
const std::array<const char*, kGains.size()> kGainColours{"#8c564b", "#6baed6", "#2171b5", "#08306b"};
constexpr int kGainDepth = 16;
constexpr double kCollapsed = 1e-12;  // a spread this small counts as collapsed: within 1e4 of rounding

struct Remedies {
  std::array<std::vector<double>, kRemedies> spread;    // per column, depths 0..32
  std::array<double, kRemedies> norm32{};               // ||X||_F at depth 32 (not kept for (a), (b))
  std::array<std::vector<double>, kGains.size()> gain;  // FFN only, weights scaled by kGains[i], 0..kGainDepth
};

// The first depth whose spread is <= kCollapsed, or 0 when none is.
int collapse_depth(const std::vector<double>& spreads) {
  for (std::size_t d = 1; d < spreads.size(); ++d)
    if (spreads[d] <= kCollapsed) return static_cast<int>(d);
  return 0;
}

Remedies run_remedies(std::uint64_t seed, const Tensor<T, 3>& input, const Stacks& s) {
  Remedies r;
  r.spread[0] = s.spread[0];        // (a) attention only
  r.spread[1] = s.spread[1];        // (b) x + attn(x): the residual alone
  const LayerNorm<T> norm(kEmbed);  // weight 1, bias 0
  std::array<Tensor<T, 3>, kRemedies> x;
  for (std::size_t w = 2; w < kRemedies; ++w) {
    x[w] = input;
    r.spread[w].push_back(spread(input));
  }
  std::array<Tensor<T, 3>, kGains.size()> xg;  // xg[0] unused: g = 1 is x[kFfnOnly]
  for (std::size_t i = 1; i < kGains.size(); ++i) {
    xg[i] = input;
    r.gain[i].push_back(spread(input));
  }
  for (int d = 1; d <= kDepth; ++d) {
    const MultiHeadAttention<T> attention(layer_config(false).attention, layer_seed(seed, d));  // as in part 1
    // the FFN of the full layers (d) and (e) at this depth
    const TransformerLayerParams<T>& layer = s.pre[static_cast<std::size_t>(d - 1)].params();
    FeedForward<T> ffn({kEmbed, kFfn, Activation::relu, 0.0, true});
    ffn.params() = {layer.linear1_weight, layer.linear1_bias, layer.linear2_weight, layer.linear2_bias};
    // the same query and key projections; the value and output projections the identity, so each head's output
    // is its attention matrix times its own 8 columns of x
    MhaParams<T> identity_vo = attention.params();
    for (Tensor<T, 2>* w : {&identity_vo.v_weight, &identity_vo.out_weight}) {
      w->fill(0);
      for (Index i = 0; i < kEmbed; ++i) (*w)(i, i) = 1;
    }
    x[kFfnOnly] = ffn.forward(attention.forward(x[kFfnOnly]).output).output;      // FFN(attn(x))
    x[kIdentityVO] = attention.forward_with(identity_vo, x[kIdentityVO]).output;  // attn with W_V = W_O = I
    x[kNormOnly] = norm.forward(attention.forward(x[kNormOnly]).output).output;   // LN(attn(x))
    x[kNoResidual] =                                                              // LN(FFN(LN(attn(x))))
        norm.forward(ffn.forward(norm.forward(attention.forward(x[kNoResidual]).output).output).output).output;
    for (std::size_t w = 2; w < kRemedies; ++w) r.spread[w].push_back(spread(x[w]));
    for (std::size_t i = 1; i < kGains.size() && d <= kGainDepth; ++i) {
      FeedForward<T> scaled = ffn;
      for (Tensor<T, 2>* w : {&scaled.params().linear1_weight, &scaled.params().linear2_weight})
        for (Index n = 0; n < w->size(); ++n) w->data()[n] *= kGains[i];
      xg[i] = scaled.forward(attention.forward(xg[i]).output).output;
      r.gain[i].push_back(spread(xg[i]));
    }
  }
  for (std::size_t w = 2; w < kRemedies; ++w) r.norm32[w] = std::sqrt(squared_norm(x[w]));
  r.gain[0].assign(r.spread[kFfnOnly].begin(), r.spread[kFfnOnly].begin() + kGainDepth + 1);
  return r;
}

// ---- 5. Pictures: line charts (selfattn/plot/line_chart.hpp) -----------------------------------------------

std::vector<double> range(int first, int last) {
  std::vector<double> v;
  for (int i = first; i <= last; ++i) v.push_back(i);
  return v;
}

// 0 to a round number above the largest value, ticks every 50 or 100.
void fit_y(ChartAxis& y, const std::vector<std::vector<double>>& values) {
  double top = 0;
  for (const auto& v : values) top = std::max(top, *std::max_element(v.begin(), v.end()));
  y.min = 0;
  y.max = 50 * std::ceil(1.1 * top / 50);
  const double step = y.max > 250 ? 100 : 50;
  for (double v = 0; v <= y.max + 1e-9; v += step) y.ticks.push_back(v);
}

// Charts side by side under a title, one legend below them. False if the file could not be written.
bool write_figure(const char* path, const std::string& title, const std::vector<LineChart>& charts) {
  LineChartOptions options;
  options.title = title;
  try {
    write_line_charts_svg(path, charts, options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return false;
  }
  return true;
}

bool write_collapse_figure(const Stacks& s) {
  LineChart log_chart, linear_chart;
  for (LineChart* c : {&log_chart, &linear_chart}) {
    c->x = {"depth (layers stacked)", AxisScale::linear, 0, kDepth, {0, 4, 8, 12, 16, 20, 24, 28, 32}};
    c->y.label = "spread ||X \u2212 1 mean(X)|| / ||X||";
    for (std::size_t w = 0; w < kWirings; ++w)  // the legend lists each label once: the first chart's
      c->series.push_back({kNames[w], kColours[w], range(0, kDepth), s.spread[w]});
  }
  log_chart.title = "log scale: attention alone collapses";
  log_chart.y.scale = AxisScale::log;
  log_chart.y.min = 1e-18;
  log_chart.y.max = 1;
  log_chart.y.ticks = {1e-16, 1e-12, 1e-8, 1e-4, 1};
  log_chart.references.push_back({0x1.0p-52, "rounding (double epsilon)"});
  linear_chart.title = "linear scale: what the residuals keep";
  linear_chart.y.min = 0;
  linear_chart.y.max = 1;
  linear_chart.y.ticks = {0, 0.2, 0.4, 0.6, 0.8, 1};
  return write_figure("oversmoothing.svg", "Token spread vs depth at initialisation (L = 32, E = 32, H = 4)",
                      {log_chart, linear_chart});
}

bool write_gradient_figure(const Gradients& g) {
  LineChart per_layer, by_depth;
  per_layer.title = "32-layer stack: every layer";
  per_layer.x = {"layer (1 = next to the input)", AxisScale::linear, 1, kDepth, {1, 4, 8, 12, 16, 20, 24, 28, 32}};
  per_layer.y.label = "||d loss / d W2||";
  std::vector<double> post, pre;
  for (std::size_t i = 0; i < g.post.size(); ++i) {
    post.push_back(g.post[i].linear2);
    pre.push_back(g.pre[i].linear2);
  }
  fit_y(per_layer.y, {post, pre});
  per_layer.series = {{"post-norm (PyTorch's default)", kColours[kPost], range(1, kDepth), post},
                      {"pre-norm (+ final LayerNorm)", kColours[kPre], range(1, kDepth), pre}};
  by_depth.title = "the last layer, stacks of 1 to 32 layers";
  by_depth.x = {"layers in the stack", AxisScale::log, 1, kDepth, {1, 2, 4, 8, 16, 32}};
  by_depth.y.label = "||d loss / d W2|| of the last layer";
  fit_y(by_depth.y, {g.top_post, g.top_pre});
  const std::vector<double> sizes(kStackSizes.begin(), kStackSizes.end());
  // no labels: the same two stacks as in the first chart, whose labels the legend shows
  by_depth.series = {{"", kColours[kPost], sizes, g.top_post, true}, {"", kColours[kPre], sizes, g.top_pre, true}};
  return write_figure("oversmoothing_gradients.svg", "Weight gradients at initialisation: post-norm vs pre-norm",
                      {per_layer, by_depth});
}

bool write_remedies_figure(const Remedies& r) {
  constexpr int kShown = 12;  // every line is flat from depth 10 on (the table has the rest)
  LineChart alone, gains;
  alone.title = "each remedy alone, on attention only";
  gains.title = "FFN only, its weights scaled by g (brown: g = 1)";
  for (LineChart* c : {&alone, &gains}) {
    c->x = {"depth (layers stacked)", AxisScale::linear, 0, kShown, {0, 2, 4, 6, 8, 10, 12}};
    c->y = {"spread ||X \u2212 1 mean(X)|| / ||X||", AxisScale::log, 1e-18, 1, {1e-16, 1e-12, 1e-8, 1e-4, 1}};
    c->references.push_back({0x1.0p-52, "rounding (double epsilon)"});
  }
  const auto first = [](const std::vector<double>& v) {
    return std::vector<double>(v.begin(), v.begin() + kShown + 1);
  };
  for (std::size_t w = 0; w < kRemedies; ++w)
    alone.series.push_back({kRemedyNames[w], kRemedyColours[w], range(0, kShown), first(r.spread[w]), true});
  for (std::size_t i = 0; i < kGains.size(); ++i)  // g = 1: the legend's "FFN only"
    gains.series.push_back({i == 0 ? "" : "FFN only, g = " + std::to_string(static_cast<int>(kGains[i])),
                            kGainColours[i], range(0, kShown), first(r.gain[i]), true});
  return write_figure("oversmoothing_remedies.svg",
                      "Token spread vs depth, one remedy at a time (L = 32, E = 32, H = 4)", {alone, gains});
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t seed = 1;
  if (!seed_argument(argc, argv, seed)) return 2;
  // The input: N(0, 1) token embeddings plus the sinusoidal position encoding, as the original Transformer's first
  // layer sees them. Every sequence carries the same positions, so the input's spread is below 1 already.
  Rng rng(seed);
  Tensor<T, 3> input = random_normal(rng);
  const Tensor<T, 2> pe = sinusoidal_encoding<T>(kLength, kEmbed);
  for (Index l = 0; l < kLength; ++l)
    for (Index e = 0; e < kEmbed; ++e) input(0, l, e) += pe(l, e);
  const Tensor<T, 3> upstream = random_normal(rng);  // part 2: G = d loss / d output

  std::printf(
      "Oversmoothing at initialisation: B = 1, L = %td tokens, E = %td, H = %td, F = %td, seed %llu.\n"
      "Depth d has its own random weights (PyTorch's initialisation); the five wirings share them.\n\n",
      kLength, kEmbed, kHeads, kFfn, static_cast<unsigned long long>(seed));
  const Stacks s = run_depths(seed, input);
  print_depth_table("spread = ||X - 1 mean(X)||_F / ||X||_F (0 when every token is the same vector)", kNames, s.spread,
                    true);
  std::printf("\n");
  print_depth_table("sigma2 / sigma1 of X (0: rank one)", kNames, s.sigma, false);
  if (!write_collapse_figure(s)) return 1;

  const Gradients g = run_gradients(s, upstream);
  std::printf(
      "\nGradient norms ||d loss / d W||_F per layer of the 32-layer stacks, "
      "loss = sum(G * output), G ~ N(0, 1)\n"
      "(attention: q, k, v and output weights together; W1, W2: the FFN's linear1 and linear2 weights)\n"
      "         ----------- post-norm -----------   ----------- pre-norm ------------\n"
      "  layer    attention         W1         W2    attention         W1         W2\n");
  for (int d : kPrintedDepths) {
    if (d == 0) continue;
    const LayerGradNorms& a = g.post[static_cast<std::size_t>(d - 1)];
    const LayerGradNorms& b = g.pre[static_cast<std::size_t>(d - 1)];
    std::printf("  %5d  %11.4g %10.4g %10.4g  %11.4g %10.4g %10.4g\n", d, a.attention, a.linear1, a.linear2,
                b.attention, b.linear1, b.linear2);
  }
  const double post_ratio = g.post.back().linear2 / g.post.front().linear2;
  const double pre_ratio = g.pre.back().linear2 / g.pre.front().linear2;
  std::printf("  W2, last layer / first layer: post-norm %.2f, pre-norm %.2f\n", post_ratio, pre_ratio);
  std::printf(
      "\nThe last layer's ||d loss / d W2||_F in stacks of n layers (the first n of the 32)\n"
      "      n  post-norm   pre-norm  post / pre   RMS of the pre-norm stream before its final norm\n");
  for (std::size_t i = 0; i < kStackSizes.size(); ++i)
    std::printf("  %5d  %9.4g  %9.4g  %10.2f  %9.3g\n", kStackSizes[i], g.top_post[i], g.top_pre[i],
                g.top_post[i] / g.top_pre[i], g.pre_rms[i]);
  if (!write_gradient_figure(g)) return 1;
  std::printf("\nwrote oversmoothing.svg and oversmoothing_gradients.svg\n\n");

  const Remedies r = run_remedies(seed, input, s);
  std::printf(
      "Each remedy alone, on top of attention only, with the same attention at each depth as above:\n"
      "  attention only    x <- attn(x)                                    (a) above\n"
      "  residual only     x <- x + attn(x)                                (b) above\n"
      "  FFN only          x <- FFN(attn(x))             the FFN of (d) and (e), no residual, no norm\n"
      "  W_V = W_O = I     x <- attn(x), identity value and output projections: only the mixing A\n"
      "  LayerNorm only    x <- LayerNorm(attn(x))\n"
      "  all but residual  x <- LN(FFN(LN(attn(x))))     the post-norm layer (e) without its two skips\n");
  print_depth_table("spread = ||X - 1 mean(X)||_F / ||X||_F", kRemedyNames, r.spread, true);
  const auto width = [](std::size_t w) { return static_cast<int>(std::strlen(kRemedyNames[w])) + 2; };
  std::printf("  collapsed at depth (first spread <= %.0e; -: never)\n       ", kCollapsed);
  for (std::size_t w = 0; w < kRemedies; ++w) {
    const int at = collapse_depth(r.spread[w]);
    if (at == 0)
      std::printf("%*s", width(w), "-");
    else
      std::printf("%*d", width(w), at);
  }
  std::printf("\n  ||X||_F at depth 32 (input %.3g)\n       %*s%*s", std::sqrt(squared_norm(input)), width(0), "",
              width(1), "");
  for (std::size_t w = 2; w < kRemedies; ++w) std::printf("%*.3g", width(w), r.norm32[w]);
  std::printf(
      "\n\nFFN only, W1 and W2 scaled by g (its Lipschitz bound ||W2|| ||W1|| by g^2): spread\n"
      "      g");
  constexpr std::array<int, 9> kGainDepths{1, 2, 3, 4, 5, 6, 8, 12, kGainDepth};
  for (int d : kGainDepths) std::printf("%9d", d);
  std::printf("  collapsed at depth\n");
  for (std::size_t i = 0; i < kGains.size(); ++i) {
    std::printf("  %5g", kGains[i]);
    for (int d : kGainDepths) std::printf("%9.2g", r.gain[i][static_cast<std::size_t>(d)]);
    const int at = collapse_depth(r.gain[i]);
    if (at == 0)
      std::printf("  %18s\n", "-");
    else
      std::printf("  %18d\n", at);
  }
  if (!write_remedies_figure(r)) return 1;
  std::printf("\nwrote oversmoothing_remedies.svg\n\n");

  // ---- The verdict ----
  bool ok = true;
  const auto check = [&ok](bool passed, const char* claim) {
    std::printf("  %s  %s\n", passed ? "ok    " : "FAILED", claim);
    ok = ok && passed;
  };
  char line[256];
  const double collapse = s.spread[0][kDepth] / s.spread[0][1];
  std::snprintf(line, sizeof line, "attention only collapses: spread at depth 32 / depth 1 = %.2g (needs <= 1e-6)",
                collapse);
  check(collapse <= 1e-6, line);
  double kept_min = 1;
  for (std::size_t w = 1; w < kWirings; ++w) kept_min = std::min(kept_min, s.spread[w][kDepth] / s.spread[w][0]);
  std::snprintf(line, sizeof line,
                "residual wirings keep their tokens apart: spread at depth 32 / input >= %.2f (needs >= 0.05)",
                kept_min);
  check(kept_min >= 0.05, line);
  const double pre_kept = s.spread[kPre][kDepth] / s.spread[kPre][0];
  std::snprintf(line, sizeof line, "the pre-norm layer keeps most: spread at depth 32 / input = %.2f (needs >= 0.4)",
                pre_kept);
  check(pre_kept >= 0.4, line);
  const std::size_t last = kStackSizes.size() - 1;  // kStackSizes[0] = 1 layer, [last] = 32
  const double one_layer = g.top_post[0] / g.top_pre[0], deep = g.top_post[last] / g.top_pre[last];
  std::snprintf(line, sizeof line,
                "last layer's W2 gradient, post-norm / pre-norm: %.2f in 1 layer, %.2f in 32: grew %.2fx "
                "(needs >= 1.25x)",
                one_layer, deep, deep / one_layer);
  check(deep / one_layer >= 1.25, line);
  std::snprintf(line, sizeof line,
                "pre-norm W2 gradients shrink toward the output: last layer / first = %.2f (needs <= 0.8)", pre_ratio);
  check(pre_ratio <= 0.8, line);
  std::printf("  (not checked: post-norm's last / first = %.2f; it depends on the draw, see docs/oversmoothing.md)\n",
              post_ratio);
  // part 3: which remedies alone stop the collapse (the residual's own check is the second one above)
  double worst = 0;  // the largest spread at depth 32 / depth 1 of a remedy without a residual
  for (std::size_t w = 2; w < kRemedies; ++w) worst = std::max(worst, r.spread[w][kDepth] / r.spread[w][1]);
  std::snprintf(line, sizeof line,
                "FFN, W_V = W_O = I, LayerNorm, alone or all but the residual: each collapses: spread at depth 32 / "
                "depth 1 <= %.2g (needs <= 1e-6)",
                worst);
  check(worst <= 1e-6, line);
  const int attention_at = collapse_depth(r.spread[0]);
  int latest = 0;  // the latest collapse of those four (a column that never collapses counts as depth 33)
  for (std::size_t w = 2; w < kRemedies; ++w) {
    const int at = collapse_depth(r.spread[w]);
    latest = std::max(latest, at == 0 ? kDepth + 1 : at);
  }
  std::snprintf(line, sizeof line,
                "none of them delays the collapse by more than a layer: attention only at depth %d, the latest at "
                "%d (needs <= %d)",
                attention_at, latest, attention_at + 1);
  check(attention_at > 0 && latest <= attention_at + 1, line);
  const int unscaled_at = collapse_depth(r.gain[0]);
  int gain_latest = 0;
  double gain_worst = 0;
  for (std::size_t i = 0; i < kGains.size(); ++i) {
    const int at = collapse_depth(r.gain[i]);
    gain_latest = std::max(gain_latest, at == 0 ? kDepth + 1 : at);
    gain_worst = std::max(gain_worst, r.gain[i][kGainDepth] / r.gain[i][1]);
  }
  std::snprintf(line, sizeof line,
                "a larger FFN slows the collapse: g = 1 collapses at depth %d, the latest of g = 4, 8, 32 at %d "
                "(needs >= %d)",
                unscaled_at, gain_latest, unscaled_at + 2);
  check(unscaled_at > 0 && gain_latest >= unscaled_at + 2, line);
  std::snprintf(line, sizeof line,
                "but does not stop it: spread at depth 16 / depth 1 <= %.2g for every g (needs <= 1e-6)", gain_worst);
  check(gain_worst <= 1e-6, line);
  return ok ? 0 : 1;
}
