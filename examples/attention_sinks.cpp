// attention_sinks.cpp — what evicting the first tokens from the KV cache costs when one of them is a sink.
//
// Trained language models send a large share of every row's attention to the first token (an "attention sink",
// Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks"). A sliding-window cache evicts
// that token after W steps, each row's softmax renormalises over what is left, and the output moves away from
// what the model computes with the full cache; keeping the first S tokens beside the window (StreamingLLM,
// CachePolicy::attention_sinks) avoids it. Random weights show no sink, and nothing is trained here: the layer
// is BUILT, and the output says so. One MultiHeadAttention layer (E = 64, H = 2, D = 32, no position encoding):
//   * local attention: the stream drifts slowly (x_t = rho x_(t-1) + sqrt(1 - rho^2) noise, rho = 0.9) and
//     queries and keys share one projection, W_q = W_k = g W0, so a token scores itself and its recent, similar
//     neighbours about g^2 sqrt(D) = 14 and old, unrelated tokens about N(0, g^4): most heads of trained models
//     are local too;
//   * a sink: the first token is a BOS input e_0 (input dim 0 is BOS's alone) whose key is exactly u, the last
//     dim of each head; no other key has a component on u, and every query's is the constant c sqrt(D) (the
//     query bias), so every row scores BOS at exactly c = kSinkLogit = 15;
//   * values and the output projection are the module's Xavier draw: BOS's value is small (its input has norm 1
//     against sqrt(63) for the others), as the sinks of trained models have small values.
// The control is the same local layer without the sink (BOS then scores about 0 and gets almost nothing).
//
// Each model streams the same N = 2048 tokens through MultiHeadAttention::step_into, one token at a time, with
//   (a) keep_all()                 the reference: every token kept
//   (b) attention_sinks(S, W)      the first S = 4 tokens plus the last W = 60
//   (c) sliding_window(S + W)      the last 64 tokens: the same memory as (b), no sinks
// and prints, at some positions and on average, the drift of (b) and (c) from (a), ||y - y_a|| / ||y_a||, beside
// where (a)'s attention goes: the mass on the first S tokens and on the tokens both (b) and (c) have evicted
// (from one causal forward of the whole stream with its weights).
//
// Usage: attention_sinks [--seed N]   (default seed 1; the same seed prints the same output)
// Writes attention_sinks.svg (drift against position, both models, log scale) in the current directory. Exits 1
// (with the reason) unless: before the first eviction (b) and (c) equal (a) to 1e-5; the causal forward whose
// weights give the masses matches (a)'s outputs to 1e-4 (relative); in the sink model the first S tokens take at
// least half of the attention (mean over the positions after the first eviction), (b)'s mean drift is at most a
// tenth of (c)'s and (b) drifts less than (c) at every position; and in the control the ratio of the mean drifts
// is within [0.5, 2] (no sink, nothing gained by keeping the first tokens).
// Walk-through: docs/decoding.md, "Attention sinks: what evicting them costs".
#include <selfattn/plot/line_chart.hpp>  // not yet in the umbrella header
#include <selfattn/selfattn.hpp>

#include "example_args.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <vector>

using namespace selfattn;

