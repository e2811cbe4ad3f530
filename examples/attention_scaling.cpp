// attention_scaling.cpp — why attention divides the scores by sqrt(d).
//
// For q and k with independent entries of mean 0 and variance 1, q.k = sum_i q_i k_i is a sum of d terms of
// variance 1: Var(q.k) = d. Unscaled, the scores of a row grow like sqrt(d), so softmax over them tends to a
// one-hot row as d grows: the entropy of the row falls toward 0, its largest weight toward 1, and the softmax's
// Jacobian J = diag(p) - p p^T toward 0 (every entry has a factor p_i (1 - p_i) or p_i p_j): gradients through
// the scores vanish. Scaled by 1 / sqrt(d) the scores have variance 1 at every d, and the row keeps its shape.
// For d = 16, 32, ..., 1024 this draws 16 batches of 64 queries (16 in an unoptimised build) and 64 keys with
// N(0, 1) entries and runs the library's own softmax, attention_weights(q, k, opts), twice on the same draws: with
// opts.scale = 1 (unscaled) and with the default scale 1 / sqrt(d). It prints, per d: Var(q.k) (with its standard
// error from the 16 batches), and for each version the mean over rows of the entropy -sum_j p_j log p_j (at most
// log 64 = 4.16 nats), of the largest weight, of ||J||_F, and of the variance over the row of
// log p_j = s_j - logsumexp(s) (the variance of the scores softmax was given, read back from its output: about d
// unscaled, 1 scaled).
//
// Then the backward, on draws of its own: with L = sum(O * G) for G with N(0, 1) entries and q = x W_Q^T (x N(0, 1),
// W_Q N(0, 1/d)), the RMS of an entry of dL/dq (the library's sdpa_backward) and of dL/dW_Q = sum dq^T x, unscaled
// and scaled. Does the gradient vanish or explode without the scale? The Jacobian vanishes, but what reaches q and
// W_Q grows: dL/dp_ij = G_i . v_j and the keys that carry ds back to q both have norms of order sqrt(d).
//
// Usage: attention_scaling [--seed N]     (default seed 1; the same seed prints the same output)
// Writes scaling.svg (variance, entropy, largest weight, ||J||_F, dL/dq and dL/dW_Q against d) in the current
// directory.
// Exits 1 unless
//   Var(q.k) grows like d: the slope of log Var against log d, fitted over the 7 d, is in [0.95, 1.05], and at
//     every d the scaled variance Var(q.k) / d is within 4 standard errors of 1;
//   the library applies the scale: the variance of log p_j over a scaled row, averaged over the rows, is in
//     [0.9, 1.1] at every d (its noise is about 0.01, 0.02 with 256 rows; a scale of 1/d would give 1/d);
//   the scale keeps the rows' shape: the scaled mean entropy stays within a band of 0.1 nats over all d (each
//     mean, over 1024 rows, has a standard error of about 0.01 nats, printed; seeds 1 to 30 gave bands of 0.007
//     to 0.035, and 0.014 to 0.041 with 256 rows);
//   without it the rows saturate: the unscaled mean entropy falls by more than half from d = 16 to d = 1024, and
//     the unscaled ||J||_F at d = 1024 is below half its value at d = 16 and below the scaled one;
//   yet without it the gradients grow: the unscaled RMS of dL/dq and of dL/dW_Q at d = 1024 are more than twice
//     their values at d = 16, while scaled each stays within a factor of 1.5 over all d (seeds 1 to 30 grew 3.1 to
//     4.8 times and spread at most 1.27; seeds 1 to 10 with 256 rows grew 2.9 to 5.2 times and spread at most 1.21).
// Walk-through and measured tables: docs/scaling.md.
#include <selfattn/plot/line_chart.hpp>
#include <selfattn/selfattn.hpp>

#include "example_args.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <random>
#include <vector>

using namespace selfattn;

