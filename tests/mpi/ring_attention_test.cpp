// tests/mpi/ring_attention_test.cpp — ring attention (selfattn/distributed.hpp) against single-process attention.
// ctest runs this one program under mpirun with 1, 2, 3 and 4 ranks (tests/mpi/CMakeLists.txt). Every rank builds the
// same whole-sequence inputs from a fixed seed, computes sdpa_forward / sdpa_backward on the whole sequence, runs the
// ring on its own block, and compares its block: out, lse, dq, dk, dv within 1e-12 in double (1e-5 in float), for
// no mask, causal (contiguous and zigzag layouts), key padding (a batch whose padding masks whole ranks' keys, and one
// fully masked), grouped-query heads, a custom scale, and lengths that do not divide by the rank count (ranks with no
// token at all). A mistake on one rank must throw the same error on every rank, not hang.
//
// Output: rank 0 prints GoogleTest's report; the other ranks print only their failures, prefixed "[rank N]". After
// each test the ranks agree on its result (a failure on any rank fails it on rank 0), and the exit status is the
// worst over ranks.
#include <selfattn/distributed.hpp>
#include <selfattn/selfattn.hpp>

#include "support/expect_error.hpp"
#include "support/random.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace selfattn {
namespace {

using test::expect_error;
using test::Random;

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

const char* layout_name(SequenceLayout layout) { return layout == SequenceLayout::zigzag ? "zigzag" : "contiguous"; }

// Every test: after it, the ranks agree on its result, so that rank 0's report (and the exit status) shows a failure
// seen on any rank.
class RingAttention : public ::testing::Test {
 protected:
  void TearDown() override {
    const int failed = HasFailure() ? 1 : 0;
    std::vector<int> failures(static_cast<std::size_t>(world_size()));
    MPI_Allgather(&failed, 1, MPI_INT, failures.data(), 1, MPI_INT, MPI_COMM_WORLD);
    std::string elsewhere;
    for (int r = 1; r < world_size(); ++r)
      if (failures[static_cast<std::size_t>(r)]) elsewhere += (elsewhere.empty() ? "" : ", ") + std::to_string(r);
    if (world_rank() == 0 && !elsewhere.empty())
      ADD_FAILURE() << "failed on rank(s) " << elsewhere << ": see their lines prefixed [rank N]";
  }
};

using SequenceLayoutTest = RingAttention;  // no MPI in these, but the ranks agree on their results all the same

// One case: the whole sequence's sizes and options. The ranks split L by the layout.
struct RingCase {
  Index batch = 2, heads = 4, kv_heads = 2, q_length = 13, k_length = 13, head_dim = 8, value_dim = 6;
  Causal causal = Causal::none;
  std::vector<Index> key_lengths;  // global positions, one per batch; empty = none
  std::optional<double> scale;

