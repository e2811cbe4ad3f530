// exercises.cpp — seven exercises on self-attention, worked (chapter §14-15): each is what a reader would write
// with a matrix library, a few lines of Eigen, and a check of the answer against selfattn or against calculus.
//
//   1. attention from scratch: softmax(Q K^T / sqrt(d)) V, with and without a causal mask, against sdpa_forward
//   2. multi-head attention from its parts: project, split into heads, attend per head, concatenate, project out,
//      against MultiHeadAttention::forward
//   3. causality by perturbation: changing token j leaves every output before j bit for bit as it was
//   4. temperature: scores divided by T; T -> 0 gives the argmax (one-hot rows), T -> infinity the mean of the values
//   5. the backward by hand, dS = P * (dP - rowsum(dO * O)), against central finite differences
//   6. cross-attention: queries from one sequence, keys and values from another of another length; every output
//      row is a convex combination of the value rows
//   7. padding: a padded batch with key_lengths gives the unpadded answer, whatever the padding holds
//
// Everything in double, on random inputs. Usage: exercises [--seed N]   (default seed 1; the same seed prints the
// same output). Exits 1 unless every answer matches: 1, 2, 6 and 7 within 1e-12 (relative to the largest entry),
// 3 bitwise, 4 within 1e-3 of the limits, 5 within 1e-7 relative. Walk-through: docs/tutorial.md, "§14-15".
#include <selfattn/selfattn.hpp>

#include "example_args.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>

using namespace selfattn;

