// Tests of selfattn/train/parameters.hpp: the list of a TransformerStack's tensors (every element once, names,
// decay on matrices only, pointers into the tensors), the errors, the global gradient norm and clipping as
// PyTorch's clip_grad_norm_ does it.
#include <selfattn/io/transformer_state_dict.hpp>
#include <selfattn/selfattn.hpp>
#include <selfattn/train/parameters.hpp>

#include "support/expect_error.hpp"
#include "support/random.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace selfattn::test {
namespace {

TransformerStackConfig stack_config(bool bias) {
  TransformerStackConfig cfg;
  cfg.layer = decoder_layer_config(8, 2);
  cfg.layer.bias = bias;
  cfg.layer.attention.bias = bias;
  cfg.num_layers = 2;
  cfg.final_norm = true;
  return cfg;
}

// A gradient struct of the parameters' shapes, every element `value`.
TransformerStackParams<float> filled_like(const TransformerStackParams<float>& p, float value) {
  TransformerStackParams<float> g = p;
  std::vector<ParameterRef<float>> refs;
  add_parameters(refs, g, g);
  for (const ParameterRef<float>& r : refs) std::fill(r.value, r.value + r.size, value);
  return g;
}

TEST(ParametersTest, AStackListsEveryTensorOnceWithDecayOnMatricesOnly) {
  for (bool bias : {true, false}) {
    SCOPED_TRACE(bias ? "with biases" : "without biases");
    TransformerStack<float> stack(stack_config(bias), 1);
    TransformerStackParams<float> grads = filled_like(stack.params(), 0.0f);
    std::vector<ParameterRef<float>> refs;
    add_parameters(refs, stack.params(), grads, "stack.");
    // Every element of the state dict (PyTorch's names, the attention's q, k, v stacked) once.
    Index expected = 0;
    for (const auto& entry : transformer_stack_state_dict(stack.params(), stack.config()))
      expected += static_cast<Index>(entry.second.values.size());
    Index total = 0;
    std::set<std::string> names;
    for (const ParameterRef<float>& r : refs) {
      total += r.size;
      names.insert(r.name);
      const bool matrix = r.name.find("_weight") != std::string::npos && r.name.find("norm") == std::string::npos;
      EXPECT_EQ(r.decay, matrix) << r.name;
      EXPECT_GT(r.size, 0) << r.name;
    }
    EXPECT_EQ(total, expected);
    EXPECT_EQ(names.size(), refs.size()) << "a name twice";
    EXPECT_EQ(refs.size(), bias ? 2u * 16u + 2u : 2u * 8u + 1u);
    EXPECT_TRUE(names.count("stack.layers.1.self_attn.q_weight"));
    EXPECT_TRUE(names.count("stack.layers.0.linear2_weight"));
    EXPECT_TRUE(names.count("stack.norm_weight"));
    EXPECT_EQ(names.count("stack.norm_bias"), bias ? 1u : 0u);
  }
}

TEST(ParametersTest, RefsPointIntoTheTensors) {
  TransformerStack<float> stack(stack_config(true), 2);
  TransformerStackParams<float> grads = filled_like(stack.params(), 0.5f);
  std::vector<ParameterRef<float>> refs;
  add_parameters(refs, stack.params(), grads);
  const auto ref = std::find_if(refs.begin(), refs.end(), [](const auto& r) { return r.name == "layers.1.linear1_bias"; });
  ASSERT_NE(ref, refs.end());
  EXPECT_EQ(ref->value, stack.params().layers[1].linear1_bias.data());
  EXPECT_EQ(ref->grad, grads.layers[1].linear1_bias.data());
  EXPECT_EQ(ref->size, stack.params().layers[1].linear1_bias.size());
  ref->value[3] = 42.0f;
  EXPECT_EQ(stack.params().layers[1].linear1_bias(3), 42.0f);
}

TEST(ParametersTest, AddParameterSkipsAbsentTensorsAndChecksShapes) {
  std::vector<ParameterRef<double>> refs;
  Tensor<double, 1> empty, empty_grad;
  add_parameter(refs, "bias", empty, empty_grad, false);
  EXPECT_TRUE(refs.empty());
  Tensor<double, 2> w({3, 4}), dw({4, 3});
  expect_error<ShapeError>([&] { add_parameter(refs, "head", w, dw, true); },
                           {"[add_parameter]", "head gradient", "expected shape (3, 4), got (4, 3)"});
  EXPECT_TRUE(refs.empty());
}

TEST(ParametersTest, ErrorsNameTheTensor) {
  TransformerStack<float> stack(stack_config(true), 3);
  TransformerStackParams<float> grads = filled_like(stack.params(), 0.0f);
  grads.layers[1].self_attn.v_weight = Tensor<float, 2>({2, 2});
  std::vector<ParameterRef<float>> refs;
  expect_error<ShapeError>([&] { add_parameters(refs, stack.params(), grads, "m."); },
                           {"m.layers.1.self_attn.v_weight gradient", "expected shape (8, 8), got (2, 2)"});
  grads.layers.pop_back();
  expect_error<std::invalid_argument>([&] { add_parameters(refs, stack.params(), grads, "m."); },
                                      {"[add_parameters]", "grads.layers", "expected 2 layers, got 1"});
}

std::vector<ParameterRef<double>> two_refs(Tensor<double, 2>& a, Tensor<double, 2>& ga, Tensor<double, 1>& b,
                                           Tensor<double, 1>& gb) {
  std::vector<ParameterRef<double>> refs;
  add_parameter(refs, "a", a, ga, true);
  add_parameter(refs, "b", b, gb, false);
  return refs;
}

TEST(ParametersTest, GradNormIsTheNormOfAllGradientsTogether) {
  Tensor<double, 2> a({1, 2}), ga({1, 2});
  Tensor<double, 1> b({1}), gb({1});
  ga(0, 0) = 3, ga(0, 1) = 4, gb(0) = 12;  // sqrt(9 + 16 + 144) = 13
  EXPECT_DOUBLE_EQ(grad_norm(two_refs(a, ga, b, gb)), 13.0);
}

TEST(ParametersTest, ClipScalesOnlyAboveMaxNormAndReturnsTheNormBefore) {
  Random rng(4);
  Tensor<double, 2> a({3, 5}), ga = rng.normal_tensor<double, 2>({3, 5});
  Tensor<double, 1> b({4}), gb = rng.normal_tensor<double, 1>({4});
  const auto refs = two_refs(a, ga, b, gb);
  const double norm = grad_norm(refs);
  const Tensor<double, 2> ga_before = ga;
  // Below the limit: nothing changes.
  EXPECT_DOUBLE_EQ(clip_grad_norm(refs, 2 * norm), norm);
  for (Index n = 0; n < ga.size(); ++n) EXPECT_EQ(ga.data()[n], ga_before.data()[n]);
  // Above: every gradient scaled by max_norm / (norm + 1e-6), the direction kept.
  EXPECT_DOUBLE_EQ(clip_grad_norm(refs, norm / 4), norm);
  const double scale = (norm / 4) / (norm + 1e-6);
  for (Index n = 0; n < ga.size(); ++n) EXPECT_NEAR(ga.data()[n], ga_before.data()[n] * scale, 1e-15);
  EXPECT_NEAR(grad_norm(refs), norm / 4, 1e-6);
}

TEST(ParametersTest, ClipLeavesNonFiniteGradientsAlone) {
  Tensor<double, 2> a({1, 2}), ga({1, 2});
  Tensor<double, 1> b({1}), gb({1});
  ga(0, 0) = 1e3, gb(0) = std::numeric_limits<double>::quiet_NaN();
  const auto refs = two_refs(a, ga, b, gb);
  EXPECT_TRUE(std::isnan(clip_grad_norm(refs, 1.0)));
  EXPECT_EQ(ga(0, 0), 1e3);
  gb(0) = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(std::isinf(clip_grad_norm(refs, 1.0)));
  EXPECT_EQ(ga(0, 0), 1e3);
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()})
    expect_error<std::invalid_argument>([&] { clip_grad_norm(refs, bad); }, {"[clip_grad_norm]", "max_norm"});
}

}  // namespace
}  // namespace selfattn::test
