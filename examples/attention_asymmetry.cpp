// attention_asymmetry.cpp — the score of i on j is not the score of j on i, and a token need not attend to itself.
//
// Self-attention scores token pairs with two different projections: S_ij = q_i . k_j / sqrt(d), q_i = x_i W_Q,
// k_j = x_j W_K, so S = X W_Q W_K^T X^T / sqrt(d). With W_Q != W_K the matrix A = W_Q W_K^T is not symmetric,
// and neither is S: how much "it" looks at "dog" says nothing about how much "dog" looks at "it". Nor is the
// diagonal special: S_ii = x_i A x_i^T has no reason to be the largest of its row, so a token attends most to
// itself about as often as to any other token (1 in L). With W_Q = W_K = W, S = (X W)(X W)^T / sqrt(d) is a
// Gram matrix: symmetric, positive semidefinite, and S_ii = |q_i|^2 dominates its row unless a neighbour's
// query is much longer (Cauchy-Schwarz: q_i . q_j <= |q_i| |q_j|).
// The experiment: L = 8 tokens with N(0, 1) embeddings, E = d = 16, W_Q with N(0, 1/E) entries and
// W_K = sqrt(1 - a^2) W_Q + a W' (W' independent, like W_Q), so a = 1 is independent weights, a = 0 tied ones,
// and in between the two are correlated by sqrt(1 - a^2). 128 draws per a; for each it prints the asymmetry
// ||S - S^T||_F / ||S||_F, and how often a row's largest attention weight (attention_weights, the library's
// softmax of S) is on the diagonal. One draw's S is printed for a = 1 and a = 0.
//
// Usage: attention_asymmetry [--seed N]     (default seed 1; the same seed prints the same output)
// Exits 1 unless, over the 128 draws (1024 rows),
//   independent weights (a = 1): ||S - S^T||_F / ||S||_F >= 0.5 on average (for a random A the antisymmetric
//     part is as large as the symmetric one: about 1.4), and the diagonal is a row's largest weight in at most
//     0.25 of the rows (chance is 1/8 = 0.125, with a standard error of 0.01 over 1024 rows);
//   tied weights (a = 0): ||S - S^T||_F / ||S||_F <= 1e-12 in every draw, and the diagonal is the row's largest
//     weight in at least 0.8 of the rows.
// Walk-through: docs/scaling.md, "Asymmetry".
#include <selfattn/selfattn.hpp>

#include "example_args.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

using namespace selfattn;

namespace {

using T = double;
using Rng = std::mt19937_64;  // its raw output is fixed by the standard; the distributions are not
using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

constexpr Index kLength = 8;   // L tokens
constexpr Index kEmbed = 16;   // E
constexpr Index kHead = 16;    // d, one head
constexpr int kDraws = 128;    // draws of X, W_Q, W' per a
constexpr std::array<double, 5> kMix{1.0, 0.75, 0.5, 0.25, 0.0};  // a: 1 independent, 0 tied

double uniform01(Rng& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }
double normal(Rng& rng) {  // Box-Muller
  const double u = std::max(uniform01(rng), 0x1.0p-53), v = uniform01(rng);
  return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
}

Matrix random_normal(Rng& rng, Index rows, Index columns, double sd) {
  Matrix m(rows, columns);
  for (Index i = 0; i < rows; ++i)
    for (Index j = 0; j < columns; ++j) m(i, j) = sd * normal(rng);
  return m;
}

// One draw: the scores S (L, L) and the library's attention weights softmax(S) for them.
struct Draw {
  Matrix scores;
  Tensor<T, 4> weights;  // (1, 1, L, L)
};

Draw draw(Rng& rng, double a) {
  const Matrix x = random_normal(rng, kLength, kEmbed, 1.0);
  const double sd = 1.0 / std::sqrt(static_cast<double>(kEmbed));  // q, k entries of variance 1
  const Matrix w_q = random_normal(rng, kEmbed, kHead, sd), w_other = random_normal(rng, kEmbed, kHead, sd);
  const Matrix w_k = a == 0.0 ? w_q : Matrix(std::sqrt(1 - a * a) * w_q + a * w_other);
  Tensor<T, 4> q({1, 1, kLength, kHead}), k({1, 1, kLength, kHead});
  as_matrix(q[0][0]).noalias() = x * w_q;
  as_matrix(k[0][0]).noalias() = x * w_k;
  Draw d;
  d.scores.noalias() = as_matrix(q[0][0]) * as_matrix(k[0][0]).transpose();
  d.scores /= std::sqrt(static_cast<double>(kHead));
  d.weights = attention_weights(q, k);  // softmax(q k^T / sqrt(d)): the same S, through the library
  return d;
}

// ||S - S^T||_F / ||S||_F
double asymmetry(const Matrix& s) { return (s - s.transpose()).norm() / s.norm(); }

// Rows whose largest weight is on the diagonal (the first index wins a tie).
int diagonal_wins(const Tensor<T, 4>& w) {
  int wins = 0;
  for (Index i = 0; i < kLength; ++i) {
    Index best = 0;
    for (Index j = 1; j < kLength; ++j)
      if (w(0, 0, i, j) > w(0, 0, i, best)) best = j;
    wins += best == i;
  }
  return wins;
}

// S with the diagonal in [brackets] and each row's largest score marked *.
void print_scores(const char* title, const Matrix& s) {
  std::printf("%s\n      ", title);
  for (Index j = 0; j < kLength; ++j) std::printf("   key %td  ", j);
  std::printf("\n");
  for (Index i = 0; i < kLength; ++i) {
    Index best = 0;
    for (Index j = 1; j < kLength; ++j)
      if (s(i, j) > s(i, best)) best = j;
    std::printf("  q %td ", i);
    for (Index j = 0; j < kLength; ++j)
      std::printf(" %c%+6.2f%c%c", i == j ? '[' : ' ', s(i, j), i == j ? ']' : ' ', j == best ? '*' : ' ');
    std::printf("\n");
  }
  std::printf("  ||S - S^T||_F / ||S||_F = %.3g, largest |S_ij - S_ji| = %.3g\n\n", asymmetry(s),
              (s - s.transpose()).cwiseAbs().maxCoeff());
}

struct Row {
  double a = 0;
  double mean_asymmetry = 0, max_asymmetry = 0;
  double diagonal_fraction = 0;  // rows whose largest weight is their own token's
};

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t seed = 1;
  if (!seed_argument(argc, argv, seed)) return 2;
  std::printf("S = (X W_Q)(X W_K)^T / sqrt(d): L = %td tokens, E = d = %td, X ~ N(0, 1), W ~ N(0, 1/E), seed %llu.\n"
              "W_K = sqrt(1 - a^2) W_Q + a W' with W' independent: a = 1 independent, a = 0 tied (W_K = W_Q).\n\n",
              kLength, kEmbed, static_cast<unsigned long long>(seed));
  {
    Rng show(seed);
    print_scores("One draw, a = 1 (independent W_Q, W_K): [diagonal], * the row's largest", draw(show, 1.0).scores);
    print_scores("One draw, a = 0 (W_K = W_Q): [diagonal], * the row's largest", draw(show, 0.0).scores);
  }

