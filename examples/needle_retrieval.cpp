// needle_retrieval.cpp — "lost in the middle", taken apart: which ingredients make retrieval accuracy U-shaped in
// the needle's position.
//
// Liu et al. (2023, "Lost in the Middle") found that long-context models retrieve a fact best when it sits at the
// start or the end of the context, worst in the middle. This program measures accuracy by the needle's position on
// a synthetic retrieval task, one ingredient at a time, through the library's attention_weights. The task: L
// context tokens with keys k_j ~ N(0, I_D), D = 16; one of them, the needle, has the key g u + N(0, I_D) (gap
// g = 4); the query is u, a random unit vector, with scale 1, so a distractor scores N(0, 1) and the needle
// g + N(0, 1). Values are one-hot, so the output is the vector of the context tokens' shares, and the answer is the
// token with the largest share: correct when it is the needle. The needle is inserted at depth 0 %, 10 %, ..., 100 %
// of the context (position round(depth (L - 1))) among the same L - 1 distractors in the same order, so every depth
// sees the same draws. The conditions, for L = 64, 512 and 2048, 300 draws each:
//   no position     attention alone (permutation equivariant);
//   sink            a BOS token before the context that every query scores 8: it takes most of the weight;
//   ALiBi 2^-8      the smallest of ALiBi's slopes (its farthest-looking head), the query just after the context;
//   RoPE            rotary embedding of query and keys (D = 16, base 10000), the query at position L;
//   causal layer    a causal layer in front of the readout, with equal scores (the causal mask alone: every token
//                   averages its prefix) and a residual, h_j = x_j + mean_{i <= j} x_i; the readout attends over h,
//                   so a token's share of the output comes from its own row and from the mean of every later row;
//   causal + ALiBi  both.
// The causal layer is the library's scaled_dot_product_attention with Causal::top_left and a zero query; the program
// checks at each length that it is that running mean, and that the shares it passes on are those of its
// attention_weights, then uses the O(L) form.
//
// Usage: needle_retrieval [--seed N]     (default seed 1; the same seed prints the same output)
// Writes needle_retrieval.svg in the current directory (accuracy against depth at each L, and against the position
// on a log axis at L = 512). Exits 1 unless
//   the causal layer is the library's causal attention, to 1e-12;
//   no position is flat to the last draw: at every L each draw succeeds at every depth or at none;
//   a sink changes nothing: every draw's outcome at every depth is the one without it;
//   ALiBi is a recency bias: at L = 512 and 2048, 100 % beats 0 % by more than 0.3, and accuracy never falls from
//     one depth to the next (draw for draw it cannot: moving the needle nearer the query raises its score and moves
//     the distractors it passes one step away);
//   the causal layer is a primacy bias: at every L, 0 % beats 100 % by more than 0.1, accuracy never rises by more
//     than 0.05 from one depth to the next, and the share of its misses won by a token before the needle exceeds
//     that without positions by more than 0.1;
//   its primacy spans orders of magnitude, not the first token alone: at L = 512 accuracy falls by more than 0.04
//     from position 1 to 16 and again from 16 to 256;
//   both together are U-shaped at L = 512: 0 % and 100 % each beat the worst depth between them by more than 0.2;
//     at L = 64 the primacy wins (0 % beats 100 %), at L = 2048 the recency (0 % at most 0.3, 100 % at least 0.7);
//   RoPE keeps the adjacent needle (100 % is the best depth at every L) and loses the rest: over depths 0 to 90 %
//     its mean accuracy is below that without positions by more than 0.3 at every L.
// Walk-through and measured tables: docs/scaling.md, "Position: lost in the middle".
#include <selfattn/plot/line_chart.hpp>  // not yet in the umbrella header
#include <selfattn/selfattn.hpp>

#include "example_args.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <vector>

using namespace selfattn;

