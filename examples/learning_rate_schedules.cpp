// learning_rate_schedules.cpp — the original Transformer's learning rate (Noam) beside warmup-cosine, and what the
// warmup is for (chapter §11.1, training tips).
//
// Part 1, the curves. NoamSchedule: lr = factor * d^-0.5 * min(t^-0.5, t * warmup^-1.5), t = step + 1: a linear
// warmup to factor / sqrt(d * warmup) at t = warmup, then a decay as 1 / sqrt(t) that never reaches zero, so the rate
// halves at four times the steps. Printed for the paper's d = 512, warmup 4000 beside a WarmupCosineSchedule with the
// same peak and warmup over the base model's 100k steps.
//
// Part 2, a small training run. Claim (Vaswani et al. 2017; Xiong et al. 2020, "On Layer Normalization in the
// Transformer Architecture"): a post-norm Transformer needs the warmup, because at initialisation the gradient of its
// last layers is large, and a large rate at once throws it off; a pre-norm one trains without it. The task: reverse 6
// letters from a-j (output position i names input letter 5 - i), a 2-layer encoder (TransformerStack, E = 32, 4 heads,
// FFN 64, ReLU, no dropout) and a linear head, cross-entropy, AdamW without decay, clipping at 1, 150 steps of 16
// strings, the same batches for every run. Four schedules at one peak rate, 3e-2, for post-norm and pre-norm:
//   noam             NoamSchedule with d = 32, warmup 30, factor chosen so that its peak is 3e-2;
//   cosine           WarmupCosineSchedule, warmup 30, peak 3e-2, down to 0 at step 150;
//   constant         3e-2 from the first step, no warmup;
//   warmup+constant  the same warmup to 3e-2, then flat: separates the warmup from the decay.
// The held-out loss is measured on 512 fresh strings; chance is ln 10 = 2.303.
//
// Usage: learning_rate_schedules [--seed N]   (default seed 1; the same seed prints the same output)
// Writes learning_rate_schedules.svg (the four rates, and the loss curves of post-norm and pre-norm) in the current
// directory. Exits 1 unless
//   the Noam curve: peaks at t = warmup at 1 / sqrt(d * warmup) (6.99e-4 for 512 / 4000), halves at 4x the steps and
//     quarters at 16x; the training runs' Noam and cosine reach the same peak first at the same step, t = warmup;
//   post-norm without warmup fails: held-out loss at least 0.8 ln 10 after 150 steps;
//   post-norm with any of the three warmups learns: held-out loss below 0.5 ln 10;
//   pre-norm learns with every schedule, the constant without warmup included: held-out loss below 0.5 ln 10.
// Which of Noam and cosine ends lower is printed, not checked: it changes with the seed (docs/training.md).
// Walk-through: docs/training.md, "Noam beside warmup-cosine".
#include <selfattn/selfattn.hpp>

#include "example_args.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

using namespace selfattn;

