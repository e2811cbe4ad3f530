// examples/ring_attention/ring_attention.cpp — attention over a sequence split across MPI ranks (ring attention).
//
// Each rank holds the queries, keys and values of its own tokens only; the key/value blocks travel around the ring
// of ranks and every rank merges its partial results by log-sum-exp (selfattn/distributed.hpp, docs/distributed.md).
// The program
//   1. checks: on a sequence of --check-length tokens (default 1001, which no rank count up to 8 divides), in
//      double, every rank compares its rows of ring_attention_forward and ring_attention_backward with
//      sdpa_forward / sdpa_backward on the whole sequence (for this check only, each rank builds the whole inputs);
//   2. runs: a sequence of --length tokens in float, each rank generating only its own block (no rank ever holds the
//      whole sequence), and times forward and backward (medians of --repeats calls; a call lasts as long as its
//      slowest rank). Rank 0 prints, per rank, the tokens it holds, the bytes of its tensors, its peak resident
//      memory, and the key/value bytes it sent around the ring.
//
//   mpirun -np 2 ring_attention                       causal, zigzag layout, L = 16384, H = 8, Hkv = 2, D = 64
//   mpirun -np 4 --oversubscribe ring_attention --length 8192 --layout contiguous
//   mpirun -np 2 ring_attention --quick               what ctest runs (L = 2048, 256 unoptimised; --baseline)
//
// Flags: --length L, --check-length L, --heads H, --kv-heads Hkv, --dim D, --layout contiguous|zigzag,
// --no-causal, --repeats R, --baseline (rank 0 also times sdpa_forward / sdpa_backward on the whole sequence, in the
// same run: the speed-up over one process), --quick. Exit codes: 0 success; 1 the check failed; 2 bad arguments.
#include <selfattn/distributed.hpp>
#include <selfattn/selfattn.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace selfattn;

