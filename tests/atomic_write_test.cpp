// tests/atomic_write_test.cpp — every file the library writes is replaced atomically (selfattn/io/atomic_file.hpp):
// a write that fails midway leaves the old file byte for byte and no temporary file beside it. Each writer
// (write_npy, SafetensorsWriter::write, write_attention_csv, write_attention_heatmap_svg, write_line_charts_svg)
// rewrites a good file under a file-size limit in a forked child (always runs, root included), into a read-only
// directory (not as root: root ignores permissions), and into /dev/full (where it exists).
#include <selfattn/selfattn.hpp>
#include <selfattn/io/safetensors.hpp>

#include "support/expect_error.hpp"

#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <ostream>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

using namespace selfattn;
using selfattn::test::expect_error;

namespace {

namespace fs = std::filesystem;

// One writer of the library: `write(path, version)` writes the file whose bytes are `encode(version)`. Versions
// differ in content, and every file is tens of kilobytes, so a limit of half its size fails the write after some
// bytes have gone to disk.
struct Writer {
  std::string name;
  std::function<void(const std::string& path, int version)> write;
  std::function<std::string(int version)> encode;
};
void PrintTo(const Writer& writer, std::ostream* out) { *out << writer.name; }

// An (n, n) matrix of values in [0, 1): 96 for the binary files (36 KiB of float), 48 for the text ones.
Tensor<float, 2> values(int version, Index n = 48) {
  Tensor<float, 2> w({n, n});
  for (Index n = 0; n < w.size(); ++n) w.data()[n] = static_cast<float>((n * 7 + version) % 97) / 97.0f;
  return w;
}

LineChart chart(int version) {
  LineChart c;
  c.title = "version " + std::to_string(version);
  LineSeries s;
  s.label = "values";
  for (int n = 0; n < 2000; ++n) {
    s.x.push_back(n);
    s.y.push_back((n * 7 + version) % 97);
  }
  c.series.push_back(s);
  return c;
}

std::vector<Writer> writers() {
  std::vector<Writer> all{
      {"npy", [](const std::string& path, int v) { write_npy(path, values(v, 96)); },
       [](int v) { return encode_npy(values(v, 96)); }},
      {"csv", [](const std::string& path, int v) { write_attention_csv(path, values(v)); },
       [](int v) { return attention_csv(values(v)); }},
      {"heatmap_svg", [](const std::string& path, int v) { write_attention_heatmap_svg(path, values(v), {}, {}); },
       [](int v) { return attention_heatmap_svg(values(v), {}, {}); }},
      {"line_chart_svg", [](const std::string& path, int v) { write_line_charts_svg(path, {chart(v)}); },
       [](int v) { return line_charts_svg({chart(v)}); }},
  };
#if SELFATTN_HAS_SAFETENSORS
  const auto safetensors = [](int v) {
    SafetensorsWriter w;
    w.add("w", values(v, 96));
    return w;
  };
  all.push_back({"safetensors", [=](const std::string& path, int v) { safetensors(v).write(path); },
                 [=](int v) { return safetensors(v).encode(); }});
#endif
  return all;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Entries of `directory` named like a temporary file of a write to `directory/stem` ("<stem>.tmp-..."); any
// stem when `stem` is empty.
std::vector<std::string> temporaries_in(const std::string& directory, const std::string& stem = "") {
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(directory)) {
    const std::string name = entry.path().filename().string();
    const std::size_t at = name.find(".tmp-");
    if (at != std::string::npos && (stem.empty() || name.compare(0, at, stem) == 0)) found.push_back(name);
  }
  return found;
}

class AtomicWrite : public ::testing::TestWithParam<Writer> {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("selfattn_atomic_write_" + std::to_string(std::random_device{}()))).string();
    fs::create_directories(dir_);
    target_ = dir_ + "/file." + GetParam().name;
  }
  void TearDown() override {
    std::error_code ignored;
    fs::permissions(dir_, fs::perms::owner_all, ignored);
    fs::remove_all(dir_, ignored);
  }
  /// Writes version 1 and checks it arrived whole.
  std::string write_good_file() {
    GetParam().write(target_, 1);
    const std::string good = read_file(target_);
    EXPECT_EQ(good, GetParam().encode(1));
    EXPECT_GT(good.size(), 16000u) << "large enough for a limit of half its size to fail a write midway";
    EXPECT_GT(GetParam().encode(2).size(), good.size() / 2) << "the rewrite must exceed the limit";
    EXPECT_NE(GetParam().encode(2), good);
    return good;
  }
  void expect_untouched(const std::string& good) {
    EXPECT_TRUE(read_file(target_) == good) << "the old file changed: " << read_file(target_).size() << " bytes, was "
                                            << good.size();
    EXPECT_EQ(temporaries_in(dir_), std::vector<std::string>{}) << "a temporary file was left behind";
  }

  std::string dir_, target_;
};

TEST_P(AtomicWrite, ReplacesTheWholeFileAndLeavesNoTemporary) {
  write_good_file();
  GetParam().write(target_, 2);
  EXPECT_TRUE(read_file(target_) == GetParam().encode(2));
  EXPECT_EQ(temporaries_in(dir_), std::vector<std::string>{});
}