namespace {

using Rng = std::mt19937_64;  // its raw output is fixed by the standard; the distributions are not

constexpr Index kLetters = 10, kLength = 6, kEmbed = 32, kHeads = 4, kLayers = 2;
constexpr Index kSteps = 150, kBatch = 16, kWarmup = 30, kHeldOut = 512;
constexpr double kPeakLr = 3e-2, kMaxGradNorm = 1.0;
const double kChance = std::log(static_cast<double>(kLetters));

Index below(Rng& rng, Index n) { return static_cast<Index>(rng() % static_cast<std::uint64_t>(n)); }
double uniform01(Rng& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// ---- the schedules ------------------------------------------------------------------------------------------------

enum class Arm { noam, cosine, constant, warmup_constant };
constexpr std::array<Arm, 4> kArms{Arm::noam, Arm::cosine, Arm::constant, Arm::warmup_constant};
const char* name_of(Arm arm) {
  switch (arm) {
    case Arm::noam: return "noam";
    case Arm::cosine: return "cosine";
    case Arm::constant: return "constant";
    default: return "warmup+constant";
  }
}
const char* colour_of(Arm arm) {
  switch (arm) {
    case Arm::noam: return "#1f77b4";
    case Arm::cosine: return "#ff7f0e";
    case Arm::constant: return "#d62728";
    default: return "#2ca02c";
  }
}

// Noam's factor for a given peak: the peak is factor / sqrt(d * warmup).
NoamSchedule noam_with_peak(Index model_dim, Index warmup, double peak) {
  NoamSchedule s;
  s.model_dim = model_dim;
  s.warmup_steps = warmup;
  s.factor = peak * std::sqrt(static_cast<double>(model_dim) * static_cast<double>(warmup));
  return s;
}

WarmupCosineSchedule cosine_with(double peak, Index warmup, Index total) {
  WarmupCosineSchedule s;
  s.peak_lr = peak;
  s.min_lr = 0.0;
  s.warmup_steps = warmup;
  s.total_steps = total;
  return s;
}

double rate(Arm arm, Index step) {
  static const NoamSchedule noam = noam_with_peak(kEmbed, kWarmup, kPeakLr);
  static const WarmupCosineSchedule cosine = cosine_with(kPeakLr, kWarmup, kSteps);
  switch (arm) {
    case Arm::noam: return noam.learning_rate(step);
    case Arm::cosine: return cosine.learning_rate(step);
    case Arm::constant: return kPeakLr;
    default: return kPeakLr * std::min(1.0, static_cast<double>(step + 1) / static_cast<double>(kWarmup));
  }
}

// ---- the task and the model ---------------------------------------------------------------------------------------

// Strings (B, 6) and their reversals as targets.
struct Batch {
  Tensor<Index, 2> input, target;
};

Batch make_batch(Rng& rng, Index b) {
  Batch batch{Tensor<Index, 2>({b, kLength}), Tensor<Index, 2>({b, kLength})};
  for (Index i = 0; i < b; ++i) {
    for (Index l = 0; l < kLength; ++l) batch.input(i, l) = below(rng, kLetters);
    for (Index l = 0; l < kLength; ++l) batch.target(i, l) = batch.input(i, kLength - 1 - l);
  }
  return batch;
}

struct Model {
  Tensor<float, 2> table;  // (V, E), N(0, 1)
  TransformerStack<float> stack;
  Tensor<float, 2> head_weight;  // (V, E)
  Tensor<float, 1> head_bias;    // (V)
  Tensor<float, 2> positions;    // (L, E), sinusoidal

  static TransformerStackConfig config(bool pre_norm) {
    TransformerStackConfig cfg;
    cfg.layer.attention.embed_dim = kEmbed;
    cfg.layer.attention.num_heads = kHeads;
    cfg.layer.attention.dropout = 0.0;
    cfg.layer.ffn_dim = 2 * kEmbed;
    cfg.layer.activation = Activation::relu;
    cfg.layer.dropout = 0.0;
    cfg.layer.norm_first = pre_norm;
    cfg.num_layers = kLayers;
    cfg.final_norm = pre_norm;  // a pre-norm stack ends with a norm; a post-norm one already does
    return cfg;
  }

  Model(std::uint64_t seed, bool pre_norm)
      : table({kLetters, kEmbed}),
        stack(config(pre_norm), seed),
        head_weight({kLetters, kEmbed}),
        head_bias({kLetters}),
        positions(sinusoidal_encoding<float>(kLength, kEmbed)) {
    Rng rng(seed + 200);
    std::generate_n(table.data(), table.size(), [&] {  // Box-Muller
      const double u = std::max(uniform01(rng), 0x1.0p-53), v = uniform01(rng);
      return static_cast<float>(std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v));
    });
    const double bound = 1.0 / std::sqrt(static_cast<double>(kEmbed));  // nn.Linear's U(-1/sqrt(E), 1/sqrt(E))
    std::generate_n(head_weight.data(), head_weight.size(),
                    [&] { return static_cast<float>(bound * (2 * uniform01(rng) - 1)); });
  }

  Tensor<float, 3> embed(const Tensor<Index, 2>& ids) const {
    Tensor<float, 3> x = embedding<float>(table.view(), ids.view());
    for (Index b = 0; b < x.dim(0); ++b)
      for (Index l = 0; l < kLength; ++l)
        for (Index e = 0; e < kEmbed; ++e) x(b, l, e) += positions(l, e);
    return x;
  }
};

// One step: forward, cross-entropy, the library's backward through head, stack and embedding, clipping, AdamW.
double train_step(Model& m, const Batch& batch, AdamW<float>& adamw, double lr) {
  const Tensor<float, 3> x = m.embed(batch.input);
  const auto f = m.stack.forward(x);
  const Tensor<float, 3> logits = linear<float>(f.output.view(), m.head_weight.view(), m.head_bias.view());
  const CrossEntropy<float> ce = softmax_cross_entropy<float>(logits.view(), batch.target.view());
  LinearGradients<float> head = linear_backward<float>(f.output.view(), m.head_weight.view(), ce.d_logits.view(), true);
  auto g = m.stack.backward(head.dx, f);
  Tensor<float, 2> d_table = embedding_backward<float>(batch.input.view(), g.d_input.view(), kLetters);
  std::vector<ParameterRef<float>> params;
  add_parameter(params, "table", m.table, d_table, false);
  add_parameters(params, m.stack.params(), g.params, "stack.");
  add_parameter(params, "head_weight", m.head_weight, head.dweight, true);
  add_parameter(params, "head_bias", m.head_bias, head.dbias, false);
  if (std::isfinite(clip_grad_norm(params, kMaxGradNorm))) adamw.step(params, lr);
  return ce.loss;
}

struct Run {
  std::vector<double> losses;                     // the training loss of every step
  double held_out = 0;                            // held-out loss after training
  double accuracy = 0;                            // held-out letters right
  double mean_loss(Index from, Index to) const {  // mean training loss of steps [from, to)
    double sum = 0;
    for (Index s = from; s < to; ++s) sum += losses[static_cast<std::size_t>(s)];
    return sum / static_cast<double>(to - from);
  }
};

Run train(std::uint64_t seed, bool pre_norm, Arm arm, const Batch& held_out) {
  Model model(seed, pre_norm);
  AdamWConfig adamw_config;
  adamw_config.weight_decay = 0.0;
  AdamW<float> adamw(adamw_config);
  Rng rng(seed);  // the same batches for every run of this seed
  Run run;
  for (Index step = 0; step < kSteps; ++step)
    run.losses.push_back(train_step(model, make_batch(rng, kBatch), adamw, rate(arm, step)));
  const Tensor<float, 3> output = model.stack.forward(model.embed(held_out.input)).output;
  const Tensor<float, 3> logits = linear<float>(output.view(), model.head_weight.view(), model.head_bias.view());
  CrossEntropyOptions loss_only;
  loss_only.gradient = false;
  run.held_out = softmax_cross_entropy<float>(logits.view(), held_out.target.view(), loss_only).loss;
  Index right = 0;
  for (Index i = 0; i < kHeldOut; ++i)
    for (Index l = 0; l < kLength; ++l) {
      const float* row = &logits(i, l, 0);
      right += std::max_element(row, row + kLetters) - row == held_out.target(i, l);
    }
  run.accuracy = static_cast<double>(right) / static_cast<double>(kHeldOut * kLength);
  return run;
}

// The loss curve averaged over windows of 5 steps, at the window's last step (1-based).
LineSeries loss_series(const Run& run, Arm arm) {
  LineSeries s{name_of(arm), colour_of(arm), {}, {}};
  for (Index end = 5; end <= kSteps; end += 5) {
    s.x.push_back(static_cast<double>(end));
    s.y.push_back(run.mean_loss(end - 5, end));
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t seed = 1;
  if (!seed_argument(argc, argv, seed)) return 2;
  const auto start = std::chrono::steady_clock::now();
  bool ok = true;
  const auto check = [&ok](bool passed, const std::string& claim) {
    std::printf("  %s  %s\n", passed ? "ok    " : "FAILED", claim.c_str());
    ok = ok && passed;
  };
  char line[320];

  // ---- part 1: the curves ----
  NoamSchedule paper;  // d = 512, warmup 4000, factor 1
  const WarmupCosineSchedule paper_cosine = cosine_with(paper.learning_rate(paper.warmup_steps - 1), 4000, 100000);
  const double peak = paper.learning_rate(3999);
  std::printf(
      "Part 1: the schedules. Noam with d = 512, warmup 4000 (the paper's), beside warmup-cosine with the same peak\n"
      "and warmup over 100k steps (the base model's). t = step + 1.\n\n");
  std::printf("       t      noam   / peak    cosine   / peak\n");
  for (Index t : {1, 1000, 4000, 8000, 16000, 50000, 64000, 100000, 256000}) {
    const double n = paper.learning_rate(t - 1), c = paper_cosine.learning_rate(t - 1);
    std::printf("  %6td   %.2e   %5.3f   %.2e   %5.3f\n", t, n, n / peak, c, c / peak);
  }
  Index argmax = 0;
  for (Index step = 1; step < 20000; ++step)
    if (paper.learning_rate(step) > paper.learning_rate(argmax)) argmax = step;
  std::printf("\n");
  std::snprintf(line, sizeof line, "Noam peaks at t = %td (warmup 4000) at %.3e = 1 / sqrt(512 * 4000) = %.3e",
                argmax + 1, peak, 1 / std::sqrt(512.0 * 4000.0));
  check(argmax + 1 == 4000 && std::abs(peak * std::sqrt(512.0 * 4000.0) - 1) < 1e-12, line);
  const double half = paper.learning_rate(16000 - 1) / peak, quarter = paper.learning_rate(64000 - 1) / peak;
  std::snprintf(line, sizeof line, "its half-life: the rate at 4x the steps is %.4f of the peak, at 16x %.4f", half,
                quarter);
  check(std::abs(half - 0.5) < 1e-12 && std::abs(quarter - 0.25) < 1e-12, line);

  std::printf("\nThe training runs' schedules (d = %td, peak %.0e, warmup %td, %td steps):\n\n", kEmbed, kPeakLr,
              kWarmup, kSteps);
  std::printf("   step");
  for (Arm arm : kArms) std::printf("  %15s", name_of(arm));
  std::printf("\n");
  for (Index step : {0, 9, 29, 59, 89, 119, 149}) {
    std::printf("  %5td", step + 1);
    for (Arm arm : kArms) std::printf("  %15.2e", rate(arm, step));
    std::printf("\n");
  }
  // The first step at the peak, and the highest rate of the run. (WarmupCosineSchedule stays at its peak one step
  // longer: the warmup's last step, t = warmup, and the cosine's first, t = warmup + 1, both give peak_lr.)
  const auto first_peak = [](Arm arm) {
    double top = 0;
    for (Index step = 0; step < kSteps; ++step) top = std::max(top, rate(arm, step));
    Index step = 0;
    while (rate(arm, step) < top * (1 - 1e-12)) ++step;
    return std::make_pair(step, top);
  };
  const auto noam_top = first_peak(Arm::noam), cosine_top = first_peak(Arm::cosine);
  std::printf("\n");
  std::snprintf(line, sizeof line, "Noam (factor %.3f) and cosine both peak first at t = %td / %td, at %.3e / %.3e",
                noam_with_peak(kEmbed, kWarmup, kPeakLr).factor, noam_top.first + 1, cosine_top.first + 1,
                noam_top.second, cosine_top.second);
  check(noam_top.first == kWarmup - 1 && cosine_top.first == kWarmup - 1 &&
            std::abs(noam_top.second / kPeakLr - 1) < 1e-12 && std::abs(cosine_top.second / kPeakLr - 1) < 1e-12,
        line);

  // ---- part 2: training ----
  std::printf(
      "\nPart 2: reversing %td letters (a-j), a %td-layer encoder (E = %td, %td heads), %td steps of %td strings, "
      "seed %llu;\nheld-out loss on %td fresh strings (chance: ln 10 = %.3f).\n\n",
      kLength, kLayers, kEmbed, kHeads, kSteps, kBatch, static_cast<unsigned long long>(seed), kHeldOut, kChance);
  Rng held_out_rng(seed + 7777);
  const Batch held_out = make_batch(held_out_rng, kHeldOut);
  std::array<std::array<Run, kArms.size()>, 2> runs;  // [pre_norm][arm]
  std::printf("  norm   schedule          loss 1-10  loss 41-50  loss 141-150  held-out loss  accuracy\n");
  for (int pre = 0; pre < 2; ++pre)
    for (std::size_t a = 0; a < kArms.size(); ++a) {
      Run& r = runs[static_cast<std::size_t>(pre)][a] = train(seed, pre == 1, kArms[a], held_out);
      std::printf("  %-5s  %-15s  %9.3f  %10.3f  %12.3f  %13.3f  %8.3f\n", pre ? "pre" : "post", name_of(kArms[a]),
                  r.mean_loss(0, 10), r.mean_loss(40, 50), r.mean_loss(kSteps - 10, kSteps), r.held_out, r.accuracy);
    }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("\n  (8 runs in %.1f s)\n", seconds);

  // ---- the picture ----
  LineChart rates, post, pre;
  rates.title = "learning rate";
  rates.x.label = "step";
  rates.y.label = "learning rate";
  for (Arm arm : kArms) {
    LineSeries s{name_of(arm), colour_of(arm), {}, {}};
    for (Index step = 0; step < kSteps; ++step) {
      s.x.push_back(static_cast<double>(step + 1));
      s.y.push_back(rate(arm, step));
    }
    s.dashed = arm == Arm::warmup_constant;
    rates.series.push_back(s);
  }
  post.title = "post-norm: training loss";
  pre.title = "pre-norm: training loss";
  for (int p = 0; p < 2; ++p) {
    LineChart& c = p ? pre : post;
    c.x.label = "step";
    c.y = {"loss (mean of 5 steps)", AxisScale::log, 1e-3, 10, {}};
    c.references.push_back({kChance, "chance"});
    for (std::size_t a = 0; a < kArms.size(); ++a) {
      LineSeries s = loss_series(runs[static_cast<std::size_t>(p)][a], kArms[a]);
      for (double& y : s.y) y = std::max(y, 1e-3);
      s.dashed = kArms[a] == Arm::warmup_constant;
      c.series.push_back(s);
    }
  }
  LineChartOptions options;
  options.title =
      "Noam and warmup-cosine at peak 3e-2, and 3e-2 without warmup: reversing 6 letters, seed " + std::to_string(seed);
  options.plot_width = 260;
  options.plot_height = 200;
  write_line_charts_svg("learning_rate_schedules.svg", {rates, post, pre}, options);
  std::printf("  wrote learning_rate_schedules.svg\n\n");

  // ---- the checks ----
  const auto& post_runs = runs[0];
  const auto& pre_runs = runs[1];
  const auto index = [](Arm arm) { return static_cast<std::size_t>(arm); };
  std::snprintf(line, sizeof line,
                "post-norm without warmup fails: held-out loss %.3f after %td steps (needs >= 0.8 ln 10 = %.3f)",
                post_runs[index(Arm::constant)].held_out, kSteps, 0.8 * kChance);
  check(post_runs[index(Arm::constant)].held_out >= 0.8 * kChance, line);
  for (int p = 0; p < 2; ++p)
    for (Arm arm : kArms) {
      if (p == 0 && arm == Arm::constant) continue;
      const double loss = runs[static_cast<std::size_t>(p)][index(arm)].held_out;
      std::snprintf(line, sizeof line, "%s-norm with %s learns: held-out loss %.3f (needs < 0.5 ln 10 = %.3f)",
                    p ? "pre" : "post", arm == Arm::constant ? "constant (no warmup)" : name_of(arm), loss,
                    0.5 * kChance);
      check(loss < 0.5 * kChance, line);
    }
  std::printf(
      "\n  (printed, not checked) held-out loss, Noam against cosine: post-norm %.3f / %.3f, "
      "pre-norm %.3f / %.3f\n",
      post_runs[index(Arm::noam)].held_out, post_runs[index(Arm::cosine)].held_out, pre_runs[index(Arm::noam)].held_out,
      pre_runs[index(Arm::cosine)].held_out);
  return ok ? 0 : 1;
}
