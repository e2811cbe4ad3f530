// coreference.cpp — a small model that learns to resolve "it".
//
// Sentences like "the dog slept near the ball in the park . it was happy ." and one question: which
// animal is "it"? The model: a learned token embedding plus the sinusoidal position encoding, ONE
// MultiHeadAttention layer (self-attention, E = 32, H = 4), and a linear readout from the layer's output
// at "it" to the animal classes; softmax cross-entropy, Adam with warmup and cosine decay, gradient
// clipping. The backward is written out by hand: readout -> mha.backward -> embedding rows. There is no
// residual connection, so the output at "it" holds only what "it" gathered by attention: the model
// cannot answer without looking at the animal.
//
// Usage: coreference [--seed N]     (default seed 1; the same seed prints the same output)
// Writes coreference_attention.svg and coreference_attention.csv in the current directory. Exits 1 if the
// held-out accuracy is below 0.95 or no head's "it" row puts its largest weight on the animal.
// Walk-through: docs/training.md.
#include <selfattn/selfattn.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

using namespace selfattn;

namespace {

using T = float;              // float: 1.3x faster than double here; the printed results are the same
using Rng = std::mt19937_64;  // its raw output is fixed by the standard; the distributions are not

constexpr Index kEmbed = 32;  // E
constexpr Index kHeads = 4;   // H, head dim 8
constexpr int kSteps = 300, kBatch = 16, kWarmup = 30, kPrintEvery = 25;
constexpr double kPeakLr = 5e-3, kMinLr = 1e-4, kMaxGradNorm = 1.0;

double uniform(Rng& rng, double a) { return a * (2.0 * static_cast<double>(rng() >> 11) * 0x1.0p-53 - 1.0); }
std::size_t below(Rng& rng, std::size_t n) { return static_cast<std::size_t>(rng() % n); }

// ---- 1. Data: synthetic sentences -------------------------------------------------------------------

const std::vector<std::string> kAnimals{"cat", "dog", "bird", "fox", "horse", "rabbit", "cow", "mouse"};  // classes
const std::vector<std::string> kPlaces{"mat", "park", "garden", "house", "barn", "river", "field", "yard"};
const std::vector<std::string> kObjects{"ball", "bone", "hat", "box", "stick", "apple"};
const std::vector<std::string> kVerbs{"sat", "slept", "played", "waited", "hid", "ran"};
const std::vector<std::string> kAdjectives{"tired", "happy", "hungry", "sleepy"};
// A animal, P place, O object, V verb, J adjective. The animal moves (positions 1, 4, 8) and places and
// objects are distractor nouns: "it" has to find the animal by what it is, not by where it is.
const std::vector<std::string> kTemplates{
    "the A V on the P . it was J .",
    "in the P the A V . it was J .",
    "the A V near the O in the P . it was J .",
    "the O was in the P and the A V . it was J .",
};
const std::vector<std::string> kVocabulary = [] {
  std::vector<std::string> words{"<pad>", "the", "on", "in", "near", "was", "and", ".", "it"};
  for (const auto* list : {&kAnimals, &kPlaces, &kObjects, &kVerbs, &kAdjectives})
    words.insert(words.end(), list->begin(), list->end());
  return words;
}();

std::size_t token_of(const std::string& word) {
  return static_cast<std::size_t>(std::find(kVocabulary.begin(), kVocabulary.end(), word) - kVocabulary.begin());
}

struct Sentence {
  std::vector<std::string> words;
  std::vector<std::size_t> tokens;
  std::size_t tmpl = 0;    // index into kTemplates
  std::size_t it = 0;      // position of "it": the readout reads the layer's output there
  std::size_t animal = 0;  // position of the antecedent
  std::size_t label = 0;   // index into kAnimals
};

Sentence make_sentence(std::size_t tmpl, std::size_t animal, std::size_t place, std::size_t verb, std::size_t object,
                       std::size_t adjective) {
  Sentence s;
  s.tmpl = tmpl;
  s.label = animal;
  std::istringstream in(kTemplates[tmpl]);
  for (std::string slot; in >> slot;) {
    if (slot == "A") s.animal = s.words.size();
    if (slot == "it") s.it = s.words.size();
    s.words.push_back(slot == "A" ? kAnimals[animal] : slot == "P" ? kPlaces[place] : slot == "O" ? kObjects[object]
                      : slot == "V" ? kVerbs[verb] : slot == "J" ? kAdjectives[adjective] : slot);
    s.tokens.push_back(token_of(s.words.back()));
  }
  return s;
}

// Every (template, animal, place, verb) combination once, with a random object and adjective, shuffled by
// the seed; the first fifth is held out, so no held-out combination is ever seen in training.
void make_dataset(std::uint64_t seed, std::vector<Sentence>& train, std::vector<Sentence>& held_out) {
  Rng rng(seed);
  std::vector<Sentence> all;
  for (std::size_t t = 0; t < kTemplates.size(); ++t)
    for (std::size_t a = 0; a < kAnimals.size(); ++a)
      for (std::size_t p = 0; p < kPlaces.size(); ++p)
        for (std::size_t v = 0; v < kVerbs.size(); ++v) {
          // Two statements, not two arguments: compilers evaluate arguments in different orders.
          const std::size_t object = below(rng, kObjects.size());
          const std::size_t adjective = below(rng, kAdjectives.size());
          all.push_back(make_sentence(t, a, p, v, object, adjective));
        }
  for (std::size_t i = all.size() - 1; i > 0; --i) std::swap(all[i], all[below(rng, i + 1)]);  // Fisher-Yates
  const auto split = all.begin() + static_cast<std::ptrdiff_t>(all.size() / 5);
  held_out.assign(all.begin(), split);
  train.assign(split, all.end());
}

std::string joined(const std::vector<std::string>& words) {
  std::string text;
  for (const std::string& w : words) text += (text.empty() ? "" : " ") + w;
  return text;
}

// ---- 2. Model: forward and backward -----------------------------------------------------------------

MultiHeadAttentionConfig attention_config() {
  MultiHeadAttentionConfig cfg;
  cfg.embed_dim = kEmbed;
  cfg.num_heads = kHeads;
  cfg.dropout = 0.1;  // on the attention probabilities, in training mode only
  return cfg;
}

struct Model {
  explicit Model(std::uint64_t seed)
      : embedding({static_cast<Index>(kVocabulary.size()), kEmbed}), attention(attention_config(), seed),
        readout_weight({static_cast<Index>(kAnimals.size()), kEmbed}),
        readout_bias(std::array<Index, 1>{static_cast<Index>(kAnimals.size())}) {
    Rng rng(seed + 1);
    // Embeddings U(-1, 1): the same scale as the position encoding, so neither drowns the other.
    for (Index n = 0; n < embedding.size(); ++n) embedding.data()[n] = static_cast<T>(uniform(rng, 1.0));
    // The readout as nn.Linear initialises it: U(-1/sqrt(E), 1/sqrt(E)), zero bias.
    for (Index n = 0; n < readout_weight.size(); ++n)
      readout_weight.data()[n] = static_cast<T>(uniform(rng, 1.0 / std::sqrt(static_cast<double>(kEmbed))));
  }
  Tensor<T, 2> embedding;           // (V, E), learned
  MultiHeadAttention<T> attention;  // one self-attention layer, with its own parameters
  Tensor<T, 2> readout_weight;      // (C, E): logits = y_it W^T + b
  Tensor<T, 1> readout_bias;        // (C)
};

struct Gradients {
  Tensor<T, 2> embedding;
  MhaParams<T> attention;
  Tensor<T, 2> readout_weight;
  Tensor<T, 1> readout_bias;
};

// One forward pass over a batch. `attention` keeps views of x; moving a Pass keeps x's buffer in place.
struct Pass {
  std::vector<const Sentence*> batch;
  Tensor<T, 3> x;              // (B, L, E): embedding[token] + pe[position]; L = the longest sentence
  MhaForward<T> attention;     // output (B, L, E); weights (B, H, L, L) when asked for
  Tensor<T, 3> it_output;      // (1, B, E): the output at each sentence's "it"
  Tensor<T, 3> probabilities;  // (1, B, C): softmax of the logits
};

Pass forward(const Model& m, const std::vector<const Sentence*>& batch, std::uint64_t dropout_seed, bool weights) {
  Pass p;
  p.batch = batch;
  std::size_t length = 0;
  for (const Sentence* s : batch) length = std::max(length, s->tokens.size());
  const Tensor<T, 2> pe = sinusoidal_encoding<T>(static_cast<Index>(length), kEmbed);
  p.x = Tensor<T, 3>({static_cast<Index>(batch.size()), static_cast<Index>(length), kEmbed});
  AttentionOptions<T> options;
  for (std::size_t b = 0; b < batch.size(); ++b) {
    for (std::size_t l = 0; l < batch[b]->tokens.size(); ++l)
      for (Index e = 0; e < kEmbed; ++e) p.x(b, l, e) = m.embedding(batch[b]->tokens[l], e) + pe(l, e);
    options.key_lengths.push_back(static_cast<Index>(batch[b]->tokens.size()));  // shorter sentences: padding
  }
  options.seed = dropout_seed;  // one fixed dropout stream per step: reproducible runs
  options.need_weights = weights;
  p.attention = m.attention.forward(p.x, options);

  p.it_output = Tensor<T, 3>({1, static_cast<Index>(batch.size()), kEmbed});  // gather y_it = output[b, it_b]
  for (std::size_t b = 0; b < batch.size(); ++b)
    for (Index e = 0; e < kEmbed; ++e) p.it_output(0, b, e) = p.attention.output(b, batch[b]->it, e);
  p.probabilities = linear<T>(p.it_output, m.readout_weight, m.readout_bias);  // logits = y_it W^T + b
  for (std::size_t b = 0; b < batch.size(); ++b) {  // softmax, shifted by the max so exp cannot overflow
    T* z = &p.probabilities(0, b, 0);
    const T top = *std::max_element(z, z + kAnimals.size());
    T sum = 0;
    for (std::size_t c = 0; c < kAnimals.size(); ++c) sum += (z[c] = std::exp(z[c] - top));
    for (std::size_t c = 0; c < kAnimals.size(); ++c) z[c] /= sum;
  }
  return p;
}

// 1 - p[label] summed from the wrong classes: once p[label] rounds to 1 in float, 1 - p[label] is 0 and a
// confident model would get exactly zero gradient (and zero saliency); the sum keeps the small numbers.
double wrong_mass(const Pass& p, std::size_t b) {
  double sum = 0;
  for (std::size_t c = 0; c < kAnimals.size(); ++c)
    if (c != p.batch[b]->label) sum += static_cast<double>(p.probabilities(0, b, c));
  return sum;
}

// Mean cross-entropy: -log p[label] = log(1 + wrong / p[label]).
double loss_of(const Pass& p) {
  double loss = 0;
  for (std::size_t b = 0; b < p.batch.size(); ++b)
    loss += std::log1p(wrong_mass(p, b) / static_cast<double>(p.probabilities(0, b, p.batch[b]->label)));
  return loss / static_cast<double>(p.batch.size());
}

// Backward of the mean loss into g; returns dx (B, L, E), the gradient of the loss for every input row.
Tensor<T, 3> backward(const Model& m, const Pass& p, Gradients& g) {
  const std::size_t n = p.batch.size();
  // d logits = (softmax - onehot) / B; at the label, p - 1 = -(sum of the other probabilities)
  Tensor<T, 3> d_logits = p.probabilities;
  for (std::size_t b = 0; b < n; ++b) {
    d_logits(0, b, p.batch[b]->label) = static_cast<T>(-wrong_mass(p, b));
    for (std::size_t c = 0; c < kAnimals.size(); ++c) d_logits(0, b, c) /= static_cast<T>(n);
  }
  // logits = y_it W^T + b:  dy_it = d_logits W,  dW = d_logits^T y_it,  db = sum over the batch of d_logits
  LinearGradients<T> readout = linear_backward<T>(p.it_output, m.readout_weight, d_logits, true);
  g.readout_weight = std::move(readout.dweight);
  g.readout_bias = std::move(readout.dbias);
  // y_it = output[b, it_b]: the gather's backward scatters dy_it into an otherwise zero d output
  Tensor<T, 3> d_output(p.attention.output.shape());
  for (std::size_t b = 0; b < n; ++b)
    for (Index e = 0; e < kEmbed; ++e) d_output(b, p.batch[b]->it, e) = readout.dx(0, b, e);
  MhaGradients<T> att = m.attention.backward(d_output, p.attention);
  g.attention = std::move(att.params);
  // x feeds query, key and value: dx = d_query + d_key + d_value. x = embedding[token] + pe, so each row of
  // dx is added into its token's embedding row (scatter-add: a word used twice collects both rows).
  Tensor<T, 3> dx = std::move(att.d_query);
  g.embedding = Tensor<T, 2>(m.embedding.shape());
  for (std::size_t b = 0; b < n; ++b)
    for (std::size_t l = 0; l < p.batch[b]->tokens.size(); ++l)
      for (Index e = 0; e < kEmbed; ++e) {
        dx(b, l, e) += att.d_key(b, l, e) + att.d_value(b, l, e);
        g.embedding(p.batch[b]->tokens[l], e) += dx(b, l, e);
      }
  return dx;
}

// ---- 3. Optimizer: Adam, learning-rate schedule, gradient clipping ----------------------------------
// The library's training pieces (train/): AdamW without weight decay is Adam; the schedule warms up linearly,
// then decays along a cosine; clipping scales all gradients together when their global norm exceeds kMaxGradNorm.

// Every trainable tensor beside its gradient, always in this order (Adam matches its moments by position).
std::vector<ParameterRef<T>> parameters(Model& m, Gradients& g) {
  std::vector<ParameterRef<T>> list;
  add_parameter(list, "embedding", m.embedding, g.embedding, false);
  add_parameters(list, m.attention.params(), g.attention, "attention.");
  add_parameter(list, "readout_weight", m.readout_weight, g.readout_weight, false);
  add_parameter(list, "readout_bias", m.readout_bias, g.readout_bias, false);
  return list;
}

AdamW<T> adam() {
  AdamWConfig cfg;
  cfg.weight_decay = 0.0;  // Adam (Kingma & Ba, 2015)
  return AdamW<T>(cfg);
}

WarmupCosineSchedule schedule() {
  WarmupCosineSchedule s;
  s.peak_lr = kPeakLr;
  s.min_lr = kMinLr;
  s.warmup_steps = kWarmup;
  s.total_steps = kSteps;
  return s;
}

// ---- 4. Reports: predictions, attention beside saliency, the SVG and CSV ----------------------------

std::size_t predicted(const Pass& p, std::size_t b) {
  const T* z = &p.probabilities(0, b, 0);
  return static_cast<std::size_t>(std::max_element(z, z + kAnimals.size()) - z);
}

std::string prediction(const Pass& p, std::size_t b) {  // "cat (p = 0.9993)"
  char text[64];
  std::snprintf(text, sizeof text, "%s (p = %.4f)", kAnimals[predicted(p, b)].c_str(),
                static_cast<double>(p.probabilities(0, b, predicted(p, b))));
  return text;
}

// Among the heads whose "it" row has its largest weight on the animal, the one with the most; -1 if none.
int resolving_head(const Pass& p, std::size_t b) {
  const Sentence& s = *p.batch[b];
  int best = -1;
  for (int h = 0; h < kHeads; ++h) {
    const T* row = &p.attention.weights(b, h, s.it, 0);
    const bool top = static_cast<std::size_t>(std::max_element(row, row + s.tokens.size()) - row) == s.animal;
    if (top && (best < 0 || row[s.animal] > p.attention.weights(b, best, s.it, s.animal))) best = h;
  }
  return best;
}

// The "it" row of every head beside the saliency |d loss / d x_l| (L2 norm of row l of dx; x = embedding
// row + pe, so it is also the gradient of the embedding row), and its share of the total saliency.
void print_attention_vs_saliency(const Pass& p, const Tensor<T, 3>& dx) {
  const Sentence& s = *p.batch[0];
  std::printf("Attention of \"it\" (row %zu) over every key, per head, beside the gradient saliency\n"
              "|d loss / d embedding row|. Attention is not explanation: a weight says where a head reads\n"
              "from, the gradient says which inputs would move the loss. We show both side by side.\n\n  token  ",
              s.it);
  for (int h = 0; h < kHeads; ++h) std::printf("  head %d", h);
  std::printf("   saliency  share\n");
  std::vector<double> norms(s.tokens.size());
  for (std::size_t l = 0; l < s.tokens.size(); ++l) {
    for (Index e = 0; e < kEmbed; ++e) norms[l] += static_cast<double>(dx(0, l, e)) * static_cast<double>(dx(0, l, e));
    norms[l] = std::sqrt(norms[l]);
  }
  double total = 0;
  for (double n : norms) total += n;
  for (std::size_t l = 0; l < s.tokens.size(); ++l) {
    std::printf("  %-7s", s.words[l].c_str());
    for (int h = 0; h < kHeads; ++h) std::printf("  %6.3f", static_cast<double>(p.attention.weights(0, h, s.it, l)));
    std::printf("   %8.2e  %4.0f%%%s\n", norms[l], total > 0 ? 100.0 * norms[l] / total : 0.0,
                l == s.animal ? "   <- antecedent" : l == s.it ? "   <- it" : "");
  }
}

// Two panels (selfattn/plot/heatmap.hpp), one colour scale: the "it" row of every head (rows = heads, columns =
// key tokens), then the full (L, L) attention of the head that resolves "it" (rows = queries, columns = keys),
// its "it" row outlined; the antecedent's label in bold. The CSV holds that head's (L, L) weights.
void write_pictures(const std::string& svg, const std::string& csv, const Pass& p, int head) {
  const Sentence& s = *p.batch[0];
  const Index n = static_cast<Index>(s.tokens.size()), it = static_cast<Index>(s.it);
  const Index animal = static_cast<Index>(s.animal);
  Tensor<T, 2> it_rows({kHeads, n});  // it_rows(h, j) = weights(0, h, it, j)
  std::vector<std::string> heads;
  for (Index h = 0; h < kHeads; ++h) {
    heads.push_back("head " + std::to_string(h));
    for (Index j = 0; j < n; ++j) it_rows(h, j) = p.attention.weights(0, h, it, j);
  }
  HeatmapPanel rows = make_heatmap_panel(it_rows, heads, s.words, "the \"it\" row of every head (columns: keys)");
  rows.row_axis = "";  // the title names both axes
  rows.column_axis = "";
  rows.bold_column_labels = {animal};
  const std::string subtitle = "head " + std::to_string(head) + ": every query (rows) over every key (columns)";
  HeatmapPanel full = make_heatmap_panel(p.attention.weights[0][head], s.words, s.words, subtitle);
  full.bold_column_labels = {animal};
  full.bold_row_labels = {it};
  full.outlined_rows = {it};
  HeatmapOptions options;
  options.title = "What \"it\" attends to in a held-out sentence (target: " + kAnimals[s.label] + ")";
  options.grid_columns = 1;  // one panel above the other
  write_heatmap_panels_svg(svg, {rows, full}, options);
  write_attention_csv(csv, p.attention.weights, 0, head, s.words, s.words);
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
  std::vector<Sentence> train, held_out;
  make_dataset(seed, train, held_out);
  std::printf("Resolving \"it\": %zu training and %zu held-out sentences (no template/animal/place/verb\n"
              "combination in both), vocabulary %zu, %zu animal classes, seed %llu. For example:\n", train.size(),
              held_out.size(), kVocabulary.size(), kAnimals.size(), static_cast<unsigned long long>(seed));
  for (std::size_t i = 0; i < 3; ++i)
    std::printf("  %-58s -> %s\n", joined(train[i].words).c_str(), kAnimals[train[i].label].c_str());

  // ---- Training: shuffled mini-batches, dropout on ----
  Model model(seed);
  model.attention.set_training(true);
  Gradients grads;
  AdamW<T> optimizer = adam();
  const WarmupCosineSchedule lr_schedule = schedule();
  Rng rng(seed + 2);
  std::vector<std::size_t> order(train.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::size_t cursor = order.size();
  double interval_loss = 0, interval_correct = 0;
  std::printf("\n step       lr    loss  train acc  loss bar (full width: ln %zu, chance)\n", kAnimals.size());
  for (int step = 0; step < kSteps; ++step) {
    std::vector<const Sentence*> batch;
    for (int b = 0; b < kBatch; ++b) {
      if (cursor == order.size()) {  // a new epoch: reshuffle
        for (std::size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[below(rng, i + 1)]);
        cursor = 0;
      }
      batch.push_back(&train[order[cursor++]]);
    }
    const Pass pass = forward(model, batch, static_cast<std::uint64_t>(step), false);
    backward(model, pass, grads);
    const std::vector<ParameterRef<T>> params = parameters(model, grads);
    clip_grad_norm(params, kMaxGradNorm);
    optimizer.step(params, lr_schedule.learning_rate(step));

    interval_loss += loss_of(pass);
    for (std::size_t b = 0; b < batch.size(); ++b) interval_correct += predicted(pass, b) == batch[b]->label;
    if ((step + 1) % kPrintEvery == 0 || step == 0) {
      const int count = step == 0 ? 1 : kPrintEvery;
      const double mean = interval_loss / count;
      const double chance = std::log(static_cast<double>(kAnimals.size()));
      const auto bar = static_cast<std::size_t>(std::lround(40.0 * std::min(1.0, mean / chance)));
      std::printf("%5d  %.1e  %6.3f     %5.3f   %s\n", step + 1, lr_schedule.learning_rate(step), mean,
                  interval_correct / (count * kBatch), std::string(bar, '#').c_str());
      interval_loss = interval_correct = 0;
    }
  }

  // ---- Held-out evaluation, dropout off ----
  model.attention.set_training(false);
  std::vector<const Sentence*> all;
  for (const Sentence& s : held_out) all.push_back(&s);
  const Pass test = forward(model, all, 0, true);
  int correct = 0, attends = 0;
  for (std::size_t b = 0; b < all.size(); ++b) {
    correct += predicted(test, b) == all[b]->label;
    attends += resolving_head(test, b) >= 0;
  }
  const double accuracy = static_cast<double>(correct) / static_cast<double>(all.size());
  std::printf("\nheld-out accuracy: %.3f (%d / %zu), held-out loss %.2e\n", accuracy, correct, all.size(),
              loss_of(test));
  std::printf("held-out sentences where some head attends most to the animal: %d / %zu\n", attends, all.size());

  // ---- One held-out sentence with both distractors: attention beside gradient saliency ----
  // A held-out "the cat V near the O in the P . it was J .", with both distractor nouns.
  const auto is_cat_example = [](const Sentence* s) { return s->tmpl == 2 && s->label == 0; };
  const auto cat = std::find_if(all.begin(), all.end(), is_cat_example);
  const Sentence* example = cat != all.end() ? *cat : all[0];
  const Pass one = forward(model, {example}, 0, true);
  Gradients scratch;
  const Tensor<T, 3> dx = backward(model, one, scratch);
  std::printf("\nheld-out sentence: \"%s\"\nprediction: %s, target %s\n\n", joined(example->words).c_str(),
              prediction(one, 0).c_str(), kAnimals[example->label].c_str());
  print_attention_vs_saliency(one, dx);
  const int head = resolving_head(one, 0);
  const std::string& animal = example->words[example->animal];
  if (head >= 0)
    std::printf("\ncheck: head %d attends most to '%s' (%.2f)\n", head, animal.c_str(),
                static_cast<double>(one.attention.weights(0, head, example->it, example->animal)));
  else
    std::printf("\ncheck FAILED: no head attends most to '%s'\n", animal.c_str());

  // ---- Counterfactual: another animal in the same sentence; the answer should follow ----
  Sentence swapped = *example;
  swapped.label = example->label == 1 ? 0 : 1;  // "dog", or "cat" if it was a dog
  swapped.words[swapped.animal] = kAnimals[swapped.label];
  swapped.tokens[swapped.animal] = token_of(kAnimals[swapped.label]);
  const Pass cf = forward(model, {&swapped}, 0, false);
  std::printf("\ncounterfactual (swap the animal, the answer should follow):\n  %-58s -> %s\n  %-58s -> %s\n",
              joined(example->words).c_str(), prediction(one, 0).c_str(), joined(swapped.words).c_str(),
              prediction(cf, 0).c_str());

  const std::string svg = "coreference_attention.svg", csv = "coreference_attention.csv";
  try {
    write_pictures(svg, csv, one, head >= 0 ? head : 0);
    std::printf("\nattention heatmap written to %s\n", svg.c_str());
    std::printf("attention weights of head %d written to %s\n", head >= 0 ? head : 0, csv.c_str());
  } catch (const std::runtime_error& e) {
    std::printf("\ncould not write the pictures: %s\n", e.what());
  }

  if (accuracy < 0.95 || head < 0) {
    std::printf("FAILED: %s\n", accuracy < 0.95 ? "held-out accuracy below 0.95"
                                                 : "no head attends most to the antecedent");
    return 1;
  }
  return 0;
}
