/// \file
/// MpiError and the small MPI helpers ring attention (selfattn/distributed.hpp) is built on: return codes turned
/// into exceptions, the MPI datatype of float and double, a private duplicate of the caller's communicator, and
/// non-blocking requests that are always completed before their buffers go away.
///
/// Needs an MPI implementation's `<mpi.h>` (Debian: libopenmpi-dev; CMake: `find_package(MPI COMPONENTS CXX)`
/// and link `MPI::MPI_CXX`). Without `<mpi.h>` on the include path this header defines `SELFATTN_HAS_MPI` as 0
/// and nothing else. (`SELFATTN_DOXYGEN`, defined by the documentation build only, shows the API without MPI.)
#pragma once

#if __has_include(<mpi.h>) || defined(SELFATTN_DOXYGEN)
#include <mpi.h>

#include <selfattn/errors.hpp>

#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

/// 1 when `<mpi.h>` is available and selfattn/distributed.hpp defines its API, else 0.
#define SELFATTN_HAS_MPI 1

namespace selfattn {

/// \brief Thrown when an MPI call returns an error code: the message names the function, the MPI call and MPI's
/// own text for the code (MPI_Error_string); `error_code()` is the code. A std::runtime_error, not an
/// std::invalid_argument: the arguments were valid, the communication failed.
/// \code
/// try {
///   auto fwd = ring_attention_forward(MPI_COMM_WORLD, SequenceLayout::zigzag, q, k, v, opts);
/// } catch (const MpiError& e) {
///   std::fprintf(stderr, "%s (MPI error %d)\n", e.what(), e.error_code());
/// }
/// \endcode
class MpiError : public std::runtime_error {
 public:
  /// An error of MPI code `code` with the full message `message`.
  MpiError(int code, const std::string& message) : std::runtime_error(message), code_(code) {}
  /// The MPI error code the call returned.
  int error_code() const { return code_; }

 private:
  int code_;
};

namespace detail {

/// Throws MpiError unless `code` is MPI_SUCCESS: "[function] MPI_Isend failed: <MPI's text for the code>".
inline void check_mpi(int code, const char* function, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  std::string reason = MPI_Error_string(code, text, &length) == MPI_SUCCESS
                           ? std::string(text, static_cast<std::size_t>(length))
                           : "unknown MPI error";
  throw MpiError(code, std::string("[") + function + "] " + call + " failed: " + reason + " (MPI error code " +
                           std::to_string(code) + ")");
}

/// The MPI datatype of a float or double.
template <typename T>
MPI_Datatype mpi_datatype() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "selfattn: MPI transfers float or double");
  if constexpr (std::is_same_v<T, float>)
    return MPI_FLOAT;
  else
    return MPI_DOUBLE;
}

/// Throws std::logic_error unless MPI is initialised and not yet finalised: any other MPI call would abort.
inline void check_mpi_running(const char* function) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    throw std::logic_error(std::string("[") + function + "] MPI is " +
                           (finalized ? "already finalised" : "not initialised") +
                           ": call it between MPI_Init and MPI_Finalize");
}

/// A private duplicate of the caller's communicator (collective: every rank of `comm` creates it), freed on
/// destruction. Our messages then never match the caller's pending ones whatever their tags, and its error handler
/// is MPI_ERRORS_RETURN, so that a failed call returns a code (which check_mpi turns into MpiError) instead of
/// aborting every process, the default of MPI_COMM_WORLD.
class PrivateCommunicator {
 public:
  PrivateCommunicator(MPI_Comm comm, const char* function) {
    check_mpi(MPI_Comm_dup(comm, &comm_), function, "MPI_Comm_dup");
    const int code = MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    if (code != MPI_SUCCESS) {
      MPI_Comm_free(&comm_);
      check_mpi(code, function, "MPI_Comm_set_errhandler");
    }
    check_mpi(MPI_Comm_rank(comm_, &rank_), function, "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm_, &size_), function, "MPI_Comm_size");
  }
  PrivateCommunicator(const PrivateCommunicator&) = delete;
  PrivateCommunicator& operator=(const PrivateCommunicator&) = delete;
  ~PrivateCommunicator() { MPI_Comm_free(&comm_); }

  MPI_Comm get() const { return comm_; }  ///< the duplicate
  int rank() const { return rank_; }      ///< this process's rank in it
  int size() const { return size_; }      ///< the number of ranks

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

/// Non-blocking requests in flight. Destruction waits for any still pending (an exception thrown between posting
/// and waiting must not free a buffer MPI is still reading or writing): declare it after the buffers it uses, so
/// that it is destroyed first.
class PendingRequests {
 public:
  PendingRequests() = default;
  PendingRequests(const PendingRequests&) = delete;
  PendingRequests& operator=(const PendingRequests&) = delete;
  ~PendingRequests() {
    if (!requests_.empty()) MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  }

  /// Posts MPI_Isend of `count` elements at `data` to rank `to`.
  template <typename T>
  void send(const T* data, int count, int to, int tag, MPI_Comm comm, const char* function) {
    requests_.push_back(MPI_REQUEST_NULL);
    check_mpi(MPI_Isend(data, count, mpi_datatype<T>(), to, tag, comm, &requests_.back()), function, "MPI_Isend");
  }
  /// Posts MPI_Irecv of `count` elements into `data` from rank `from`.
  template <typename T>
  void receive(T* data, int count, int from, int tag, MPI_Comm comm, const char* function) {
    requests_.push_back(MPI_REQUEST_NULL);
    check_mpi(MPI_Irecv(data, count, mpi_datatype<T>(), from, tag, comm, &requests_.back()), function, "MPI_Irecv");
  }
  /// Waits for every posted request; throws MpiError if one failed.
  void wait_all(const char* function) {
    if (requests_.empty()) return;
    const int code = MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
    requests_.clear();  // completed (or failed): nothing left to wait for either way
    check_mpi(code, function, "MPI_Waitall");
  }

 private:
  std::vector<MPI_Request> requests_;
};

}  // namespace detail
}  // namespace selfattn

#else
/// 0: `<mpi.h>` is not available, so selfattn/distributed.hpp defines nothing but the layout helpers.
#define SELFATTN_HAS_MPI 0
#endif
