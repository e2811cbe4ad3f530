/// \file
/// Atomic file replacement, for every file the library writes: `write_npy`, `SafetensorsWriter::write` (and so
/// state dicts saved through it), and the `write_*` functions of plot/ (SVG and CSV).
///
/// A write never truncates the file it replaces. The bytes go to a new temporary file in the same directory
/// (`<path>.tmp-<process>-<hex>`, created exclusively, so two writers never share one), which is written,
/// flushed, fsynced and closed, each step checked; only then is it renamed over `path`. Rename within one
/// directory is atomic on POSIX file systems: a reader, or a crash, sees the old file or the whole new one,
/// never a mix. On any failure the temporary is removed, the old file is left byte for byte as it was, and
/// std::runtime_error names the path, the step that failed and the system's reason:
/// \code{.unparsed}
///   [write_npy] cannot write 'model.npy': writing the temporary file 'model.npy.tmp-4242-9f3c...' failed: File
///   too large; 'model.npy' is left as it was
/// \endcode
///
/// Details:
/// - A symbolic link at `path` is followed: the file it points to is replaced and the link stays a link.
/// - A replaced file keeps its permission bits (owner and group are the writer's, as for any new file).
/// - The directory must be writable, since the temporary is created there (a writable file in a read-only
///   directory cannot be replaced this way; the write throws and changes nothing). A read-only file is not
///   replaced either: the write throws, as opening the file for writing would.
/// - A path that exists but is not a regular file (a device such as /dev/stdout, a pipe) cannot be renamed
///   over: it is written directly, with the same checks, and without the atomicity.
/// - Without POSIX (`SELFATTN_ATOMIC_WRITE_FSYNC` is 0, e.g. on Windows) the temporary is written with
///   std::ofstream and flushed, but not fsynced, and std::filesystem::rename replaces the target; the old file
///   is still never truncated, but a power failure just after the write may lose the new data.
/// - The directory entry is not fsynced: after a power failure the rename itself may be undone, which leaves
///   the old file (never a partial one).
#pragma once

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#if defined(__unix__) || (defined(__APPLE__) && defined(__MACH__))
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
/// 1 when writes are fsynced before the rename (POSIX), 0 when they are only flushed (see io/atomic_file.hpp).
#define SELFATTN_ATOMIC_WRITE_FSYNC 1
#else
#include <fstream>
#include <ios>
/// 1 when writes are fsynced before the rename (POSIX), 0 when they are only flushed (see io/atomic_file.hpp).
#define SELFATTN_ATOMIC_WRITE_FSYNC 0
#endif

namespace selfattn {
namespace detail {

/// The std::runtime_error of a failed write: `[function] cannot write 'path': step[: reason]; outcome`.
[[noreturn]] inline void throw_write_error(const char* function, const std::string& path, const std::string& step,
                                           std::error_code reason, const char* outcome) {
  std::string message = std::string("[") + function + "] cannot write '" + path + "': " + step;
  if (reason) message += ": " + reason.message();
  throw std::runtime_error(message + "; '" + path + "' " + outcome);
}

/// Where the bytes for `path` end up: the file a symbolic link points to (so that the link survives the
/// rename), else `path` itself. A dangling link is replaced by the file.
inline std::string atomic_write_target(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::is_symlink(fs::symlink_status(path, error))) return path;
  const fs::path resolved = fs::canonical(path, error);
  return error ? path : resolved.string();
}

/// `target.tmp-<process>-<hex>`: the process id (POSIX) and a hash of the thread, the clock and the attempt
/// number, so concurrent writers (other processes, threads, calls) pick different names; creating the file
/// exclusively makes a collision a retry, never a shared file.
inline std::string temporary_path_for(const std::string& target, unsigned attempt) {
  std::size_t mix = std::hash<std::thread::id>{}(std::this_thread::get_id());
  const auto tick = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  mix ^= std::hash<std::uint64_t>{}(tick + attempt) + 0x9e3779b97f4a7c15ull + (mix << 6) + (mix >> 2);
  static const char digits[] = "0123456789abcdef";
  std::string hex;
  for (std::size_t n = 0; n < 2 * sizeof mix; ++n) hex.push_back(digits[(mix >> (4 * n)) & 0xfu]);
  std::string process;
#if SELFATTN_ATOMIC_WRITE_FSYNC
  process = std::to_string(static_cast<long long>(::getpid())) + "-";
#endif
  return target + ".tmp-" + process + hex;
}

#if SELFATTN_ATOMIC_WRITE_FSYNC

/// An errno value as the std::error_code that throw_write_error takes.
inline std::error_code posix_error(int error_number) { return std::error_code(error_number, std::generic_category()); }

/// An open temporary file: closed and removed when it goes out of scope, unless committed (renamed).
class TemporaryFile {
 public:
  TemporaryFile(std::string path, int descriptor) : path_(std::move(path)), descriptor_(descriptor) {}
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;
  ~TemporaryFile() {
    if (descriptor_ >= 0) ::close(descriptor_);
    if (!committed_) ::unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }
  int descriptor() const { return descriptor_; }
  /// close(2), once; 0 or the errno it reported (NFS, for one, reports a failed write only here).
  int close() {
    const int result = ::close(descriptor_);
    descriptor_ = -1;
    return result == 0 ? 0 : errno;
  }
  void commit() { committed_ = true; }