namespace {

using T = double;
using Rng = std::mt19937_64;  // its raw output is fixed by the standard; the distributions are not

constexpr std::array<Index, 3> kLengths{64, 512, 2048};
constexpr std::size_t kMiddle = 1;  // kLengths[kMiddle] = 512: where the U is, and the log-position table
constexpr int kDepths = 11;         // 0 %, 10 %, ..., 100 %
constexpr Index kDim = 16;          // D
constexpr double kGap = 4.0;        // g: the needle's expected score; a distractor's is 0
constexpr double kSinkScore = 8.0;  // the score every query gives the sink
constexpr double kRopeBase = 10000.0;
constexpr int kTrials = 300;  // draws per length

enum Condition { kNone, kSink, kAlibi, kRope, kCausal, kCausalAlibi, kConditions };
constexpr std::array<const char*, kConditions> kNames{"no position", "sink",         "ALiBi 2^-8",
                                                      "RoPE",        "causal layer", "causal + ALiBi"};
constexpr std::array<const char*, kConditions> kColours{"#7f7f7f", "#bcbd22", "#1f77b4",
                                                        "#9467bd", "#2ca02c", "#d62728"};

double uniform01(Rng& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// n standard normals, by Box-Muller, both of each pair.
void fill_normal(Rng& rng, double* out, std::size_t n) {
  for (std::size_t i = 0; i < n; i += 2) {
    const double r = std::sqrt(-2.0 * std::log(std::max(uniform01(rng), 0x1.0p-53))),
                 a = 6.283185307179586 * uniform01(rng);
    out[i] = r * std::cos(a);
    if (i + 1 < n) out[i + 1] = r * std::sin(a);
  }
}

// ---- The causal layer: h_j = x_j + mean_{i <= j} x_i, and the shares it passes on ---------------------------------

// h from x (both `rows` x D, row-major), in O(L D).
void causal_layer(const double* x, Index rows, double* h) {
  std::array<double, kDim> sum{};
  for (Index j = 0; j < rows; ++j) {
    const double inverse = 1.0 / static_cast<double>(j + 1);
    for (Index d = 0; d < kDim; ++d) {
      sum[static_cast<std::size_t>(d)] += x[j * kDim + d];
      h[j * kDim + d] = x[j * kDim + d] + sum[static_cast<std::size_t>(d)] * inverse;
    }
  }
}

// The share of token i in the output when the readout gives row j of h the weight w_j. With one-hot values,
// c_i = w_i + sum_{j >= i} w_j / (j + 1): its own row, and the running means of every row from i on. In place.
void shares_through_layer(std::vector<double>& w) {
  double suffix = 0;
  for (std::size_t i = w.size(); i-- > 0;) {
    suffix += w[i] / static_cast<double>(i + 1);
    w[i] += suffix;
  }
}

// The library's causal attention with a zero query (every score 0) against causal_layer and shares_through_layer on
// random rows: the largest difference between the outputs, and between the shares (w + A^T w for a random w, A from
// attention_weights, against the O(L) form).
double check_causal_layer(Rng& rng, Index rows) {
  Tensor<T, 4> x({1, 1, rows, kDim}), zero({1, 1, rows, kDim});
  fill_normal(rng, x.data(), static_cast<std::size_t>(x.size()));
  AttentionOptions<T> causal;
  causal.causal = Causal::top_left;
  const Tensor<T, 4> mixed = scaled_dot_product_attention(zero, x, x, causal);
  std::vector<double> h(static_cast<std::size_t>(rows * kDim));
  causal_layer(x.data(), rows, h.data());
  double gap = 0;
  for (Index n = 0; n < x.size(); ++n)
    gap = std::max(gap, std::abs(x.data()[n] + mixed.data()[n] - h[static_cast<std::size_t>(n)]));
  const Tensor<T, 4> a = attention_weights(zero, x, causal);  // (1, 1, rows, rows), row-major
  std::vector<double> w(static_cast<std::size_t>(rows));
  for (double& v : w) v = uniform01(rng);
  std::vector<double> c = w;
  shares_through_layer(c);
  for (Index i = 0; i < rows; ++i) {
    double through = w[static_cast<std::size_t>(i)];
    for (Index j = 0; j < rows; ++j) through += w[static_cast<std::size_t>(j)] * a.data()[j * rows + i];
    gap = std::max(gap, std::abs(through - c[static_cast<std::size_t>(i)]));
  }
  return gap;
}

// ---- One length: accuracy by the needle's position under each condition ---------------------------------------------

struct Tally {
  std::array<std::vector<int>, kConditions> hits;  // per position: the draws whose answer was the needle
  std::array<int, kConditions> misses{};           // misses at positions > 0 ...
  std::array<int, kConditions> misses_before{};    // ... won by a token before the needle
  bool none_flat = true;                           // every draw: the same outcome at every position
  bool sink_same = true;                           // every draw and position: the outcome without the sink
};

double accuracy(int hits) { return static_cast<double>(hits) / kTrials; }

// The needle at each of `positions` (one batch entry each), kTrials draws, each condition of `conditions`.
// Slot 0 of every key tensor is BOS (the sink's token, masked out in the other conditions, key 0), context position
// j is slot j + 1; tensors are row-major, element (b, 0, s, d) of (B, 1, L + 1, D) at (b (L + 1) + s) D + d.
// ALiBi's distance from the query (Lq = 1, offset Lk - Lq = L) to slot j is L - j, the distance of position j - 1
// from the last context token; RoPE puts the query one step further, at L. A constant, which softmax ignores.
Tally measure(Rng& rng, Index length, const std::vector<Index>& positions, const std::vector<Condition>& conditions) {
  const Index batch = static_cast<Index>(positions.size()), slots = length + 1;
  const RotaryEmbedding<T> rope(kDim, kRopeBase);
  const bool with_rope = std::find(conditions.begin(), conditions.end(), kRope) != conditions.end();

  AttentionOptions<T> plain, sink, alibi;
  Tensor<bool, 2> context_only({1, slots});
  Tensor<T, 2> sink_bias({1, slots});
  for (Index j = 0; j < slots; ++j) {
    context_only(0, j) = j > 0;
    sink_bias(0, j) = j == 0 ? kSinkScore : 0.0;
  }
  plain.scale = 1.0;
  plain.allowed = context_only;
  sink.scale = 1.0;
  sink.bias = sink_bias;  // BOS's key is 0: its score is the bias alone
  alibi = plain;
  alibi.alibi_slopes = {alibi_slopes<T>(8).back()};  // 2^-8

  Tally tally;
  for (std::vector<int>& h : tally.hits) h.assign(positions.size(), 0);
  // Zero-initialised: slot 0 (BOS) stays 0.
  Tensor<T, 4> keys({batch, 1, slots, kDim}), rope_keys({batch, 1, slots, kDim}), causal_keys({batch, 1, slots, kDim});
  Tensor<T, 4> query({batch, 1, 1, kDim}), rope_query({batch, 1, 1, kDim});
  Tensor<T, 4> early({1, 1, length - 1, kDim}), late({1, 1, length - 1, kDim}), needle_at({1, 1, 1, kDim});
  Tensor<T, 4> last_query({1, 1, 1, kDim});
  std::vector<double> distractors(static_cast<std::size_t>((length - 1) * kDim)), needle(kDim), u(kDim);
  std::vector<double> share(static_cast<std::size_t>(length));
  std::array<std::vector<Index>, kConditions> answer;
  for (int trial = 0; trial < kTrials; ++trial) {
    // 1. The draw: L - 1 distractor keys, the query u (a unit vector), the needle's key g u + N(0, I).
    fill_normal(rng, distractors.data(), distractors.size());
    fill_normal(rng, u.data(), u.size());
    double norm = 0;
    for (const double v : u) norm += v * v;
    for (double& v : u) v /= std::sqrt(norm);
    fill_normal(rng, needle.data(), needle.size());
    for (std::size_t d = 0; d < needle.size(); ++d) needle[d] += kGap * u[d];
    // RoPE rotates each key by its position: a distractor before the needle sits at its own index i, one after it
    // at i + 1. Both rotations of all of them, once per draw: early at i, late at i + 1; the query at L.
    if (with_rope) {
      std::copy(distractors.begin(), distractors.end(), early.data());
      std::copy(distractors.begin(), distractors.end(), late.data());
      rope.apply(early, 0);
      rope.apply(late, 1);
      std::copy(u.begin(), u.end(), last_query.data());
      rope.apply(last_query, length);
    }

    // 2. The needle at each position, one batch entry each.
    for (Index b = 0; b < batch; ++b) {
      const Index p = positions[static_cast<std::size_t>(b)];
      T* const context = keys.data() + (b * slots + 1) * kDim;
      std::copy(distractors.data(), distractors.data() + p * kDim, context);
      std::copy(needle.begin(), needle.end(), context + p * kDim);
      std::copy(distractors.data() + p * kDim, distractors.data() + (length - 1) * kDim, context + (p + 1) * kDim);
      std::copy(u.begin(), u.end(), query.data() + b * kDim);
      causal_layer(context, length, causal_keys.data() + (b * slots + 1) * kDim);
      if (with_rope) {
        std::copy(needle.begin(), needle.end(), needle_at.data());
        rope.apply(needle_at, p);
        T* const rotated = rope_keys.data() + (b * slots + 1) * kDim;
        std::copy(early.data(), early.data() + p * kDim, rotated);
        std::copy(needle_at.data(), needle_at.data() + kDim, rotated + p * kDim);
        std::copy(late.data() + p * kDim, late.data() + (length - 1) * kDim, rotated + (p + 1) * kDim);
        std::copy(last_query.data(), last_query.data() + kDim, rope_query.data() + b * kDim);
      }
    }

    // 3. Each condition: the readout's weights over the context, the shares, the answer.
    for (const Condition c : conditions) {
      const bool rotary = c == kRope, causal = c == kCausal || c == kCausalAlibi;
      const AttentionOptions<T>& opts = c == kSink ? sink : (c == kAlibi || c == kCausalAlibi) ? alibi : plain;
      const Tensor<T, 4> w = attention_weights(rotary ? rope_query : query,
                                               rotary   ? rope_keys
                                               : causal ? causal_keys
                                                        : keys,
                                               opts);
      std::vector<Index>& answers = answer[static_cast<std::size_t>(c)];
      answers.clear();
      for (Index b = 0; b < batch; ++b) {
        const T* const row = w.data() + b * slots;  // (B, 1, 1, L + 1)
        std::copy(row + 1, row + slots, share.begin());
        if (causal) shares_through_layer(share);
        const Index best = std::max_element(share.begin(), share.end()) - share.begin();
        const Index p = positions[static_cast<std::size_t>(b)];
        answers.push_back(best);
        tally.hits[static_cast<std::size_t>(c)][static_cast<std::size_t>(b)] += best == p;
        if (best != p && p > 0) {
          ++tally.misses[static_cast<std::size_t>(c)];
          tally.misses_before[static_cast<std::size_t>(c)] += best < p;
        }
      }
    }
    const auto hit = [&](Condition c, Index b) {
      return answer[static_cast<std::size_t>(c)][static_cast<std::size_t>(b)] == positions[static_cast<std::size_t>(b)];
    };
    for (Index b = 0; b < batch; ++b) {
      if (!answer[kNone].empty()) tally.none_flat = tally.none_flat && hit(kNone, b) == hit(kNone, 0);
      if (!answer[kNone].empty() && !answer[kSink].empty())
        tally.sink_same = tally.sink_same && hit(kSink, b) == hit(kNone, b);
    }
  }
  return tally;
}

// ---- The picture (plot/line_chart.hpp) ------------------------------------------------------------------------------

std::vector<double> accuracies(const std::vector<int>& hits) {
  std::vector<double> a;
  for (const int h : hits) a.push_back(accuracy(h));
  return a;
}

void write_picture(const std::string& path, const std::array<Tally, kLengths.size()>& by_depth,
                   const std::vector<Index>& log_positions, const Tally& by_position) {
  const ChartAxis accuracy_axis{"accuracy", AxisScale::linear, 0, 1, {0, 0.2, 0.4, 0.6, 0.8, 1}};
  std::vector<LineChart> charts;
  std::vector<double> depths;
  for (int i = 0; i < kDepths; ++i) depths.push_back(10.0 * i);
  for (std::size_t l = 0; l < kLengths.size(); ++l) {
    LineChart chart;
    chart.title = "L = " + std::to_string(kLengths[l]) + ", by depth";
    chart.x = {"needle depth (% of the context)", AxisScale::linear, 0, 100, {0, 20, 40, 60, 80, 100}};
    chart.y = accuracy_axis;
    for (int c = 0; c < kConditions; ++c) {
      if (c == kSink) continue;  // the same as no position, draw for draw
      const auto ci = static_cast<std::size_t>(c);
      chart.series.push_back({kNames[ci], kColours[ci], depths, accuracies(by_depth[l].hits[ci]), true});
    }
    charts.push_back(std::move(chart));
  }
  LineChart chart;
  chart.title = "L = " + std::to_string(kLengths[kMiddle]) + ", by position (log)";
  chart.x = {"needle position + 1", AxisScale::log, 1, 1000, {1, 10, 100, 1000}};
  chart.y = accuracy_axis;
  std::vector<double> x;
  for (const Index p : log_positions) x.push_back(static_cast<double>(p + 1));
  for (const Condition c : {kNone, kAlibi, kCausal, kCausalAlibi}) {
    const auto ci = static_cast<std::size_t>(c);
    chart.series.push_back({kNames[ci], kColours[ci], x, accuracies(by_position.hits[ci]), true});
  }
  charts.push_back(std::move(chart));
  LineChartOptions options;
  options.title = "Needle retrieval accuracy by position: flat, recency, primacy, and both";
  options.plot_width = 300;
  options.plot_height = 200;
  options.charts_per_row = 2;
  write_line_charts_svg(path, charts, options);
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t seed = 1;
  if (!seed_argument(argc, argv, seed)) return 2;
  Rng rng(seed);
  std::printf(
      "Needle retrieval: L context tokens, keys N(0, I_%td); the query u (unit), the needle's key g u + N(0, I), g = "
      "%.0f,\n"
      "scale 1; one-hot values: correct when the needle has the largest share of the output. %d draws per length,\n"
      "seed %llu; the same draws at every depth (position round(depth (L - 1))). Accuracy by the needle's depth:\n",
      kDim, kGap, kTrials, static_cast<unsigned long long>(seed));

  const std::vector<Condition> all{kNone, kSink, kAlibi, kRope, kCausal, kCausalAlibi};
  std::array<Tally, kLengths.size()> tallies;
  double layer_gap = 0;
  for (std::size_t l = 0; l < kLengths.size(); ++l) {
    const Index length = kLengths[l];
    layer_gap = std::max(layer_gap, check_causal_layer(rng, length));
    std::vector<Index> positions;
    for (int i = 0; i < kDepths; ++i)
      positions.push_back(static_cast<Index>(std::lround(i * static_cast<double>(length - 1) / (kDepths - 1))));
    tallies[l] = measure(rng, length, positions, all);
    std::printf("\nL = %td%*s depth:", length, 6 - static_cast<int>(std::to_string(length).size()), "");
    for (int i = 0; i < kDepths; ++i) std::printf(" %4d%%", 10 * i);
    std::printf("   misses to an earlier token\n");
    for (const Condition c : all) {
      const auto ci = static_cast<std::size_t>(c);
      std::printf("  %-16s", kNames[ci]);
      for (const int hits : tallies[l].hits[ci]) std::printf(" %5.2f", accuracy(hits));
      std::printf("   %4d of %4d\n", tallies[l].misses_before[ci], tallies[l].misses[ci]);
    }
  }

  // Primacy and recency by position on a log scale, at L = 512: positions 0, 1, 2, 4, ..., 256, 511.
  const Index middle = kLengths[kMiddle];
  std::vector<Index> log_positions{0};
  for (Index p = 1; p < middle; p *= 2) log_positions.push_back(p);
  log_positions.push_back(middle - 1);
  const std::vector<Condition> shown{kNone, kAlibi, kCausal, kCausalAlibi};
  const Tally by_position = measure(rng, middle, log_positions, shown);
  std::printf("\nL = %td    position:", middle);
  for (const Index p : log_positions) std::printf(" %5td", p);
  std::printf("\n");
  for (const Condition c : shown) {
    std::printf("  %-16s", kNames[static_cast<std::size_t>(c)]);
    for (const int hits : by_position.hits[static_cast<std::size_t>(c)]) std::printf(" %5.2f", accuracy(hits));
    std::printf("\n");
  }

  bool ok = true;
  try {
    write_picture("needle_retrieval.svg", tallies, log_positions, by_position);
    std::printf("\nWrote needle_retrieval.svg.\n\n");
  } catch (const std::exception& e) {
    std::printf("\ncould not write needle_retrieval.svg: %s\n\n", e.what());
    ok = false;
  }

  const auto check = [&ok](bool passed, const char* claim) {
    std::printf("  %s  %s\n", passed ? "ok    " : "FAILED", claim);
    ok = ok && passed;
  };
  const auto acc = [&](std::size_t l, Condition c, int i) {
    return accuracy(tallies[l].hits[static_cast<std::size_t>(c)][static_cast<std::size_t>(i)]);
  };
  // The largest rise (sign +1) or fall (sign -1) of accuracy from one depth to the next.
  const auto worst_step = [&](std::size_t l, Condition c, double sign) {
    double worst = 0;
    for (int i = 0; i + 1 < kDepths; ++i) worst = std::max(worst, sign * (acc(l, c, i + 1) - acc(l, c, i)));
    return worst;
  };
  const int last = kDepths - 1;
  char line[512];

  std::snprintf(line, sizeof line,
                "the causal layer is the library's causal attention with equal scores, and passes on the shares of "
                "its weights: largest difference %.1e (needs <= 1e-12)",
                layer_gap);
  check(layer_gap <= 1e-12, line);

  bool flat = true, same = true;
  for (const Tally& t : tallies) {
    flat = flat && t.none_flat;
    same = same && t.sink_same;
  }
  std::snprintf(line, sizeof line,
                "no position is flat to the last draw: each draw succeeds at every depth or at none (%.2f, %.2f, %.2f "
                "at L = 64, 512, 2048)",
                acc(0, kNone, 0), acc(1, kNone, 0), acc(2, kNone, 0));
  check(flat, line);
  check(same, "a sink changes nothing: every draw's outcome at every depth is the one without it");

  {
    const bool rises = acc(1, kAlibi, last) - acc(1, kAlibi, 0) > 0.3 && acc(2, kAlibi, last) - acc(2, kAlibi, 0) > 0.3;
    double fall = 0;
    for (std::size_t l = 0; l < kLengths.size(); ++l) fall = std::max(fall, worst_step(l, kAlibi, -1));
    std::snprintf(line, sizeof line,
                  "ALiBi is a recency bias: 0%% -> 100%% %.2f -> %.2f at L = 512, %.2f -> %.2f at 2048 (needs a rise "
                  "> 0.3); largest fall between depths %.2f (needs 0)",
                  acc(1, kAlibi, 0), acc(1, kAlibi, last), acc(2, kAlibi, 0), acc(2, kAlibi, last), fall);
    check(rises && fall <= 0, line);
  }
  {
    bool falls = true, earlier = true;
    double rise = 0;
    std::string fractions;
    for (std::size_t l = 0; l < kLengths.size(); ++l) {
      falls = falls && acc(l, kCausal, 0) - acc(l, kCausal, last) > 0.1;
      rise = std::max(rise, worst_step(l, kCausal, +1));
      // The share of misses won by a token before the needle, against the same share without positions.
      const auto fraction = [&](Condition c) {
        return static_cast<double>(tallies[l].misses_before[c]) / std::max(1, tallies[l].misses[c]);
      };
      earlier = earlier && fraction(kCausal) > fraction(kNone) + 0.1;
      char pair[32];
      std::snprintf(pair, sizeof pair, "%s%.2f vs %.2f", l == 0 ? "" : ", ", fraction(kCausal), fraction(kNone));
      fractions += pair;
    }
    std::snprintf(line, sizeof line,
                  "the causal layer is a primacy bias: 0%% -> 100%% %.2f -> %.2f, %.2f -> %.2f, %.2f -> %.2f (needs a "
                  "fall > 0.1); largest rise %.2f (needs <= 0.05); its misses go to an earlier token more often than "
                  "without positions: %s (needs > + 0.1)",
                  acc(0, kCausal, 0), acc(0, kCausal, last), acc(1, kCausal, 0), acc(1, kCausal, last),
                  acc(2, kCausal, 0), acc(2, kCausal, last), rise, fractions.c_str());
    check(falls && rise <= 0.05 && earlier, line);
  }
  {
    // log_positions: 0, 1, 2, 4, 8, 16, ..., 256, 511; position 1 is entry 1, 16 entry 5, 256 entry 9.
    const std::vector<double> a = accuracies(by_position.hits[kCausal]);
    std::snprintf(line, sizeof line,
                  "the causal layer's primacy spans orders of magnitude: at L = 512, %.2f at position 1, %.2f at 16, "
                  "%.2f at 256 (needs each fall > 0.04)",
                  a[1], a[5], a[9]);
    check(a[1] - a[5] > 0.04 && a[5] - a[9] > 0.04, line);
  }
  {
    double low = 1;
    for (int i = 1; i < last; ++i) low = std::min(low, acc(1, kCausalAlibi, i));
    const double first = acc(1, kCausalAlibi, 0), end = acc(1, kCausalAlibi, last);
    std::snprintf(line, sizeof line,
                  "causal + ALiBi is U-shaped at L = 512: %.2f at 0%%, %.2f at the worst depth between, %.2f at 100%% "
                  "(needs both ends > worst + 0.2)",
                  first, low, end);
    check(first > low + 0.2 && end > low + 0.2, line);
    std::snprintf(line, sizeof line,
                  "causal + ALiBi: the primacy wins at L = 64 (0%% %.2f > 100%% %.2f), the recency at L = 2048 (0%% "
                  "%.2f <= 0.3, 100%% %.2f >= 0.7)",
                  acc(0, kCausalAlibi, 0), acc(0, kCausalAlibi, last), acc(2, kCausalAlibi, 0),
                  acc(2, kCausalAlibi, last));
    check(acc(0, kCausalAlibi, 0) > acc(0, kCausalAlibi, last) && acc(2, kCausalAlibi, 0) <= 0.3 &&
              acc(2, kCausalAlibi, last) >= 0.7,
          line);
  }
  {
    bool best_last = true;
    double gap = 1;
    for (std::size_t l = 0; l < kLengths.size(); ++l) {
      double rope_mean = 0, none_mean = 0;
      for (int i = 0; i < last; ++i) {
        best_last = best_last && acc(l, kRope, i) < acc(l, kRope, last);
        rope_mean += acc(l, kRope, i) / last;
        none_mean += acc(l, kNone, i) / last;
      }
      gap = std::min(gap, none_mean - rope_mean);
    }
    std::snprintf(
        line, sizeof line,
        "RoPE keeps the adjacent needle (100%% the best depth at every L: %s) and loses the rest: over depths "
        "0 to 90%% below no position by at least %.2f (needs > 0.3)",
        best_last ? "yes" : "no", gap);
    check(best_last && gap > 0.3, line);
  }
  return ok ? 0 : 1;
}
