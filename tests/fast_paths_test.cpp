// Every fast path against the brute-force specification (tests/support/brute_force.hpp: plain loops in long
// double, none of the library's mask, softmax or kernel code), over the shared sweep of shapes and masks plus
// shapes that cross the kernels' tile and chunk edges:
//
//   - the fused forward and the fused backward (dq, dk, dv, dbias);
//   - the decode kernel's general path, and its grouped and streaming paths wherever no per-element mask rules
//     them out (forced, so that each runs whatever the automatic choice would pick).
//
// The fused and decode kernels are otherwise compared with the reference kernel, which shares mask.hpp and
// softmax.hpp with them: a rule wrong in a shared helper would pass those tests and fails these.
#include <selfattn/attention.hpp>

#include "support/brute_force.hpp"
#include "support/compare.hpp"
#include "support/level_copy.hpp"
#include "support/random.hpp"
#include "support/sanitizers.hpp"
#include "support/scalars.hpp"
#include "support/sweep.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace selfattn::test {
namespace {

using detail::DecodePath;

SELFATTN_SCALAR_TEST_SUITE(FastPathsTest);

// The shared sweep, and shapes beyond its lengths: more query rows than a fused block (64 float or 32 double
// lanes), more keys than a fused tile (64) or a decode chunk (256), few query rows over several chunks with every
// group size of the decode paths (G = 1, 3: streaming; G = 8: grouped). The sweep's two D = 128 shapes are left
// out: the brute force's long double costs seconds there under the sanitizers, and D = 59 and 64 already cover
// whole and partial packets.
std::vector<Shape> fast_path_shapes() {
  std::vector<Shape> shapes;
  for (const Shape& s : test::sweep_shapes)
    if (s.head_dim != 128) shapes.push_back(s);
  shapes.push_back({1, 2, 1, 70, 140, 16, 12});
  shapes.push_back({2, 3, 1, 2, 530, 16, 9});
  shapes.push_back({1, 8, 8, 1, 600, 24, 24});
  shapes.push_back({1, 8, 1, 3, 300, 20, 20});
  return shapes;
}

template <typename T>
struct Case {
  Tensor<T, 4> q, k, v, dout;
  test::MaskedOptions<T> masks;
  std::string where;
};

template <typename T>
Case<T> make_case(const Shape& s, MaskKind kind, Random& random) {
  Case<T> c;
  c.q = random.normal_tensor<T, 4>({s.batch, s.heads, s.q_len, s.head_dim});
  c.k = random.normal_tensor<T, 4>({s.batch, s.kv_heads, s.k_len, s.head_dim});
  c.v = random.normal_tensor<T, 4>({s.batch, s.kv_heads, s.k_len, s.value_dim});
  c.dout = random.normal_tensor<T, 4>({s.batch, s.heads, s.q_len, s.value_dim});
  test::make_options(kind, s, random, c.masks);
  c.masks.opts.need_weights = false;
  c.where = "B " + std::to_string(s.batch) + " H " + std::to_string(s.heads) + " Hkv " + std::to_string(s.kv_heads) +
            " Lq " + std::to_string(s.q_len) + " Lk " + std::to_string(s.k_len) + " D " + std::to_string(s.head_dim) +
            " Dv " + std::to_string(s.value_dim) + ", mask kind " + std::to_string(static_cast<int>(kind));
  return c;
}

TYPED_TEST(FastPathsTest, FusedForwardAndBackwardMatchTheBruteForce) {
  using T = TypeParam;
  Random random(20261201);
  const std::vector<Shape> shapes = fast_path_shapes();
  int cases = 0;
  for (std::size_t si = 0; si < shapes.size(); ++si)
    for (std::size_t ki = 0; ki < test::mask_kinds.size(); ++ki) {
      const Shape& s = shapes[si];
      const MaskKind kind = test::mask_kinds[ki];
      const Case<T> c = make_case<T>(s, kind, random);  // drawn for every pair: each pair's data is the same
      if (!test::sweep_pair_runs(si, ki)) continue;      // in every build
      SCOPED_TRACE(c.where);
      AttentionOptions<T> opts = c.masks.opts;
      opts.kernel = Kernel::fused;
      const auto fwd = sdpa_forward(c.q, c.k, c.v, opts);
      const auto g = sdpa_backward(c.q, c.k, c.v, fwd.out, fwd.lse, c.dout, opts);
      const auto expected = test::brute_force_attention<T>(c.q, c.k, c.v, opts);
      const auto expected_g = test::brute_force_backward<T>(c.q, c.k, c.v, c.dout, opts);
      const double tolerance = default_tolerance<T>();
      EXPECT_TRUE(all_close(fwd.out, expected.out, tolerance));
      EXPECT_TRUE(all_close(fwd.lse, expected.lse, tolerance));
      EXPECT_TRUE(all_close(g.dq, expected_g.dq, tolerance));
      EXPECT_TRUE(all_close(g.dk, expected_g.dk, tolerance));
      EXPECT_TRUE(all_close(g.dv, expected_g.dv, tolerance));
      EXPECT_TRUE(all_close(g.dbias, expected_g.dbias, tolerance));
      ++cases;
    }
  EXPECT_EQ(cases, test::sweep_pairs_run(shapes.size(), test::mask_kinds.size()));
  if (!test::sanitized) {
    EXPECT_EQ(cases, static_cast<int>(shapes.size() * test::mask_kinds.size()));
  }
}

TYPED_TEST(FastPathsTest, EveryDecodePathMatchesTheBruteForce) {
  using T = TypeParam;
  Random random(20261202);
  const std::vector<Shape> shapes = fast_path_shapes();
  int general = 0, fast = 0;
  for (std::size_t si = 0; si < shapes.size(); ++si)
    for (std::size_t ki = 0; ki < test::mask_kinds.size(); ++ki) {
      const Shape& s = shapes[si];
      const MaskKind kind = test::mask_kinds[ki];
      const Case<T> c = make_case<T>(s, kind, random);
      if (!test::sweep_pair_runs(si, ki)) continue;
      SCOPED_TRACE(c.where);
      const auto expected = test::brute_force_attention<T>(c.q, c.k, c.v, c.masks.opts);
      const auto params = detail::make_params<T>(c.q, c.k, c.v, c.masks.opts);
      const bool element_masks = params.mask.has_element_masks();
      for (DecodePath path : {DecodePath::general, DecodePath::grouped, DecodePath::streaming}) {
        if (path != DecodePath::general && element_masks) continue;  // they would run the general path again
        SCOPED_TRACE(path == DecodePath::general ? "general path" : path == DecodePath::grouped ? "grouped path"
                                                                                                  : "streaming path");
        Tensor<T, 4> out(expected.out.shape());
        Tensor<T, 3> lse(expected.lse.shape());
        detail::decode_forward(params, detail::ForwardOutputs<T>{out.view(), lse.view(), {}}, path);
        EXPECT_TRUE(all_close(out, expected.out, default_tolerance<T>()));
        EXPECT_TRUE(all_close(lse, expected.lse, default_tolerance<T>()));
        ++(path == DecodePath::general ? general : fast);
      }
    }
  EXPECT_EQ(general, test::sweep_pairs_run(shapes.size(), test::mask_kinds.size()));
  if (test::sanitized) {
    EXPECT_GT(fast, 0);
  } else {
    const int count = static_cast<int>(shapes.size());
    EXPECT_EQ(general, count * static_cast<int>(test::mask_kinds.size()));
    EXPECT_EQ(fast, count * 2 * 8);  // 8 of the 13 mask kinds have no allowed mask and no bias
  }
}

}  // namespace
}  // namespace selfattn::test
