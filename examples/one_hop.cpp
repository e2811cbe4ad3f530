// one_hop.cpp — why attention beats recurrence at a distance (chapter §2): in a recurrent network the first token
// reaches the last through L - 1 steps, in attention through one.
//
// How much can token 1 move the output at position L? The norm of the Jacobian ||d y_L / d x_1|| (Frobenius), for
// L = 2 ... 512, averaged over 8 random sequences x_t ~ N(0, I), width d = 32:
//
//   recurrent (Elman, PyTorch's nn.RNN with tanh and its initialisation U(-1/sqrt(d), 1/sqrt(d))):
//       h_t = tanh(W h_{t-1} + U x_t + b),   d h_L / d x_1 = D_L W D_{L-1} W ... D_2 W D_1 U,   D_t = diag(1 - h_t^2)
//     a product of L - 1 matrices of norm below 1: it shrinks geometrically with the distance.
//   attention (one causal MultiHeadAttention layer, 4 heads, PyTorch's initialisation):
//       y_L = W_o sum_j p_Lj W_v x_j + ...,   d y_L / d x_1 ~ p_L1 W_o W_v + (the paths through q_L and k_1)
//     one step whatever the distance; its size is that of the weight p_L1, which dilutes as 1/L (attention_dilution
//     measures that), not geometrically. The attention Jacobian comes from the library's backward: one call per
//     output coordinate, dout = e_k at row L, reading row 1 of d_query + d_key + d_value.
//
// Usage: one_hop [--seed N]     (default seed 1)
// Exits 1 unless
//   the recurrent influence vanishes geometrically: at L = 64 it is below 1e-12 of its value at L = 2;
//   the attention's does not: at L = 512 it is above 1e-3 of its value at L = 2, and L times it stays within a
//     factor of 10 from L = 8 to L = 512 (the 1/L of a diluting softmax row);
//   one hop wins from a short distance on: attention's influence exceeds the recurrent one's for every L >= 16.
// Walk-through and measured table: docs/scaling.md.
#include <selfattn/selfattn.hpp>

#include "example_args.hpp"

#include <Eigen/Dense>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

using namespace selfattn;

namespace {

using Rng = std::mt19937_64;  // its raw output is fixed by the standard; the distributions are not
using Matrix = Eigen::MatrixXd;
using Vector = Eigen::VectorXd;

constexpr Index kWidth = 32, kHeads = 4, kSequences = 8;
constexpr std::array<Index, 9> kLengths{2, 4, 8, 16, 32, 64, 128, 256, 512};

double uniform01(Rng& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }
double normal(Rng& rng) {  // Box-Muller
  const double u = std::max(uniform01(rng), 0x1.0p-53), v = uniform01(rng);
  return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
}

// An Elman RNN as nn.RNN(d, d, nonlinearity="tanh") initialises it: every weight and bias U(-1/sqrt(d), 1/sqrt(d)).
struct Recurrent {
  Matrix w, u;  // (d, d): hidden to hidden, input to hidden
  Vector b;     // b_ih + b_hh
  explicit Recurrent(Rng& rng) : w(kWidth, kWidth), u(kWidth, kWidth), b(kWidth) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(kWidth));
    const auto draw = [&] { return bound * (2 * uniform01(rng) - 1); };
    for (Matrix* m : {&w, &u})
      for (Index n = 0; n < m->size(); ++n) m->data()[n] = draw();
    for (Index n = 0; n < kWidth; ++n) b[n] = draw() + draw();
  }

  // ||d h_L / d x_1||: the forward, then the Jacobian carried along: J_1 = D_1 U, J_t = D_t W J_{t-1}.
  double influence(const Matrix& x) const {  // x (L, d)
    Vector h = Vector::Zero(kWidth);
    Matrix jacobian;
    for (Index t = 0; t < x.rows(); ++t) {
      h = (w * h + u * x.row(t).transpose() + b).array().tanh().matrix();
      const Vector slope = (1.0 - h.array().square()).matrix();  // tanh' at the step
      jacobian = slope.asDiagonal() * (t == 0 ? u : Matrix(w * jacobian));
    }
    return jacobian.norm();
  }
};

