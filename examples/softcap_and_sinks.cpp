// softcap_and_sinks.cpp — two terms serving models add to the softmax of attention, and what each is for.
//
// 1. Logit soft-capping (Gemma 2; opts.softcap, cfg.softcap): s <- c tanh(s / c) before the softmax. Every score of a
//    row then lies in (-c, c), so no two allowed keys' weights differ by more than a factor e^(2c), however large the
//    dot products grow. Random q and k of growing norm, one head, 64 keys: without the cap the rows collapse onto one
//    key (entropy near 0); with c = 5 every row keeps the bound.
// 2. A learned sink logit (gpt-oss; opts.sinks, cfg.sinks): one logit per head joins the softmax with no value, so a
//    head can put its weight nowhere. Task: a probe token looks for its own kind among 8 memory tokens and must
//    return that kind's payload vector, or the zero vector when its kind is absent (half of the examples). A softmax
//    must spend its whole weight on the memory, so without a sink the absent case cannot give 0; with one it can.
//    The head retrieves by hand-set weights (a match scores 8, other kinds 0); with cfg.sinks its sink logit is then
//    learned by AdamW from its gradient alone, starting at 0.
//
// Usage: softcap_and_sinks [--seed N]     (default seed 1)
// Exits 1 unless
//   part 1: without the cap some row's largest weight is above 0.99; with it every row's largest / smallest weight
//     is within e^(2c) (+1e-4 relative), and its lowest entropy at least 10 times the uncapped one's;
//   part 2: with the learned sink the held-out error on absent kinds is below a quarter of the error without it, the
//     error on present kinds no worse than 1.5 times (+ 0.05), and the sink takes most of the weight of an absent
//     probe (mean sink probability above 0.5 where the kind is absent, below 0.5 where it is present).
// Walk-through: docs/softcap_and_sinks.md.
#include <selfattn/selfattn.hpp>

#include "example_args.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

using namespace selfattn;

