// tests/fuzz/replay_main.cpp — runs a libFuzzer target's LLVMFuzzerTestOneInput on files, without libFuzzer.
//
//   attention_fuzz_replay tests/fuzz/corpus/attention        (every file of a directory, sorted)
//   attention_fuzz_replay crash-1234 seed-7                 (single files)
// This is how the committed corpus, and every crash input the fuzzer ever found, run as a ctest test on any
// compiler: a finding aborts the program, which fails the test.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

int run_file(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    std::fprintf(stderr, "replay: cannot read %s\n", path.string().c_str());
    return 1;
  }
  const std::vector<char> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::filesystem::path> files;
  for (int a = 1; a < argc; ++a) {
    const std::filesystem::path arg(argv[a]);
    if (std::filesystem::is_directory(arg)) {
      for (const auto& entry : std::filesystem::directory_iterator(arg))
        if (entry.is_regular_file()) files.push_back(entry.path());
    } else {
      files.push_back(arg);
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "replay: no input files (usage: %s <file-or-directory>...)\n", argv[0]);
    return 1;
  }
  int failures = 0;
  for (const auto& file : files) failures += run_file(file);
  std::printf("replay: ran %zu inputs\n", files.size());
  return failures == 0 ? 0 : 1;
}
