// tests/support/fixture.hpp — loader for the PyTorch conformance fixtures in tests/fixtures/.
//
// The files are written by tests/pytorch/make_fixtures.py (format: tests/pytorch/README.md):
//
//   # selfattn fixture v1 <case>
//   int <name> <value>
//   tensor <name> <rank> <d0> ... <d_{rank-1}>
//   <all values, row-major, space-separated, printed with %.17g>
//
// Values are read with `>>` into double in the classic locale, which round-trips %.17g exactly.
//
//   auto fx = selfattn::test::load_fixture(selfattn::test::fixture_path("mha_self_basic.txt"));
//   Index E = fx.integer("embed_dim");
//   Tensor<double, 3> x = fx.tensor<3>("query");
//   Tensor<float, 3> xf = fx.tensor<3, float>("query");     // converted element type
//   Tensor<bool, 4> allowed = fx.tensor<4, bool>("allowed");  // nonzero -> true
//   std::vector<Index> lengths = fx.indices("key_lengths");
#pragma once

#include <selfattn/tensor.hpp>

#include <array>
#include <cstddef>
#include <fstream>
#include <locale>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#ifndef SELFATTN_FIXTURE_DIR
#error "SELFATTN_FIXTURE_DIR must be defined (a string literal: the absolute path of tests/fixtures)"
#endif

namespace selfattn::test {

/// The absolute path of a file in tests/fixtures.
inline std::string fixture_path(const std::string& file) { return std::string(SELFATTN_FIXTURE_DIR) + "/" + file; }

struct Fixture {
  struct Entry {
    std::vector<Index> shape;
    std::vector<double> values;  // row-major
  };

  std::string path;                      // file it was read from
  std::string name;                      // case name from the header line
  std::map<std::string, Index> ints;     // `int` lines
  std::map<std::string, Entry> tensors;  // `tensor` entries

  /// True when an integer or a tensor of this name is present.
  bool has(const std::string& key) const { return ints.count(key) != 0 || tensors.count(key) != 0; }

  Index integer(const std::string& key) const {
    const auto it = ints.find(key);
    if (it == ints.end()) throw std::runtime_error(where() + ": no integer '" + key + "'");
    return it->second;
  }

  std::vector<Index> shape(const std::string& key) const { return entry(key).shape; }

  /// The values of a tensor, row-major, as stored.
  const std::vector<double>& values(const std::string& key) const { return entry(key).values; }

  /// A tensor of rank `Rank`, converted to element type `T` (static_cast; for bool: nonzero -> true).
  template <int Rank, typename T = double>
  selfattn::Tensor<T, Rank> tensor(const std::string& key) const {
    const Entry& e = entry(key);
    if (e.shape.size() != static_cast<std::size_t>(Rank))
      throw std::runtime_error(where() + ": tensor '" + key + "' has rank " + std::to_string(e.shape.size()) +
                               ", expected rank " + std::to_string(Rank));
    std::array<Index, Rank> dims{};
    for (std::size_t d = 0; d < dims.size(); ++d) dims[d] = e.shape[d];
    selfattn::Tensor<T, Rank> t(dims);
    T* out = t.data();
    for (std::size_t i = 0; i < e.values.size(); ++i) {
      if constexpr (std::is_same_v<T, bool>)
        out[i] = e.values[i] != 0.0;
      else
        out[i] = static_cast<T>(e.values[i]);
    }
    return t;
  }

  /// A rank-1 tensor of integral values (e.g. `key_lengths`) as a vector of Index.
  std::vector<Index> indices(const std::string& key) const {
    const Entry& e = entry(key);
    if (e.shape.size() != 1)
      throw std::runtime_error(where() + ": tensor '" + key + "' has rank " + std::to_string(e.shape.size()) +
                               ", expected rank 1");
    std::vector<Index> out;
    out.reserve(e.values.size());
    for (double v : e.values) {
      const auto i = static_cast<Index>(v);
      if (static_cast<double>(i) != v)
        throw std::runtime_error(where() + ": tensor '" + key + "' holds a non-integer value");
      out.push_back(i);
    }
    return out;
  }

 private:
  std::string where() const { return "fixture " + path; }

  const Entry& entry(const std::string& key) const {
    const auto it = tensors.find(key);
    if (it == tensors.end()) throw std::runtime_error(where() + ": no tensor '" + key + "'");
    return it->second;
  }
};

/// Reads a fixture file; throws std::runtime_error (naming the file and the entry) on any problem.
inline Fixture load_fixture(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("fixture " + path + ": cannot open");
  in.imbue(std::locale::classic());

  Fixture fx;
  fx.path = path;
  const auto fail = [&](const std::string& what) { throw std::runtime_error("fixture " + path + ": " + what); };

  std::string line;
  if (!std::getline(in, line)) fail("empty file");
  {
    std::istringstream header(line);
    header.imbue(std::locale::classic());
    std::string hash, lib, kind, version;
    header >> hash >> lib >> kind >> version >> fx.name;
    if (hash != "#" || lib != "selfattn" || kind != "fixture" || version != "v1")
      fail("bad header line '" + line + "' (expected '# selfattn fixture v1 <case>')");
  }

  std::string word;
  while (in >> word) {
    if (!word.empty() && word[0] == '#') {  // comment: skip the rest of the line
      std::getline(in, line);
      continue;
    }
    if (word != "int" && word != "tensor")
      fail("unknown entry kind '" + word + "' (expected 'int' or 'tensor'; too many values in the previous tensor?)");
    std::string key;
    if (!(in >> key)) fail("missing name after '" + word + "'");
    if (fx.has(key)) fail("duplicate entry '" + key + "'");
    if (word == "int") {
      long long v = 0;
      if (!(in >> v)) fail("bad value for integer '" + key + "'");
      fx.ints[key] = static_cast<Index>(v);
    } else {  // tensor
      int rank = -1;
      if (!(in >> rank) || rank < 0 || rank > 8) fail("bad rank for tensor '" + key + "'");
      Fixture::Entry e;
      Index count = 1;
      for (int d = 0; d < rank; ++d) {
        long long extent = -1;
        if (!(in >> extent) || extent < 0) fail("bad shape for tensor '" + key + "'");
        e.shape.push_back(static_cast<Index>(extent));
        count *= static_cast<Index>(extent);
      }
      e.values.resize(static_cast<std::size_t>(count));
      for (Index i = 0; i < count; ++i)
        if (!(in >> e.values[static_cast<std::size_t>(i)]))
          fail("tensor '" + key + "': could not read value " + std::to_string(i) + " of " + std::to_string(count));
      fx.tensors.emplace(key, std::move(e));
    }
  }
  if (!in.eof()) fail("read error");
  return fx;
}

}  // namespace selfattn::test