 private:
  std::string path_;
  int descriptor_;
  bool committed_ = false;
};

/// Every byte to `descriptor`, through short writes and signals; 0 or the errno of the write that failed.
inline int write_all(int descriptor, const char* data, std::size_t size) {
  constexpr std::size_t max_chunk = std::size_t{1} << 30;  // Linux writes at most about 2 GiB per call
  while (size > 0) {
    const ::ssize_t written = ::write(descriptor, data, std::min(size, max_chunk));
    if (written < 0 && errno == EINTR) continue;
    if (written < 0) return errno;
    if (written == 0) return EIO;
    data += written;
    size -= static_cast<std::size_t>(written);
  }
  return 0;
}

/// A device or pipe cannot be renamed over: write into it, with the same checks, and no fsync (which pipes
/// and terminals reject).
inline void write_in_place(const char* function, const std::string& path, const std::string& target,
                           const std::string& bytes) {
  const char* outcome = "was written in place (not a regular file, so not atomically)";
  const int descriptor = ::open(target.c_str(), O_WRONLY | O_CLOEXEC);
  if (descriptor < 0) throw_write_error(function, path, "opening it failed", posix_error(errno), "is unchanged");
  const int write_error = write_all(descriptor, bytes.data(), bytes.size());
  const int close_error = ::close(descriptor) == 0 ? 0 : errno;
  if (write_error != 0) throw_write_error(function, path, "writing failed", posix_error(write_error), outcome);
  if (close_error != 0) throw_write_error(function, path, "closing failed", posix_error(close_error), outcome);
}

/// Creates a new temporary file beside `target`, exclusively (O_EXCL), retrying on a name already taken.
inline TemporaryFile create_temporary_beside(const char* function, const std::string& path, const std::string& target) {
  constexpr unsigned max_attempts = 100;
  int error_number = 0;
  for (unsigned attempt = 0; attempt < max_attempts; ++attempt) {
    std::string temporary = temporary_path_for(target, attempt);
    const int descriptor = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (descriptor >= 0) return TemporaryFile(std::move(temporary), descriptor);
    error_number = errno;
    if (error_number != EEXIST) break;
  }
  throw_write_error(function, path, "creating a temporary file in its directory failed", posix_error(error_number),
                    "is left as it was");
}

/// Replaces the file at `path` with `bytes`, atomically (see the file comment); std::runtime_error otherwise.
inline void write_file_atomically(const char* function, const std::string& path, const std::string& bytes) {
  const char* untouched = "is left as it was";
  const std::string target = atomic_write_target(path);
  struct ::stat existing {};
  const bool exists = ::stat(target.c_str(), &existing) == 0;
  if (exists && !S_ISREG(existing.st_mode)) {
    write_in_place(function, path, target, bytes);
    return;
  }
  // rename(2) would replace a read-only file regardless of its mode: refuse it, as opening it for writing would.
  if (exists && ::access(target.c_str(), W_OK) != 0)
    throw_write_error(function, path, "it is not writable", posix_error(errno), untouched);
  TemporaryFile temporary = create_temporary_beside(function, path, target);
  const std::string step_on = "the temporary file '" + temporary.path() + "' failed";
  // A replacement keeps the old file's permissions (a private key stays private).
  if (exists && ::fchmod(temporary.descriptor(), existing.st_mode & 07777) != 0)
    throw_write_error(function, path, "setting the permissions of " + step_on, posix_error(errno), untouched);
  if (const int error_number = write_all(temporary.descriptor(), bytes.data(), bytes.size()))
    throw_write_error(function, path, "writing " + step_on, posix_error(error_number), untouched);
  if (::fsync(temporary.descriptor()) != 0)
    throw_write_error(function, path, "fsync of " + step_on, posix_error(errno), untouched);
  if (const int error_number = temporary.close())
    throw_write_error(function, path, "closing " + step_on, posix_error(error_number), untouched);
  if (::rename(temporary.path().c_str(), target.c_str()) != 0)
    throw_write_error(function, path, "renaming " + step_on, posix_error(errno), untouched);
  temporary.commit();
}

#else  // not POSIX: std::ofstream and std::filesystem only

/// Replaces the file at `path` with `bytes`: written, flushed and closed beside it, then renamed over it; the
/// old file is never truncated, but nothing is fsynced (see the file comment).
inline void write_file_atomically(const char* function, const std::string& path, const std::string& bytes) {
  namespace fs = std::filesystem;
  const char* untouched = "is left as it was";
  const std::string target = atomic_write_target(path);
  std::error_code error;
  std::string temporary;
  for (unsigned attempt = 0; temporary.empty() || fs::exists(temporary, error); ++attempt) {
    if (attempt == 100) throw_write_error(function, path, "no free temporary file name beside it", {}, untouched);
    temporary = temporary_path_for(target, attempt);
  }
  struct RemoveUnlessRenamed {
    const std::string& file;
    bool renamed = false;
    ~RemoveUnlessRenamed() {
      std::error_code ignored;
      if (!renamed) fs::remove(file, ignored);
    }
  } cleanup{temporary};
  std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
  if (!out) throw_write_error(function, path, "creating the temporary file '" + temporary + "' failed", {}, untouched);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.flush();
  out.close();
  if (!out) throw_write_error(function, path, "writing the temporary file '" + temporary + "' failed", {}, untouched);
  fs::rename(temporary, target, error);
  if (error)
    throw_write_error(function, path, "renaming the temporary file '" + temporary + "' failed", error, untouched);
  cleanup.renamed = true;
}

#endif

}  // namespace detail
}  // namespace selfattn
