// speculative_decoding.cpp — greedy decoding that verifies a tree of drafted tokens per step
// (TransformerStack::step_tree, keep_draft_path) and writes the same tokens as one step per token, in fewer steps.
//
// The model is random and fixed: an embedding table (64 tokens x E = 512), 4 GPT-style layers with RoPE and grouped
// heads (TransformerStack, decoder_layer_config), a final norm and a readout to the 64 tokens. Greedy
// decoding of a small model soon repeats itself (docs/tiny_lm.md), which is where drafting from the text already
// written pays: prompt lookup. The drafter finds every earlier occurrence of the last two tokens and proposes the
// (up to 4) tokens that followed each; the continuations share their first tokens, so they form a tree (a trie)
// rooted at the token the model chose last.
//
// One speculative step: the tree (root = the chosen token, not yet cached; the drafts below it) goes through the
// model in one step_tree call; row i of the output is the model's next-token prediction after node i. Walking down
// from the root, a child is accepted while its token is the model's own prediction at its parent: the accepted
// path is what one-token steps would have produced, so the written text is the same. keep_draft_path keeps the
// path in every layer's cache; the prediction after its last node is the next chosen token.
//
// Usage: speculative_decoding [--seed N]   (default seed 1: the prompt's tokens). Prints both runs' steps and
// time per token, and how many drafts each step accepted. Exits 1 unless the two texts are equal token for token
// and the speculative run took fewer model calls than tokens written (some drafts accepted). The two runs' outputs
// differ by rounding only (about 1e-6 of a logit); the program prints the smallest gap between two largest logits
// it met, which is what a rounding difference would have to bridge to change a token.
// Walk-through: docs/decoding.md, "Speculative decoding".
#include <selfattn/selfattn.hpp>

#include "example_args.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

using namespace selfattn;

namespace {

// A Debug build (no __OPTIMIZE__, the sanitizer builds) writes fewer tokens, to stay at a few seconds.
#ifdef __OPTIMIZE__
constexpr Index kWritten = 200;
#else
constexpr Index kWritten = 120;
#endif
constexpr Index kVocab = 64, kEmbed = 512, kHeads = 8, kKvHeads = 2, kLayers = 4, kPrompt = 24;
constexpr Index kDraftDepth = 4, kMaxDrafts = 7;  // the tree: at most 4 tokens deep, 7 drafts below the root

using Clock = std::chrono::steady_clock;

struct Model {
  TransformerStack<float> stack;
  Tensor<float, 2> embedding{{kVocab, kEmbed}};  // row t: the input of token t
  Tensor<float, 2> readout{{kVocab, kEmbed}};    // logits = readout * output row

  static TransformerStackConfig config() {
    TransformerStackConfig cfg;
    cfg.layer = decoder_layer_config(kEmbed, kHeads);
    cfg.layer.attention.num_kv_heads = kKvHeads;
    cfg.layer.attention.rope_dim = kEmbed / kHeads;
    cfg.num_layers = kLayers;
    cfg.final_norm = true;
    return cfg;
  }

  Model() : stack(config(), 3) {
    std::mt19937_64 random(2026);
    std::normal_distribution<float> normal;
    for (Index n = 0; n < embedding.size(); ++n) embedding.data()[n] = normal(random);
    for (Index n = 0; n < readout.size(); ++n) readout.data()[n] = normal(random);
  }

  Tensor<float, 3> embed(const std::vector<int>& tokens) const {
    Tensor<float, 3> x({1, static_cast<Index>(tokens.size()), kEmbed});
    for (std::size_t l = 0; l < tokens.size(); ++l)
      as_vector(x[0][static_cast<Index>(l)]) = as_vector(embedding.view()[tokens[l]]);
    return x;
  }

  // Greedy: the token whose readout row scores row `row` of y (1, L, E) highest.
  int predict(const Tensor<float, 3>& y, Index row) const {
    Eigen::VectorXf logits = as_matrix(readout.view()) * as_vector(y.view()[0][row]).transpose();
    Index best = 0;
    const float largest = logits.maxCoeff(&best);
    logits(best) = -std::numeric_limits<float>::infinity();
    smallest_gap = std::min(smallest_gap, static_cast<double>(largest - logits.maxCoeff()));
    return static_cast<int>(best);
  }