// ||d y_L / d x_1|| of one causal self-attention layer, by the library's backward: row k of the Jacobian is row 1 of
// dx for dout = e_k at row L (dx = d_query + d_key + d_value: x is all three).
double attention_influence(const MultiHeadAttention<double>& mha, const Matrix& x) {
  const Index length = x.rows();
  Tensor<double, 3> input({1, length, kWidth});
  for (Index t = 0; t < length; ++t)
    for (Index e = 0; e < kWidth; ++e) input(0, t, e) = x(t, e);
  AttentionOptions<double> opts;
  opts.causal = Causal::top_left;
  const MhaForward<double> f = mha.forward(input, opts);
  double squares = 0;
  Tensor<double, 3> dout({1, length, kWidth});
  for (Index k = 0; k < kWidth; ++k) {
    dout.fill(0.0);
    dout(0, length - 1, k) = 1.0;
    const MhaGradients<double> g = mha.backward(dout, f);
    for (Index e = 0; e < kWidth; ++e) {
      const double d = g.d_query(0, 0, e) + g.d_key(0, 0, e) + g.d_value(0, 0, e);
      squares += d * d;
    }
  }
  return std::sqrt(squares);
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t seed = 1;
  if (!seed_argument(argc, argv, seed)) return 2;
  Rng rng(seed);
  const Recurrent rnn(rng);
  MultiHeadAttentionConfig cfg;
  cfg.embed_dim = kWidth;
  cfg.num_heads = kHeads;
  MultiHeadAttention<double> mha(cfg, seed);
  for (Tensor<double, 1>* bias : {&mha.params().q_bias, &mha.params().k_bias, &mha.params().v_bias})
    for (Index n = 0; n < bias->size(); ++n) bias->data()[n] = 0.1 * normal(rng);  // PyTorch's are 0; any will do

  std::printf(
      "How much token 1 moves the output at position L: ||d y_L / d x_1|| (Frobenius), width %td, mean of "
      "%td random sequences.\n\n",
      kWidth, kSequences);
  std::printf("%6s  %14s  %14s  %16s\n", "L", "recurrent", "attention", "L x attention");
  std::vector<double> recurrent, attention, lengths;
  for (Index length : kLengths) {
    double r = 0, a = 0;
    for (Index s = 0; s < kSequences; ++s) {
      Matrix x(length, kWidth);
      for (Index n = 0; n < x.size(); ++n) x.data()[n] = normal(rng);
      r += rnn.influence(x) / kSequences;
      a += attention_influence(mha, x) / kSequences;
    }
    recurrent.push_back(r);
    attention.push_back(a);
    lengths.push_back(static_cast<double>(length));
    std::printf("%6td  %14.3e  %14.3e  %16.3f\n", length, r, a, static_cast<double>(length) * a);
  }

  // The picture: both on a log scale against L.
  LineChart chart;
  chart.title = "influence of token 1 on the output at L";
  chart.x.label = "distance L";
  chart.x.scale = AxisScale::log;
  chart.y.label = "||d y_L / d x_1||";
  chart.y.scale = AxisScale::log;
  chart.y.min = 1e-24;  // the recurrent curve leaves the chart after L = 64 (it underflows double by L = 512)
  chart.y.max = 10;
  std::vector<double> recurrent_shown, lengths_shown;  // the recurrent curve while it is inside the chart
  for (std::size_t i = 0; i < recurrent.size(); ++i)
    if (recurrent[i] >= chart.y.min) {
      recurrent_shown.push_back(recurrent[i]);
      lengths_shown.push_back(lengths[i]);
    }
  chart.series.push_back({"recurrent (L - 1 steps)", "#d62728", lengths_shown, recurrent_shown, true});
  chart.series.push_back({"attention (one step)", "#1f77b4", lengths, attention, true});
  write_line_charts_svg("one_hop.svg", {chart});
  std::printf("\nWrote one_hop.svg.\n\n");

  const auto at = [&](const std::vector<double>& v, Index length) {
    for (std::size_t i = 0; i < kLengths.size(); ++i)
      if (kLengths[i] == length) return v[i];
    return 0.0;
  };
  double lowest = 1e300, highest = 0;  // of L x attention for L >= 8
  bool attention_wins = true;
  for (std::size_t i = 0; i < kLengths.size(); ++i) {
    if (kLengths[i] >= 8) {
      lowest = std::min(lowest, lengths[i] * attention[i]);
      highest = std::max(highest, lengths[i] * attention[i]);
    }
    if (kLengths[i] >= 16 && !(attention[i] > recurrent[i])) attention_wins = false;
  }
  bool ok = true;
  const auto check = [&](bool claim, const char* what) {
    std::printf("%s %s\n", claim ? "ok  " : "FAIL", what);
    ok = ok && claim;
  };
  check(at(recurrent, 64) < 1e-12 * at(recurrent, 2),
        "the recurrent influence vanishes geometrically (L = 64: < 1e-12 of L = 2)");
  check(at(attention, 512) > 1e-3 * at(attention, 2), "the attention's does not (L = 512: > 1e-3 of L = 2)");
  check(highest < 10 * lowest,
        "L x attention influence stays within a factor of 10 from L = 8 to 512: it dilutes as 1/L");
  check(attention_wins, "attention's influence exceeds the recurrent one's for every L >= 16");
  return ok ? 0 : 1;
}