namespace {

using T = float;
using Rng = std::mt19937_64;  // its raw output is fixed by the standard; the distributions are not

constexpr Index kEmbed = 64, kHeads = 2, kHeadDim = kEmbed / kHeads;  // E, H, D
constexpr Index kSinks = 4, kWindow = 60;  // S, W: (b) keeps S + W tokens, (c) the last S + W
constexpr double kCorrelation = 0.9;       // rho: x_t = rho x_(t-1) + sqrt(1 - rho^2) noise
constexpr double kSharpness = 2.5;         // g^2: W_q = W_k = g W0, so a token scores itself about g^2 sqrt(D)
constexpr double kSinkLogit = 15.0;        // c: the score every query gives the BOS key

// The stream's length, by the build: without optimisation (CI's AddressSanitizer Debug build) a shorter stream.
// __OPTIMIZE__: g++ and clang++ from -O1 up.
#ifdef __OPTIMIZE__
constexpr Index kStream = 2048;
#else
constexpr Index kStream = 384;
#endif

double uniform(Rng& rng, double a) { return a * (2.0 * static_cast<double>(rng() >> 11) * 0x1.0p-53 - 1.0); }

// The stream (1, N, E): BOS = e_0 first, then tokens that drift slowly, x_t = rho x_(t-1) + sqrt(1 - rho^2) xi_t
// with xi_t uniform of variance 1, on dims 1 .. E-1 (dim 0 is BOS's alone).
Tensor<T, 3> make_stream(std::uint64_t seed) {
  Rng rng(seed);
  Tensor<T, 3> x({1, kStream, kEmbed});
  x(0, 0, 0) = 1;
  const double fresh = std::sqrt(1 - kCorrelation * kCorrelation);
  for (Index t = 1; t < kStream; ++t)
    for (Index e = 1; e < kEmbed; ++e)
      x(0, t, e) = static_cast<T>(t > 1 ? kCorrelation * x(0, t - 1, e) + fresh * uniform(rng, std::sqrt(3.0))
                                        : uniform(rng, std::sqrt(3.0)));  // stationary from t = 1
  return x;
}

// A local layer: queries and keys share one projection, W_q = W_k = g W0 with W0 uniform of variance 1 / E, so
// q_t . k_j / sqrt(D) = g^2 (W0 x_t) . (W0 x_j) / sqrt(D): about g^2 sqrt(D) for the token itself and its recent,
// similar neighbours, about N(0, g^4) for old, unrelated ones. Values and the output projection are the module's
// Xavier draw. With `sink`, BOS becomes a sink as described above.
MultiHeadAttention<T> make_layer(std::uint64_t seed, bool sink) {
  MultiHeadAttentionConfig cfg;
  cfg.embed_dim = kEmbed;
  cfg.num_heads = kHeads;
  MultiHeadAttention<T> mha(cfg, seed);
  MhaParams<T>& P = mha.params();
  Rng rng(seed + 1);
  const double g = std::sqrt(kSharpness), bound = std::sqrt(3.0 / static_cast<double>(kEmbed));
  for (Index n = 0; n < P.q_weight.size(); ++n)
    P.k_weight.data()[n] = P.q_weight.data()[n] = static_cast<T>(g * uniform(rng, bound));
  if (!sink) return mha;
  for (Index h = 0; h < kHeads; ++h) {
    const Index u = h * kHeadDim + kHeadDim - 1;  // head h's last dim
    for (Index e = 0; e < kEmbed; ++e) {
      P.q_weight(u, e) = 0;                     // every query's u component: the bias alone
      P.k_weight(u, e) = e == 0 ? T(1) : T(0);  // only BOS has a key on u
    }
    for (Index d = 0; d < kHeadDim; ++d)
      if (h * kHeadDim + d != u) P.k_weight(h * kHeadDim + d, 0) = 0;  // BOS's key is u and nothing else
    // q . k_0 / sqrt(D) = c: q_u = c sqrt(D), k_0 = u
    P.q_bias(u) = static_cast<T>(kSinkLogit * std::sqrt(static_cast<double>(kHeadDim)));
  }
  return mha;
}

// The stream through step, one token at a time, under `policy`: (N, E) outputs.
std::vector<std::vector<double>> stream_outputs(const MultiHeadAttention<T>& mha, const Tensor<T, 3>& x,
                                                const CachePolicy& policy) {
  KVCache<T> cache = mha.make_cache(1, policy);
  std::vector<std::vector<double>> y;
  Tensor<T, 3> token({1, 1, kEmbed}), out({1, 1, kEmbed});
  for (Index t = 0; t < kStream; ++t) {
    for (Index e = 0; e < kEmbed; ++e) token(0, 0, e) = x(0, t, e);
    mha.step_into(token, cache, out);
    y.emplace_back(out.data(), out.data() + kEmbed);
  }
  return y;
}

double relative_drift(const std::vector<double>& y, const std::vector<double>& reference) {
  double diff = 0, norm = 0;
  for (std::size_t e = 0; e < y.size(); ++e) {
    diff += (y[e] - reference[e]) * (y[e] - reference[e]);
    norm += reference[e] * reference[e];
  }
  return std::sqrt(diff / norm);
}

// Where each row's attention goes in the full cache, averaged over heads: the first S tokens, and the tokens
// that neither (b) nor (c) keeps (S <= j <= t - W). From one causal forward over the stream with its weights
// (B, H, N, N): row t of a causal forward is what step computes for token t over the full cache.
struct Mass {
  double sinks = 0, evicted = 0;
};

// Also returns, in `forward_gap`, the largest relative difference between a row of that forward's output and the
// full cache's step output for the same token: the weights are those of the attention that made (a).
std::vector<Mass> masses_of(const MultiHeadAttention<T>& mha, const Tensor<T, 3>& x,
                            const std::vector<std::vector<double>>& full, double& forward_gap) {
  AttentionOptions<T> opts;
  opts.causal = Causal::top_left;
  opts.need_weights = true;
  const MhaForward<T> fwd = mha.forward(x, opts);
  forward_gap = 0;
  for (Index t = 0; t < kStream; ++t) {
    const T* row = &fwd.output(0, t, 0);
    forward_gap = std::max(forward_gap,
                           relative_drift(std::vector<double>(row, row + kEmbed), full[static_cast<std::size_t>(t)]));
  }
  std::vector<Mass> masses(static_cast<std::size_t>(kStream));
  for (Index t = 0; t < kStream; ++t) {
    Mass& m = masses[static_cast<std::size_t>(t)];
    for (Index h = 0; h < kHeads; ++h)
      for (Index j = 0; j <= t; ++j) {
        const double w = fwd.weights(0, h, t, j);
        if (j < kSinks)
          m.sinks += w;
        else if (j <= t - kWindow)
          m.evicted += w;
      }
    m.sinks /= static_cast<double>(kHeads);
    m.evicted /= static_cast<double>(kHeads);
  }
  return masses;
}

struct Run {
  std::string name;
  std::vector<double> drift_sinks, drift_window;  // per position: (b) and (c) against (a)
  double before_eviction = 0;                     // largest drift of (b) or (c) before the first eviction
  double mean_sinks = 0, mean_window = 0;         // mean drift after the first eviction
  Index sinks_worse = 0;                          // positions after the first eviction where (b) >= (c)
  Mass mean_mass;                                 // (a)'s mass on the first S and on evicted keys, mean after it
  double forward_gap = 0;                         // the causal forward against (a), largest relative difference
};

Run run_model(const std::string& name, const MultiHeadAttention<T>& mha, const Tensor<T, 3>& x,
              const std::vector<Index>& shown) {
  Run r;
  r.name = name;
  const auto full = stream_outputs(mha, x, CachePolicy::keep_all());
  const auto sinks = stream_outputs(mha, x, CachePolicy::attention_sinks(kSinks, kWindow));
  const auto window = stream_outputs(mha, x, CachePolicy::sliding_window(kSinks + kWindow));
  const std::vector<Mass> masses = masses_of(mha, x, full, r.forward_gap);
  const Index first_eviction = kSinks + kWindow;  // token t sees keys 0 .. t: eviction starts at t = S + W
  for (Index t = 0; t < kStream; ++t) {
    const std::size_t i = static_cast<std::size_t>(t);
    r.drift_sinks.push_back(relative_drift(sinks[i], full[i]));
    r.drift_window.push_back(relative_drift(window[i], full[i]));
    if (t < first_eviction) {
      r.before_eviction = std::max({r.before_eviction, r.drift_sinks.back(), r.drift_window.back()});
    } else {
      const Mass& m = masses[i];
      r.mean_mass.sinks += m.sinks;
      r.mean_mass.evicted += m.evicted;
      r.mean_sinks += r.drift_sinks.back();
      r.mean_window += r.drift_window.back();
      r.sinks_worse += r.drift_sinks.back() >= r.drift_window.back();
    }
  }
  const double after = static_cast<double>(kStream - first_eviction);
  r.mean_sinks /= after;
  r.mean_window /= after;
  r.mean_mass.sinks /= after;
  r.mean_mass.evicted /= after;

  std::printf(
      "\n%s\n\n  position  (a) mass on first %td  on evicted  drift (b) sinks + window  drift (c) window only\n",
      name.c_str(), kSinks);
  for (Index t : shown) {
    const Mass& mass = masses[static_cast<std::size_t>(t)];
    std::printf("  %8td  %18.3f  %10.2e  %23.2e  %21.2e\n", t, mass.sinks, mass.evicted,
                r.drift_sinks[static_cast<std::size_t>(t)], r.drift_window[static_cast<std::size_t>(t)]);
  }
  std::printf("  %8s  %18.3f  %10.2e  %23.2e  %21.2e   mean over t >= %td (after the first eviction)\n", "mean",
              r.mean_mass.sinks, r.mean_mass.evicted, r.mean_sinks, r.mean_window, first_eviction);
  std::printf("  mean drift ratio (c) / (b): %.1f\n", r.mean_window / r.mean_sinks);
  std::printf("  positions after the first eviction where (b) drifts at least as much as (c): %td of %td\n",
              r.sinks_worse, kStream - first_eviction);
  return r;
}

// ---- The picture: drift against position, one chart per model, (b) and (c) in each (plot/line_chart.hpp) -------

void write_picture(const std::string& path, const std::vector<Run>& runs) {
  std::vector<LineChart> charts;
  std::vector<double> positions;
  for (Index t = 0; t < kStream; ++t) positions.push_back(static_cast<double>(t));
  for (const Run& r : runs) {
    LineChart c;
    c.title = r.name;
    c.x.label = "position t (first eviction at t = " + std::to_string(kSinks + kWindow) + ")";
    c.x.min = 0;
    c.x.max = static_cast<double>(kStream - 1);
    c.y = {"||y - y_full|| / ||y_full||", AxisScale::log, 1e-6, 1e2, {}};  // a drift of 0 sits at the bottom
    c.series.push_back(
        {"(c) sliding_window(" + std::to_string(kSinks + kWindow) + ")", "#d62728", positions, r.drift_window});
    c.series.push_back({"(b) attention_sinks(" + std::to_string(kSinks) + ", " + std::to_string(kWindow) + ")",
                        "#1f77b4", positions, r.drift_sinks});
    charts.push_back(std::move(c));
  }
  LineChartOptions options;
  options.title = "Output drift from the full cache, per position";
  options.plot_width = 560;
  options.plot_height = 200;
  options.charts_per_row = 1;
  write_line_charts_svg(path, charts, options);
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t seed = 1;
  if (!seed_argument(argc, argv, seed)) return 2;
  std::printf(
      "Attention sinks in a KV cache: one layer, E = %td, H = %td, D = %td; a stream of %td slowly drifting\n"
      "tokens (BOS first) through step, one token at a time, seed %llu. BUILT, not trained: W_q = W_k makes\n"
      "attention local, and every query scores the BOS key at exactly c = %.1f, so BOS is a sink; its value\n"
      "is small. The control is the same local layer without the sink.\n"
      "(a) keep_all   (b) attention_sinks(%td, %td)   (c) sliding_window(%td): (b) and (c) hold the same memory\n",
      kEmbed, kHeads, kHeadDim, kStream, static_cast<unsigned long long>(seed), kSinkLogit, kSinks, kWindow,
      kSinks + kWindow);
  const Tensor<T, 3> x = make_stream(seed * 1000 + 1);
  std::vector<Index> shown{kSinks + kWindow - 1, kSinks + kWindow};
  for (Index t = 128; t < kStream; t *= 2) shown.push_back(t);
  shown.push_back(kStream - 1);
  std::sort(shown.begin(), shown.end());
  shown.erase(std::unique(shown.begin(), shown.end()), shown.end());

  std::vector<Run> runs;
  runs.push_back(run_model("Sink model (local attention, and every query gives BOS the score c)",
                           make_layer(seed, true), x, shown));
  runs.push_back(run_model("Control (the same local layer, no sink)", make_layer(seed, false), x, shown));
  const Run& sink = runs[0];
  const Run& control = runs[1];

  // The claims, fixed before measuring: in the sink model the first S tokens take at least half of the attention
  // (mean over positions), and keeping them cuts the drift: (b)'s mean drift at most a tenth of (c)'s, and below
  // (c)'s at every position; in the control, where they take almost nothing, keeping them changes little: the
  // ratio of mean drifts within [0.5, 2]. Before the first eviction all three caches hold the same tokens.
  std::vector<std::string> failures;
  const double sink_ratio = sink.mean_window / sink.mean_sinks,
               control_ratio = control.mean_window / control.mean_sinks;
  if (std::max(sink.before_eviction, control.before_eviction) > 1e-5)
    failures.push_back("before the first eviction the evicting caches do not equal the full one");
  if (!(sink.mean_mass.sinks >= 0.5))
    failures.push_back("the first tokens hold less than half of the sink model's attention");
  if (!(sink_ratio >= 10)) failures.push_back("keeping the sinks does not cut the mean drift to a tenth");
  if (sink.sinks_worse > 0) failures.push_back("with the sinks kept, some positions drift as much as without them");
  if (!(control_ratio >= 0.5 && control_ratio <= 2))
    failures.push_back("in the control, keeping the first tokens changes the drift by more than a factor 2");
  const double forward_gap = std::max(sink.forward_gap, control.forward_gap);
  if (!(forward_gap <= 1e-4)) failures.push_back("the causal forward behind the masses does not match the full cache");
  std::printf(
      "\ncheck: sink model: mass on the first %td %.3f (needed >= 0.5), drift ratio (c) / (b) %.1f (needed >= 10),\n"
      "       (b) >= (c) at %td positions (needed 0); control: ratio %.2f (needed in [0.5, 2]);\n"
      "       before the first eviction the largest drift is %.1e (needed <= 1e-5); the causal forward whose\n"
      "       weights give the masses matches the full cache's outputs to %.1e (needed <= 1e-4)\n",
      kSinks, sink.mean_mass.sinks, sink_ratio, sink.sinks_worse, control_ratio,
      std::max(sink.before_eviction, control.before_eviction), forward_gap);
  try {
    write_picture("attention_sinks.svg", runs);
    std::printf("drift against position written to attention_sinks.svg\n");
  } catch (const std::exception& e) {
    std::printf("could not write attention_sinks.svg: %s\n", e.what());
  }
  if (!failures.empty()) {
    for (const std::string& f : failures) std::printf("FAILED: %s\n", f.c_str());
    return 1;
  }
  return 0;
}
