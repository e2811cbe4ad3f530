// PyTorch conformance of TransformerLayer and TransformerStack: every fixture written by
// tests/pytorch/make_layer_fixtures.py (nn.TransformerEncoderLayer, nn.TransformerEncoder, and pre-norm
// layers with RMSNorm and SwiGLU written from the formulas) is loaded through load_state_dict under
// PyTorch's parameter names, run forward and backward, and compared by name: the output, dL/dx and the
// gradient of every parameter, mapped back to PyTorch's names with transformer_layer_state_dict /
// transformer_stack_state_dict. In double within 1e-10, in float within 1e-4 (both relative to the
// largest magnitude of the expected tensor, at least 1). A causal case runs twice: with opts.causal and with
// the configuration's `causal`. Each case prints its largest difference and where.
#include <selfattn/io/transformer_state_dict.hpp>
#include <selfattn/selfattn.hpp>

#include "support/compare.hpp"
#include "support/fixture.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace selfattn::test {
namespace {

constexpr double double_tolerance = 1e-10;
constexpr double float_tolerance = 1e-4;

// ---- the fixture's configuration ----------------------------------------------------------------

bool is_stack(const std::string& case_name) { return case_name.rfind("stack_", 0) == 0; }

Activation activation_of(const Fixture& fx) {
  switch (fx.integer("activation")) {  // codes of make_layer_fixtures.py
    case 0: return Activation::relu;
    case 1: return Activation::gelu;
    case 2: return Activation::gelu_tanh;
    case 3: return Activation::swiglu;
    default: throw std::runtime_error(fx.path + ": unknown activation code " + std::to_string(fx.integer("activation")));
  }
}

NormKind norm_of(const Fixture& fx) {
  switch (fx.integer("norm_kind")) {
    case 0: return NormKind::layer_norm;
    case 1: return NormKind::rms_norm;
    default: throw std::runtime_error(fx.path + ": unknown norm kind " + std::to_string(fx.integer("norm_kind")));
  }
}

// Where a case's causal mask goes: opts.causal = Causal::top_left, or the configuration's `causal` (decoder-only
// layers), which makes the attention top-left causal whatever opts.causal says. Both must give PyTorch's result.
enum class CausalRoute { options, config };

TransformerLayerConfig layer_config(const Fixture& fx, CausalRoute route) {
  TransformerLayerConfig cfg;
  cfg.attention.embed_dim = fx.integer("embed_dim");
  cfg.attention.num_heads = fx.integer("num_heads");
  cfg.attention.dropout = 0.0;
  cfg.ffn_dim = fx.integer("ffn_dim");
  cfg.activation = activation_of(fx);
  cfg.dropout = 0.0;  // PyTorch ran with dropout = 0 (in training mode)
  cfg.norm_first = fx.integer("norm_first") != 0;
  cfg.norm = norm_of(fx);
  cfg.norm_eps = fx.values("norm_eps").at(0);
  cfg.bias = fx.integer("bias") != 0;
  cfg.causal = route == CausalRoute::config && fx.integer("causal") != 0;
  return cfg;
}

TransformerStackConfig stack_config(const Fixture& fx, CausalRoute route) {
  TransformerStackConfig cfg;
  cfg.layer = layer_config(fx, route);
  cfg.num_layers = fx.integer("num_layers");
  cfg.final_norm = fx.integer("final_norm") != 0;
  return cfg;
}

// PyTorch's causal src_mask (j <= i) and src_key_padding_mask (as lengths).
template <typename T>
AttentionOptions<T> options_of(const Fixture& fx, CausalRoute route) {
  AttentionOptions<T> opts;
  if (route == CausalRoute::options && fx.integer("causal") != 0) opts.causal = Causal::top_left;
  if (fx.has("key_lengths")) opts.key_lengths = fx.indices("key_lengths");
  return opts;
}

// ---- state dicts ---------------------------------------------------------------------------------

// Entries of a fixture that are not parameters: data, results and gradients ("grad.<name>").
bool is_parameter(const std::string& name) {
  static const std::set<std::string> data = {"x", "dout", "output", "norm_eps", "key_lengths"};
  return data.count(name) == 0 && name.rfind("grad.", 0) != 0;
}

template <typename T>
NdArray<T> array_of(const Fixture::Entry& e) {
  NdArray<T> a{e.shape, std::vector<T>(e.values.size())};
  for (std::size_t n = 0; n < e.values.size(); ++n) a.values[n] = static_cast<T>(e.values[n]);
  return a;
}

template <typename T, int Rank>
NdArray<T> array_of(const Tensor<T, Rank>& t) {
  return NdArray<T>{std::vector<Index>(t.shape().begin(), t.shape().end()), std::vector<T>(t.data(), t.data() + t.size())};
}

// The fixture's parameters under their PyTorch names, converted to T.
template <typename T>
StateDict<T> parameters_of(const Fixture& fx) {
  StateDict<T> sd;
  for (const auto& [name, entry] : fx.tensors)
    if (is_parameter(name)) sd[name] = array_of<T>(entry);
  return sd;
}

template <typename T>
StateDict<T> state_dict_of(const TransformerLayerParams<T>& p, const TransformerLayerConfig& cfg) {
  return transformer_layer_state_dict(p, cfg);
}

template <typename T>
StateDict<T> state_dict_of(const TransformerStackParams<T>& p, const TransformerStackConfig& cfg) {
  return transformer_stack_state_dict(p, cfg);
}

// ---- one run ---------------------------------------------------------------------------------------

// Loads the fixture into a Model (TransformerLayer<T> or TransformerStack<T>), runs forward and backward,
// and returns what it computed under the fixture's names: "output", "grad.x" and "grad.<parameter>".
template <typename T, typename Model, typename Config>
StateDict<T> run(const Fixture& fx, const Config& cfg, CausalRoute route) {
  const StateDict<T> parameters = parameters_of<T>(fx);
  Model model(cfg);
  load_state_dict(model, parameters);

  // The inverse mapping gives back exactly what was loaded: same names, shapes and values.
  const StateDict<T> reloaded = state_dict_of(model.params(), model.config());
  EXPECT_EQ(reloaded.size(), parameters.size());
  for (const auto& [name, array] : parameters) {
    const auto it = reloaded.find(name);
    if (it == reloaded.end()) {
      ADD_FAILURE() << "the state dict of the loaded parameters has no '" << name << "'";
      continue;
    }
    EXPECT_EQ(it->second.shape, array.shape) << name;
    EXPECT_TRUE(it->second.values == array.values) << name << " changed in a load and save";
  }

  const Tensor<T, 3> x = fx.tensor<3, T>("x");
  const Tensor<T, 3> dout = fx.tensor<3, T>("dout");
  const AttentionOptions<T> opts = options_of<T>(fx, route);
  const auto fwd = model.forward(x, opts);
  const auto grads = model.backward(dout, fwd);

  StateDict<T> result;
  for (auto& [name, array] : state_dict_of(grads.params, model.config())) result["grad." + name] = array;
  result["output"] = array_of(fwd.output);
  result["grad.x"] = array_of(grads.d_input);
  return result;
}

template <typename T>
StateDict<T> run(const Fixture& fx, const std::string& case_name, CausalRoute route) {
  if (is_stack(case_name)) return run<T, TransformerStack<T>>(fx, stack_config(fx, route), route);
  return run<T, TransformerLayer<T>>(fx, layer_config(fx, route), route);
}

// ---- comparison ------------------------------------------------------------------------------------

struct Worst {
  double difference = 0.0;  // max |actual - expected| / max(1, max |expected|)
  std::string name;
};

// Compares every result of the fixture ("output", "grad.x", each "grad.<parameter>") with ours by name, and
// the names themselves: no gradient missing, none extra. Returns the largest scaled difference.
template <typename T>
Worst compare(const Fixture& fx, const StateDict<T>& ours, double tolerance) {
  Worst worst;
  std::size_t expected_count = 0;
  for (const auto& [name, entry] : fx.tensors) {
    if (name != "output" && name.rfind("grad.", 0) != 0) continue;
    ++expected_count;
    SCOPED_TRACE(name);
    const auto it = ours.find(name);
    if (it == ours.end()) {
      ADD_FAILURE() << "no '" << name << "' among our results";
      continue;
    }
    const NdArray<T>& actual = it->second;
    if (actual.shape != entry.shape || actual.values.size() != entry.values.size()) {
      ADD_FAILURE() << "shape " << detail::dynamic_shape_string(actual.shape) << " differs from PyTorch's "
                    << detail::dynamic_shape_string(entry.shape);
      continue;
    }
    // Flattened: the shapes are equal, and all_close reports the flat index of the worst element.
    const auto count = static_cast<Index>(entry.values.size());
    Tensor<T, 1> a({count});
    Tensor<double, 1> e({count});
    std::copy(actual.values.begin(), actual.values.end(), a.data());
    std::copy(entry.values.begin(), entry.values.end(), e.data());
    EXPECT_TRUE(all_close(a, e, tolerance));

    double scale = 1.0;
    for (double v : entry.values) scale = std::max(scale, std::abs(v));
    const double difference = test::max_abs_difference(a, e) / scale;
    if (!(difference <= worst.difference)) worst = {difference, name};
  }
  if (ours.size() != expected_count) {
    std::string extra;
    for (const auto& entry : ours)
      if (!fx.has(entry.first)) extra += " '" + entry.first + "'";
    ADD_FAILURE() << "our results hold " << ours.size() << " names, the fixture " << expected_count << "; not in the fixture:"
                  << extra;
  }
  return worst;
}

// ---- the test ----------------------------------------------------------------------------------------

class TransformerPyTorchConformance : public ::testing::TestWithParam<std::string> {};

TEST_P(TransformerPyTorchConformance, OutputAndEveryGradientMatchPyTorch) {
  const std::string case_name = GetParam();
  const Fixture fx = test::load_fixture(test::fixture_path(case_name + ".txt"));

  std::vector<CausalRoute> routes = {CausalRoute::options};
  if (fx.integer("causal") != 0) routes.push_back(CausalRoute::config);
  for (CausalRoute route : routes) {
    const char* via = route == CausalRoute::options ? "opts.causal" : "cfg.causal";
    SCOPED_TRACE(std::string("causal mask through ") + via);
    Worst in_double, in_float;
    {
      SCOPED_TRACE("double");
      in_double = compare(fx, run<double>(fx, case_name, route), double_tolerance);
    }
    {
      SCOPED_TRACE("float");
      in_float = compare(fx, run<float>(fx, case_name, route), float_tolerance);
    }
    std::printf("%-34s %-11s max scaled difference: double %.2e (%s), float %.2e (%s)\n", case_name.c_str(),
                fx.integer("causal") != 0 ? via : "", in_double.difference, in_double.name.c_str(),
                in_float.difference, in_float.name.c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TransformerPyTorchConformance,
                         ::testing::Values("layer_post_relu", "layer_post_gelu_causal", "layer_pre_relu_padding",
                                           "layer_pre_gelu_causal_padding", "layer_post_relu_causal_padding",
                                           "layer_pre_gelu_tanh_eps", "layer_post_gelu_tanh_eps_padding",
                                           "layer_rms_norm", "layer_swiglu", "layer_rms_norm_swiglu",
                                           "stack_pre_final_norm", "stack_post"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace selfattn::test