namespace {

using Rng = std::mt19937_64;

double normal(Rng& rng) {  // Box-Muller on the generator's raw bits: the same numbers with every standard library
  const double u = (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53,
               v = static_cast<double>(rng() >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
}

Tensor<float, 4> normal_tensor(const std::array<Index, 4>& shape, double scale, Rng& rng) {
  Tensor<float, 4> t(shape);
  for (Index n = 0; n < t.size(); ++n) t.data()[n] = static_cast<float>(scale * normal(rng));
  return t;
}

bool check(bool ok, const char* claim) {
  std::printf("  [%s] %s\n", ok ? "ok" : "FAILED", claim);
  return ok;
}

// ---- 1. the cap bounds every row ---------------------------------------------------------------------------------

struct RowStats {
  double max_weight = 0, min_entropy = 1e30, worst_ratio = 0;  // over the rows
};

RowStats row_stats(const Tensor<float, 4>& weights) {
  RowStats stats;
  for (Index i = 0; i < weights.dim(2); ++i) {
    double largest = 0, smallest = 1, entropy = 0;
    for (Index j = 0; j < weights.dim(3); ++j) {
      const double p = weights(0, 0, i, j);
      largest = std::max(largest, p);
      smallest = std::min(smallest, p);
      if (p > 0) entropy -= p * std::log(p);
    }
    stats.max_weight = std::max(stats.max_weight, largest);
    stats.min_entropy = std::min(stats.min_entropy, entropy);
    stats.worst_ratio = std::max(stats.worst_ratio, smallest > 0 ? largest / smallest : 1e300);
  }
  return stats;
}

bool cap_bounds_rows(Rng& rng) {
  constexpr double cap = 5.0;
  std::printf("1. Soft-capping, c = %.0f: 16 query rows over 64 keys, D = 32, q and k of norm growing with gain g\n",
              cap);
  std::printf("   %6s  %26s  %26s\n", "gain", "no cap: max p, min entropy", "c = 5: max/min p, min entropy");
  bool ok = true;
  double uncapped_max = 0, uncapped_entropy = 1e30, capped_entropy = 1e30, worst_ratio = 0;
  for (double gain : {1.0, 3.0, 10.0}) {
    const Tensor<float, 4> q = normal_tensor({1, 1, 16, 32}, gain, rng), k = normal_tensor({1, 1, 64, 32}, gain, rng);
    AttentionOptions<float> opts;
    const RowStats plain = row_stats(attention_weights(q, k, opts));
    opts.softcap = static_cast<float>(cap);
    const RowStats capped = row_stats(attention_weights(q, k, opts));
    std::printf("   %6.0f  %12.4f  %12.4f  %12.1f  %12.4f\n", gain, plain.max_weight, plain.min_entropy,
                capped.worst_ratio, capped.min_entropy);
    uncapped_max = std::max(uncapped_max, plain.max_weight);
    uncapped_entropy = std::min(uncapped_entropy, plain.min_entropy);
    capped_entropy = std::min(capped_entropy, capped.min_entropy);
    worst_ratio = std::max(worst_ratio, capped.worst_ratio);
  }
  std::printf("   bound e^(2c) = %.1f\n", std::exp(2 * cap));
  ok &= check(uncapped_max > 0.99, "without the cap, a row collapses onto one key (max weight > 0.99)");
  ok &= check(worst_ratio <= std::exp(2 * cap) * (1 + 1e-4), "with it, every row's max / min weight <= e^(2c)");
  ok &= check(capped_entropy >= 10 * uncapped_entropy, "the lowest row entropy is at least 10 times the uncapped one");
  return ok;
}

// ---- 2. a learned sink lets a head attend to nothing -------------------------------------------------------------

constexpr Index width = 16, kinds = 16, memory_len = 8, batch = 64;
constexpr double match_gain = 2.0;  // q = 2 x: a match scores 2 |e|^2 / sqrt(16) = 8, two different kinds 0

// Kind t's embedding is 4 e_t (e_t the t-th unit vector), its payload a random normal vector.
std::vector<std::vector<float>> make_payloads(Rng& rng) {
  std::vector<std::vector<float>> payload(kinds, std::vector<float>(width));
  for (auto& g : payload)
    for (float& x : g) x = static_cast<float>(normal(rng));
  return payload;
}

struct Batch {
  Tensor<float, 3> probe, memory, target;  // (B, 1, E), (B, 8, E), (B, 1, E)
  std::vector<bool> present;
};

// Probe kind t; memory of 8 kinds other than t, one of them replaced by t in half of the examples.
Batch draw_batch(const std::vector<std::vector<float>>& payload, Rng& rng) {
  Batch b{Tensor<float, 3>({batch, 1, width}),
          Tensor<float, 3>({batch, memory_len, width}),
          Tensor<float, 3>({batch, 1, width}),
          {}};
  for (Index n = 0; n < batch; ++n) {
    const Index kind = static_cast<Index>(rng() % kinds);
    const bool present = rng() % 2 == 0;
    const Index at = static_cast<Index>(rng() % memory_len);
    b.present.push_back(present);
    for (Index l = 0; l < memory_len; ++l) {
      Index other = static_cast<Index>(rng() % (kinds - 1));
      if (other >= kind) ++other;
      b.memory(n, l, present && l == at ? kind : other) = 4.0f;
    }
    b.probe(n, 0, kind) = 4.0f;
    for (Index d = 0; d < width; ++d)
      b.target(n, 0, d) = present ? payload[static_cast<std::size_t>(kind)][static_cast<std::size_t>(d)] : 0.0f;
  }
  return b;
}

// One head whose weights retrieve by hand: q = 2 x, k = x, v = the payload of x's kind, output = v. Only the sinks,
// when the module has them, are left to learn.
MultiHeadAttention<float> retrieval_head(const std::vector<std::vector<float>>& payload, bool sinks) {
  MultiHeadAttentionConfig cfg;
  cfg.embed_dim = width;
  cfg.num_heads = 1;
  cfg.bias = false;
  cfg.sinks = sinks;
  MultiHeadAttention<float> mha(cfg);
  MhaParams<float>& p = mha.params();
  for (Tensor<float, 2>* w : {&p.q_weight, &p.k_weight, &p.v_weight, &p.out_weight}) w->fill(0.0f);
  for (Index d = 0; d < width; ++d) {
    p.q_weight(d, d) = static_cast<float>(match_gain);
    p.k_weight(d, d) = 1.0f;
    p.out_weight(d, d) = 1.0f;
    for (Index t = 0; t < kinds; ++t)  // v = W_v (4 e_t) = payload(t)
      p.v_weight(d, t) = payload[static_cast<std::size_t>(t)][static_cast<std::size_t>(d)] / 4.0f;
  }
  return mha;
}

struct Errors {
  double absent = 0, present = 0, sink_absent = 0, sink_present = 0;
};

// Mean squared error per example (summed over E) on absent and present kinds, and the sink's mean probability in
// each group (exp(sink - lse); 0 without sinks).
Errors evaluate(const MultiHeadAttention<float>& mha, const Batch& b) {
  const MhaForward<float> f = mha.forward(b.probe, b.memory, b.memory);
  Errors e;
  double absent = 0;
  for (Index n = 0; n < batch; ++n) {
    double squared = 0;
    for (Index d = 0; d < width; ++d) squared += std::pow(f.output(n, 0, d) - b.target(n, 0, d), 2);
    const double sink = mha.config().sinks ? std::exp(mha.params().sinks(0) - f.attention.lse(n, 0, 0)) : 0.0;
    const bool present = b.present[static_cast<std::size_t>(n)];
    (present ? e.present : e.absent) += squared;
    (present ? e.sink_present : e.sink_absent) += sink;
    absent += present ? 0 : 1;
  }
  const double present = static_cast<double>(batch) - absent;
  return {e.absent / absent, e.present / present, e.sink_absent / absent, e.sink_present / present};
}

// AdamW on the sink logit alone, from its gradient (MhaGradients::params.sinks), 300 steps of 64 examples.
void train_sinks(MultiHeadAttention<float>& mha, const std::vector<std::vector<float>>& payload, Rng& data) {
  AdamWConfig adam;
  adam.weight_decay = 0.0;
  AdamW<float> optimizer(adam);
  for (int step = 0; step < 300; ++step) {
    const Batch b = draw_batch(payload, data);
    const MhaForward<float> f = mha.forward(b.probe, b.memory, b.memory);
    Tensor<float, 3> dout(f.output.shape());  // d/dy of the mean over examples of |y - target|^2
    for (Index n = 0; n < dout.size(); ++n)
      dout.data()[n] = 2.0f * (f.output.data()[n] - b.target.data()[n]) / static_cast<float>(batch);
    MhaGradients<float> g = mha.backward(dout, f);
    std::vector<ParameterRef<float>> sinks;
    add_parameter(sinks, "sinks", mha.params().sinks, g.params.sinks, false);
    optimizer.step(sinks, 0.05);
  }
}

bool sinks_help(std::uint64_t seed) {
  std::printf(
      "\n2. A learned sink: a retrieval head set by hand (a match scores 8, other kinds 0) looks for its probe's\n"
      "   kind among 8 memory tokens; target: that kind's payload if present, else 0. Only the sink trains.\n");
  Rng rng(seed);
  const std::vector<std::vector<float>> payload = make_payloads(rng);
  const MultiHeadAttention<float> without = retrieval_head(payload, false);
  MultiHeadAttention<float> with = retrieval_head(payload, true);
  train_sinks(with, payload, rng);
  Rng held_out(seed + 99);
  Errors plain, sunk;
  for (int round = 0; round < 8; ++round) {  // 512 held-out examples
    const Batch b = draw_batch(payload, held_out);
    const Errors p = evaluate(without, b), s = evaluate(with, b);
    plain.absent += p.absent / 8;
    plain.present += p.present / 8;
    sunk.absent += s.absent / 8;
    sunk.present += s.present / 8;
    sunk.sink_absent += s.sink_absent / 8;
    sunk.sink_present += s.sink_present / 8;
  }
  std::printf(
      "   held-out error |y - target|^2     kind absent   kind present   sink probability (absent / present)\n");
  std::printf("   without a sink                    %11.4f   %12.4f\n", plain.absent, plain.present);
  std::printf("   with the learned sink             %11.4f   %12.4f   %.3f / %.3f\n", sunk.absent, sunk.present,
              sunk.sink_absent, sunk.sink_present);
  std::printf("   learned sink logit: %.2f (from 0)\n", static_cast<double>(with.params().sinks(0)));
  bool ok = check(sunk.absent < 0.25 * plain.absent, "with the sink, the absent-kind error is below a quarter");
  ok &= check(sunk.present <= 1.5 * plain.present + 0.05, "and the present-kind error no worse (1.5 times + 0.05)");
  ok &= check(sunk.sink_absent > 0.5 && sunk.sink_present < 0.5,
              "the sink takes most of an absent probe's weight, and not of a present one's");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t seed = 1;
  if (!seed_argument(argc, argv, seed)) return 2;
  Rng rng(seed);
  bool ok = cap_bounds_rows(rng);
  ok &= sinks_help(seed);
  std::printf("\n%s\n", ok ? "All claims hold." : "A claim failed.");
  return ok ? 0 : 1;
}