namespace {

using Matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Rng = std::mt19937_64;

bool ok = true;

// One answer checked: what was measured, and the bound it had to meet ("<= 1e-12", "== 0", "> 1e-6").
void check(bool passed, const char* what, double measured, const char* needs) {
  std::printf("  %s  %-66s %9.2e  (needs %s)\n", passed ? "ok    " : "FAILED", what, measured, needs);
  ok = ok && passed;
}

Matrix random_matrix(Index rows, Index cols, Rng& rng) {
  std::normal_distribution<double> normal;
  Matrix m(rows, cols);
  for (Index i = 0; i < m.size(); ++i) m.data()[i] = normal(rng);
  return m;
}

// A (1, 1, L, D) tensor holding m, and back: the library's layout is (batch, heads, length, head_dim).
Tensor<double, 4> as_tensor(const Matrix& m) {
  Tensor<double, 4> t({1, 1, m.rows(), m.cols()});
  std::copy(m.data(), m.data() + m.size(), t.data());
  return t;
}
Matrix head_of(const Tensor<double, 4>& t, Index b, Index h) {
  Matrix m(t.dim(2), t.dim(3));
  for (Index i = 0; i < m.rows(); ++i)
    for (Index j = 0; j < m.cols(); ++j) m(i, j) = t(b, h, i, j);
  return m;
}
Matrix as_matrix_copy(const Tensor<double, 2>& t) {
  Matrix m(t.dim(0), t.dim(1));
  std::copy(t.data(), t.data() + t.size(), m.data());
  return m;
}
Eigen::RowVectorXd as_row(const Tensor<double, 1>& t) {
  return Eigen::Map<const Eigen::RowVectorXd>(t.data(), t.dim(0));
}

// |a - b| at its largest, over the largest |b|: the error of a against the answer b, in units of b's size.
double relative_error(const Matrix& a, const Matrix& b) {
  return (a - b).cwiseAbs().maxCoeff() / std::max(b.cwiseAbs().maxCoeff(), 1e-300);
}

// ---- Exercise 1 ----------------------------------------------------------------------------------------------
// P = softmax(Q K^T / sqrt(d)) row by row, a masked score being -inf (weight 0); the output is P V.
Matrix softmax_rows(Matrix scores) {
  for (Index i = 0; i < scores.rows(); ++i) {
    // subtracting the row's largest score first keeps exp from overflowing and changes nothing else
    const double largest = scores.row(i).maxCoeff();
    for (Index j = 0; j < scores.cols(); ++j) scores(i, j) = std::exp(scores(i, j) - largest);
    scores.row(i) /= scores.row(i).sum();
  }
  return scores;
}
Matrix attention_by_hand(const Matrix& q, const Matrix& k, const Matrix& v, bool causal) {
  Matrix scores = q * k.transpose() / std::sqrt(static_cast<double>(q.cols()));
  if (causal)
    for (Index i = 0; i < scores.rows(); ++i)
      for (Index j = i + 1; j < scores.cols(); ++j) scores(i, j) = -std::numeric_limits<double>::infinity();
  return softmax_rows(scores) * v;
}

void exercise_attention_from_scratch(Rng& rng) {
  std::printf("1. Attention from scratch: softmax(Q K^T / sqrt(d)) V in Eigen against sdpa_forward (L = 9, d = 8)\n");
  const Matrix q = random_matrix(9, 8, rng), k = random_matrix(9, 8, rng), v = random_matrix(9, 8, rng);
  for (bool causal : {false, true}) {
    AttentionOptions<double> opts;
    opts.causal = causal ? Causal::top_left : Causal::none;
    const Matrix library = head_of(sdpa_forward(as_tensor(q), as_tensor(k), as_tensor(v), opts).out, 0, 0);
    const double error = relative_error(attention_by_hand(q, k, v, causal), library);
    check(error <= 1e-12, causal ? "causal: the same output" : "no mask: the same output", error, "<= 1e-12");
  }
}

// ---- Exercise 2 ----------------------------------------------------------------------------------------------
// Multi-head attention is H small attentions side by side: Q = X W_Q^T + b_Q (and K, V), head h takes columns
// h*Dh .. h*Dh + Dh - 1 of each, the heads' outputs are concatenated and projected: out = concat W_O^T + b_O.
void exercise_multi_head(Rng& rng) {
  std::printf("\n2. Multi-head attention from its parts against MultiHeadAttention::forward (L = 7, E = 16, H = 4)\n");
  constexpr Index kLength = 7, kEmbed = 16, kHeads = 4, kHeadDim = kEmbed / kHeads;
  MultiHeadAttentionConfig cfg;
  cfg.embed_dim = kEmbed;
  cfg.num_heads = kHeads;
  MultiHeadAttention<double> mha(cfg, rng());
  auto& P = mha.params();
  std::normal_distribution<double> normal;
  for (Tensor<double, 1>* bias : {&P.q_bias, &P.k_bias, &P.v_bias, &P.out_bias})  // zero by default: make them count
    for (Index i = 0; i < bias->size(); ++i) bias->data()[i] = 0.1 * normal(rng);

  const Matrix x = random_matrix(kLength, kEmbed, rng);
  Tensor<double, 3> x_tensor({1, kLength, kEmbed});
  std::copy(x.data(), x.data() + x.size(), x_tensor.data());
  AttentionOptions<double> opts;
  opts.causal = Causal::top_left;
  const Tensor<double, 3> out = mha.forward(x_tensor, opts).output;
  Matrix library(kLength, kEmbed);
  std::copy(out.data(), out.data() + out.size(), library.data());

  const auto project = [&x](const Tensor<double, 2>& weight, const Tensor<double, 1>& bias) -> Matrix {
    return (x * as_matrix_copy(weight).transpose()).rowwise() + as_row(bias);
  };
  const Matrix q = project(P.q_weight, P.q_bias), k = project(P.k_weight, P.k_bias), v = project(P.v_weight, P.v_bias);
  Matrix concat(kLength, kEmbed);
  for (Index h = 0; h < kHeads; ++h)
    concat.middleCols(h * kHeadDim, kHeadDim) =
        attention_by_hand(q.middleCols(h * kHeadDim, kHeadDim), k.middleCols(h * kHeadDim, kHeadDim),
                          v.middleCols(h * kHeadDim, kHeadDim), /*causal=*/true);
  const Matrix by_hand = (concat * as_matrix_copy(P.out_weight).transpose()).rowwise() + as_row(P.out_bias);
  const double error = relative_error(by_hand, library);
  check(error <= 1e-12, "causal, 4 heads, biases: the same output", error, "<= 1e-12");
}

// ---- Exercise 3 ----------------------------------------------------------------------------------------------
// With the causal mask, output i reads tokens 0..i only: changing token j (its query, key and value) must leave
// outputs 0..j-1 exactly as they were, and change j and every output after it.
void exercise_causality(Rng& rng) {
  std::printf("\n3. Causality by perturbation: token 5 of 10 changed (q, k and v), 2 heads\n");
  constexpr Index kLength = 10, kChanged = 5, kDim = 4;
  Tensor<double, 4> q({1, 2, kLength, kDim}), k({1, 2, kLength, kDim}), v({1, 2, kLength, kDim});
  std::normal_distribution<double> normal;
  for (Tensor<double, 4>* t : {&q, &k, &v})
    for (Index i = 0; i < t->size(); ++i) t->data()[i] = normal(rng);
  AttentionOptions<double> opts;
  opts.causal = Causal::top_left;
  const Tensor<double, 4> before = sdpa_forward(q, k, v, opts).out;
  for (Tensor<double, 4>* t : {&q, &k, &v})
    for (Index h = 0; h < 2; ++h)
      for (Index d = 0; d < kDim; ++d) (*t)(0, h, kChanged, d) += 1.0;
  const Tensor<double, 4> after = sdpa_forward(q, k, v, opts).out;

  double largest_before = 0, smallest_from = std::numeric_limits<double>::infinity();
  for (Index h = 0; h < 2; ++h)
    for (Index i = 0; i < kLength; ++i) {
      const double change = (head_of(after, 0, h).row(i) - head_of(before, 0, h).row(i)).cwiseAbs().maxCoeff();
      if (i < kChanged)
        largest_before = std::max(largest_before, change);
      else
        smallest_from = std::min(smallest_from, change);
    }
  check(largest_before == 0, "outputs 0..4: the largest change (bitwise equal)", largest_before, "== 0");
  check(smallest_from > 1e-6, "outputs 5..9: the smallest change", smallest_from, "> 1e-6");
}

// ---- Exercise 4 ----------------------------------------------------------------------------------------------
// softmax(s / T): as T -> 0 each row puts all its weight on its largest score; as T -> infinity the weights
// become 1/L and the output the mean of the value rows. The temperature is the scale: scale = 1 / (T sqrt(d)).
void exercise_temperature(Rng& rng) {
  std::printf("\n4. Temperature: weights and output of softmax(Q K^T / (T sqrt(d))) V (L = 12, d = 8)\n");
  constexpr Index kLength = 12, kDim = 8;
  constexpr double kColdest = 1e-4;
  const Matrix q = random_matrix(kLength, kDim, rng), k = random_matrix(kLength, kDim, rng),
               v = random_matrix(kLength, kDim, rng);
  const Matrix scores = q * k.transpose();
  std::printf("         T   mean largest weight   distance from 1/L   distance of the output from mean(V)\n");
  Matrix cold, hot;
  for (double temperature : {kColdest, 0.1, 1.0, 10.0, 1000.0, 100000.0}) {
    AttentionOptions<double> opts;
    opts.scale = 1 / (temperature * std::sqrt(static_cast<double>(kDim)));
    const Matrix weights = head_of(attention_weights(as_tensor(q), as_tensor(k), opts), 0, 0);
    const Matrix out = head_of(sdpa_forward(as_tensor(q), as_tensor(k), as_tensor(v), opts).out, 0, 0);
    const Eigen::RowVectorXd mean_v = v.colwise().mean();
    const double from_uniform = (weights.array() - 1.0 / kLength).abs().maxCoeff();
    const double from_mean = (out.rowwise() - mean_v).cwiseAbs().maxCoeff();
    std::printf("  %8g   %19.4f   %17.2e   %18.2e\n", temperature, weights.rowwise().maxCoeff().mean(), from_uniform,
                from_mean);
    if (temperature == kColdest) cold = weights;
    if (temperature == 100000.0) hot = weights;
    if (temperature == 100000.0)
      check(from_mean <= 1e-3, "T = 1e5: the output is the mean of V, within", from_mean, "<= 1e-3");
  }
  // As T -> 0 each row goes one-hot on its largest score, at a rate set by the gap g to the second largest: the
  // other L - 1 weights are each at most exp(-g / (T sqrt(d))) times the largest, so 1 - largest <= (L - 1)
  // exp(-g / (T sqrt(d))). Two nearly equal largest scores share the weight until T falls below their gap.
  bool on_argmax = true, within_bound = true;
  double smallest_gap = std::numeric_limits<double>::infinity();
  for (Index i = 0; i < kLength; ++i) {
    Index largest_score = 0, largest_weight = 0;
    scores.row(i).maxCoeff(&largest_score);
    cold.row(i).maxCoeff(&largest_weight);
    Eigen::RowVectorXd others = scores.row(i);
    others(largest_score) = -std::numeric_limits<double>::infinity();
    const double gap = scores(i, largest_score) - others.maxCoeff();
    smallest_gap = std::min(smallest_gap, gap);
    on_argmax = on_argmax && largest_score == largest_weight;
    within_bound =
        within_bound && 1 - cold(i, largest_score) <=
                            (kLength - 1) * std::exp(-gap / (kColdest * std::sqrt(static_cast<double>(kDim)))) + 1e-15;
  }
  std::printf("  (T = 1e-4: the smallest gap between a row's two largest scores is %.2e)\n", smallest_gap);
  check(on_argmax && within_bound, "T = 1e-4: rows peak on their largest score; largest 1 - peak weight",
        1 - cold.rowwise().maxCoeff().minCoeff(), "<= (L-1) exp(-gap/(T sqrt d)), each row");
  const double uniform_error = (hot.array() - 1.0 / kLength).abs().maxCoeff();
  check(uniform_error <= 1e-3, "T = 1e5: every weight 1/L, within", uniform_error, "<= 1e-3");
}

// ---- Exercise 5 ----------------------------------------------------------------------------------------------
// For a loss L(O) with dO = dL/dO and O = P V, P = softmax(S), S = Q K^T / sqrt(d):
//   dV = P^T dO,   dP = dO V^T,   dS = P * (dP - rowsum(dO * O)),   dQ = dS K / sqrt(d),   dK = dS^T Q / sqrt(d)
// (rowsum(dO * O) = rowsum(P * dP): the softmax's Jacobian applied to dP). Checked by central differences of the
// loss L = sum(dO * O) with dO fixed, one input element at a time.
void exercise_backward(Rng& rng) {
  std::printf("\n5. The backward by hand against central finite differences (L = 6, d = 4, causal)\n");
  constexpr Index kLength = 6, kDim = 4;
  const Matrix q = random_matrix(kLength, kDim, rng), k = random_matrix(kLength, kDim, rng),
               v = random_matrix(kLength, kDim, rng), d_out = random_matrix(kLength, kDim, rng);
  const double scale = 1 / std::sqrt(static_cast<double>(kDim));
  Matrix scores = q * k.transpose() * scale;
  for (Index i = 0; i < kLength; ++i)
    for (Index j = i + 1; j < kLength; ++j) scores(i, j) = -std::numeric_limits<double>::infinity();
  const Matrix p = softmax_rows(scores), out = p * v;
  const Matrix d_v = p.transpose() * d_out, d_p = d_out * v.transpose();
  const Eigen::VectorXd row_sums = (d_out.array() * out.array()).rowwise().sum();
  const Matrix d_s = p.array() * (d_p.colwise() - row_sums).array();
  const Matrix d_q = d_s * k * scale, d_k = d_s.transpose() * q * scale;

  const auto loss = [&](const Matrix& q_, const Matrix& k_, const Matrix& v_) {
    return (attention_by_hand(q_, k_, v_, true).array() * d_out.array()).sum();
  };
  const double step = 1e-6;
  const auto numeric = [&](int which) {
    Matrix grad(kLength, kDim);
    for (Index i = 0; i < grad.size(); ++i) {
      Matrix plus[3] = {q, k, v}, minus[3] = {q, k, v};
      plus[which].data()[i] += step;
      minus[which].data()[i] -= step;
      // (L(x + h) - L(x - h)) / 2h: error O(h^2), against O(h) one-sided
      grad.data()[i] = (loss(plus[0], plus[1], plus[2]) - loss(minus[0], minus[1], minus[2])) / (2 * step);
    }
    return grad;
  };
  const char* names[3] = {"dQ: by hand against finite differences", "dK: by hand against finite differences",
                          "dV: by hand against finite differences"};
  const Matrix* by_hand[3] = {&d_q, &d_k, &d_v};
  for (int which = 0; which < 3; ++which) {
    const double error = relative_error(*by_hand[which], numeric(which));
    check(error <= 1e-7, names[which], error, "<= 1e-7");
  }
  // and the library's backward gives the same
  AttentionOptions<double> opts;
  opts.causal = Causal::top_left;
  const auto forward = sdpa_forward(as_tensor(q), as_tensor(k), as_tensor(v), opts);
  const auto grads =
      sdpa_backward(as_tensor(q), as_tensor(k), as_tensor(v), forward.out, forward.lse, as_tensor(d_out), opts);
  const double error =
      std::max({relative_error(head_of(grads.dq, 0, 0), d_q), relative_error(head_of(grads.dk, 0, 0), d_k),
                relative_error(head_of(grads.dv, 0, 0), d_v)});
  check(error <= 1e-12, "sdpa_backward: dQ, dK, dV equal the ones by hand", error, "<= 1e-12");
}

// ---- Exercise 6 ----------------------------------------------------------------------------------------------
// Cross-attention: 3 queries read 7 keys and values. The output has one row per query, and each row is a weighted
// mean of the 7 value rows (weights >= 0 summing to 1), so every entry lies between the values' min and max.
void exercise_cross_attention(Rng& rng) {
  std::printf("\n6. Cross-attention: 3 queries over 7 keys and values (d = 8, d_v = 5)\n");
  const Matrix q = random_matrix(3, 8, rng), k = random_matrix(7, 8, rng), v = random_matrix(7, 5, rng);
  AttentionOptions<double> opts;
  opts.need_weights = true;
  const auto forward = sdpa_forward(as_tensor(q), as_tensor(k), as_tensor(v), opts);
  const Matrix out = head_of(forward.out, 0, 0), weights = head_of(forward.weights, 0, 0);
  std::printf("  output (%td, %td): one row per query; weights (%td, %td)\n", out.rows(), out.cols(), weights.rows(),
              weights.cols());
  const double sum_error = (weights.rowwise().sum().array() - 1).abs().maxCoeff();
  check(sum_error <= 1e-12 && weights.minCoeff() >= 0, "every row of weights is >= 0 and sums to 1, within", sum_error,
        "<= 1e-12");
  double outside = 0;  // how far any output entry lies outside [min_j v_jc, max_j v_jc]
  for (Index c = 0; c < out.cols(); ++c)
    for (Index i = 0; i < out.rows(); ++i)
      outside = std::max({outside, v.col(c).minCoeff() - out(i, c), out(i, c) - v.col(c).maxCoeff()});
  check(outside <= 1e-12, "every output entry lies within its value column's range, within", std::max(outside, 0.0),
        "<= 1e-12");
  const double error = relative_error(attention_by_hand(q, k, v, false), out);
  check(error <= 1e-12, "exercise 1's function, given 3 and 7 rows, gives the same", error, "<= 1e-12");
}

// ---- Exercise 7 ----------------------------------------------------------------------------------------------
// A batch of two sequences of lengths 7 and 4, the second padded to 7 with junk: key_lengths = {7, 4} keeps the
// junk out of every softmax, so sequence 2's outputs (rows 0..3) equal attention over its 4 tokens alone.
void exercise_padding(Rng& rng) {
  std::printf("\n7. Padding: a batch of lengths 7 and 4, the short one padded with junk, key_lengths = {7, 4}\n");
  constexpr Index kLength = 7, kShort = 4, kDim = 6;
  Tensor<double, 4> q({2, 1, kLength, kDim}), k({2, 1, kLength, kDim}), v({2, 1, kLength, kDim});
  std::normal_distribution<double> normal;
  for (Tensor<double, 4>* t : {&q, &k, &v})
    for (Index i = 0; i < t->size(); ++i) t->data()[i] = normal(rng);
  AttentionOptions<double> opts;
  opts.key_lengths = {kLength, kShort};
  const auto junk = [&](double value) {
    for (Tensor<double, 4>* t : {&k, &v})
      for (Index l = kShort; l < kLength; ++l)
        for (Index d = 0; d < kDim; ++d) (*t)(1, 0, l, d) = value;
    return head_of(sdpa_forward(q, k, v, opts).out, 1, 0).topRows(kShort).eval();
  };
  const Matrix with_junk = junk(1e3), with_other_junk = junk(-7.5);
  const Matrix alone = attention_by_hand(head_of(q, 1, 0).topRows(kShort), head_of(k, 1, 0).topRows(kShort),
                                         head_of(v, 1, 0).topRows(kShort), false);
  const double error = relative_error(with_junk, alone);
  check(error <= 1e-12, "sequence 2 padded equals sequence 2 alone, within", error, "<= 1e-12");
  const double change = (with_junk - with_other_junk).cwiseAbs().maxCoeff();
  check(change == 0, "other junk in the padding: the largest change (bitwise equal)", change, "== 0");
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t seed = 1;
  if (!seed_argument(argc, argv, seed)) return 2;
  Rng rng(seed);
  std::printf("Seven exercises on self-attention, worked in double (seed %llu)\n\n",
              static_cast<unsigned long long>(seed));
  exercise_attention_from_scratch(rng);
  exercise_multi_head(rng);
  exercise_causality(rng);
  exercise_temperature(rng);
  exercise_backward(rng);
  exercise_cross_attention(rng);
  exercise_padding(rng);
  std::printf("\n%s\n", ok ? "every answer checks out" : "FAILED: an answer does not match");
  return ok ? 0 : 1;
}
