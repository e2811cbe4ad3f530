/// \file
/// What the CPU at hand can run, found once at run time, and which kernels selfattn runs on it.
///
/// \code
/// const selfattn::CpuInfo& cpu = selfattn::cpu_info();
/// std::cout << selfattn::to_string(cpu);  // vendor, model, levels found, the level chosen, each entry's kernel
/// \endcode
///
/// Detection reads CPUID and, for the vector state, XGETBV: a level counts only when the CPU has its instructions
/// and the operating system saves its registers (AVX-512 needs the opmask and zmm state enabled in XCR0). The
/// environment variable `SELFATTN_ISA` (`generic`, `avx2`, `avx512`, `avx512_bf16`) chooses a lower level, so every
/// variant can be run on one machine; a level the CPU lacks, or an unknown name, throws std::invalid_argument from
/// the first call (and so from the first attention call) instead of running an illegal instruction.
/// docs/dispatch.md has the whole story.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define SELFATTN_DISPATCH_X86 1
#else
#define SELFATTN_DISPATCH_X86 0
#endif
/// \def SELFATTN_DISPATCH_X86
/// 1 when this build carries the run-time dispatched x86-64 kernels (g++ and clang++ on x86-64), else 0.

namespace selfattn {

/// Instruction-set levels, each including the ones before it.
///   generic      the kernels as the program was compiled (Eigen's packets at the compiler's flags: SSE2 in a
///                default x86-64 build, AVX-512 under -march=native on such a CPU, NEON on ARM)
///   avx2         AVX2 with FMA (8 floats per vector, 16 registers)
///   avx512       AVX-512 F, BW, DQ and VL (16 floats per vector, 32 registers)
///   avx512_bf16  avx512 with the bfloat16 dot products (vdpbf16ps)
enum class Isa { generic = 0, avx2 = 1, avx512 = 2, avx512_bf16 = 3 };

/// The name of a level, as SELFATTN_ISA spells it.
inline const char* to_string(Isa isa) {
  switch (isa) {
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
    case Isa::avx512_bf16: return "avx512_bf16";
    default: return "generic";
  }
}

/// The CPU, what it and the operating system support, and the level selfattn's kernels run at.
struct CpuInfo {
  std::string vendor;  ///< CPUID's vendor string ("GenuineIntel", "AuthenticAMD"); empty off x86-64
  std::string model;   ///< CPUID's brand string; empty off x86-64
  /// \name Instructions the CPU has and the operating system enabled (their register state saved by XSAVE)
  ///@{
  bool avx2 = false;         ///< AVX2 (256-bit integer and float vectors)
  bool fma = false;          ///< FMA3 (fused multiply-add)
  bool f16c = false;         ///< half-precision conversions (vcvtph2ps)
  bool avx512f = false;      ///< AVX-512 Foundation
  bool avx512bw = false;     ///< AVX-512 byte and word instructions
  bool avx512dq = false;     ///< AVX-512 doubleword and quadword instructions
  bool avx512vl = false;     ///< AVX-512 at 128- and 256-bit widths
  bool avx512_bf16 = false;  ///< bfloat16 conversions and dot products (vdpbf16ps)
  ///@}
  /// \name AMX, the CPU's flags only (tiles also need the kernel's permission, which is not asked for)
  ///@{
  bool amx_tile = false;  ///< tile registers
  bool amx_bf16 = false;  ///< bfloat16 tile products
  ///@}
  /// Whether vdpbf16ps beats the 512-bit FMA on this CPU (bfloat16 attention then uses it; else it widens to float).
  /// From a table of measured CPUs (docs/dispatch.md): AMD's Zen 4 and later, yes (about twice the FMA's FLOP/s);
  /// Intel's Xeons, no (about half); any other CPU, no.
  bool bf16_products_faster = false;
  Isa best = Isa::generic;      ///< the highest level this CPU supports and this build can dispatch to
  Isa selected = Isa::generic;  ///< the level the kernels run at: `best`, or lower when SELFATTN_ISA says so
  bool overridden = false;      ///< SELFATTN_ISA was set
  /// What each dispatched entry runs, as (entry, kernel) pairs in words.
  std::vector<std::pair<std::string, std::string>> kernels;
};

namespace detail {

/// The level the compiler's own flags give the generic kernels (what Eigen vectorises with).
constexpr const char* compiled_simd() {
#if defined(__AVX512F__)
  return "AVX-512";
#elif defined(__AVX2__) && defined(__FMA__)
  return "AVX2+FMA";
#elif defined(__AVX__)
  return "AVX";
#elif defined(__SSE2__)
  return "SSE2";
#elif defined(__ARM_NEON)
  return "NEON";
#else
  return "scalar";
#endif
}

/// The level the compiler's flags already give Eigen (its GEMM is then as wide as a dispatched one would be).
constexpr Isa compiled_level() {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
  return Isa::avx512;
#elif defined(__AVX2__) && defined(__FMA__)
  return Isa::avx2;
#else
  return Isa::generic;
#endif
}

#if SELFATTN_DISPATCH_X86
struct CpuidRegisters {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
};

inline CpuidRegisters cpuid(unsigned leaf, unsigned subleaf = 0) {
  CpuidRegisters r;
  if (!__get_cpuid_count(leaf, subleaf, &r.eax, &r.ebx, &r.ecx, &r.edx)) return CpuidRegisters{};
  return r;
}

/// XCR0: which register states the operating system saves (bit 1 SSE, 2 AVX, 5-7 opmask/zmm, 17-18 tiles).
inline std::uint64_t read_xcr0() {
  unsigned low = 0, high = 0;
  __asm__ volatile("xgetbv" : "=a"(low), "=d"(high) : "c"(0));
  return (static_cast<std::uint64_t>(high) << 32) | low;
}

inline bool bit(unsigned value, int index) { return ((value >> index) & 1u) != 0; }

/// The CPU's flags, levels left at generic.
inline CpuInfo detect_cpu() {
  CpuInfo info;
  const CpuidRegisters vendor = cpuid(0);
  char name[13] = {};
  std::memcpy(name, &vendor.ebx, 4);
  std::memcpy(name + 4, &vendor.edx, 4);
  std::memcpy(name + 8, &vendor.ecx, 4);
  info.vendor = name;
  if (cpuid(0x80000000u).eax >= 0x80000004u) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      const CpuidRegisters r = cpuid(0x80000002u + i);
      std::memcpy(brand + 16 * i, &r, 16);
    }
    info.model = brand;
    const auto first = info.model.find_first_not_of(' ');
    info.model = first == std::string::npos ? std::string() : info.model.substr(first);
  }
  const CpuidRegisters leaf1 = cpuid(1);
  const bool osxsave = bit(leaf1.ecx, 27);
  const std::uint64_t xcr0 = osxsave ? read_xcr0() : 0;
  const bool ymm_state = (xcr0 & 0x6u) == 0x6u;              // SSE and AVX registers
  const bool zmm_state = ymm_state && (xcr0 & 0xE0u) == 0xE0u;  // opmask, upper zmm0-15, zmm16-31
  const bool tile_state = (xcr0 & 0x60000u) == 0x60000u;     // TILECFG, TILEDATA
  if (vendor.eax < 7) return info;
  const CpuidRegisters leaf7 = cpuid(7), leaf7_1 = cpuid(7, 1);
  info.fma = ymm_state && bit(leaf1.ecx, 12);
  info.f16c = ymm_state && bit(leaf1.ecx, 29);
  info.avx2 = ymm_state && bit(leaf1.ecx, 28) && bit(leaf7.ebx, 5);
  info.avx512f = zmm_state && bit(leaf7.ebx, 16);
  info.avx512dq = zmm_state && bit(leaf7.ebx, 17);
  info.avx512bw = zmm_state && bit(leaf7.ebx, 30);
  info.avx512vl = zmm_state && bit(leaf7.ebx, 31);
  info.avx512_bf16 = info.avx512f && bit(leaf7_1.eax, 5);
  info.amx_tile = tile_state && bit(leaf7.edx, 24);
  info.amx_bf16 = tile_state && bit(leaf7.edx, 22);
  // The base family plus the extended family: 0x19 is Zen 3 and Zen 4, 0x1A Zen 5 (Zen 3 has no AVX512-BF16).
  const unsigned family = ((leaf1.eax >> 8) & 0xFu) + ((leaf1.eax >> 20) & 0xFFu);
  info.bf16_products_faster = info.avx512_bf16 && info.vendor == "AuthenticAMD" && family >= 0x19;
  return info;
}
#else
inline CpuInfo detect_cpu() { return CpuInfo{}; }
#endif