namespace {

struct Settings {
  Index length = 16384, check_length = 1001, heads = 8, kv_heads = 2, dim = 64;
  SequenceLayout layout = SequenceLayout::zigzag;
  bool causal = true;
  bool baseline = false;  // --baseline: rank 0 also times sdpa_forward / sdpa_backward on the whole sequence
  int repeats = 3;
};

struct World {
  int rank = 0, ranks = 1;
};

// ---- Inputs defined by global position, so that any rank can build its own rows and only those ----------------

// A value in [-1, 1) from (tensor, batch, head, position, feature): splitmix64 of the packed coordinates.
double input_value(std::uint64_t tensor, Index b, Index h, Index position, Index d) {
  std::uint64_t x = tensor * 0x9e3779b97f4a7c15ULL ^ (static_cast<std::uint64_t>(b) << 56) ^
                    (static_cast<std::uint64_t>(h) << 44) ^ (static_cast<std::uint64_t>(position) << 12) ^
                    static_cast<std::uint64_t>(d);
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return 2.0 * static_cast<double>(x >> 11) * 0x1.0p-53 - 1.0;
}

// Rows of tensor `which` (B, heads, rows, dim) at the given global positions.
template <typename T>
Tensor<T, 4> rows_at(std::uint64_t which, Index heads, Index dim, const std::vector<Index>& positions) {
  Tensor<T, 4> x({1, heads, static_cast<Index>(positions.size()), dim});
  for (Index h = 0; h < heads; ++h)
    for (Index l = 0; l < x.dim(2); ++l)
      for (Index d = 0; d < dim; ++d)
        x(0, h, l, d) = static_cast<T>(input_value(which, 0, h, positions[static_cast<std::size_t>(l)], d));
  return x;
}

std::vector<Index> positions_of(const std::vector<TokenRange>& ranges) {
  std::vector<Index> positions;
  for (const TokenRange& range : ranges)
    for (Index p = range.begin; p < range.end; ++p) positions.push_back(p);
  return positions;
}

std::vector<Index> all_positions(Index length) { return positions_of({TokenRange{0, length}}); }

template <typename T>
AttentionOptions<T> options(const Settings& s) {
  AttentionOptions<T> opts;
  if (s.causal) opts.causal = Causal::top_left;
  return opts;
}

double max_difference(const Tensor<double, 4>& a, const Tensor<double, 4>& b) {
  double m = 0;
  for (Index i = 0; i < a.dim(0); ++i)
    for (Index j = 0; j < a.dim(1); ++j)
      for (Index k = 0; k < a.dim(2); ++k)
        for (Index l = 0; l < a.dim(3); ++l) m = std::max(m, std::abs(a(i, j, k, l) - b(i, j, k, l)));
  return m;
}

// ---- 1. The check: this rank's rows of the ring result against the single-process result ------------------------

bool check(const Settings& s, const World& world) {
  const Index length = s.check_length;
  const std::vector<Index> all = all_positions(length);
  const Tensor<double, 4> q = rows_at<double>(1, s.heads, s.dim, all), k = rows_at<double>(2, s.kv_heads, s.dim, all),
                          v = rows_at<double>(3, s.kv_heads, s.dim, all),
                          dout = rows_at<double>(4, s.heads, s.dim, all);
  const AttentionOptions<double> opts = options<double>(s);
  const AttentionForward<double> whole = sdpa_forward(q, k, v, opts);
  const AttentionGradients<double> whole_grad = sdpa_backward(q, k, v, whole.out, whole.lse, dout, opts);

  const auto mine = [&](const Tensor<double, 4>& x) { return sequence_block(x, s.layout, world.rank, world.ranks); };
  const Tensor<double, 4> q_r = mine(q), k_r = mine(k), v_r = mine(v), dout_r = mine(dout);
  const AttentionForward<double> ring = ring_attention_forward(MPI_COMM_WORLD, s.layout, q_r, k_r, v_r, opts);
  const AttentionGradients<double> grad =
      ring_attention_backward(MPI_COMM_WORLD, s.layout, q_r, k_r, v_r, ring.out, ring.lse, dout_r, opts);

  const double differences[4] = {
      max_difference(ring.out, mine(whole.out)), max_difference(grad.dq, mine(whole_grad.dq)),
      max_difference(grad.dk, mine(whole_grad.dk)), max_difference(grad.dv, mine(whole_grad.dv))};
  double worst[4];
  MPI_Reduce(differences, worst, 4, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  int ok = 1;
  if (world.rank == 0) {
    std::printf("check, double, L = %td on %d ranks (%s layout%s): max |ring - single process| over all ranks\n",
                length, world.ranks, s.layout == SequenceLayout::zigzag ? "zigzag" : "contiguous",
                s.causal ? ", causal" : "");
    std::printf("  out %.1e   dq %.1e   dk %.1e   dv %.1e   (needed <= 1e-12)\n", worst[0], worst[1], worst[2],
                worst[3]);
    ok = *std::max_element(worst, worst + 4) <= 1e-12;
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return ok != 0;
}

// ---- 2. The run: each rank builds only its block, then forward and backward are timed -------------------------

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

// Seconds of the slowest rank for one collective call.
template <typename F>
double timed(F&& call) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = MPI_Wtime();
  call();
  double mine = MPI_Wtime() - start, slowest = 0;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

double mebibytes(double bytes) { return bytes / (1024.0 * 1024.0); }

double peak_resident_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

// Bytes this rank sends in one forward: at step s = 0 .. P - 2 it passes on the block of rank r - s.
double forward_bytes_sent(const Settings& s, const World& world) {
  double elements = 0;
  for (int step = 0; step + 1 < world.ranks; ++step) {
    const int owner = ((world.rank - step) % world.ranks + world.ranks) % world.ranks;
    elements +=
        static_cast<double>(s.kv_heads * sequence_block_length(s.layout, s.length, owner, world.ranks) * 2 * s.dim);
  }
  return elements * sizeof(float);
}

// The baseline, measured in the same run: one process (rank 0, while the others wait) attends over the whole
// sequence with sdpa_forward / sdpa_backward. Returns {forward, backward} seconds on rank 0, zeros elsewhere.
std::vector<double> single_process_seconds(const Settings& s, const World& world) {
  std::vector<double> seconds{0, 0};
  if (world.rank == 0) {
    const std::vector<Index> all = all_positions(s.length);
    const Tensor<float, 4> q = rows_at<float>(1, s.heads, s.dim, all), k = rows_at<float>(2, s.kv_heads, s.dim, all),
                           v = rows_at<float>(3, s.kv_heads, s.dim, all), dout = rows_at<float>(4, s.heads, s.dim, all);
    const AttentionOptions<float> opts = options<float>(s);
    std::vector<double> forward_s, backward_s;
    for (int r = 0; r < s.repeats; ++r) {
      double start = MPI_Wtime();
      const AttentionForward<float> fwd = sdpa_forward(q, k, v, opts);
      forward_s.push_back(MPI_Wtime() - start);
      start = MPI_Wtime();
      const AttentionGradients<float> grad = sdpa_backward(q, k, v, fwd.out, fwd.lse, dout, opts);
      backward_s.push_back(MPI_Wtime() - start);
    }
    seconds = {median(forward_s), median(backward_s)};
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return seconds;
}

void run(const Settings& s, const World& world) {
  const std::vector<Index> positions = positions_of(sequence_ranges(s.layout, s.length, world.rank, world.ranks));
  const Tensor<float, 4> q = rows_at<float>(1, s.heads, s.dim, positions),
                         k = rows_at<float>(2, s.kv_heads, s.dim, positions),
                         v = rows_at<float>(3, s.kv_heads, s.dim, positions),
                         dout = rows_at<float>(4, s.heads, s.dim, positions);
  const AttentionOptions<float> opts = options<float>(s);
  const std::vector<double> baseline = s.baseline ? single_process_seconds(s, world) : std::vector<double>{0, 0};
  AttentionForward<float> fwd;
  AttentionGradients<float> grad;
  std::vector<double> forward_s, backward_s;
  for (int r = 0; r < s.repeats; ++r) {
    forward_s.push_back(timed([&] { fwd = ring_attention_forward(MPI_COMM_WORLD, s.layout, q, k, v, opts); }));
    backward_s.push_back(timed(
        [&] { grad = ring_attention_backward(MPI_COMM_WORLD, s.layout, q, k, v, fwd.out, fwd.lse, dout, opts); }));
  }
  // What this rank holds: its inputs, out, lse, dout and the three gradients.
  const double tensor_bytes =
      sizeof(float) * static_cast<double>(q.size() + k.size() + v.size() + dout.size() + fwd.out.size() +
                                          fwd.lse.size() + grad.dq.size() + grad.dk.size() + grad.dv.size());
  const double report[4] = {static_cast<double>(positions.size()), tensor_bytes, peak_resident_mib(),
                            forward_bytes_sent(s, world)};
  std::vector<double> reports(4 * static_cast<std::size_t>(world.ranks));
  MPI_Gather(report, 4, MPI_DOUBLE, reports.data(), 4, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (world.rank != 0) return;

  const double flops = 4.0 * static_cast<double>(s.heads * s.dim) * static_cast<double>(s.length) *
                       static_cast<double>(s.length) * (s.causal ? 0.5 : 1.0);
  std::printf("\nrun, float, L = %td tokens on %d ranks (%s layout%s), H = %td, Hkv = %td, D = %td; medians of %d\n",
              s.length, world.ranks, s.layout == SequenceLayout::zigzag ? "zigzag" : "contiguous",
              s.causal ? ", causal" : "", s.heads, s.kv_heads, s.dim, s.repeats);
  std::printf("  rank   tokens   tensors MiB   peak resident MiB   k/v sent per forward MiB\n");
  for (int r = 0; r < world.ranks; ++r) {
    const double* x = &reports[4 * static_cast<std::size_t>(r)];
    std::printf("  %4d   %6.0f   %11.1f   %17.1f   %24.2f\n", r, x[0], mebibytes(x[1]), x[2], mebibytes(x[3]));
  }
  const double one_process_bytes = sizeof(float) * static_cast<double>(s.length) *
                                   static_cast<double>(4 * s.heads * s.dim + 4 * s.kv_heads * s.dim + s.heads);
  std::printf("  one process holding the whole sequence: %.1f MiB of tensors\n", mebibytes(one_process_bytes));
  if (s.baseline) std::printf("  (rank 0's peak includes the baseline's whole-sequence tensors)\n");
  const double forward = median(forward_s), backward = median(backward_s);
  std::printf("  forward  %8.1f ms  %6.1f GFLOP/s\n", 1e3 * forward, flops / forward * 1e-9);
  std::printf("  backward %8.1f ms  %6.1f GFLOP/s (2.5x the forward's flops)\n", 1e3 * backward,
              2.5 * flops / backward * 1e-9);
  if (!s.baseline) return;
  std::printf("  baseline, one process, sdpa_forward / sdpa_backward over the whole sequence, same run:\n");
  std::printf("  forward  %8.1f ms  %6.1f GFLOP/s   ring: %.2fx its speed\n", 1e3 * baseline[0],
              flops / baseline[0] * 1e-9, baseline[0] / forward);
  std::printf("  backward %8.1f ms  %6.1f GFLOP/s   ring: %.2fx its speed\n", 1e3 * baseline[1],
              2.5 * flops / baseline[1] * 1e-9, baseline[1] / backward);
}

// ---- Arguments ------------------------------------------------------------------------------------------------

bool parse_index(const char* text, Index minimum, Index& into) {
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || value < minimum) return false;
  into = static_cast<Index>(value);
  return true;
}

bool parse(int argc, char** argv, Settings& s) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const bool has_value = i + 1 < argc;
    Index repeats = 0;
    if (flag == "--quick") {
      // Unoptimised builds (the sanitizer stage of CI) run the kernels some 30 times slower: a shorter sequence.
#ifdef __OPTIMIZE__
      s.length = 2048;
      s.check_length = 257;
#else
      s.length = 256;
      s.check_length = 65;
#endif
      s.repeats = 1;
      s.baseline = true;
    } else if (flag == "--baseline") {
      s.baseline = true;
    } else if (flag == "--no-causal") {
      s.causal = false;
    } else if (flag == "--length" && has_value) {
      if (!parse_index(argv[++i], 1, s.length)) return false;
    } else if (flag == "--check-length" && has_value) {
      if (!parse_index(argv[++i], 1, s.check_length)) return false;
    } else if (flag == "--heads" && has_value) {
      if (!parse_index(argv[++i], 1, s.heads)) return false;
    } else if (flag == "--kv-heads" && has_value) {
      if (!parse_index(argv[++i], 1, s.kv_heads)) return false;
    } else if (flag == "--dim" && has_value) {
      if (!parse_index(argv[++i], 1, s.dim)) return false;
    } else if (flag == "--repeats" && has_value) {
      if (!parse_index(argv[++i], 1, repeats)) return false;
      s.repeats = static_cast<int>(repeats);
    } else if (flag == "--layout" && has_value) {
      const std::string layout = argv[++i];
      if (layout != "contiguous" && layout != "zigzag") return false;
      s.layout = layout == "zigzag" ? SequenceLayout::zigzag : SequenceLayout::contiguous;
    } else {
      return false;
    }
  }
  return s.heads % s.kv_heads == 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  World world;
  MPI_Comm_rank(MPI_COMM_WORLD, &world.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world.ranks);
  Settings settings;
  if (!parse(argc, argv, settings)) {
    if (world.rank == 0)
      std::fprintf(stderr,
                   "usage: mpirun -np P %s [--length L] [--check-length L] [--heads H] [--kv-heads Hkv (divides H)] "
                   "[--dim D] [--layout contiguous|zigzag] [--no-causal] [--repeats R] [--baseline] [--quick]\n",
                   argv[0]);
    MPI_Finalize();
    return 2;
  }
  const bool ok = check(settings, world);
  if (ok) run(settings, world);
  if (world.rank == 0) std::printf(ok ? "\nall checks passed\n" : "\nFAILED: the ring differs from one process\n");
  MPI_Finalize();
  return ok ? 0 : 1;
}