// The failure of issue 32: rewriting a good file under a file-size limit used to leave it truncated at the limit.
// The child process takes the limit (and ignores SIGXFSZ, so that write() fails with EFBIG instead of killing
// it); its exit code says what it saw: 0 the expected std::runtime_error, 1 no exception, 2 another exception, 3
// a message without the path, the reason or the outcome.
TEST_P(AtomicWrite, FileSizeLimitMidwayLeavesTheOldFile) {
  const std::string good = write_good_file();
  std::fflush(nullptr);
  const pid_t child = fork();
  ASSERT_GE(child, 0) << "fork failed";
  if (child == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    const rlim_t limit = good.size() / 2;
    const struct rlimit file_size {limit, limit};
    if (setrlimit(RLIMIT_FSIZE, &file_size) != 0) _exit(4);
    try {
      GetParam().write(target_, 2);
      _exit(1);
    } catch (const std::runtime_error& error) {
      const std::string message = error.what();
      const bool named = message.find(target_) != std::string::npos &&
                         message.find("File too large") != std::string::npos &&
                         message.find("is left as it was") != std::string::npos;
      if (!named) std::fprintf(stderr, "child: message: %s\n", message.c_str());
      _exit(named ? 0 : 3);
    } catch (...) {
      _exit(2);
    }
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: no exception, 2: not std::runtime_error, 3: message, 4: setrlimit";
  expect_untouched(good);
}

// A temporary cannot be created in a read-only directory: the write fails before any byte moves. A read-only file
// in a writable directory is not replaced either, as before atomic writes (rename would not check its mode).
TEST_P(AtomicWrite, ReadOnlyDirectoryOrFileLeavesTheOldFile) {
  if (geteuid() == 0) GTEST_SKIP() << "root writes regardless of permissions";
  const std::string good = write_good_file();
  fs::permissions(dir_, fs::perms::owner_read | fs::perms::owner_exec);
  expect_error<std::runtime_error>([&] { GetParam().write(target_, 2); },
                                   {target_, "Permission denied", "is left as it was"});
  fs::permissions(dir_, fs::perms::owner_all);
  expect_untouched(good);

  fs::permissions(target_, fs::perms::owner_read);
  expect_error<std::runtime_error>([&] { GetParam().write(target_, 2); },
                                   {target_, "Permission denied", "is left as it was"});
  expect_untouched(good);
}

// /dev/full accepts the open and fails every write with ENOSPC. It is not a regular file, so it is written in
// place (a device cannot be renamed over): the error must still be reported, and nothing left in /dev.
TEST_P(AtomicWrite, FullDeviceIsAnErrorNamingIt) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  expect_error<std::runtime_error>([&] { GetParam().write("/dev/full", 2); },
                                   {"/dev/full", "No space left on device"});
  EXPECT_TRUE(fs::is_character_file("/dev/full"));
  EXPECT_EQ(temporaries_in("/dev", "full"), std::vector<std::string>{});
}

TEST_P(AtomicWrite, MissingDirectoryNamesThePath) {
  const std::string missing = dir_ + "/no/such/dir/file";
  expect_error<std::runtime_error>([&] { GetParam().write(missing, 1); },
                                   {missing, "creating a temporary file", "No such file or directory"});
}

// Through a symbolic link the file it points to is replaced, and the link stays a link.
TEST_P(AtomicWrite, SymbolicLinkIsFollowed) {
  write_good_file();
  const std::string link = dir_ + "/link";
  fs::create_symlink(target_, link);
  GetParam().write(link, 2);
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_TRUE(read_file(target_) == GetParam().encode(2));
  EXPECT_EQ(temporaries_in(dir_), std::vector<std::string>{});
}

TEST_P(AtomicWrite, ReplacementKeepsThePermissions) {
  write_good_file();
  const fs::perms mode = fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read;
  fs::permissions(target_, mode);
  GetParam().write(target_, 2);
  EXPECT_EQ(fs::status(target_).permissions(), mode);
}

// Threads rewriting one file each pick their own temporary (the name has the thread and the clock in it, and it is
// created exclusively): the file ends up as one whole version, whichever rename came last.
TEST_P(AtomicWrite, ConcurrentWritersLeaveOneWholeFile) {
  constexpr int threads = 4, writes_each = 5;
  std::vector<std::string> versions;
  for (int v = 0; v < threads; ++v) versions.push_back(GetParam().encode(v));
  std::vector<std::thread> pool;
  std::atomic<int> failures{0};
  for (int v = 0; v < threads; ++v)
    pool.emplace_back([&, v] {
      for (int n = 0; n < writes_each; ++n) {
        try {
          GetParam().write(target_, v);
        } catch (const std::exception&) {
          ++failures;
        }
      }
    });
  for (std::thread& t : pool) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_NE(std::find(versions.begin(), versions.end(), read_file(target_)), versions.end())
      << "the file is not one whole version";
  EXPECT_EQ(temporaries_in(dir_), std::vector<std::string>{});
}

INSTANTIATE_TEST_SUITE_P(Writers, AtomicWrite, ::testing::ValuesIn(writers()),
                         [](const ::testing::TestParamInfo<Writer>& info) { return info.param.name; });

}  // namespace