namespace {

using T = double;
using Rng = std::mt19937_64;  // its raw output is fixed by the standard; the distributions are not

constexpr std::array<Index, 7> kDims{16, 32, 64, 128, 256, 512, 1024};  // head dimension d
constexpr Index kBatches = 16;  // B: independent draws, for the standard errors
// Lq rows of softmax per batch. Unoptimised builds (CI's -O0 sanitizer run) draw 16: the GEMMs of q k^T at d = 1024
// dominate, and 1024 rows at -O0 under ASan take 23 s; the checks hold at both sizes (docs/scaling.md).
#ifdef __OPTIMIZE__
constexpr Index kQueries = 64;
#else
constexpr Index kQueries = 16;
#endif
constexpr Index kKeys = 64;     // Lk = n keys: the entropy of a row is at most log n

double uniform01(Rng& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }
double normal(Rng& rng) {  // Box-Muller
  const double u = std::max(uniform01(rng), 0x1.0p-53), v = uniform01(rng);
  return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
}

Tensor<T, 4> random_normal(Rng& rng, Index rows, Index d) {
  Tensor<T, 4> x({kBatches, 1, rows, d});
  for (Index n = 0; n < x.size(); ++n) x.data()[n] = normal(rng);
  return x;
}

// Means over all B * Lq rows of one softmax, the weights p (B, 1, Lq, Lk) of attention_weights.
// Standard error of the mean of B batch values: their sample standard deviation / sqrt(B).
double standard_error(const std::array<double, kBatches>& v) {
  double mean = 0, spread = 0;
  for (double x : v) mean += x / kBatches;
  for (double x : v) spread += (x - mean) * (x - mean) / (kBatches - 1);
  return std::sqrt(spread / kBatches);
}

struct RowStats {
  double entropy = 0;     // -sum_j p_j log p_j
  double entropy_se = 0;  // its standard error, from the spread of the B batches' means
  double max_weight = 0;  // max_j p_j
  double jacobian = 0;    // ||diag(p) - p p^T||_F
  double seen = 0;        // variance over j of log p_j = s_j - logsumexp(s): the scores' variance as softmax saw them
};

RowStats row_stats(const Tensor<T, 4>& p) {
  RowStats s;
  const Index rows = kBatches * kQueries;
  std::array<double, kBatches> batch_entropy{};
  for (Index r = 0; r < rows; ++r) {
    const T* row = p.data() + r * kKeys;
    double entropy = 0, largest = 0, sum2 = 0, sum3 = 0, log_sum = 0, log_sum2 = 0;
    for (Index j = 0; j < kKeys; ++j) {
      const double pj = row[j];
      const double log_p = std::log(pj);  // p_j > 0: at d = 1024 unscaled, log p_j is at worst a few hundred below 0
      log_sum += log_p;
      log_sum2 += log_p * log_p;
      if (pj > 0) entropy -= pj * std::log(pj);  // 0 log 0 = 0
      largest = std::max(largest, pj);
      sum2 += pj * pj;
      sum3 += pj * pj * pj;
    }
    // ||J||_F^2 = sum_ij (p_i [i = j] - p_i p_j)^2 = sum_i p_i^2 - 2 sum_i p_i^3 + (sum_i p_i^2)^2
    s.entropy += entropy;
    batch_entropy[static_cast<std::size_t>(r / kQueries)] += entropy / kQueries;
    s.max_weight += largest;
    s.jacobian += std::sqrt(std::max(0.0, sum2 - 2 * sum3 + sum2 * sum2));
    s.seen += (log_sum2 - log_sum * log_sum / kKeys) / (kKeys - 1);
  }
  s.entropy /= static_cast<double>(rows);
  s.max_weight /= static_cast<double>(rows);
  s.jacobian /= static_cast<double>(rows);
  s.seen /= static_cast<double>(rows);
  s.entropy_se = standard_error(batch_entropy);
  return s;
}

struct Measurement {
  Index d = 0;
  double variance = 0, variance_se = 0;  // Var(q.k) over all B * Lq * Lk pairs; standard error over the B batches
  RowStats unscaled, scaled;
};

// Var(q.k) of batch b: the mean of (q_i . k_j)^2 over its Lq * Lk pairs (the mean of q.k is 0 by construction).
std::array<double, kBatches> batch_variances(const Tensor<T, 4>& q, const Tensor<T, 4>& k) {
  std::array<double, kBatches> v{};
  for (Index b = 0; b < kBatches; ++b) {
    const auto qb = as_matrix(q[b][0]), kb = as_matrix(k[b][0]);
    Eigen::MatrixXd scores(kQueries, kKeys);
    scores.noalias() = qb * kb.transpose();
    v[static_cast<std::size_t>(b)] = scores.squaredNorm() / static_cast<double>(kQueries * kKeys);
  }
  return v;
}

Measurement measure(Rng& rng, Index d) {
  Measurement m;
  m.d = d;
  const Tensor<T, 4> q = random_normal(rng, kQueries, d), k = random_normal(rng, kKeys, d);
  const std::array<double, kBatches> v = batch_variances(q, k);
  for (double x : v) m.variance += x / kBatches;
  m.variance_se = standard_error(v);
  AttentionOptions<T> unscaled;
  unscaled.scale = 1.0;  // softmax(q k^T)
  m.unscaled = row_stats(attention_weights(q, k, unscaled));
  m.scaled = row_stats(attention_weights(q, k));  // the default: softmax(q k^T / sqrt(d))
  return m;
}

// Least-squares slope of log y against log x.
double log_log_slope(const std::vector<double>& x, const std::vector<double>& y) {
  double mx = 0, my = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    mx += std::log(x[i]) / static_cast<double>(x.size());
    my += std::log(y[i]) / static_cast<double>(x.size());
  }
  double sxy = 0, sxx = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    sxy += (std::log(x[i]) - mx) * (std::log(y[i]) - my);
    sxx += (std::log(x[i]) - mx) * (std::log(x[i]) - mx);
  }
  return sxy / sxx;
}

