// attention_sinks.cpp — what evicting the first tokens from the KV cache does when one of them is a sink.
//
// Trained language models send a large share of every row's attention to the first token (an "attention sink",
// Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks"). A sliding-window cache evicts
// that token after W steps, the row's softmax renormalises over what is left, and the output moves away from
// what the model computes with the full cache; keeping the first S tokens beside the window (StreamingLLM)
// avoids it. Random weights show no sink, so this program BUILDS one, and says so: one MultiHeadAttention layer
// (E = 64, H = 4, D = 16, RoPE on the first 8 dims of each head), Xavier-random, then edited so that
//   * the first token is a BOS input e_0 (a unit vector on input dim 0; every other token is U(-sqrt 3, sqrt 3) on
//     dims 1 .. E-1 and 0 on dim 0), and its key is exactly u, the last (unrotated) dim of each head: k_0 = u;
//   * no other token's key has a component on u (that row of k_weight is zero), and every query's is the
//     same constant: the row of q_weight is zero and q_bias = c sqrt(D) there. So every row scores the sink at
//     exactly c = kSinkLogit, against about N(0, 1) for the other keys: the sink takes a large share of every row;
//   * the sink's value is what the random value projection makes of e_0: small (norm about sqrt(D / E) against
//     sqrt(D) for the others), as the sinks of trained models have small values.
// A control model is the same random layer without these edits (the same BOS input first).
//
// Each model streams the same N tokens through MultiHeadAttention::step, one token at a time, with three caches:
//   (a) keep_all()                 the reference: every token kept
//   (b) attention_sinks(S, W)      the first S = 4 tokens plus the last W = 60
//   (c) sliding_window(S + W)      the last 64 tokens: the same memory as (b), no sinks
// and prints, per position, the drift of (b) and (c) from (a), ||y - y_a|| / ||y_a||, beside the attention mass
// the first S tokens receive in (a) (from a forward with need_weights of that row over the tokens before it).
//
// Usage: attention_sinks [--seed N]   (default seed 1; the same seed prints the same output)
// Writes attention_sinks.svg (drift against position, both models) in the current directory. Exits 1 (with the
// reason) unless: before the first eviction (b) and (c) equal (a) to 1e-5; in the sink model the first S tokens
// hold at least half of the attention mass at the last position; the mean drift of (b) after the first eviction
// is at most a quarter of (c)'s, and (b) drifts less than (c) at every position; and in the control model,
// where nothing is a sink, keeping the first tokens buys much less: (c)'s mean drift over (b)'s is at most half
// of that ratio in the sink model. Walk-through: docs/decoding.md, "Attention sinks: what evicting them costs".
#include <selfattn/selfattn.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

using namespace selfattn;

