// permutation_equivariance.cpp — self-attention without positions does not know word order.
//
// Multi-head self-attention is permutation-equivariant: shuffling the input tokens shuffles the
// output rows the same way, MHA(P X) = P MHA(X), because every token is treated alike and softmax
// sums over an unordered set of keys. Position information breaks this symmetry, which is what
// it is for: here (1) no positions, (2) sinusoidal positions added to X, (3) rotary embedding (RoPE).
// Mean-pooling the outputs over the tokens, pool(Y) = (1/L) sum_i Y[i], forgets the order the rows come in,
// so without positions the pooled vector is invariant: pool(MHA(P X)) = pool(P MHA(X)) = pool(MHA(X)) for every
// P (a sentence classifier on a pooled output cannot tell "dog bites man" from "man bites dog"). With positions
// it changes. The program tries all 5! = 120 permutations.
// Exits non-zero if (1) is not equivariant to 1e-12 or (2), (3) are equivariant to 1e-3, or if the pooled output
// of (1) moves by more than 1e-12 under any permutation, or that of (2) or (3) stays within 1e-4 under any
// permutation other than the identity (rounding alone moves it by ~1e-16; the smallest real change here, RoPE's
// under {2, 1, 4, 0, 3}, is 1.7e-3).
#include <selfattn/selfattn.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <numeric>

using namespace selfattn;

namespace {

constexpr Index kLength = 5;  // L tokens
constexpr Index kEmbed = 8;   // E
constexpr Index kHeads = 2;   // H, head dim 4
// Position i of the shuffled sequence holds token perm[i]: (P X)[i] = X[perm[i]].
constexpr std::array<Index, kLength> perm{3, 0, 4, 1, 2};

using Permutation = std::array<Index, kLength>;

Tensor<double, 3> permute_rows(const Tensor<double, 3>& x, const Permutation& p = perm) {
  Tensor<double, 3> y(x.shape());
  for (Index i = 0; i < kLength; ++i)
    for (Index e = 0; e < kEmbed; ++e) y(0, i, e) = x(0, p[static_cast<std::size_t>(i)], e);
  return y;
}

// X + pe (no positions: pe null)
Tensor<double, 3> with_positions(Tensor<double, 3> x, const Tensor<double, 2>* pe) {
  if (pe)
    for (Index i = 0; i < kLength; ++i)
      for (Index e = 0; e < kEmbed; ++e) x(0, i, e) += (*pe)(i, e);
  return x;
}

// pool(Y)[e] = (1/L) sum_i Y[i, e]
std::array<double, kEmbed> mean_pool(const Tensor<double, 3>& y) {
  std::array<double, kEmbed> pooled{};
  for (Index i = 0; i < kLength; ++i)
    for (Index e = 0; e < kEmbed; ++e) pooled[static_cast<std::size_t>(e)] += y(0, i, e) / kLength;
  return pooled;
}

// Over all L! permutations P: the largest max_e |pool(MHA(P X + pe)) - pool(MHA(X + pe))|, and the smallest
// over the permutations other than the identity.
struct PooledChange {
  double largest = 0, smallest_moved = 1e300;
  Permutation closest{};  // the permutation other than the identity that moves it least
  int permutations = 0;
};

PooledChange pooled_change(const MultiHeadAttention<double>& mha, const Tensor<double, 3>& x,
                           const Tensor<double, 2>* pe) {
  const std::array<double, kEmbed> reference = mean_pool(mha.forward(with_positions(x, pe)).output);
  PooledChange c;
  Permutation p;
  std::iota(p.begin(), p.end(), Index{0});
  do {
    const std::array<double, kEmbed> pooled = mean_pool(mha.forward(with_positions(permute_rows(x, p), pe)).output);
    double diff = 0;
    for (std::size_t e = 0; e < pooled.size(); ++e) diff = std::max(diff, std::abs(pooled[e] - reference[e]));
    c.largest = std::max(c.largest, diff);
    if (!std::is_sorted(p.begin(), p.end()) && diff < c.smallest_moved) {
      c.smallest_moved = diff;
      c.closest = p;
    }
    ++c.permutations;
  } while (std::next_permutation(p.begin(), p.end()));
  return c;
}

// max over i, e of |Y'[i, e] - (P Y)[i, e]|
double max_diff_to_permuted(const Tensor<double, 3>& y, const Tensor<double, 3>& y_shuffled) {
  const Tensor<double, 3> py = permute_rows(y);
  double diff = 0;
  for (Index n = 0; n < py.size(); ++n) diff = std::max(diff, std::abs(y_shuffled.data()[n] - py.data()[n]));
  return diff;
}

// Rows labelled by token: "x3 @ pos 0" is token 3 sitting at position 0.
void print_rows(const char* title, const Tensor<double, 3>& y, bool shuffled) {
  std::printf("%s\n", title);
  for (Index i = 0; i < kLength; ++i) {
    const Index token = shuffled ? perm[static_cast<std::size_t>(i)] : i;
    std::printf("  x%td @ pos %td:", token, i);
    for (Index e = 0; e < kEmbed; ++e) std::printf(" %+.4f", y(0, i, e));
    std::printf("\n");
  }
}

// Y = MHA(X + pe) and Y' = MHA(P X + pe): positions stay 0..L-1 while the tokens move.
double shuffle_difference(const MultiHeadAttention<double>& mha, const Tensor<double, 3>& x,
                          const Tensor<double, 2>* pe, bool print) {
  Tensor<double, 3> input = x, shuffled = permute_rows(x);
  if (pe)
    for (Index i = 0; i < kLength; ++i)
      for (Index e = 0; e < kEmbed; ++e) {
        input(0, i, e) += (*pe)(i, e);
        shuffled(0, i, e) += (*pe)(i, e);
      }
  const Tensor<double, 3> y = mha.forward(input).output;
  const Tensor<double, 3> y_shuffled = mha.forward(shuffled).output;
  if (print) {
    print_rows("Y = MHA(X):", y, false);
    print_rows("Y' = MHA(P X), rows in shuffled order:", y_shuffled, true);
  }
  return max_diff_to_permuted(y, y_shuffled);
}

}  // namespace