// ---- The backward: what the scale does to the gradients ------------------------------------------------
//
// L = sum(O * G) for an upstream gradient G with N(0, 1) entries, and q = x W_Q^T with x N(0, 1) and W_Q N(0, 1/d),
// so that q has N(0, 1) entries as above. dL/dq comes from the library's backward (sdpa_backward), and
// dL/dW_Q = sum over the rows of dq^T x. Unscaled, the softmax's Jacobian shrinks as the rows saturate, but what it
// multiplies grows: dL/dp_ij = G_i . v_j and the keys that carry ds back to q both have norms of order sqrt(d).

struct GradientStats {
  double dq = 0;  // RMS of an entry of dL/dq
  double dw = 0;  // RMS of an entry of dL/dW_Q
};

struct GradientMeasurement {
  Index d = 0;
  GradientStats unscaled, scaled;
};

GradientMeasurement measure_gradients(Rng& rng, Index d) {
  GradientMeasurement m;
  m.d = d;
  const Tensor<T, 4> x = random_normal(rng, kQueries, d);
  Eigen::MatrixXd w_q(d, d);
  for (Index n = 0; n < w_q.size(); ++n) w_q.data()[n] = normal(rng) / std::sqrt(static_cast<double>(d));
  const Tensor<T, 4> k = random_normal(rng, kKeys, d), v = random_normal(rng, kKeys, d);
  const Tensor<T, 4> g = random_normal(rng, kQueries, d);  // dL/dO
  Tensor<T, 4> q(x.shape());
  for (Index b = 0; b < kBatches; ++b) as_matrix(q[b][0]) = as_matrix(x[b][0]) * w_q.transpose();
  const auto gradients = [&](const AttentionOptions<T>& opts) {
    const AttentionForward<T> f = sdpa_forward(q, k, v, opts);
    const AttentionGradients<T> grad = sdpa_backward(q, k, v, f.out, f.lse, g, opts);
    Eigen::MatrixXd dw = Eigen::MatrixXd::Zero(d, d);  // dL/dW_Q = sum_b dq_b^T x_b
    for (Index b = 0; b < kBatches; ++b) dw.noalias() += as_matrix(grad.dq[b][0]).transpose() * as_matrix(x[b][0]);
    const double dq_norm = Eigen::Map<const Eigen::VectorXd>(grad.dq.data(), grad.dq.size()).norm();
    return GradientStats{dq_norm / std::sqrt(static_cast<double>(grad.dq.size())), dw.norm() / static_cast<double>(d)};
  };
  AttentionOptions<T> unscaled;
  unscaled.scale = 1.0;
  m.unscaled = gradients(unscaled);
  m.scaled = gradients(AttentionOptions<T>{});
  return m;
}