/// The highest level of `info` this build dispatches to.
inline Isa best_level(const CpuInfo& info) {
  if (!SELFATTN_DISPATCH_X86 || !info.avx2 || !info.fma) return Isa::generic;
  if (!(info.avx512f && info.avx512bw && info.avx512dq && info.avx512vl)) return Isa::avx2;
  return info.avx512_bf16 ? Isa::avx512_bf16 : Isa::avx512;
}

/// SELFATTN_ISA's value as a level; throws std::invalid_argument for an unknown name or one above `best`.
inline Isa parse_isa_override(const std::string& value, const CpuInfo& info) {
  const Isa levels[] = {Isa::generic, Isa::avx2, Isa::avx512, Isa::avx512_bf16};
  for (Isa level : levels) {
    if (value != to_string(level)) continue;
    if (static_cast<int>(level) > static_cast<int>(info.best))
      throw std::invalid_argument("SELFATTN_ISA=" + value + ": this CPU (" +
                                  (info.model.empty() ? std::string("unknown") : info.model) + ") and build support " +
                                  "levels up to " + to_string(info.best) + "; choose one of them");
    return level;
  }
  throw std::invalid_argument("SELFATTN_ISA=" + value + ": expected one of generic, avx2, avx512, avx512_bf16");
}

/// The kernel each dispatched entry runs at `selected` (what docs/dispatch.md tabulates).
inline std::vector<std::pair<std::string, std::string>> kernels_at(Isa selected, bool bf16_products) {
  const std::string generic = std::string("generic (") + compiled_simd() + ", as compiled)";
  const std::string vector_kernel = selected >= Isa::avx512 ? std::string("avx512 (16 floats per vector)")
                                    : selected == Isa::avx2 ? std::string("avx2 (8 floats per vector, FMA)")
                                                            : generic;
  const bool linear_dispatched = std::min(selected, Isa::avx512) > compiled_level();
  return {{"fused forward and backward, float", vector_kernel},
          {"linear layers (projections, FFN) and their backward, float",
           linear_dispatched ? vector_kernel : "Eigen's GEMM, as compiled"},
          {"fused forward and backward, double", generic},
          {"bfloat16 attention", bf16_products ? "avx512_bf16 (vdpbf16ps dot products, 32 bfloat16 per vector)"
                                               : "widened to float, " + vector_kernel},
          {"decode kernel, all three paths (float, 16-bit caches)", vector_kernel},
          {"few-row projections (a decode step's, float or 16-bit weights)", vector_kernel}};
}