int main() {
  Tensor<double, 3> x({1, kLength, kEmbed});  // deterministic token embeddings
  for (Index i = 0; i < kLength; ++i)
    for (Index e = 0; e < kEmbed; ++e) x(0, i, e) = std::sin(0.9 * static_cast<double>(i * kEmbed + e) + 0.3);

  MultiHeadAttentionConfig cfg;
  cfg.embed_dim = kEmbed;
  cfg.num_heads = kHeads;
  const MultiHeadAttention<double> plain(cfg, 7);  // one seed for both on purpose: the same weights, +/- RoPE
  cfg.rope_dim = kEmbed / kHeads;  // rotate the whole head
  const MultiHeadAttention<double> rotary(cfg, 7);
  const Tensor<double, 2> pe = sinusoidal_encoding<double>(kLength, kEmbed);

  std::printf("permutation P = {3, 0, 4, 1, 2}: position i of P X holds token P[i]\n\n");
  const double none = shuffle_difference(plain, x, nullptr, true);
  const double sinusoidal = shuffle_difference(plain, x, &pe, false);
  const double rope = shuffle_difference(rotary, x, nullptr, false);

  std::printf("\nmax |MHA(P X) - P MHA(X)|\n");
  std::printf("  no positions:        %-8.2g -> equivariant: the same outputs, only reordered\n", none);
  std::printf("  sinusoidal (X + PE): %-8.2g -> not equivariant: outputs depend on where a token sits\n", sinusoidal);
  std::printf("  RoPE on q and k:     %-8.2g -> not equivariant: scores depend on relative positions\n", rope);

  const PooledChange pooled_none = pooled_change(plain, x, nullptr);
  const PooledChange pooled_sinusoidal = pooled_change(plain, x, &pe);
  const PooledChange pooled_rope = pooled_change(rotary, x, nullptr);
  std::printf("\nmean-pooled output pool(Y) = (1/L) sum_i Y[i], over all %d permutations P:\n"
              "max |pool(MHA(P X)) - pool(MHA(X))|   largest    smallest (P != identity), at P\n",
              pooled_none.permutations);
  const auto print_pooled = [](const char* name, const PooledChange& c, const char* verdict) {
    std::printf("  %-20s %-10.2g %-10.2g {%td, %td, %td, %td, %td}  -> %s\n", name, c.largest, c.smallest_moved,
                c.closest[0], c.closest[1], c.closest[2], c.closest[3], c.closest[4], verdict);
  };
  print_pooled("no positions:", pooled_none, "invariant: the pooled vector forgets the order");
  print_pooled("sinusoidal (X + PE):", pooled_sinusoidal, "every reordering changes it");
  print_pooled("RoPE on q and k:", pooled_rope, "every reordering changes it");

  const bool ok = none <= 1e-12 && sinusoidal >= 1e-3 && rope >= 1e-3;
  if (!ok) std::printf("FAILED: expected no-position difference <= 1e-12 and positional differences >= 1e-3\n");
  const bool pooled_ok =
      pooled_none.largest <= 1e-12 && pooled_sinusoidal.smallest_moved >= 1e-4 && pooled_rope.smallest_moved >= 1e-4;
  if (!pooled_ok)
    std::printf("FAILED: expected the pooled output to move by <= 1e-12 without positions under every permutation, "
                "and by >= 1e-4 with positions under every permutation but the identity\n");
  return ok && pooled_ok ? 0 : 1;
}
