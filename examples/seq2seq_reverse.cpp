// seq2seq_reverse: a tiny encoder-decoder transformer trained in C++ to reverse a string, and its cross-attention
// drawn: the alignment a reader can see (chapter §1.1, cross- vs self-attention).
//
// The task: a string of 3 to 8 letters from a-j in, the same letters in reverse order out, then <eos>. Output
// position i copies input position n - 1 - i, so a decoder that has learned the task must read, at step i, that one
// source position: its cross-attention (queries from the target, keys and values from the encoder's output) should
// draw the anti-diagonal. Self-attention relates a sequence to itself; cross-attention relates two sequences.
//
// The model: token embeddings plus sinusoidal positions; an encoder (TransformerStack, 2 pre-norm layers, a final
// norm) over the source; a decoder (TransformerDecoderStack, 2 layers: causal self-attention, cross-attention over
// the encoder's output, FFN) over the target shifted right (<bos> first); a linear head; cross-entropy, AdamW, a
// warmup-cosine schedule. Every gradient is the library's backward: the decoder's d_memory is the encoder's dout.
//
// What it checks (exit code 1 when a claim fails):
//   1. held-out accuracy: greedy decoding through the decoder's KV caches over the memory projected once reverses
//      at least 95 % of 500 strings the training never saw, whole strings exactly;
//   2. decoding with the caches gives the full forward's logits (within 1e-4 in float);
//   3. the alignment: in the decoder's last layer, the head-averaged cross-attention of output position i peaks on
//      source position n - 1 - i for at least 90 % of the output positions of the held-out strings.
// It writes seq2seq_alignment.svg: one held-out string's cross-attention, output letters down, source letters across.
//
//   seq2seq_reverse [--seed N]
#include <selfattn/selfattn.hpp>

#include "example_args.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

using namespace selfattn;