  std::string describe(SequenceLayout layout) const {
    std::ostringstream text;
    text << "B=" << batch << " H=" << heads << " Hkv=" << kv_heads << " Lq=" << q_length << " Lk=" << k_length
         << " D=" << head_dim << " Dv=" << value_dim << " causal=" << static_cast<int>(causal)
         << " layout=" << layout_name(layout) << " ranks=" << world_size() << " key_lengths={";
    for (Index length : key_lengths) text << length << ' ';
    text << "}";
    return text.str();
  }
};

template <typename T>
AttentionOptions<T> options_of(const RingCase& c) {
  AttentionOptions<T> opts;
  opts.causal = c.causal;
  opts.key_lengths = c.key_lengths;
  if (c.scale) opts.scale = static_cast<T>(*c.scale);
  return opts;
}

// Largest |a - b| over two tensors of one shape; equal infinities (lse of a fully masked row) count as 0, anything
// else non-finite as infinity.
template <typename T, int Rank>
double max_difference(const Tensor<T, Rank>& a, const Tensor<T, Rank>& b) {
  if (a.shape() != b.shape()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (Index n = 0; n < a.size(); ++n) {
    const double x = static_cast<double>(a.data()[n]), y = static_cast<double>(b.data()[n]);
    if (x == y) continue;
    const double difference = std::abs(x - y);
    worst = std::max(worst, std::isfinite(difference) ? difference : std::numeric_limits<double>::infinity());
  }
  return worst;
}

// The ring on this rank's block against its block of the single-process results; returns the ring's forward.
template <typename T>
AttentionForward<T> expect_ring_matches(const RingCase& c, SequenceLayout layout, double tolerance,
                                        std::uint64_t seed = 7) {
  const int rank = world_rank(), ranks = world_size();
  Random random(seed);  // the same numbers on every rank
  const Tensor<T, 4> q = random.normal_tensor<T, 4>({c.batch, c.heads, c.q_length, c.head_dim});
  const Tensor<T, 4> k = random.normal_tensor<T, 4>({c.batch, c.kv_heads, c.k_length, c.head_dim});
  const Tensor<T, 4> v = random.normal_tensor<T, 4>({c.batch, c.kv_heads, c.k_length, c.value_dim});
  const Tensor<T, 4> dout = random.normal_tensor<T, 4>({c.batch, c.heads, c.q_length, c.value_dim});
  const AttentionOptions<T> opts = options_of<T>(c);
  const AttentionForward<T> whole = sdpa_forward(q, k, v, opts);
  const AttentionGradients<T> whole_grads = sdpa_backward(q, k, v, whole.out, whole.lse, dout, opts);

  const auto mine = [&](const auto& x) { return sequence_block(x, layout, rank, ranks); };
  const Tensor<T, 4> q_block = mine(q), k_block = mine(k), v_block = mine(v), dout_block = mine(dout);
  const AttentionForward<T> fwd = ring_attention_forward(MPI_COMM_WORLD, layout, q_block, k_block, v_block, opts);
  const AttentionGradients<T> grads =
      ring_attention_backward(MPI_COMM_WORLD, layout, q_block, k_block, v_block, fwd.out, fwd.lse, dout_block, opts);

  const std::string where = c.describe(layout) + " rank=" + std::to_string(rank);
  EXPECT_LE(max_difference(fwd.out, mine(whole.out)), tolerance) << "out, " << where;
  EXPECT_LE(max_difference(fwd.lse, mine(whole.lse)), tolerance) << "lse, " << where;
  EXPECT_LE(max_difference(grads.dq, mine(whole_grads.dq)), tolerance) << "dq, " << where;
  EXPECT_LE(max_difference(grads.dk, mine(whole_grads.dk)), tolerance) << "dk, " << where;
  EXPECT_LE(max_difference(grads.dv, mine(whole_grads.dv)), tolerance) << "dv, " << where;
  EXPECT_TRUE(fwd.weights.empty() && grads.dbias.empty()) << where;
  return fwd;
}

constexpr double double_tolerance = 1e-12;
constexpr SequenceLayout both_layouts[] = {SequenceLayout::contiguous, SequenceLayout::zigzag};
// 1 and 2 leave ranks without any token (with 4 ranks even 7 leaves zigzag chunks empty); 13 divides by nothing here.
constexpr Index lengths[] = {1, 2, 7, 13, 16};

TEST_F(SequenceLayoutTest, RangesCoverTheSequenceOnceWithChunksWithinOneToken) {
  for (const SequenceLayout layout : both_layouts)
    for (int ranks = 1; ranks <= 5; ++ranks)
      for (Index length = 0; length <= 23; ++length) {
        std::vector<int> owner(static_cast<std::size_t>(length), -1);
        Index shortest = length, longest = 0, total = 0;
        for (int r = 0; r < ranks; ++r) {
          for (const TokenRange& range : sequence_ranges(layout, length, r, ranks)) {
            shortest = std::min(shortest, range.size());
            longest = std::max(longest, range.size());
            for (Index i = range.begin; i < range.end; ++i) {
              EXPECT_EQ(owner[static_cast<std::size_t>(i)], -1) << "token " << i << " held twice";
              owner[static_cast<std::size_t>(i)] = r;
            }
          }
          total += sequence_block_length(layout, length, r, ranks);
        }
        EXPECT_EQ(total, length);
        EXPECT_EQ(std::count(owner.begin(), owner.end(), -1), 0) << layout_name(layout) << " L=" << length;
        EXPECT_LE(longest - shortest, 1) << layout_name(layout) << " L=" << length << " P=" << ranks;
      }
  // The documented examples.
  const auto zigzag = sequence_ranges(SequenceLayout::zigzag, 13, 0, 2);
  ASSERT_EQ(zigzag.size(), 2u);
  EXPECT_EQ(zigzag[0].begin, 0);
  EXPECT_EQ(zigzag[0].end, 4);
  EXPECT_EQ(zigzag[1].begin, 10);
  EXPECT_EQ(zigzag[1].end, 13);
  EXPECT_EQ(sequence_block_length(SequenceLayout::contiguous, 13, 3, 4), 3);
  expect_error<std::invalid_argument>([] { sequence_ranges(SequenceLayout::zigzag, 5, 2, 2); }, {"rank", "[0, 2)"});
}

TEST_F(SequenceLayoutTest, PlacingEveryBlockRebuildsTheWhole) {
  Random random(3);
  const Tensor<double, 4> whole = random.normal_tensor<double, 4>({2, 3, 11, 5});
  const Tensor<double, 3> lse = random.normal_tensor<double, 3>({2, 3, 11});
  for (const SequenceLayout layout : both_layouts) {
    Tensor<double, 4> rebuilt(whole.shape());
    Tensor<double, 3> rebuilt_lse(lse.shape());
    for (int r = 0; r < 3; ++r) {
      place_sequence_block(sequence_block(whole, layout, r, 3), rebuilt, layout, r, 3);
      place_sequence_block(sequence_block(lse, layout, r, 3), rebuilt_lse, layout, r, 3);
    }
    EXPECT_EQ(max_difference(rebuilt, whole), 0.0);
    EXPECT_EQ(max_difference(rebuilt_lse, lse), 0.0);
    Tensor<double, 4> wrong({2, 3, 2, 5});
    const std::string rank_zero_shape = "(2, 3, " + std::to_string(sequence_block_length(layout, 11, 0, 3)) + ", 5)";
    expect_error<ShapeError>([&] { place_sequence_block(wrong, rebuilt, layout, 0, 3); }, {"block", rank_zero_shape});
  }
}

TEST_F(RingAttention, WithoutMaskEqualsSingleProcess) {
  for (const SequenceLayout layout : both_layouts)
    for (const Index length : lengths) {
      RingCase c;
      c.q_length = c.k_length = length;
      expect_ring_matches<double>(c, layout, double_tolerance);
    }
}

TEST_F(RingAttention, CausalEqualsSingleProcess) {
  for (const SequenceLayout layout : both_layouts)
    for (const Index length : lengths) {
      RingCase c;
      c.q_length = c.k_length = length;
      c.causal = Causal::top_left;
      expect_ring_matches<double>(c, layout, double_tolerance);
    }
  RingCase bottom_right;  // the same mask when queries and keys are one sequence
  bottom_right.causal = Causal::bottom_right;
  expect_ring_matches<double>(bottom_right, SequenceLayout::zigzag, double_tolerance);
}

TEST_F(RingAttention, KeyPaddingEqualsSingleProcess) {
  // Batch 0 unpadded; batch 1 keeps 3 keys (every rank but the first holds only padding under contiguous: its
  // blocks are skipped); batch 2 keeps none (every row fully masked: out 0, lse -inf); batch 3 keeps 9.
  for (const SequenceLayout layout : both_layouts)
    for (const Causal causal : {Causal::none, Causal::top_left}) {
      RingCase c;
      c.batch = 4;
      c.causal = causal;
      c.key_lengths = {13, 3, 0, 9};
      const AttentionForward<double> fwd = expect_ring_matches<double>(c, layout, double_tolerance);
      for (Index h = 0; h < c.heads; ++h)
        for (Index i = 0; i < fwd.out.dim(2); ++i) {
          EXPECT_EQ(fwd.lse(2, h, i), -std::numeric_limits<double>::infinity());
          for (Index e = 0; e < c.value_dim; ++e) EXPECT_EQ(fwd.out(2, h, i, e), 0.0);
        }
    }
}

TEST_F(RingAttention, GroupedQueryHeadsEqualSingleProcess) {
  for (const Index kv_heads : {1, 2, 3, 6})
    for (const SequenceLayout layout : both_layouts) {
      RingCase c;
      c.heads = 6;
      c.kv_heads = kv_heads;
      c.causal = Causal::top_left;
      c.q_length = c.k_length = 11;
      expect_ring_matches<double>(c, layout, double_tolerance);
    }
}

TEST_F(RingAttention, ScaleAndHeadDimsEqualSingleProcess) {
  RingCase c;
  c.scale = 0.3;
  c.head_dim = 5;
  c.value_dim = 9;
  c.causal = Causal::top_left;
  expect_ring_matches<double>(c, SequenceLayout::zigzag, double_tolerance);
  c.value_dim = 1;
  c.causal = Causal::none;
  expect_ring_matches<double>(c, SequenceLayout::contiguous, double_tolerance);
}

TEST_F(RingAttention, QueriesAndKeysOfDifferentLengthsWithoutCausal) {
  for (const SequenceLayout layout : both_layouts) {
    RingCase c;
    c.q_length = 7;
    c.k_length = 13;
    c.key_lengths = {10, 2};
    expect_ring_matches<double>(c, layout, double_tolerance);
  }
}

TEST_F(RingAttention, FloatEqualsSingleProcess) {
  for (const SequenceLayout layout : both_layouts) {
    RingCase c;
    c.batch = 3;
    c.q_length = c.k_length = 29;
    c.head_dim = 16;
    c.value_dim = 16;
    c.causal = Causal::top_left;
    c.key_lengths = {29, 17, 5};
    expect_ring_matches<float>(c, layout, 1e-5);
  }
}

// The inputs of a small causal call, this rank's block; `head_dim` is what this rank passes.
struct SmallCall {
  Tensor<double, 4> q, k, v;
  AttentionOptions<double> opts;
  SmallCall(Index q_head_dim, Index k_head_dim, SequenceLayout layout, Index length = 10) {
    const int rank = world_rank(), ranks = world_size();
    const Index rows = sequence_block_length(layout, length, rank, ranks);
    Random random(11 + static_cast<std::uint64_t>(rank));
    q = random.normal_tensor<double, 4>({2, 4, rows, q_head_dim});
    k = random.normal_tensor<double, 4>({2, 2, rows, k_head_dim});
    v = random.normal_tensor<double, 4>({2, 2, rows, 3});
    opts.causal = Causal::top_left;
  }
  AttentionForward<double> forward(SequenceLayout layout) const {
    return ring_attention_forward(MPI_COMM_WORLD, layout, q, k, v, opts);
  }
};

// After an error every rank can make the next call: nothing was left in flight.
void expect_next_call_works() {
  const SmallCall good(8, 8, SequenceLayout::zigzag);
  EXPECT_NO_THROW(good.forward(SequenceLayout::zigzag));
}

TEST_F(RingAttention, OneRanksWrongHeadDimThrowsOnEveryRank) {
  // The last rank's q has D = 9 against its k's 8: every rank reports that rank's k.
  const int bad = world_size() - 1;
  const SmallCall call(world_rank() == bad ? 9 : 8, 8, SequenceLayout::zigzag);
  expect_error<ShapeError>([&] { call.forward(SequenceLayout::zigzag); },
                           {"[ring_attention_forward]", "k on rank " + std::to_string(bad), "(2, *, *, 9)",
                            "got (2, 2,"});
  expect_next_call_works();
}

TEST_F(RingAttention, ShapesThatDifferAcrossRanksThrowOnEveryRank) {
  if (world_size() == 1) GTEST_SKIP() << "needs two ranks";  // the same on every rank: they all skip
  const int bad = world_size() - 1;
  const SmallCall call(world_rank() == bad ? 9 : 8, world_rank() == bad ? 9 : 8, SequenceLayout::contiguous);
  expect_error<ShapeError>([&] { call.forward(SequenceLayout::contiguous); },
                           {"q on rank " + std::to_string(bad), "expected shape (2, 4, *, 8) as on rank 0", ", 9)"});
  expect_next_call_works();
}

TEST_F(RingAttention, OptionsThatDifferAcrossRanksThrowOnEveryRank) {
  if (world_size() == 1) GTEST_SKIP() << "needs two ranks";
  const int bad = world_size() - 1;
  SmallCall call(8, 8, SequenceLayout::zigzag);
  if (world_rank() == bad) call.opts.causal = Causal::none;
  expect_error<std::invalid_argument>([&] { call.forward(SequenceLayout::zigzag); },
                                      {"opts.causal on rank " + std::to_string(bad)});
  call.opts.causal = Causal::top_left;
  call.opts.key_lengths = {10, world_rank() == bad ? 4 : 5};
  expect_error<std::invalid_argument>([&] { call.forward(SequenceLayout::zigzag); },
                                      {"opts.key_lengths[1]", "differs across ranks", "from 4 to 5"});
  call.opts.key_lengths.clear();
  // A layout that differs: the last rank's block then has the wrong length too, but the layout is named first.
  expect_error<std::invalid_argument>(
      [&] { call.forward(world_rank() == bad ? SequenceLayout::contiguous : SequenceLayout::zigzag); },
      {"layout on rank " + std::to_string(bad)});
  expect_next_call_works();
}

TEST_F(RingAttention, LengthsThatDoNotFitTheLayoutThrowOnEveryRank) {
  // Every rank passes its contiguous block but calls the zigzag ring, for a length where the two split differently.
  const int ranks = world_size();
  Index length = 0;
  for (Index candidate = 2; candidate <= 64 && length == 0; ++candidate)
    for (int r = 0; r < ranks; ++r)
      if (sequence_block_length(SequenceLayout::contiguous, candidate, r, ranks) !=
          sequence_block_length(SequenceLayout::zigzag, candidate, r, ranks))
        length = candidate;
  if (length == 0) GTEST_SKIP() << "with one rank both layouts give the same lengths";
  const SmallCall call(8, 8, SequenceLayout::contiguous, length);
  expect_error<ShapeError>(
      [&] { call.forward(SequenceLayout::zigzag); },
      {"on rank", "of the " + std::to_string(length) + " tokens all ranks pass, under the zigzag layout"});
  expect_next_call_works();
}

TEST_F(RingAttention, UnsupportedOptionsAreRejectedByName) {
  SmallCall call(8, 8, SequenceLayout::zigzag);
  call.opts.dropout_p = 0.1;
  expect_error<std::invalid_argument>([&] { call.forward(SequenceLayout::zigzag); }, {"opts.dropout_p on rank 0"});
  call.opts.dropout_p = 0;
  call.opts.alibi_slopes = {0.5, 0.25, 0.125, 0.0625};
  expect_error<std::invalid_argument>([&] { call.forward(SequenceLayout::zigzag); }, {"opts.alibi_slopes on rank 0"});
  call.opts.alibi_slopes.clear();
  call.opts.window_left = 3;
  expect_error<std::invalid_argument>([&] { call.forward(SequenceLayout::zigzag); }, {"opts.window_left"});
  call.opts.window_left = -1;
  call.opts.key_lengths = {10, 11};
  expect_error<std::invalid_argument>([&] { call.forward(SequenceLayout::zigzag); },
                                      {"opts.key_lengths[1]", "[0, 10]", "got 11"});
  expect_next_call_works();
}

// Rank 0 keeps GoogleTest's printer; the others print their failures only, each line prefixed with the rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    const std::string prefix = "[rank " + std::to_string(rank_) + "] ";
    std::string text = prefix + (result.file_name() ? result.file_name() : "?") + ":" +
                       std::to_string(result.line_number()) + ": Failure\n" + prefix;
    for (const char* c = result.message(); *c; ++c) text += *c == '\n' && c[1] ? "\n" + prefix : std::string(1, *c);
    std::printf("%s\n", text.c_str());
    std::fflush(stdout);
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace selfattn

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const int rank = selfattn::world_rank();
  if (rank != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new selfattn::RankFailurePrinter(rank));
  }
  const int result = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