/// The detection and the override, resolved.
inline CpuInfo resolve_cpu_info() {
  CpuInfo info = detect_cpu();
  info.best = best_level(info);
  info.selected = info.best;
  if (const char* value = std::getenv("SELFATTN_ISA"); value != nullptr && *value != '\0') {
    info.selected = parse_isa_override(value, info);
    info.overridden = true;
  }
  info.kernels = kernels_at(info.selected, info.selected == Isa::avx512_bf16 && info.bf16_products_faster);
  return info;
}

}  // namespace detail

/// The CPU and the level the kernels run at, found on the first call and kept for the life of the process
/// (thread-safe). Throws std::invalid_argument when SELFATTN_ISA names an unknown level or one this CPU lacks.
inline const CpuInfo& cpu_info() {
  static const CpuInfo info = detail::resolve_cpu_info();
  return info;
}

/// cpu_info() in a few lines, for a log or a bug report.
inline std::string to_string(const CpuInfo& info) {
  std::string text = "cpu: " + (info.vendor.empty() ? std::string("unknown") : info.vendor) +
                     (info.model.empty() ? std::string() : ", " + info.model) + "\n";
  text += "found:";
  const std::pair<const char*, bool> flags[] = {
      {"avx2", info.avx2},         {"fma", info.fma},           {"f16c", info.f16c},
      {"avx512f", info.avx512f},   {"avx512bw", info.avx512bw}, {"avx512dq", info.avx512dq},
      {"avx512vl", info.avx512vl}, {"avx512_bf16", info.avx512_bf16}, {"amx_tile", info.amx_tile},
      {"amx_bf16", info.amx_bf16}};
  for (const auto& [name, present] : flags)
    if (present) text += std::string(" ") + name;
  text += std::string("\nlevel: ") + to_string(info.selected) + (info.overridden ? " (SELFATTN_ISA)" : "") +
          ", best " + to_string(info.best) + ", compiled " + detail::compiled_simd() + "\n";
  for (const auto& [entry, kernel] : info.kernels) text += "  " + entry + ": " + kernel + "\n";
  return text;
}

}  // namespace selfattn