  // The smallest gap between the two largest logits of any prediction so far: how far a rounding difference
  // between two runs would have to move a logit to change a greedy choice.
  mutable double smallest_gap = std::numeric_limits<double>::infinity();
};

// ---- the plain run: one step per token ----------------------------------------------------------------------
struct Run {
  std::vector<int> text;  // the prompt, then the tokens written
  Index model_calls = 0;
  double milliseconds = 0;
  std::vector<Index> accepted_per_step;  // drafts accepted per speculative step
};

Run decode_plainly(const Model& model, const std::vector<int>& prompt) {
  Run run;
  run.text = prompt;
  auto cache = model.stack.make_cache(1);
  const Clock::time_point start = Clock::now();
  int chosen = model.predict(model.stack.step(model.embed(prompt), cache), kPrompt - 1);
  while (static_cast<Index>(run.text.size()) < kPrompt + kWritten) {
    run.text.push_back(chosen);
    chosen = model.predict(model.stack.step(model.embed({chosen}), cache), 0);
    ++run.model_calls;
  }
  run.milliseconds = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  return run;
}

// ---- the drafter: prompt lookup, as a trie --------------------------------------------------------------------
struct Drafts {
  DraftTree tree;           // node 0: the chosen token; below it the drafts
  std::vector<int> tokens;  // the token of each node
};

// Every earlier place where `text` then `chosen` continues the same two tokens proposes what followed it there.
Drafts draft_by_lookup(const std::vector<int>& text, int chosen) {
  Drafts d{DraftTree{{-1}}, {chosen}};
  const Index n = static_cast<Index>(text.size());
  for (Index p = n - 2; p >= 1 && d.tree.size() <= kMaxDrafts; --p) {
    if (text[static_cast<std::size_t>(p - 1)] != text.back() || text[static_cast<std::size_t>(p)] != chosen) continue;
    Index node = 0;  // walk down the trie along text[p + 1 ..], adding what is not there yet
    for (Index j = p + 1; j < std::min(n, p + 1 + kDraftDepth) && d.tree.size() <= kMaxDrafts; ++j) {
      const int token = text[static_cast<std::size_t>(j)];
      Index child = -1;
      for (Index c = node + 1; c < d.tree.size() && child < 0; ++c)
        if (d.tree.parents[static_cast<std::size_t>(c)] == node && d.tokens[static_cast<std::size_t>(c)] == token)
          child = c;
      if (child < 0) {
        d.tree.parents.push_back(node);
        d.tokens.push_back(token);
        child = d.tree.size() - 1;
      }
      node = child;
    }
  }
  return d;
}

// ---- the speculative run ---------------------------------------------------------------------------------------
Run decode_speculatively(const Model& model, const std::vector<int>& prompt) {
  Run run;
  run.text = prompt;
  auto cache = model.stack.make_cache(1);
  const Clock::time_point start = Clock::now();
  int chosen = model.predict(model.stack.step(model.embed(prompt), cache), kPrompt - 1);
  while (static_cast<Index>(run.text.size()) < kPrompt + kWritten) {
    const Drafts d = draft_by_lookup(run.text, chosen);
    const Index start_slot = cache.length();
    const Tensor<float, 3> y = model.stack.step_tree(model.embed(d.tokens), cache, d.tree);
    ++run.model_calls;
    // Walk down from the root while a child carries the model's own prediction at its parent.
    std::vector<Index> path{0};
    int prediction = model.predict(y, 0);
    for (bool found = true; found;) {
      found = false;
      for (Index c = path.back() + 1; c < d.tree.size() && !found; ++c)
        if (d.tree.parents[static_cast<std::size_t>(c)] == path.back() &&
            d.tokens[static_cast<std::size_t>(c)] == prediction) {
          path.push_back(c);
          prediction = model.predict(y, c);
          found = true;
        }
    }
    cache.keep_draft_path(0, start_slot, path);
    for (Index node : path) run.text.push_back(d.tokens[static_cast<std::size_t>(node)]);
    run.accepted_per_step.push_back(static_cast<Index>(path.size()) - 1);
    chosen = prediction;
  }
  run.text.resize(static_cast<std::size_t>(kPrompt + kWritten));  // the last step may write past the end
  run.milliseconds = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t seed = 1;
  if (!seed_argument(argc, argv, seed)) return 2;
  const Model model;
  std::mt19937_64 random(seed);
  std::vector<int> prompt;
  for (Index i = 0; i < kPrompt; ++i) prompt.push_back(static_cast<int>(random() % kVocab));

  std::printf(
      "A random GPT-style model (%td layers, E = %td, %td query / %td key-value heads, RoPE, vocabulary %td)\n"
      "writes %td tokens greedily after a prompt of %td, twice: one step per token, and with a tree of\n"
      "drafts (prompt lookup: up to %td deep, %td drafts) verified in one step_tree call per step.\n\n",
      kLayers, kEmbed, kHeads, kKvHeads, kVocab, kWritten, kPrompt, kDraftDepth, kMaxDrafts);
  const Run plain = decode_plainly(model, prompt);
  const Run speculative = decode_speculatively(model, prompt);

  Index accepted = 0, steps_accepting = 0, most = 0;
  for (Index a : speculative.accepted_per_step) {
    accepted += a;
    steps_accepting += a > 0;
    most = std::max(most, a);
  }
  std::printf("                     model calls   tokens per call   ms per token\n");
  std::printf("  one step per token   %9td   %15.2f   %12.3f\n", plain.model_calls,
              static_cast<float>(kWritten) / static_cast<float>(plain.model_calls),
              plain.milliseconds / static_cast<float>(kWritten));
  std::printf("  draft tree per step  %9td   %15.2f   %12.3f\n\n", speculative.model_calls,
              static_cast<float>(kWritten) / static_cast<float>(speculative.model_calls),
              speculative.milliseconds / static_cast<float>(kWritten));
  std::printf("  drafts accepted: %td in all; %td of %td steps accepted at least one, at most %td at once\n", accepted,
              steps_accepting, speculative.model_calls, most);
  std::printf("  the text's last 40 tokens:");
  for (std::size_t i = plain.text.size() - 40; i < plain.text.size(); ++i) std::printf(" %d", plain.text[i]);
  std::printf("\n\n");

  bool ok = true;
  const auto check = [&ok](bool passed, const char* claim) {
    std::printf("  %s  %s\n", passed ? "ok    " : "FAILED", claim);
    ok = ok && passed;
  };
  std::printf("  the smallest gap between the two largest logits of any prediction: %.3g\n\n", model.smallest_gap);
  check(speculative.text == plain.text, "the speculative run writes the same tokens as one step per token");
  check(speculative.model_calls < plain.model_calls, "and needs fewer model calls (some drafts accepted)");
  return ok ? 0 : 1;
}