// Largest over smallest of a series: 1 when it is flat.
double spread(const std::vector<double>& y) {
  return *std::max_element(y.begin(), y.end()) / *std::min_element(y.begin(), y.end());
}

// ---- The picture ---------------------------------------------------------------------------------------

constexpr const char* kUnscaledColour = "#d62728";
constexpr const char* kScaledColour = "#1f77b4";

bool write_picture(const std::vector<Measurement>& ms, const std::vector<GradientMeasurement>& gs) {
  std::vector<double> d, var_unscaled, var_scaled;
  std::array<std::vector<double>, 2> entropy, max_weight, jacobian;  // [0] unscaled, [1] scaled
  for (const Measurement& m : ms) {
    d.push_back(static_cast<double>(m.d));
    var_unscaled.push_back(m.variance);
    var_scaled.push_back(m.variance / static_cast<double>(m.d));
    for (int s = 0; s < 2; ++s) {
      const RowStats& r = s == 0 ? m.unscaled : m.scaled;
      entropy[static_cast<std::size_t>(s)].push_back(r.entropy);
      max_weight[static_cast<std::size_t>(s)].push_back(r.max_weight);
      jacobian[static_cast<std::size_t>(s)].push_back(r.jacobian);
    }
  }
  const ChartAxis x{"head dimension d", AxisScale::log, 16, 1024, {16, 32, 64, 128, 256, 512, 1024}};
  const auto chart = [&](const char* title, const char* y_label, const std::array<std::vector<double>, 2>& values) {
    LineChart c;
    c.title = title;
    c.x = x;
    c.y.label = y_label;
    c.series = {{"unscaled: softmax(q k^T)", kUnscaledColour, d, values[0], true},
                {"scaled: softmax(q k^T / sqrt(d))", kScaledColour, d, values[1], true}};
    return c;
  };
  LineChart variance = chart("Var(q.k) grows like d", "variance of the scores", {var_unscaled, var_scaled});
  variance.y = {"variance of the scores", AxisScale::log, 0.5, 2048, {1, 10, 100, 1000}};
  LineChart h = chart("entropy of a softmax row", "mean entropy (nats)", entropy);
  h.y.min = 0;
  h.y.max = 4.5;
  h.references.push_back({std::log(static_cast<double>(kKeys)), "log 64: uniform"});
  LineChart top = chart("largest weight of a row", "mean max_j p_j", max_weight);
  top.y.min = 0;
  top.y.max = 1;
  top.references.push_back({1.0 / static_cast<double>(kKeys), "1/64: uniform"});
  LineChart j = chart("softmax Jacobian: the gradient's way back", "mean ||diag(p) \u2212 p p^T||_F", jacobian);
  j.y.min = 0;
  std::array<std::vector<double>, 2> dq, dw;  // [0] unscaled, [1] scaled
  for (const GradientMeasurement& g : gs) {
    dq[0].push_back(g.unscaled.dq);
    dq[1].push_back(g.scaled.dq);
    dw[0].push_back(g.unscaled.dw);
    dw[1].push_back(g.scaled.dw);
  }
  LineChart q_gradient = chart("the gradient that reaches q", "RMS of an entry of dL/dq", dq);
  q_gradient.y.min = 0;
  LineChart w_gradient = chart("the gradient that reaches W_Q", "RMS of an entry of dL/dW_Q", dw);
  w_gradient.y.min = 0;
  LineChartOptions options;
  options.title = "Scores of random q, k (N(0, 1) entries), 64 keys a row: with and without 1/sqrt(d)";
  options.charts_per_row = 2;
  try {
    write_line_charts_svg("scaling.svg", {variance, h, top, j, q_gradient, w_gradient}, options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t seed = 1;
  if (!seed_argument(argc, argv, seed)) return 2;
  Rng rng(seed);
  std::printf("q, k with N(0, 1) entries: %td batches x %td queries x %td keys per d, seed %llu.\n"
              "Softmax by attention_weights(q, k, opts): opts.scale = 1 (unscaled) or the default 1/sqrt(d).\n"
              "Means over the %td rows; entropy in nats (log %td = %.3f: uniform), J = diag(p) - p p^T.\n\n",
              kBatches, kQueries, kKeys, static_cast<unsigned long long>(seed), kBatches * kQueries, kKeys,
              std::log(static_cast<double>(kKeys)));
  std::vector<Measurement> ms;
  for (Index d : kDims) ms.push_back(measure(rng, d));
  // The backward's draws come from a second stream of the same seed, so the forward's numbers stay those above.
  Rng gradient_rng(seed ^ 0x9e3779b97f4a7c15u);
  std::vector<GradientMeasurement> gs;
  for (Index d : kDims) gs.push_back(measure_gradients(gradient_rng, d));

  std::printf(
      "                                ------------- unscaled -------------   ------ scaled by 1/sqrt(d) ------\n"
      "     d   Var(q.k) +- s.e.   Var/d       seen  entropy  max p  ||J||_F    seen  entropy  max p  ||J||_F\n");
  for (const Measurement& m : ms)
    std::printf("  %4td  %9.2f +- %5.2f  %6.3f  %9.2f  %7.3f  %5.3f  %7.4f   %5.3f  %7.3f  %5.3f  %7.4f\n", m.d,
                m.variance, m.variance_se, m.variance / static_cast<double>(m.d), m.unscaled.seen, m.unscaled.entropy,
                m.unscaled.max_weight, m.unscaled.jacobian, m.scaled.seen, m.scaled.entropy, m.scaled.max_weight,
                m.scaled.jacobian);
  std::printf("(seen: the variance over a row of log p_j = s_j - logsumexp(s), the scores softmax was given, "
              "from the weights)\n");
  std::printf(
      "\nBackward: L = sum(O * G), G with N(0, 1) entries; q = x W_Q^T, x N(0, 1), W_Q N(0, 1/d); "
      "RMS of an entry:\n"
      "     d   ||J||_F unscaled   dL/dq unscaled   scaled   dL/dW_Q unscaled   scaled\n");
  for (std::size_t i = 0; i < gs.size(); ++i)
    std::printf("  %4td   %16.4f   %14.3f   %6.3f   %16.2f   %6.2f\n", gs[i].d, ms[i].unscaled.jacobian,
                gs[i].unscaled.dq, gs[i].scaled.dq, gs[i].unscaled.dw, gs[i].scaled.dw);
  if (!write_picture(ms, gs)) return 1;
  std::printf("\nwrote scaling.svg\n\n");

  // ---- The verdict ----
  bool ok = true;
  const auto check = [&ok](bool passed, const char* claim) {
    std::printf("  %s  %s\n", passed ? "ok    " : "FAILED", claim);
    ok = ok && passed;
  };
  char line[256];
  std::vector<double> d, variance;
  double worst_z = 0, h_min = 1e300, h_max = -1e300, h_se = 0, seen_min = 1e300, seen_max = -1e300;
  for (const Measurement& m : ms) {
    d.push_back(static_cast<double>(m.d));
    variance.push_back(m.variance);
    worst_z = std::max(worst_z, std::abs(m.variance - static_cast<double>(m.d)) / m.variance_se);
    h_min = std::min(h_min, m.scaled.entropy);
    h_max = std::max(h_max, m.scaled.entropy);
    h_se = std::max(h_se, m.scaled.entropy_se);
    seen_min = std::min(seen_min, m.scaled.seen);
    seen_max = std::max(seen_max, m.scaled.seen);
  }
  const double slope = log_log_slope(d, variance);
  std::snprintf(line, sizeof line, "Var(q.k) grows like d: log-log slope %.3f (needs 0.95 to 1.05)", slope);
  check(slope >= 0.95 && slope <= 1.05, line);
  std::snprintf(line, sizeof line,
                "scaled variance Var(q.k) / d is 1: at most %.2f standard errors away (needs <= 4)", worst_z);
  check(worst_z <= 4, line);
  std::snprintf(line, sizeof line,
                "attention_weights applies 1/sqrt(d): the scaled rows' scores have variance %.3f to %.3f "
                "(needs 0.9 to 1.1)",
                seen_min, seen_max);
  check(seen_min >= 0.9 && seen_max <= 1.1, line);
  std::snprintf(line, sizeof line,
                "scaled entropy stays flat: %.3f to %.3f nats over d = 16..1024, band %.3f (needs <= 0.1; "
                "s.e. of one mean <= %.3f)",
                h_min, h_max, h_max - h_min, h_se);
  check(h_max - h_min <= 0.1, line);
  const Measurement &first = ms.front(), &last = ms.back();
  std::snprintf(line, sizeof line,
                "unscaled entropy collapses: %.3f nats at d = 16, %.3f at d = 1024 (needs < half)",
                first.unscaled.entropy, last.unscaled.entropy);
  check(last.unscaled.entropy < 0.5 * first.unscaled.entropy, line);
  std::snprintf(
      line, sizeof line,
      "the unscaled softmax Jacobian vanishes: ||J||_F %.4f at d = 16, %.4f at d = 1024 (needs < half, and < the "
      "scaled %.4f)",
      first.unscaled.jacobian, last.unscaled.jacobian, last.scaled.jacobian);
  check(last.unscaled.jacobian < 0.5 * first.unscaled.jacobian && last.unscaled.jacobian < last.scaled.jacobian,
        line);
  std::vector<double> dq_scaled, dw_scaled;
  for (const GradientMeasurement& g : gs) {
    dq_scaled.push_back(g.scaled.dq);
    dw_scaled.push_back(g.scaled.dw);
  }
  const GradientMeasurement &g16 = gs.front(), &g1024 = gs.back();
  std::snprintf(line, sizeof line,
                "yet unscaled, the gradient that reaches q grows: RMS dL/dq %.3f at d = 16, %.3f at d = 1024 "
                "(needs > 2x)",
                g16.unscaled.dq, g1024.unscaled.dq);
  check(g1024.unscaled.dq > 2 * g16.unscaled.dq, line);
  std::snprintf(line, sizeof line,
                "and so does the one that reaches W_Q: RMS dL/dW_Q %.2f at d = 16, %.2f at d = 1024 (needs > 2x)",
                g16.unscaled.dw, g1024.unscaled.dw);
  check(g1024.unscaled.dw > 2 * g16.unscaled.dw, line);
  std::snprintf(line, sizeof line,
                "scaled, both stay flat: largest / smallest over d %.2f for dL/dq, %.2f for dL/dW_Q (needs < 1.5)",
                spread(dq_scaled), spread(dw_scaled));
  check(spread(dq_scaled) < 1.5 && spread(dw_scaled) < 1.5, line);
  return ok ? 0 : 1;
}