namespace {

constexpr Index letters = 10;       // a .. j
constexpr Index bos = letters;      // the decoder's first input
constexpr Index eos = letters + 1;  // the end of an output
constexpr Index vocabulary = letters + 2;
constexpr Index min_length = 3, max_length = 8;
constexpr Index embed_dim = 32, heads = 4;

// ---- the task ---------------------------------------------------------------------------------------

using Word = std::vector<Index>;

std::string text_of(const Word& w) {
  std::string s;
  for (Index t : w) s += t < letters ? static_cast<char>('a' + t) : t == eos ? '$' : '^';
  return s;
}

// Draws from mt19937_64's raw output, which the standard fixes (its distributions are not): the same seed gives
// the same strings and weights with every standard library.
using Rng = std::mt19937_64;
Index below(Rng& rng, Index n) { return static_cast<Index>(rng() % static_cast<std::uint64_t>(n)); }
double uniform01(Rng& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

Word random_word(Rng& rng) {
  Word w(static_cast<std::size_t>(min_length + below(rng, max_length - min_length + 1)));
  for (Index& t : w) t = below(rng, letters);
  return w;
}

// A batch as the model reads it: source ids (B, Ls), the decoder's input <bos> + reversed (B, Ls + 1), its targets
// reversed + <eos> with -100 (ignored) past the end, and each source's length.
struct Batch {
  Tensor<Index, 2> source, target_in, target_out;
  std::vector<Index> lengths;
};

Batch make_batch(const std::vector<Word>& words) {
  const auto b = static_cast<Index>(words.size());
  Index longest = 0;
  for (const Word& w : words) longest = std::max(longest, static_cast<Index>(w.size()));
  Batch batch{
      Tensor<Index, 2>({b, longest}), Tensor<Index, 2>({b, longest + 1}), Tensor<Index, 2>({b, longest + 1}), {}};
  for (Index i = 0; i < b; ++i) {
    const Word& w = words[static_cast<std::size_t>(i)];
    const auto n = static_cast<Index>(w.size());
    batch.lengths.push_back(n);
    for (Index l = 0; l < longest; ++l) batch.source(i, l) = l < n ? w[static_cast<std::size_t>(l)] : eos;  // padding
    for (Index l = 0; l <= longest; ++l) {
      const Index reversed = l < n ? w[static_cast<std::size_t>(n - 1 - l)] : eos;
      batch.target_in(i, l) = l == 0 ? bos : batch.target_out(i, l - 1) == -100 ? eos : batch.target_out(i, l - 1);
      batch.target_out(i, l) = l <= n ? reversed : -100;
    }
  }
  return batch;
}

// ---- the model --------------------------------------------------------------------------------------

struct Model {
  Tensor<float, 2> source_table, target_table;  // (V, E) embeddings
  TransformerStack<float> encoder;
  TransformerDecoderStack<float> decoder;
  Tensor<float, 2> head_weight;  // (V, E)
  Tensor<float, 1> head_bias;    // (V)
  Tensor<float, 2> positions;    // (max_length + 1, E), sinusoidal

  static TransformerStackConfig encoder_config() {
    TransformerStackConfig cfg;
    cfg.layer = decoder_layer_config(embed_dim, heads, 2 * embed_dim);  // pre-norm, GELU, no dropout ...
    cfg.layer.causal = false;                                           // ... but the encoder sees both ways
    cfg.num_layers = 2;
    cfg.final_norm = true;
    return cfg;
  }
  static TransformerDecoderStackConfig decoder_config() {
    TransformerDecoderStackConfig cfg;
    cfg.layer.attention.embed_dim = embed_dim;
    cfg.layer.attention.num_heads = heads;
    cfg.layer.attention.dropout = 0.0;
    cfg.layer.ffn_dim = 2 * embed_dim;
    cfg.layer.activation = Activation::gelu;
    cfg.layer.dropout = 0.0;
    cfg.layer.norm_first = true;
    cfg.num_layers = 2;
    cfg.final_norm = true;
    return cfg;
  }

  explicit Model(std::uint64_t seed)
      : source_table({vocabulary, embed_dim}),
        target_table({vocabulary, embed_dim}),
        encoder(encoder_config(), seed),
        decoder(decoder_config(), seed + 100),
        head_weight({vocabulary, embed_dim}),
        head_bias({vocabulary}),
        positions(sinusoidal_encoding<float>(max_length + 1, embed_dim)) {
    Rng rng(seed + 200);
    const auto normal = [&] {  // Box-Muller
      const double u = std::max(uniform01(rng), 0x1.0p-53), v = uniform01(rng);
      return static_cast<float>(std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v));
    };
    for (Tensor<float, 2>* t : {&source_table, &target_table}) std::generate_n(t->data(), t->size(), normal);
    const double bound = 1.0 / std::sqrt(static_cast<double>(embed_dim));  // nn.Linear's U(-1/sqrt(E), 1/sqrt(E))
    std::generate_n(head_weight.data(), head_weight.size(),
                    [&] { return static_cast<float>(bound * (2 * uniform01(rng) - 1)); });
  }

  // Embedding plus the position of each row (row l at position offset + l).
  Tensor<float, 3> embed(const Tensor<float, 2>& table, const Tensor<Index, 2>& ids, Index offset = 0) const {
    Tensor<float, 3> x = embedding<float>(table.view(), ids.view());
    for (Index b = 0; b < x.dim(0); ++b)
      for (Index l = 0; l < x.dim(1); ++l)
        for (Index e = 0; e < embed_dim; ++e) x(b, l, e) += positions(offset + l, e);
    return x;
  }
};

AttentionOptions<float> padding(const std::vector<Index>& lengths) {
  AttentionOptions<float> opts;
  opts.key_lengths = lengths;
  return opts;
}

// One training step on `batch`: forward, cross-entropy, the backward through head, decoder, encoder and both
// embeddings, clipping, AdamW. Returns the loss.
double train_step(Model& m, const Batch& batch, AdamW<float>& adamw, double lr) {
  const AttentionOptions<float> source = padding(batch.lengths);
  const Tensor<float, 3> x_source = m.embed(m.source_table, batch.source);
  const Tensor<float, 3> x_target = m.embed(m.target_table, batch.target_in);
  const auto encoded = m.encoder.forward(x_source, source);
  const auto decoded = m.decoder.forward(x_target, encoded.output, {}, source);  // causal by cfg.causal
  const Tensor<float, 3> logits = linear<float>(decoded.output.view(), m.head_weight.view(), m.head_bias.view());
  const CrossEntropy<float> ce = softmax_cross_entropy<float>(logits.view(), batch.target_out.view());

  LinearGradients<float> head =
      linear_backward<float>(decoded.output.view(), m.head_weight.view(), ce.d_logits.view(), true);
  auto g_decoder = m.decoder.backward(head.dx, decoded);
  auto g_encoder = m.encoder.backward(g_decoder.d_memory, encoded);  // the memory's gradient is the encoder's dout
  Tensor<float, 2> d_source = embedding_backward<float>(batch.source.view(), g_encoder.d_input.view(), vocabulary);
  Tensor<float, 2> d_target = embedding_backward<float>(batch.target_in.view(), g_decoder.d_input.view(), vocabulary);

  std::vector<ParameterRef<float>> params;
  add_parameter(params, "source_table", m.source_table, d_source, false);
  add_parameter(params, "target_table", m.target_table, d_target, false);
  add_parameters(params, m.encoder.params(), g_encoder.params, "encoder.");
  add_parameters(params, m.decoder.params(), g_decoder.params, "decoder.");
  add_parameter(params, "head_weight", m.head_weight, head.dweight, true);
  add_parameter(params, "head_bias", m.head_bias, head.dbias, false);
  clip_grad_norm(params, 1.0);
  adamw.step(params, lr);
  return ce.loss;
}

Index argmax(const float* row, Index n) { return static_cast<Index>(std::max_element(row, row + n) - row); }

// Greedy decoding of a batch: the encoder once, the memory projected once per decoder layer, then one token per
// step through the decoder's KV caches, each sequence until <eos> (at most its length + 1 steps). Also returns the
// logits of every step (B, steps, V), to compare with a full forward.
struct Decoded {
  std::vector<Word> words;
  Tensor<float, 3> logits;
};

Decoded greedy_decode(const Model& m, const Batch& batch) {
  const Index b = batch.source.dim(0), steps = batch.source.dim(1) + 1;
  const AttentionOptions<float> source = padding(batch.lengths);
  const Tensor<float, 3> encoded = m.encoder.forward(m.embed(m.source_table, batch.source), source).output;
  const TransformerDecoderStackMemory<float> memory = m.decoder.project_memory(encoded);
  TransformerStackCache<float> cache = m.decoder.make_cache(b);
  Decoded out{std::vector<Word>(static_cast<std::size_t>(b)), Tensor<float, 3>({b, steps, vocabulary})};
  std::vector<bool> done(static_cast<std::size_t>(b), false);
  Tensor<Index, 2> next({b, 1});
  next.fill(bos);
  for (Index t = 0; t < steps; ++t) {
    const Tensor<float, 3> y = m.decoder.step(m.embed(m.target_table, next, t), cache, memory, {}, source);
    const Tensor<float, 3> logits = linear<float>(y.view(), m.head_weight.view(), m.head_bias.view());
    for (Index i = 0; i < b; ++i) {
      std::copy(&logits(i, 0, 0), &logits(i, 0, 0) + vocabulary, &out.logits(i, t, 0));
      next(i, 0) = argmax(&logits(i, 0, 0), vocabulary);
      if (done[static_cast<std::size_t>(i)]) continue;
      if (next(i, 0) == eos)
        done[static_cast<std::size_t>(i)] = true;
      else
        out.words[static_cast<std::size_t>(i)].push_back(next(i, 0));
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t seed = 1;
  if (!seed_argument(argc, argv, seed)) return 2;
  const auto start = std::chrono::steady_clock::now();

  // ---- training ----
  Model model(seed);
  Rng rng(seed);
  std::set<Word> seen;
  constexpr Index steps = 700, batch_size = 32;
  AdamWConfig adamw_config;
  adamw_config.weight_decay = 0.01;
  AdamW<float> adamw(adamw_config);
  WarmupCosineSchedule schedule;
  schedule.peak_lr = 3e-3;
  schedule.min_lr = 1e-4;
  schedule.warmup_steps = 50;
  schedule.total_steps = steps;
  std::printf(
      "Reversing strings of %td to %td letters (a-j) with an encoder-decoder: E = %td, %td heads, 2 + 2 "
      "pre-norm layers; %td steps of %td strings.\n\n",
      min_length, max_length, embed_dim, heads, steps, batch_size);
  double loss = 0;
  for (Index step = 0; step < steps; ++step) {
    std::vector<Word> words;
    for (Index i = 0; i < batch_size; ++i) {
      words.push_back(random_word(rng));
      seen.insert(words.back());
    }
    loss = train_step(model, make_batch(words), adamw, schedule.learning_rate(step));
    if (step % 100 == 0 || step == steps - 1) std::printf("  step %4td  loss %.4f\n", step, loss);
  }
  const double train_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // ---- held-out strings: never drawn in training ----
  std::vector<Word> held_out;
  Rng test_rng(seed + 7777);
  while (held_out.size() < 500) {
    Word w = random_word(test_rng);
    if (seen.count(w) == 0) held_out.push_back(w);
  }
  const Batch test = make_batch(held_out);

  // 1. greedy decoding, whole strings exactly
  const Decoded decoded = greedy_decode(model, test);
  Index correct = 0;
  for (std::size_t i = 0; i < held_out.size(); ++i) {
    Word reversed(held_out[i].rbegin(), held_out[i].rend());
    if (decoded.words[i] == reversed) ++correct;
  }
  const double accuracy = static_cast<double>(correct) / static_cast<double>(held_out.size());

  // 2. the cached decode against one full forward on the decoded prefixes (teacher forcing on its own outputs)
  Tensor<Index, 2> prefixes({test.target_in.dim(0), test.target_in.dim(1)});
  for (Index i = 0; i < prefixes.dim(0); ++i)
    for (Index t = 0; t < prefixes.dim(1); ++t)
      prefixes(i, t) = t == 0 ? bos : argmax(&decoded.logits(i, t - 1, 0), vocabulary);
  const AttentionOptions<float> source = padding(test.lengths);
  AttentionOptions<float> source_weights = source;
  source_weights.need_weights = true;
  const auto encoded = model.encoder.forward(model.embed(model.source_table, test.source), source);
  const auto full =
      model.decoder.forward(model.embed(model.target_table, prefixes), encoded.output, {}, source_weights);
  const Tensor<float, 3> full_logits =
      linear<float>(full.output.view(), model.head_weight.view(), model.head_bias.view());
  double cache_difference = 0;
  for (Index n = 0; n < full_logits.size(); ++n)
    cache_difference =
        std::max(cache_difference, static_cast<double>(std::abs(full_logits.data()[n] - decoded.logits.data()[n])));

  // 3. the alignment: output position i (i < n) reads source position n - 1 - i, in the last layer's
  // head-averaged cross-attention (weights of the forward above, whose inputs are the decoded prefixes)
  const Tensor<float, 4>& cross = full.layers.back().cross_weights;  // (B, H, Lt, Ls)
  const Index ls = cross.dim(3);
  const auto averaged = [&](Index i, Index t, Index j) {
    float sum = 0;
    for (Index h = 0; h < heads; ++h) sum += cross(i, h, t, j);
    return sum / static_cast<float>(heads);
  };
  Index aligned = 0, positions = 0;
  for (Index i = 0; i < cross.dim(0); ++i) {
    const Index n = test.lengths[static_cast<std::size_t>(i)];
    for (Index t = 0; t < n; ++t, ++positions) {
      Index best = 0;
      for (Index j = 1; j < ls; ++j)
        if (averaged(i, t, j) > averaged(i, t, best)) best = j;
      if (best == n - 1 - t) ++aligned;
    }
  }
  const double alignment = static_cast<double>(aligned) / static_cast<double>(positions);

  // the picture: the first held-out string of the longest length
  Index shown = 0;
  while (test.lengths[static_cast<std::size_t>(shown)] != max_length) ++shown;
  const Word& word = held_out[static_cast<std::size_t>(shown)];
  Tensor<float, 2> picture({max_length + 1, max_length});
  std::vector<std::string> rows, columns;
  for (Index t = 0; t <= max_length; ++t) {
    const Index out = argmax(&decoded.logits(shown, t, 0), vocabulary);
    rows.push_back(std::to_string(t) + ": " + text_of({out}));
    for (Index j = 0; j < max_length; ++j) picture(t, j) = averaged(shown, t, j);
  }
  for (Index j = 0; j < max_length; ++j) columns.push_back(text_of({word[static_cast<std::size_t>(j)]}));
  HeatmapOptions picture_options;
  picture_options.title = "cross-attention, last decoder layer, mean of 4 heads: '" + text_of(word) + "' reversed";
  picture_options.decimals = 1;
  picture_options.legend_label = "weight";
  write_attention_heatmap_svg("seq2seq_alignment.svg", picture, rows, columns, picture_options);

  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("\nTrained in %.1f s; everything in %.1f s.\n", train_seconds, seconds);
  std::printf("Held out (500 strings never seen in training), greedy decoding through the KV caches:\n");
  for (std::size_t i = 0; i < 4; ++i)
    std::printf("  %-9s -> %-9s %s\n", text_of(held_out[i]).c_str(), text_of(decoded.words[i]).c_str(),
                decoded.words[i] == Word(held_out[i].rbegin(), held_out[i].rend()) ? "" : "(wrong)");
  std::printf("  whole strings reversed exactly: %.1f %%\n", 100 * accuracy);
  std::printf("  cached decode against one full forward: largest logit difference %.2e\n", cache_difference);
  std::printf("  cross-attention peaks on source position n - 1 - i: %.1f %% of %td output positions\n",
              100 * alignment, positions);
  std::printf("Wrote seq2seq_alignment.svg (the anti-diagonal is the alignment).\n\n");

  bool ok = true;
  const auto check = [&](bool claim, const char* what) {
    std::printf("%s %s\n", claim ? "ok  " : "FAIL", what);
    ok = ok && claim;
  };
  check(accuracy >= 0.95, "at least 95 % of held-out strings reversed exactly");
  check(cache_difference <= 1e-4, "decoding through the caches gives the full forward's logits (within 1e-4)");
  check(alignment >= 0.90, "the cross-attention draws the alignment: it peaks on the mirrored source position");
  return ok ? 0 : 1;
}