  std::vector<Row> rows;
  for (std::size_t n = 0; n < kMix.size(); ++n) {
    Rng rng(1000 * seed + n);
    Row r;
    r.a = kMix[n];
    int wins = 0;
    for (int t = 0; t < kDraws; ++t) {
      const Draw d = draw(rng, r.a);
      const double asym = asymmetry(d.scores);
      r.mean_asymmetry += asym / kDraws;
      r.max_asymmetry = std::max(r.max_asymmetry, asym);
      wins += diagonal_wins(d.weights);
    }
    r.diagonal_fraction = static_cast<double>(wins) / static_cast<double>(kDraws * kLength);
    rows.push_back(r);
  }
  std::printf("%d draws per a (%td rows); chance that a row's largest weight is its own token: 1/%td = %.3f\n"
              "                          ||S - S^T|| / ||S||    rows whose largest weight\n"
              "     a   corr(W_Q, W_K)        mean       max    is on the diagonal\n",
              kDraws, kDraws * kLength, kLength, 1.0 / static_cast<double>(kLength));
  for (const Row& r : rows)
    std::printf("  %4.2f   %14.3f   %9.3f  %8.3f    %10.3f\n", r.a, std::sqrt(1 - r.a * r.a), r.mean_asymmetry,
                r.max_asymmetry, r.diagonal_fraction);
  std::printf("\n");

  // ---- The verdict ----
  bool ok = true;
  const auto check = [&ok](bool passed, const char* claim) {
    std::printf("  %s  %s\n", passed ? "ok    " : "FAILED", claim);
    ok = ok && passed;
  };
  char line[256];
  const Row &independent = rows.front(), &tied = rows.back();
  std::snprintf(line, sizeof line,
                "independent W_Q, W_K: S is not symmetric, ||S - S^T|| / ||S|| = %.3f on average (needs >= 0.5)",
                independent.mean_asymmetry);
  check(independent.mean_asymmetry >= 0.5, line);
  std::snprintf(line, sizeof line,
                "independent W_Q, W_K: a token's largest weight is its own in %.3f of the rows (needs <= 0.25; "
                "chance 0.125)",
                independent.diagonal_fraction);
  check(independent.diagonal_fraction <= 0.25, line);
  std::snprintf(line, sizeof line,
                "W_Q = W_K: S is symmetric, ||S - S^T|| / ||S|| <= %.2g in every draw (needs <= 1e-12)",
                tied.max_asymmetry);
  check(tied.max_asymmetry <= 1e-12, line);
  std::snprintf(line, sizeof line, "W_Q = W_K: a token's largest weight is its own in %.3f of the rows (needs >= 0.8)",
                tied.diagonal_fraction);
  check(tied.diagonal_fraction >= 0.8, line);
  return ok ? 0 : 1;
}