namespace {

using T = float;
using Rng = std::mt19937_64;  // its raw output is fixed by the standard; the distributions are not

constexpr Index kEmbed = 64, kHeads = 4, kHeadDim = kEmbed / kHeads, kRopeDim = 8;  // E, H, D, rotated dims
constexpr Index kSinks = 4, kWindow = 60;  // S, W: (b) keeps S + W tokens, (c) the last S + W
constexpr double kSinkLogit = 7.0;         // c: the score every query gives the BOS key

// The stream's length, by the build: without optimisation (CI's AddressSanitizer Debug build) a shorter stream.
// __OPTIMIZE__: g++ and clang++ from -O1 up.
#ifdef __OPTIMIZE__
constexpr Index kStream = 2048;
#else
constexpr Index kStream = 512;
#endif

double uniform(Rng& rng, double a) { return a * (2.0 * static_cast<double>(rng() >> 11) * 0x1.0p-53 - 1.0); }

// The stream (1, N, E): BOS = e_0 first, then random tokens with dim 0 at zero.
Tensor<T, 3> make_stream(std::uint64_t seed) {
  Rng rng(seed);
  Tensor<T, 3> x({1, kStream, kEmbed});
  x(0, 0, 0) = 1;
  for (Index t = 1; t < kStream; ++t)
    for (Index e = 1; e < kEmbed; ++e) x(0, t, e) = static_cast<T>(uniform(rng, std::sqrt(3.0)));  // variance 1
  return x;
}

MultiHeadAttention<T> make_layer(std::uint64_t seed, bool sink) {
  MultiHeadAttentionConfig cfg;
  cfg.embed_dim = kEmbed;
  cfg.num_heads = kHeads;
  cfg.rope_dim = kRopeDim;
  MultiHeadAttention<T> mha(cfg, seed);
  if (!sink) return mha;
  MhaParams<T>& P = mha.params();
  for (Index h = 0; h < kHeads; ++h) {
    const Index u = h * kHeadDim + kHeadDim - 1;  // head h's last dim: outside the rotated first kRopeDim
    for (Index e = 0; e < kEmbed; ++e) {
      P.q_weight(u, e) = 0;                 // every query's u component: the bias alone
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

// The attention mass the first S tokens receive from row t in the full cache, averaged over heads: a forward of
// that row as the query over keys 0 .. t (RoPE: the last query row sits at the last key's position).
double sink_mass(const MultiHeadAttention<T>& mha, const Tensor<T, 3>& x, Index t) {
  const std::array<Index, 3> strides = x.view().strides();
  const TensorView<const T, 3> query(&x(0, t, 0), {1, 1, kEmbed}, strides);
  const TensorView<const T, 3> keys(x.data(), {1, t + 1, kEmbed}, strides);
  AttentionOptions<T> opts;
  opts.need_weights = true;
  const MhaForward<T> fwd = mha.forward(query, keys, keys, opts);
  double mass = 0;
  for (Index h = 0; h < kHeads; ++h)
    for (Index j = 0; j < std::min(kSinks, t + 1); ++j) mass += fwd.weights(0, h, 0, j);
  return mass / static_cast<double>(kHeads);
}

struct Run {
  std::string name;
  std::vector<double> drift_sinks, drift_window;  // per position: (b) and (c) against (a)
  double before_eviction = 0;                     // largest drift of (b) or (c) before the first eviction
  double mean_sinks = 0, mean_window = 0;         // mean drift after the first eviction
  Index sinks_worse = 0;                          // positions after the first eviction where (b) >= (c)
  double last_mass = 0;                           // sink mass at the last position
};

Run run_model(const std::string& name, const MultiHeadAttention<T>& mha, const Tensor<T, 3>& x,
              const std::vector<Index>& shown) {
  Run r;
  r.name = name;
  const auto full = stream_outputs(mha, x, CachePolicy::keep_all());
  const auto sinks = stream_outputs(mha, x, CachePolicy::attention_sinks(kSinks, kWindow));
  const auto window = stream_outputs(mha, x, CachePolicy::sliding_window(kSinks + kWindow));
  const Index first_eviction = kSinks + kWindow;  // token t sees keys 0 .. t: eviction starts at t = S + W
  for (Index t = 0; t < kStream; ++t) {
    const std::size_t i = static_cast<std::size_t>(t);
    r.drift_sinks.push_back(relative_drift(sinks[i], full[i]));
    r.drift_window.push_back(relative_drift(window[i], full[i]));
    if (t < first_eviction) {
      r.before_eviction = std::max({r.before_eviction, r.drift_sinks.back(), r.drift_window.back()});
    } else {
      r.mean_sinks += r.drift_sinks.back();
      r.mean_window += r.drift_window.back();
      r.sinks_worse += r.drift_sinks.back() >= r.drift_window.back();
    }
  }
  r.mean_sinks /= static_cast<double>(kStream - first_eviction);
  r.mean_window /= static_cast<double>(kStream - first_eviction);

  std::printf("\n%s\n\n  position  sink mass in (a)  drift (b) sinks + window  drift (c) window only\n", name.c_str());
  for (Index t : shown) {
    const double mass = sink_mass(mha, x, t);
    if (t == kStream - 1) r.last_mass = mass;
    std::printf("  %8td  %15.3f  %23.2e  %21.2e\n", t, mass, r.drift_sinks[static_cast<std::size_t>(t)],
                r.drift_window[static_cast<std::size_t>(t)]);
  }
  std::printf("  mean drift after the first eviction (t >= %td): (b) %.3e, (c) %.3e, ratio (c) / (b) %.1f\n",
              first_eviction, r.mean_sinks, r.mean_window, r.mean_window / r.mean_sinks);
  std::printf("  positions after the first eviction where (b) drifts at least as much as (c): %td of %td\n",
              r.sinks_worse, kStream - first_eviction);
  return r;
}

// ---- The picture: drift against position, one chart per model, (b) and (c) in each -----------------------------

std::string number(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", v);
  return text;
}

std::string chart(const Run& r, double left, double top, double y_max) {
  constexpr double kW = 560, kH = 220;
  const auto px = [&](double t) { return left + kW * t / static_cast<double>(kStream - 1); };
  const auto py = [&](double v) { return top + kH * (1 - std::min(v, y_max) / y_max); };
  std::string out = "<text x=\"" + number(left) + "\" y=\"" + number(top - 10) +
                    "\" font-size=\"13\" font-weight=\"bold\">" + r.name + "</text>\n";
  out += "<rect x=\"" + number(left) + "\" y=\"" + number(top) + "\" width=\"" + number(kW) + "\" height=\"" +
         number(kH) + "\" fill=\"none\" stroke=\"#555555\"/>\n";
  for (int i = 0; i <= 4; ++i) {  // y grid and labels
    const double v = y_max * i / 4;
    char label[16];
    std::snprintf(label, sizeof label, "%.2f", v);
    out += "<line x1=\"" + number(left) + "\" y1=\"" + number(py(v)) + "\" x2=\"" + number(left + kW) + "\" y2=\"" +
           number(py(v)) + "\" stroke=\"#e5e5e5\"/>\n<text x=\"" + number(left - 6) + "\" y=\"" + number(py(v) + 4) +
           "\" font-size=\"11\" text-anchor=\"end\">" + label + "</text>\n";
  }
  for (Index t = 0; t < kStream; t += kStream / 4)
    out += "<text x=\"" + number(px(static_cast<double>(t))) + "\" y=\"" + number(top + kH + 16) +
           "\" font-size=\"11\" text-anchor=\"middle\">" + std::to_string(t) + "</text>\n";
  const double evict = px(static_cast<double>(kSinks + kWindow));
  out += "<line x1=\"" + number(evict) + "\" y1=\"" + number(top) + "\" x2=\"" + number(evict) + "\" y2=\"" +
         number(top + kH) + "\" stroke=\"#777777\" stroke-dasharray=\"2 3\"/>\n";
  const std::vector<std::pair<const std::vector<double>*, const char*>> series{{&r.drift_window, "#d62728"},
                                                                               {&r.drift_sinks, "#1f77b4"}};
  for (const auto& [values, colour] : series) {
    std::string points;
    for (Index t = 0; t < kStream; ++t)
      points += number(px(static_cast<double>(t))) + "," + number(py((*values)[static_cast<std::size_t>(t)])) + " ";
    out += "<polyline points=\"" + points + "\" fill=\"none\" stroke=\"" + colour + "\" stroke-width=\"1.5\"/>\n";
  }
  return out;
}

bool write_svg(const char* path, const std::vector<Run>& runs) {
  double y_max = 0;
  for (const Run& r : runs)
    for (double v : r.drift_window) y_max = std::max(y_max, v);
  y_max = std::ceil(y_max * 10) / 10;
  const double width = 680, height = 130 + 290 * static_cast<double>(runs.size());
  std::string svg = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
                    number(width) + "\" height=\"" + number(height) + "\" viewBox=\"0 0 " + number(width) + " " +
                    number(height) + "\" font-family=\"DejaVu Sans, Verdana, Helvetica, Arial, sans-serif\">\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  svg += "<text x=\"20\" y=\"30\" font-size=\"16\" font-weight=\"bold\">Output drift from the full cache, "
         "||y - y_full|| / ||y_full||, against position</text>\n";
  for (std::size_t i = 0; i < runs.size(); ++i) svg += chart(runs[i], 80, 80 + 290 * static_cast<double>(i), y_max);
  const double ly = height - 30;
  svg += "<line x1=\"80\" y1=\"" + number(ly) + "\" x2=\"106\" y2=\"" + number(ly) +
         "\" stroke=\"#1f77b4\" stroke-width=\"3\"/><text x=\"112\" y=\"" + number(ly + 4) +
         "\" font-size=\"12\">(b) attention_sinks(4, 60)</text>\n";
  svg += "<line x1=\"330\" y1=\"" + number(ly) + "\" x2=\"356\" y2=\"" + number(ly) +
         "\" stroke=\"#d62728\" stroke-width=\"3\"/><text x=\"362\" y=\"" + number(ly + 4) +
         "\" font-size=\"12\">(c) sliding_window(64); dashed: first eviction</text>\n</svg>\n";
  std::ofstream file(path);
  file << svg;
  file.close();
  return static_cast<bool>(file);
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    char* end = nullptr;
    if (std::strcmp(argv[i], "--seed") == 0 && i + 1 < argc) seed = std::strtoull(argv[++i], &end, 10);
    if (!end || *end != '\0') {
      std::fprintf(stderr, "usage: %s [--seed N]\n", argv[0]);
      return 2;
    }
  }
  std::printf("Attention sinks in a KV cache: one layer, E = %td, H = %td, D = %td, RoPE on %td dims per head; a\n"
              "stream of %td tokens (BOS first) through step, one token at a time, seed %llu. The sink is BUILT:\n"
              "every query scores the BOS key at exactly c = %.1f (random keys score about N(0, 1)); its value is\n"
              "small. The control is the same random layer without that edit.\n"
              "(a) keep_all   (b) attention_sinks(%td, %td)   (c) sliding_window(%td): (b) and (c) hold the same memory\n",
              kEmbed, kHeads, kHeadDim, kRopeDim, kStream, static_cast<unsigned long long>(seed), kSinkLogit, kSinks,
              kWindow, kSinks + kWindow);
  const Tensor<T, 3> x = make_stream(seed * 1000 + 1);
  std::vector<Index> shown{kSinks + kWindow - 1, kSinks + kWindow};
  for (Index t = 128; t < kStream; t *= 2) shown.push_back(t);
  shown.push_back(kStream - 1);
  std::sort(shown.begin(), shown.end());
  shown.erase(std::unique(shown.begin(), shown.end()), shown.end());

  std::vector<Run> runs;
  runs.push_back(run_model("Sink model (built: every query gives BOS the score c)", make_layer(seed, true), x, shown));
  runs.push_back(run_model("Control (the same random layer, no sink)", make_layer(seed, false), x, shown));
  const Run& sink = runs[0];
  const Run& control = runs[1];

  std::vector<std::string> failures;
  if (std::max(sink.before_eviction, control.before_eviction) > 1e-5)
    failures.push_back("before the first eviction the evicting caches do not equal the full one");
  if (sink.last_mass < 0.5) failures.push_back("the first tokens hold less than half of the sink model's attention");
  const double sink_ratio = sink.mean_window / sink.mean_sinks, control_ratio = control.mean_window / control.mean_sinks;
  if (!(sink_ratio >= 4)) failures.push_back("keeping the sinks does not cut the drift to a quarter");
  if (sink.sinks_worse > 0) failures.push_back("with the sinks kept, some positions drift as much as without");
  if (!(control_ratio <= 0.5 * sink_ratio)) failures.push_back("the control gains as much from the first tokens as the sink model");
  std::printf("\ncheck: sink model, drift without the sinks / with them = %.1f (needed >= 4); control %.1f (needed <= %.1f);\n"
              "       sink mass at the last position %.3f (needed >= 0.5); before the first eviction max drift %.1e\n",
              sink_ratio, control_ratio, 0.5 * sink_ratio, sink.last_mass,
              std::max(sink.before_eviction, control.before_eviction));
  if (write_svg("attention_sinks.svg", runs))
    std::printf("drift against position written to attention_sinks.svg\n");
  else
    std::printf("could not write attention_sinks.svg\n");
  if (!failures.empty()) {
    for (const std::string& f : failures) std::printf("FAILED: %s\n", f.c_str());
    return 1;
  }
  return 0;
}
