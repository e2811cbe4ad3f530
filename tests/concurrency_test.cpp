// Concurrency (issue 6, part 4): many std::threads share ONE const MultiHeadAttention (and one TransformerStack) —
// forward and backward are const — and each decodes with its own KVCache, all at once; every result must equal,
// bit for bit, the same call made serially. The masks and options the threads read are shared too. Meant to run under
// ThreadSanitizer as well (docs/numerics.md, "Thread safety", says how it is built).
#include <selfattn/selfattn.hpp>

#include "support/module_config.hpp"
#include "support/random.hpp"
#include "support/scalars.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace selfattn::test {
namespace {

SELFATTN_SCALAR_TEST_SUITE(ConcurrencyTest);

constexpr int thread_count = 8;

// Same shape and the same bytes (NaN payloads and the sign of zero included).
template <typename X>
bool bitwise_equal(const X& a, const X& b) {
  return a.shape() == b.shape() &&
         (a.size() == 0 || std::memcmp(a.data(), b.data(), sizeof(*a.data()) * static_cast<std::size_t>(a.size())) == 0);
}

// Runs call(id) for every thread id one after another, then each on its own std::thread at once, and expects every
// tensor of the two runs bit for bit the same. call returns a std::vector of tensors.
template <typename Call>
void expect_threads_equal_serial_calls(const Call& call) {
  std::vector<decltype(call(0))> serial, parallel(thread_count);
  for (int id = 0; id < thread_count; ++id) serial.push_back(call(id));
  std::vector<std::thread> threads;
  for (int id = 0; id < thread_count; ++id)
    threads.emplace_back([&call, &parallel, id] { parallel[static_cast<std::size_t>(id)] = call(id); });
  for (std::thread& thread : threads) thread.join();
  for (std::size_t id = 0; id < serial.size(); ++id) {
    ASSERT_EQ(parallel[id].size(), serial[id].size()) << "thread " << id;
    for (std::size_t n = 0; n < serial[id].size(); ++n)
      EXPECT_TRUE(bitwise_equal(parallel[id][n], serial[id][n])) << "thread " << id << ", tensor " << n;
  }
}

// A module with every feature that keeps state: grouped-query heads, RoPE, ALiBi, dropout in training mode.
template <typename T>
MultiHeadAttention<T> make_module() {
  MultiHeadAttention<T> mha(ModuleConfig(32, 4).kv_heads(2).rope(4).with_alibi(true).with_dropout(0.1), 77);
  Random random(78);
  for (Tensor<T, 1>* b : {&mha.params().q_bias, &mha.params().k_bias, &mha.params().v_bias, &mha.params().out_bias})
    for (Index n = 0; n < b->size(); ++n) b->data()[n] = static_cast<T>(0.1 * random.normal());
  mha.set_training(true);
  return mha;
}

// One forward + backward: its inputs and options, and what it returned.
template <typename T>
struct Task {
  Tensor<T, 3> x, dout;
  AttentionOptions<T> opts;
  Tensor<T, 3> output, d_query;
  Tensor<T, 4> weights;
  Tensor<T, 2> d_q_weight, d_out_weight;
};

template <typename T>
void run(const MultiHeadAttention<T>& mha, Task<T>& t) {
  const MhaForward<T> f = mha.forward(t.x, t.opts);
  const MhaGradients<T> g = mha.backward(t.dout, f);
  t.output = f.output;
  t.weights = f.weights;
  t.d_query = g.d_query;
  t.d_q_weight = g.params.q_weight;
  t.d_out_weight = g.params.out_weight;
}

template <typename T>
bool same_results(const Task<T>& a, const Task<T>& b) {
  return bitwise_equal(a.output, b.output) && bitwise_equal(a.weights, b.weights) && bitwise_equal(a.d_query, b.d_query) &&
         bitwise_equal(a.d_q_weight, b.d_q_weight) && bitwise_equal(a.d_out_weight, b.d_out_weight);
}

TYPED_TEST(ConcurrencyTest, ForwardAndBackwardOnOneConstModuleEqualSerialCalls) {
  using T = TypeParam;
  const MultiHeadAttention<T> mha = make_module<T>();
  Random random(79);
  // One mask shared by every task that uses it: read concurrently.
  const Tensor<bool, 4> allowed = random.bool_tensor<4>({1, 1, 24, 24}, 0.8);
  std::vector<Task<T>> tasks(2 * thread_count);
  for (std::size_t n = 0; n < tasks.size(); ++n) {
    Task<T>& t = tasks[n];
    const Index length = 9 + static_cast<Index>(n % 4) * 5;  // 9 .. 24: some tasks span several fused tiles
    t.x = random.normal_tensor<T, 3>({2, length, 32});
    t.dout = random.normal_tensor<T, 3>({2, length, 32});
    t.opts.seed = 1000 + n;  // each call its own dropout stream
    t.opts.causal = n % 2 == 0 ? Causal::top_left : Causal::none;
    t.opts.kernel = n % 3 == 0 ? Kernel::reference : Kernel::fused;
    t.opts.need_weights = n % 5 == 0;
    if (n % 4 == 3) {
      t.opts.allowed = allowed;
      t.opts.key_lengths = {length, length - 3};
    }
  }
  std::vector<Task<T>> serial = tasks;
  for (Task<T>& t : serial) run(mha, t);

  // Every thread runs every task, starting at a different one, so each task runs on 8 threads at once-ish.
  std::vector<std::vector<Task<T>>> results(thread_count, tasks);
  std::vector<std::thread> threads;
  for (int id = 0; id < thread_count; ++id)
    threads.emplace_back([&mha, &results, id] {
      std::vector<Task<T>>& mine = results[static_cast<std::size_t>(id)];
      for (std::size_t n = 0; n < mine.size(); ++n) run(mha, mine[(n + static_cast<std::size_t>(id)) % mine.size()]);
    });
  for (std::thread& thread : threads) thread.join();

  for (int id = 0; id < thread_count; ++id)
    for (std::size_t n = 0; n < tasks.size(); ++n)
      EXPECT_TRUE(same_results(results[static_cast<std::size_t>(id)][n], serial[n])) << "thread " << id << ", task " << n;
}

// Each thread decodes its own sequence into its own cache with the shared module (step is const); the outputs
// equal the same steps run one thread at a time. Some caches evict (sliding window, attention sinks).
TYPED_TEST(ConcurrencyTest, StepOnSeparateCachesEqualsSerialDecoding) {
  using T = TypeParam;
  const MultiHeadAttention<T> mha = make_module<T>();
  Random random(80);
  const Index length = 40;
  std::vector<Tensor<T, 3>> sequences;
  for (int id = 0; id < thread_count; ++id) sequences.push_back(random.normal_tensor<T, 3>({2, length, 32}));
  const auto policy = [](int id) {
    if (id % 3 == 1) return CachePolicy::sliding_window(8);
    if (id % 3 == 2) return CachePolicy::attention_sinks(2, 8);
    return CachePolicy::keep_all();
  };
  // A prefill of 7 tokens, then one token per step.
  const auto decode = [&](int id) {
    const Tensor<T, 3>& x = sequences[static_cast<std::size_t>(id)];
    KVCache<T> cache = mha.make_cache(2, policy(id));
    std::vector<Tensor<T, 3>> outputs;
    for (Index at = 0; at < length;) {
      const Index n = at == 0 ? 7 : 1;
      const Tensor<T, 3> piece(TensorView<const T, 3>(x.data() + at * 32, {2, n, 32}, {length * 32, 32, 1}));
      outputs.push_back(mha.step(piece, cache));
      at += n;
    }
    return outputs;
  };
  expect_threads_equal_serial_calls(decode);
}

// The free functions, forward and backward with both kernels, sharing their inputs and a bias between threads.
TYPED_TEST(ConcurrencyTest, SdpaCallsSharingInputsEqualSerialCalls) {
  using T = TypeParam;
  Random random(81);
  const auto q = random.normal_tensor<T, 4>({2, 4, 37, 16});
  const auto k = random.normal_tensor<T, 4>({2, 2, 45, 16});
  const auto v = random.normal_tensor<T, 4>({2, 2, 45, 8});
  const auto dout = random.normal_tensor<T, 4>({2, 4, 37, 8});
  const auto bias = random.normal_tensor<T, 4>({1, 4, 37, 45});
  const auto call = [&](int id) {
    AttentionOptions<T> opts;
    opts.kernel = id % 2 == 0 ? Kernel::reference : Kernel::fused;
    opts.causal = Causal::bottom_right;
    opts.bias = bias;
    opts.dropout_p = T(0.2);
    opts.seed = static_cast<std::uint64_t>(id / 2);
    const auto f = sdpa_forward(q, k, v, opts);
    auto g = sdpa_backward(q, k, v, f.out, f.lse, dout, opts);
    return std::vector<Tensor<T, 4>>{f.out, g.dq, g.dk, g.dv, g.dbias};
  };
  expect_threads_equal_serial_calls(call);
}

// One const TransformerStack (pre-norm, dropout in training mode, GQA and RoPE in the attention) serves every
// thread: each runs forward and backward, then decodes its own sequence into its own caches; every result equals
// the same calls made one after another.
TYPED_TEST(ConcurrencyTest, StackForwardBackwardAndStepOnOneConstStackEqualSerialCalls) {
  using T = TypeParam;
  TransformerStackConfig cfg;
  cfg.layer.attention.embed_dim = 16;
  cfg.layer.attention.num_heads = 4;
  cfg.layer.attention.num_kv_heads = 2;
  cfg.layer.attention.rope_dim = 4;
  cfg.layer.attention.dropout = 0.1;
  cfg.layer.ffn_dim = 24;
  cfg.layer.dropout = 0.2;
  cfg.layer.norm_first = true;
  cfg.layer.causal = true;
  cfg.num_layers = 2;
  cfg.final_norm = true;
  TransformerStack<T> stack(cfg, 81);
  stack.set_training(true);
  Random random(82);
  std::vector<Tensor<T, 3>> inputs;
  for (int id = 0; id < thread_count; ++id) inputs.push_back(random.normal_tensor<T, 3>({2, 6 + id % 3, 16}));
  const auto call = [&stack, &inputs](int id) {
    const Tensor<T, 3>& x = inputs[static_cast<std::size_t>(id)];
    AttentionOptions<T> opts;
    opts.seed = static_cast<std::uint64_t>(id);
    const TransformerStackForward<T> f = stack.forward(x, opts);
    const TransformerStackGradients<T> g = stack.backward(f.output, f);
    TransformerStackCache<T> cache = stack.make_cache(2);
    Tensor<T, 3> stepped = stack.step(x, cache);
    return std::vector<Tensor<T, 3>>{f.output, g.d_input, stepped};
  };
  expect_threads_equal_serial_calls(call);
}

}  // namespace
}  // namespace selfattn::test
