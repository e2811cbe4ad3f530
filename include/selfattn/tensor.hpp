/// \file
/// Index, Tensor (owning) and TensorView (strided, non-owning), row-major Eigen maps of their 2-D slices and
/// views of row-major Eigen matrices, and the element-wise sum of two tensors (`+`, `+=`).
///
/// Both are row-major. A view's last dimension is always contiguous (stride 1) so that every row is an
/// Eigen vector and every 2-D slice is an Eigen matrix with an outer stride; the other strides are
/// free (non-negative), which is what lets split_heads and permute be views instead of copies.
#pragma once

#include <selfattn/detail/checked_size.hpp>
#include <selfattn/shape_error.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace selfattn {

/// Every extent, stride and index: `std::ptrdiff_t`, Eigen's index type, so maps and kernels need no casts.
using Index = std::ptrdiff_t;

template <typename T, int Rank>
class Tensor;

namespace detail {

template <int Rank>
std::string shape_string(const std::array<Index, Rank>& shape) {
  std::string text = "(";
  for (int d = 0; d < Rank; ++d) {
    if (d > 0) text += ", ";
    text += std::to_string(shape[static_cast<std::size_t>(d)]);
  }
  return text + ")";
}

/// The number of elements of a shape already checked (by a Tensor's or TensorView's constructor: it fits).
template <int Rank>
Index product(const std::array<Index, Rank>& shape) {
  Index n = 1;
  for (Index extent : shape) n *= extent;
  return n;
}

// Strides of a contiguous row-major tensor of this shape.
template <int Rank>
std::array<Index, Rank> row_major_strides(const std::array<Index, Rank>& shape) {
  std::array<Index, Rank> strides{};
  Index step = 1;
  for (int d = Rank - 1; d >= 0; --d) {
    strides[static_cast<std::size_t>(d)] = step;
    step *= shape[static_cast<std::size_t>(d)];
  }
  return strides;
}

template <int Rank>
void check_shape_valid(const std::array<Index, Rank>& shape) {
  for (Index extent : shape)
    if (extent < 0)
      throw std::invalid_argument("selfattn::Tensor: negative extent in shape " + shape_string<Rank>(shape));
}

/// The element count of a shape with no negative extent, checked: throws std::length_error naming `function`'s
/// `argument`, the shape and `limit` when the product of its nonzero extents (so also its row-major strides)
/// exceeds `limit` elements of `element_bytes` bytes.
template <int Rank>
Index checked_element_count(const char* function, const char* argument, const std::array<Index, Rank>& shape,
                            Index limit, std::size_t element_bytes) {
  return checked_product(shape, limit, [&] {
    return size_limit_message(function, argument, shape_string<Rank>(shape) + " holds a number of elements that",
                              limit, "elements of " + std::to_string(element_bytes) + " bytes");
  });
}

/// Row-major strides of a shape given by the caller: negative extents throw std::invalid_argument, and a shape
/// whose element count (or first stride) exceeds `limit` elements std::length_error, before any stride is computed.
template <int Rank>
std::array<Index, Rank> checked_row_major_strides(const char* function, const std::array<Index, Rank>& shape,
                                                  Index limit, std::size_t element_bytes) {
  check_shape_valid<Rank>(shape);
  checked_element_count<Rank>(function, "shape", shape, limit, element_bytes);
  return row_major_strides<Rank>(shape);
}

/// Elements from a view's first element to its last, 1 + sum_d (dim_d - 1) * stride_d, checked against `limit`
/// before the view exists (its offsets are computed in Index and its pointers in bytes); 0 when empty. Extents and
/// strides are non-negative.
template <int Rank>
Index checked_view_span(const std::array<Index, Rank>& shape, const std::array<Index, Rank>& strides, Index limit,
                        std::size_t element_bytes) {
  for (Index extent : shape)
    if (extent == 0) return 0;
  const auto message = [&] {
    return size_limit_message("TensorView", "strides",
                              "a view of shape " + shape_string<Rank>(shape) + " with strides " +
                                  shape_string<Rank>(strides) + " spans a number of elements that",
                              limit, "elements of " + std::to_string(element_bytes) + " bytes");
  };
  Index span = 1;
  for (int d = 0; d < Rank; ++d) {
    const auto du = static_cast<std::size_t>(d);
    span = checked_add(span, checked_mul(shape[du] - 1, strides[du], limit, message), limit, message);
  }
  return span;
}

/// A braced shape or stride list, `{2, 4, 5}`, as a std::array; a list of another length than the rank does not
/// compile (std::array would silently pad it with zeros: Tensor<float, 4>({2, 4, 5}) shaped (2, 4, 5, 0)).
template <int Rank, std::size_t N>
std::array<Index, Rank> extent_list(const Index (&list)[N]) {
  static_assert(N == static_cast<std::size_t>(Rank),
                "selfattn: a braced shape or stride list needs exactly one extent per dimension (Rank of them)");
  std::array<Index, Rank> extents{};
  for (std::size_t d = 0; d < N && d < extents.size(); ++d) extents[d] = list[d];
  return extents;
}

/// Calls `f(offsets)` at the first element of every row (last dimension) of N views of one shape, in
/// row-major order; `offsets[n]` is in elements of view n, whose strides are `strides[n]`. Nothing when empty.
template <int Rank, std::size_t N, typename F>
void for_each_row(const std::array<Index, Rank>& shape, const std::array<std::array<Index, Rank>, N>& strides, F&& f) {
  for (Index extent : shape)
    if (extent == 0) return;
  std::array<Index, Rank> at{};
  std::array<Index, N> offsets{};
  while (true) {
    f(offsets);
    int d = Rank - 2;  // odometer over every dimension but the last
    for (; d >= 0; --d) {
      const auto du = static_cast<std::size_t>(d);
      // Step within the dimension or rewind it; never one past its end, whose offset may lie beyond the span.
      if (at[du] + 1 < shape[du]) {
        for (std::size_t n = 0; n < N; ++n) offsets[n] += strides[n][du];
        ++at[du];
        break;
      }
      for (std::size_t n = 0; n < N; ++n) offsets[n] -= at[du] * strides[n][du];
      at[du] = 0;
    }
    if (d < 0) return;
  }
}

}  // namespace detail

/// \brief A non-owning, strided, row-major view of `Rank`-dimensional data of element type `T`.
///
/// `T` may be const (`TensorView<const float, 4>`: read-only). The last dimension is contiguous
/// (stride 1); the other strides are in elements and non-negative. A default-constructed view is
/// empty and means "absent" wherever a tensor argument is optional. Views do not own: the caller keeps
/// the data alive for as long as anything refers to it.
///
/// Shapes: any `Rank` >= 1; attention takes (B, H, L, D) views (a head split of a (B, L, E) buffer is one,
/// see split_heads), the module (B, L, E) ones.
/// \code
/// float buffer[2 * 3];
/// TensorView<float, 2> m(buffer, {2, 3});       // contiguous
/// TensorView<float, 2> col(buffer, {2, 1}, {3, 1});  // first column, strided
/// \endcode
template <typename T, int Rank>
class TensorView {
  static_assert(Rank >= 1, "selfattn::TensorView needs Rank >= 1");

 public:
  using value_type = std::remove_const_t<T>;  ///< the element type without const
  using Shape = std::array<Index, Rank>;      ///< extents (or strides), one per dimension

  /// An empty view (null data, all extents 0): "absent" where a tensor is optional.
  TensorView() = default;

  /// Wraps contiguous row-major memory. Throws std::invalid_argument for a negative extent, std::length_error
  /// for a shape of more than detail::max_elements(sizeof(T)) elements.
  TensorView(T* data, const Shape& shape)
      : TensorView(data, shape,
                   detail::checked_row_major_strides<Rank>("TensorView", shape, element_limit, element_bytes)) {}
  /// Wraps contiguous row-major memory of a braced shape, `TensorView<float, 2>(p, {2, 3})`; a list of another
  /// length than Rank does not compile.
  template <std::size_t N>
  TensorView(T* data, const Index (&shape)[N]) : TensorView(data, detail::extent_list<Rank>(shape)) {}

  /// Wraps strided memory; `strides` in elements, the last one must be 1. Throws std::invalid_argument for a
  /// negative extent or stride, or a last stride other than 1 (when the view has more than one element);
  /// std::length_error when the element count exceeds detail::max_object_size, or the elements from the first to
  /// the last, 1 + sum_d (dim_d - 1) * stride_d, exceed detail::max_elements(sizeof(T)) (offsets would wrap).
  TensorView(T* data, const Shape& shape, const Shape& strides) : data_(data), shape_(shape), strides_(strides) {
    detail::check_shape_valid<Rank>(shape);
    // A stride 0 shows elements many times over: the count may exceed the memory's, up to what Index counts.
    const Index count =
        detail::checked_element_count<Rank>("TensorView", "shape", shape, detail::max_object_size, element_bytes);
    if (strides[Rank - 1] != 1 && count > 1)
      throw std::invalid_argument("selfattn::TensorView: the last dimension must be contiguous (stride 1), got strides " +
                                  detail::shape_string<Rank>(strides));
    for (Index s : strides)
      if (s < 0)
        throw std::invalid_argument("selfattn::TensorView: strides must be non-negative, got " +
                                    detail::shape_string<Rank>(strides));
    detail::checked_view_span<Rank>(shape, strides, element_limit, element_bytes);
    strides_[Rank - 1] = 1;
  }
  /// Wraps strided memory of a braced shape and strides; lists of another length than Rank do not compile.
  template <std::size_t N, std::size_t M>
  TensorView(T* data, const Index (&shape)[N], const Index (&strides)[M])
      : TensorView(data, detail::extent_list<Rank>(shape), detail::extent_list<Rank>(strides)) {}

  /// A view of mutable data converts to a view of const data.
  template <typename U, typename = std::enable_if_t<std::is_same_v<const U, T> && !std::is_same_v<U, T>>>
  TensorView(const TensorView<U, Rank>& other)  // NOLINT(google-explicit-constructor): like T* -> const T*
      : data_(other.data()), shape_(other.shape()), strides_(other.strides()) {}

  /// A tensor converts to a view of itself (const tensors only to const views).
  template <typename U, typename = std::enable_if_t<std::is_same_v<U, T> || std::is_same_v<const U, T>>>
  TensorView(Tensor<U, Rank>& tensor)  // NOLINT(google-explicit-constructor)
      : TensorView(tensor.data(), tensor.shape()) {}
  /// \overload
  template <typename U, typename = std::enable_if_t<std::is_same_v<const U, T>>>
  TensorView(const Tensor<U, Rank>& tensor)  // NOLINT(google-explicit-constructor)
      : TensorView(tensor.data(), tensor.shape()) {}
  /// A view of a temporary tensor would dangle when the statement ends (`opts.bias = make_bias();`, `TensorView v
  /// = load();`): keep the tensor in a variable and view that.
  template <typename U, typename = std::enable_if_t<std::is_same_v<const U, T>>>
  TensorView(const Tensor<U, Rank>&& tensor) = delete;

  T* data() const { return data_; }                                            ///< first element; null when absent
  const Shape& shape() const { return shape_; }                                ///< extents
  const Shape& strides() const { return strides_; }                            ///< strides in elements; the last is 1
  Index dim(int d) const { return shape_[static_cast<std::size_t>(d)]; }       ///< extent of dimension d
  Index stride(int d) const { return strides_[static_cast<std::size_t>(d)]; }  ///< stride of dimension d
  Index size() const { return detail::product<Rank>(shape_); }                 ///< number of elements
  bool empty() const { return size() == 0; }                                   ///< no elements (e.g. "absent")

  /// True when the view covers its elements densely in row-major order.
  bool is_contiguous() const {
    const Shape dense = detail::row_major_strides<Rank>(shape_);
    for (int d = 0; d < Rank; ++d)
      if (shape_[static_cast<std::size_t>(d)] > 1 && strides_[static_cast<std::size_t>(d)] != dense[static_cast<std::size_t>(d)])
        return false;
    return true;
  }

  /// Element (i0, ..., iRank-1); bounds checked by eigen_assert (not under NDEBUG). Constness is the
  /// element type's: a const view of mutable data still writes.
  template <typename... Indices>
  T& operator()(Indices... indices) const {
    static_assert(sizeof...(Indices) == Rank, "selfattn::TensorView: wrong number of indices");
    const std::array<Index, Rank> at{static_cast<Index>(indices)...};
    Index offset = 0;
    for (int d = 0; d < Rank; ++d) {
      eigen_assert(at[static_cast<std::size_t>(d)] >= 0 && at[static_cast<std::size_t>(d)] < shape_[static_cast<std::size_t>(d)]);
      offset += at[static_cast<std::size_t>(d)] * strides_[static_cast<std::size_t>(d)];
    }
    return data_[offset];
  }

  /// The slice at index `i` of the first dimension: a view of rank `Rank - 1`.
  template <int R = Rank, typename = std::enable_if_t<(R > 1)>>
  TensorView<T, Rank - 1> operator[](Index i) const {
    eigen_assert(i >= 0 && i < shape_[0]);
    std::array<Index, Rank - 1> shape{}, strides{};
    std::copy(shape_.begin() + 1, shape_.end(), shape.begin());
    std::copy(strides_.begin() + 1, strides_.end(), strides.begin());
    return TensorView<T, Rank - 1>(data_ + i * strides_[0], shape, strides);
  }

  /// Reorders the dimensions: result dimension `d` is this view's dimension `order[d]`. The last
  /// dimension must stay last (views keep a contiguous last dimension).
  TensorView permute(const std::array<int, Rank>& order) const {
    if (order[Rank - 1] != Rank - 1)
      throw std::invalid_argument("selfattn::TensorView::permute: the last dimension must stay last");
    std::array<bool, Rank> seen{};
    Shape shape{}, strides{};
    for (int d = 0; d < Rank; ++d) {
      const int from = order[static_cast<std::size_t>(d)];
      if (from < 0 || from >= Rank || seen[static_cast<std::size_t>(from)])
        throw std::invalid_argument("selfattn::TensorView::permute: order is not a permutation of 0.." +
                                    std::to_string(Rank - 1));
      seen[static_cast<std::size_t>(from)] = true;
      shape[static_cast<std::size_t>(d)] = shape_[static_cast<std::size_t>(from)];
      strides[static_cast<std::size_t>(d)] = strides_[static_cast<std::size_t>(from)];
    }
    return TensorView(data_, shape, strides);
  }

  /// The same elements under another shape of equal size; needs a contiguous view. The rank is deduced
  /// from a `std::array<Index, N>` or given explicitly: `v.reshape<2>({6, 4})`.
  template <std::size_t N, int NewRank = static_cast<int>(N)>
  TensorView<T, NewRank> reshape(const std::array<Index, N>& shape) const {
    if (!is_contiguous())
      throw std::invalid_argument("selfattn::TensorView::reshape: the view is not contiguous");
    detail::check_shape_valid<NewRank>(shape);
    if (detail::checked_element_count<NewRank>("TensorView::reshape", "shape", shape, detail::max_object_size,
                                               element_bytes) != size())
      throw std::invalid_argument("selfattn::TensorView::reshape: cannot reshape " + detail::shape_string<Rank>(shape_) +
                                  " to " + detail::shape_string<NewRank>(shape));
    return TensorView<T, NewRank>(data_, shape);
  }

 private:
  static constexpr std::size_t element_bytes = sizeof(T);
  static constexpr Index element_limit = detail::max_elements(element_bytes);  // offsets in bytes must fit too

  T* data_ = nullptr;
  Shape shape_{};
  Shape strides_{};
};

namespace detail {

/// Elements from a view's first element to its last, inclusive: 1 + sum_d (dim_d - 1) * stride_d; 0 when empty.
template <typename T, int Rank>
Index memory_span(const TensorView<T, Rank>& x) {
  if (x.empty()) return 0;
  Index span = 1;
  for (int d = 0; d < Rank; ++d) span += (x.dim(d) - 1) * x.stride(d);
  return span;
}

/// Whether the address ranges [first element, last element] of two views intersect (element types and ranks
/// may differ; an empty view overlaps nothing). Conservative: two strided views that interleave without
/// sharing an element count as overlapping. Used to reject a destination that aliases a source.
template <typename A, int RankA, typename B, int RankB>
bool overlaps(const TensorView<A, RankA>& a, const TensorView<B, RankB>& b) {
  if (a.empty() || b.empty()) return false;
  const auto begin_a = reinterpret_cast<std::uintptr_t>(a.data());
  const auto begin_b = reinterpret_cast<std::uintptr_t>(b.data());
  const auto end_a = begin_a + static_cast<std::uintptr_t>(memory_span(a)) * sizeof(A);
  const auto end_b = begin_b + static_cast<std::uintptr_t>(memory_span(b)) * sizeof(B);
  return begin_a < end_b && begin_b < end_a;
}

/// Whether two different indices of a view may reach the same element (a stride 0, or rows that overlap), so
/// that writing through it in place would update an element more than once. Conservative like `overlaps`:
/// sorted by stride, each dimension of extent > 1 must step past everything the smaller ones span.
template <typename T, int Rank>
bool overlaps_itself(const TensorView<T, Rank>& x) {
  if (x.empty()) return false;
  std::array<int, Rank> order{};
  for (int d = 0; d < Rank; ++d) order[static_cast<std::size_t>(d)] = d;
  std::sort(order.begin(), order.end(), [&x](int a, int b) { return x.stride(a) < x.stride(b); });
  Index span = 1;  // elements spanned by the dimensions visited so far
  for (int d : order) {
    if (x.dim(d) == 1) continue;
    if (x.stride(d) < span) return true;
    span += (x.dim(d) - 1) * x.stride(d);
  }
  return false;
}

/// Alignment of a Tensor's storage: a cache line, and the widest SIMD packet (AVX-512). Eigen's reductions over a
/// map (a norm's mean, say) start their packets at the first aligned element, so the order of their sums depends on
/// the address modulo the packet size; storage at a fixed alignment makes every result a function of the values and
/// shapes alone, the same bits from run to run (operator new[] aligns only to 16 bytes).
inline constexpr std::size_t tensor_alignment = 64;

/// Frees storage from allocate_tensor_storage.
struct TensorStorageDelete {
  template <typename T>
  void operator()(T* p) const noexcept {
    ::operator delete[](p, std::align_val_t{tensor_alignment});
  }
};

/// Storage for n elements at tensor_alignment, value-initialised (zero) when `zeroed`, else default-initialised.
template <typename T>
T* allocate_tensor_storage(std::size_t n, bool zeroed) {
  static_assert(std::is_trivially_destructible_v<T>, "selfattn::Tensor holds trivially destructible elements");
  T* p = static_cast<T*>(::operator new[](n * sizeof(T), std::align_val_t{tensor_alignment}));
  if (zeroed)
    std::uninitialized_value_construct_n(p, n);
  else
    std::uninitialized_default_construct_n(p, n);
  return p;
}

}  // namespace detail

/// \brief An owning, contiguous, row-major, zero-initialised tensor, its storage aligned to 64 bytes
/// (detail::tensor_alignment: the same bits from run to run). Copies are deep; moves are cheap.
///
/// A default-constructed tensor is empty (`data() == nullptr`) and means "absent"; a moved-from one too.
///
/// Shapes: any `Rank` >= 1, e.g. (B, L, E) for the module, (B, H, L, D) for attention.
/// \code
/// Tensor<float, 3> x({2, 10, 64});
/// x(1, 2, 3) = 0.5f;
/// TensorView<const float, 3> v = x;
/// \endcode
template <typename T, int Rank>
class Tensor {
  static_assert(Rank >= 1, "selfattn::Tensor needs Rank >= 1");
  static_assert(!std::is_const_v<T>, "selfattn::Tensor owns its elements: use a non-const T");

 public:
  using value_type = T;                   ///< the element type
  using Shape = std::array<Index, Rank>;  ///< extents (or strides), one per dimension

  /// An empty tensor (no storage, all extents 0): "absent" where a tensor is optional.
  Tensor() = default;
  /// A zero-initialised tensor of this shape. Throws std::invalid_argument for a negative extent, and
  /// std::length_error, before allocating, when the shape holds more than detail::max_elements(sizeof(T))
  /// elements (PTRDIFF_MAX bytes).
  explicit Tensor(const Shape& shape) : shape_(shape) {
    data_.reset(detail::allocate_tensor_storage<T>(checked_count(shape), true));
  }
  /// A zero-initialised tensor of a braced shape, `Tensor<float, 4>({2, 4, 5, 8})`; a list of another length
  /// than Rank does not compile.
  template <std::size_t N>
  explicit Tensor(const Index (&shape)[N]) : Tensor(detail::extent_list<Rank>(shape)) {}
  /// A contiguous copy of a view's elements (std::length_error as above: a view with a stride 0 may show more
  /// elements than memory holds).
  explicit Tensor(const TensorView<const T, Rank>& view) : shape_(view.shape()) {
    data_.reset(detail::allocate_tensor_storage<T>(checked_count(shape_), false));  // copy_from writes all
    copy_from(view);
  }

  /// A deep copy. A copy of a tensor without storage (default-constructed: "absent") has none either, so it
  /// stays absent.
  Tensor(const Tensor& other) : shape_(other.shape_) {
    if (!other.data_) return;
    data_.reset(detail::allocate_tensor_storage<T>(static_cast<std::size_t>(size()), false));  // all copied below
    std::copy(other.data(), other.data() + size(), data());
  }
  /// Takes the storage; `other` becomes empty.
  Tensor(Tensor&& other) noexcept : data_(std::move(other.data_)), shape_(other.shape_) { other.shape_ = Shape{}; }
  /// A deep copy (shape and elements).
  Tensor& operator=(const Tensor& other) {
    if (this != &other) *this = Tensor(other);
    return *this;
  }
  /// Takes the storage; `other` becomes empty.
  Tensor& operator=(Tensor&& other) noexcept {
    data_ = std::move(other.data_);
    shape_ = other.shape_;
    other.shape_ = Shape{};
    return *this;
  }
  ~Tensor() = default;

  T* data() { return data_.get(); }                                          ///< first element; null when empty
  const T* data() const { return data_.get(); }                              ///< first element; null when empty
  const Shape& shape() const { return shape_; }                              ///< extents
  Shape strides() const { return detail::row_major_strides<Rank>(shape_); }  ///< dense row-major strides
  Index dim(int d) const { return shape_[static_cast<std::size_t>(d)]; }     ///< extent of dimension d
  Index size() const { return detail::product<Rank>(shape_); }               ///< number of elements
  bool empty() const { return size() == 0; }                                 ///< no elements (e.g. "absent")

  /// A mutable view of the whole tensor.
  TensorView<T, Rank> view() { return TensorView<T, Rank>(data(), shape_); }
  /// A read-only view of the whole tensor.
  TensorView<const T, Rank> view() const { return TensorView<const T, Rank>(data(), shape_); }

  /// Element (i0, ..., iRank-1); bounds checked by eigen_assert (not under NDEBUG).
  template <typename... Indices>
  T& operator()(Indices... indices) {
    return view()(indices...);
  }
  /// \overload
  template <typename... Indices>
  const T& operator()(Indices... indices) const {
    return view()(indices...);
  }

  /// The slice at index `i` of the first dimension: a view of rank `Rank - 1` sharing this tensor's memory.
  template <int R = Rank, typename = std::enable_if_t<(R > 1)>>
  TensorView<T, Rank - 1> operator[](Index i) {
    return view()[i];
  }
  /// \overload
  template <int R = Rank, typename = std::enable_if_t<(R > 1)>>
  TensorView<const T, Rank - 1> operator[](Index i) const {
    return view()[i];
  }

  /// Sets every element to `value`.
  void fill(const T& value) { std::fill(data(), data() + size(), value); }

  /// Copies a view of the same shape into this tensor (row by row; strides may differ). Throws
  /// std::invalid_argument when the shapes differ.
  void copy_from(const TensorView<const T, Rank>& source) {
    if (source.shape() != shape_)
      throw std::invalid_argument("selfattn::Tensor::copy_from: shape " + detail::shape_string<Rank>(source.shape()) +
                                  " differs from " + detail::shape_string<Rank>(shape_));
    if (source.data() == data() && source.strides() == strides()) return;  // the tensor itself: nothing to do
    // Element by element over memory that the writes change: the result would depend on the order.
    if (detail::overlaps(source, view()))
      throw std::invalid_argument(
          "selfattn::Tensor::copy_from: source (a view of " + detail::shape_string<Rank>(source.shape()) +
          ") overlaps the destination tensor's own memory; copy it to a separate tensor first");
    const Index n = shape_[Rank - 1];  // row by row: the last dimension is contiguous in both
    detail::for_each_row<Rank, 2>(shape_, {strides(), source.strides()}, [&](const std::array<Index, 2>& at) {
      std::copy(source.data() + at[1], source.data() + at[1] + n, data_.get() + at[0]);
    });
  }

 private:
  /// The element count of a shape to allocate, after the checks (negative extents, then the size limit).
  static std::size_t checked_count(const Shape& shape) {
    detail::check_shape_valid<Rank>(shape);
    return static_cast<std::size_t>(
        detail::checked_element_count<Rank>("Tensor", "shape", shape, detail::max_elements(sizeof(T)), sizeof(T)));
  }

  std::unique_ptr<T, detail::TensorStorageDelete> data_;  // at detail::tensor_alignment
  Shape shape_{};
};

// ---- Eigen maps of 2-D slices -------------------------------------------------------------------

/// A dynamic-size row-major Eigen matrix: the layout of our tensors (Eigen's default is column-major).
template <typename T>
using RowMajorMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// A row-major Eigen map over a 2-D view (rows = dim 0, columns = dim 1, outer stride = stride 0).
template <typename T>
using MatrixMap = Eigen::Map<std::conditional_t<std::is_const_v<T>, const RowMajorMatrix<std::remove_const_t<T>>,
                                                RowMajorMatrix<std::remove_const_t<T>>>,
                             Eigen::Unaligned, Eigen::OuterStride<>>;

/// \brief An Eigen map of a 2-D view: writes through a mutable map change the viewed data.
///
/// Shapes: view (rows, cols), any row stride -> a (rows, cols) row-major map with outer stride `stride(0)`.
/// \code
/// Tensor<float, 3> x({2, 4, 8});
/// auto m = as_matrix(x[1]);                           // (4, 8) map of batch 1
/// m.setOnes();
/// RowMajorMatrix<float> gram = m * m.transpose();    // (4, 4), every entry 8
/// \endcode
template <typename T>
MatrixMap<T> as_matrix(const TensorView<T, 2>& view) {
  // A single row may carry any outer stride; Eigen wants it at least the row length.
  const Index outer = view.dim(0) > 1 ? view.stride(0) : view.dim(1);
  return MatrixMap<T>(view.data(), view.dim(0), view.dim(1), Eigen::OuterStride<>(outer));
}
/// \overload
template <typename T>
MatrixMap<T> as_matrix(Tensor<T, 2>& tensor) {
  return as_matrix(tensor.view());
}
/// \overload
template <typename T>
MatrixMap<const T> as_matrix(const Tensor<T, 2>& tensor) {
  return as_matrix(tensor.view());
}

/// A contiguous Eigen row-vector map over a 1-D view.
template <typename T>
using VectorMap = Eigen::Map<std::conditional_t<std::is_const_v<T>, const Eigen::Matrix<std::remove_const_t<T>, 1, Eigen::Dynamic>,
                                                Eigen::Matrix<std::remove_const_t<T>, 1, Eigen::Dynamic>>>;

/// \brief An Eigen row-vector map of a 1-D view (pass `tensor.view()` for a Tensor).
///
/// Shapes: view (n) -> a (1, n) map.
/// \code
/// Tensor<float, 1> b({8});
/// float total = as_vector(b.view()).sum();   // 0
/// \endcode
template <typename T>
VectorMap<T> as_vector(const TensorView<T, 1>& view) {
  return VectorMap<T>(view.data(), view.dim(0));
}

// ---- Views of row-major Eigen matrices ----------------------------------------------------------

namespace detail {

/// The element type of a view of an Eigen expression: const unless the expression is writable.
template <typename Derived>
using eigen_view_element =
    std::conditional_t<bool(Derived::Flags & Eigen::LvalueBit), typename Derived::Scalar, const typename Derived::Scalar>;

/// A (rows, cols) view of an Eigen expression with storage, after the compile-time checks of as_view. The
/// checks come first, so that a wrong argument fails on their sentence rather than deep inside Eigen.
template <typename Element, typename Derived>
TensorView<Element, 2> view_of_eigen(const Eigen::DenseBase<Derived>& matrix) {
  constexpr bool has_storage = bool(Derived::Flags & Eigen::DirectAccessBit);
  constexpr bool row_major = bool(Derived::Flags & Eigen::RowMajorBit);
  static_assert(has_storage,
                "selfattn::as_view: the Eigen expression has no storage of its own (a product, a sum...): evaluate it "
                "into a RowMajorMatrix<T> first");
  static_assert(!has_storage || row_major,
                "selfattn::as_view: the Eigen matrix is column-major (Eigen's default), but a TensorView is row-major: "
                "viewing it would silently transpose it. Use RowMajorMatrix<T> (Eigen::RowMajor) or copy it into one");
  static_assert(Derived::InnerStrideAtCompileTime == 1 || Derived::InnerStrideAtCompileTime == Eigen::Dynamic,
                "selfattn::as_view: the elements of a row must be contiguous (inner stride 1)");
  if constexpr (has_storage && row_major) {
    const Derived& m = matrix.derived();
    if (m.cols() > 1 && m.innerStride() != 1)
      throw std::invalid_argument("selfattn::as_view: the elements of a row must be contiguous (inner stride 1), got " +
                                  std::to_string(m.innerStride()));
    const Index rows = m.rows(), cols = m.cols();
    // The non-const overload passes a writable matrix as const: its data may be written again.
    const Index row_stride = rows > 1 ? Index(m.outerStride()) : cols;
    return TensorView<Element, 2>(const_cast<Element*>(m.data()), {rows, cols}, {row_stride, 1});
  } else {
    return {};
  }
}

}  // namespace detail

/// \brief A (rows, cols) view of a row-major Eigen matrix, map or block: the reverse of as_matrix.
///
/// Writes through the view change the matrix (a const matrix, or a map of const data, gives a
/// `TensorView<const T, 2>`). Column-major storage (Eigen's default, `Eigen::MatrixXf`) does not compile: a
/// row-major view of it would silently be the transpose. Nor do expressions without storage (products, sums);
/// a temporary matrix is refused too, since the view would dangle.
///
/// Shapes: matrix (rows, cols), row stride `outerStride()` -> a (rows, cols) view with strides (outerStride, 1).
/// \code
/// RowMajorMatrix<float> m(4, 8);
/// TensorView<float, 2> v = as_view(m);                        // (4, 8), shares m's memory
/// TensorView<float, 2> b = as_view(m.block(1, 2, 2, 3));      // (2, 3), strides (8, 1)
/// // as_view(Eigen::MatrixXf(4, 8));   // does not compile: column-major (and a temporary)
/// \endcode
template <typename Derived>
TensorView<detail::eigen_view_element<Derived>, 2> as_view(Eigen::DenseBase<Derived>& matrix) {
  return detail::view_of_eigen<detail::eigen_view_element<Derived>>(matrix);
}
/// \overload
template <typename Derived>
TensorView<const typename Derived::Scalar, 2> as_view(const Eigen::DenseBase<Derived>& matrix) {
  return detail::view_of_eigen<const typename Derived::Scalar>(matrix);
}
/// A view of a temporary matrix would dangle: keep the matrix in a variable.
template <typename Derived>
void as_view(Eigen::PlainObjectBase<Derived>&& matrix) = delete;

// ---- Generic access for public functions ---------------------------------------------------------

namespace detail {

// tensor_traits<X>: element type and rank of a Tensor or TensorView argument, so public functions take
// either without naming the element type.
template <typename X>
struct tensor_traits {  // anything else: not a tensor, so overloads drop out cleanly (SFINAE)
  static constexpr bool is_tensor = false;
  using scalar = void;
  static constexpr int rank = 0;
};
template <typename T, int R>
struct tensor_traits<Tensor<T, R>> {
  static constexpr bool is_tensor = true;
  using scalar = T;
  static constexpr int rank = R;
};
template <typename T, int R>
struct tensor_traits<TensorView<T, R>> {
  static constexpr bool is_tensor = true;
  using scalar = std::remove_const_t<T>;
  static constexpr int rank = R;
};

template <typename X>
using scalar_of = typename tensor_traits<std::decay_t<X>>::scalar;

template <typename X, int R>
constexpr bool is_tensor_of_rank = tensor_traits<std::decay_t<X>>::is_tensor&& tensor_traits<std::decay_t<X>>::rank == R;

template <typename T, int R>
TensorView<const T, R> const_view(const Tensor<T, R>& x) {
  return x.view();
}
template <typename T, int R>
TensorView<const std::remove_const_t<T>, R> const_view(const TensorView<T, R>& x) {
  return x;
}

}  // namespace detail

// ---- Element-wise sum ---------------------------------------------------------------------------

namespace detail {

/// Whether X (after decay) is a Tensor or TensorView: the operators below take nothing else.
template <typename X>
constexpr bool is_tensor = tensor_traits<std::decay_t<X>>::is_tensor;

// For the public entries' compile-time checks: each entry states its rule in a static_assert sentence.
template <typename... X>
constexpr bool all_tensors = (is_tensor<X> && ...);
template <int R, typename... X>
constexpr bool all_of_rank = ((tensor_traits<std::decay_t<X>>::rank == R) && ...);
template <typename T, typename... X>
constexpr bool all_hold = (std::is_same_v<scalar_of<X>, T> && ...);
/// The element type a public signature names for argument X: X's when it is float or double, else float, so that
/// a wrong argument reaches the entry's static_asserts instead of failing to substitute.
template <typename X>
using float_scalar_of = std::conditional_t<std::is_floating_point_v<scalar_of<X>>, scalar_of<X>, float>;

/// Whether `+` and `+=` accept X and Y: one element type and one rank (the operators' static_asserts say so in
/// a sentence, and compile nothing else after them).
template <typename X, typename Y>
constexpr bool same_tensor_kind = std::is_same_v<scalar_of<X>, scalar_of<Y>> &&
                                  tensor_traits<std::decay_t<X>>::rank == tensor_traits<std::decay_t<Y>>::rank;
/// Whether the element type of X is a number that `+` makes sense for (not bool).
template <typename X>
constexpr bool summable = std::is_arithmetic_v<scalar_of<X>> && !std::is_same_v<scalar_of<X>, bool>;

/// Throws ShapeError unless `rhs` has the shape of `lhs`.
template <int Rank>
void check_same_shape(const char* function, const std::array<Index, Rank>& lhs, const std::array<Index, Rank>& rhs) {
  if (lhs != rhs)
    throw ShapeError(std::string("[") + function + "] rhs: expected shape " + shape_string<Rank>(lhs) +
                     " (that of lhs), got " + shape_string<Rank>(rhs));
}

/// lhs += rhs element by element, after the shape and overlap checks.
template <typename T, int Rank>
void add_in_place(const TensorView<T, Rank>& lhs, const TensorView<const T, Rank>& rhs) {
  check_same_shape<Rank>("operator+=", lhs.shape(), rhs.shape());
  if (overlaps_itself(lhs))
    throw std::invalid_argument("[operator+=] lhs: two of its indices reach the same element (a stride 0 or "
                                "overlapping rows), which would be added to twice");
  if (overlaps(lhs, rhs) && !(lhs.data() == rhs.data() && lhs.strides() == rhs.strides()))
    throw std::invalid_argument("[operator+=] rhs: overlaps lhs in another layout; copy it to a separate tensor first");
  const Index n = lhs.dim(Rank - 1);
  for_each_row<Rank, 2>(lhs.shape(), {lhs.strides(), rhs.strides()}, [&](const std::array<Index, 2>& at) {
    T* out = lhs.data() + at[0];
    const T* in = rhs.data() + at[1];
    for (Index j = 0; j < n; ++j) out[j] += in[j];
  });
}

}  // namespace detail

/// \brief Adds `rhs` to `lhs` element by element, in place; both of one shape (any strides for `rhs`).
///
/// `rhs` is a Tensor or TensorView of the same element type and rank. Throws ShapeError naming `rhs` when the
/// shapes differ, and std::invalid_argument when `rhs` overlaps `lhs` in another layout (`x += x` is fine).
///
/// Shapes: lhs (any), rhs (the same).
/// \code
/// auto g = mha.backward(dout, fwd);         // self-attention: x was query, key and value
/// g.d_query += g.d_key;
/// g.d_query += g.d_value;                   // the gradient of x
/// \endcode
template <typename T, int Rank, typename X, typename = std::enable_if_t<detail::is_tensor<X>>>
Tensor<T, Rank>& operator+=(Tensor<T, Rank>& lhs, const X& rhs) {
  static_assert(detail::same_tensor_kind<Tensor<T, Rank>, X>,
                "selfattn: + and += need two Tensor or TensorView operands of the same element type and rank");
  static_assert(detail::summable<X>, "selfattn: + and += need numbers (float, double, integers), not bool");
  if constexpr (detail::same_tensor_kind<Tensor<T, Rank>, X> && detail::summable<X>)
    detail::add_in_place<T, Rank>(lhs.view(), detail::const_view(rhs));
  return lhs;
}

/// \brief Adds `rhs` to the elements a view `lhs` shows (writing through it), element by element.
///
/// As for a Tensor; in addition throws std::invalid_argument when two indices of `lhs` reach one element (a
/// stride 0), which would be added to twice. Returns `lhs`.
///
/// Shapes: lhs (any), rhs (the same).
/// \code
/// Tensor<float, 3> x({2, 4, 8}), y({4, 8});
/// x[1] += y;                               // adds y to batch 1 of x
/// \endcode
template <typename T, int Rank, typename X, typename = std::enable_if_t<detail::is_tensor<X>>>
TensorView<T, Rank> operator+=(const TensorView<T, Rank>& lhs, const X& rhs) {
  static_assert(!std::is_const_v<T>, "selfattn: += cannot write through a TensorView of const elements");
  static_assert(detail::same_tensor_kind<TensorView<T, Rank>, X>,
                "selfattn: + and += need two Tensor or TensorView operands of the same element type and rank");
  static_assert(detail::summable<X>, "selfattn: + and += need numbers (float, double, integers), not bool");
  if constexpr (!std::is_const_v<T> && detail::same_tensor_kind<TensorView<T, Rank>, X> && detail::summable<X>)
    detail::add_in_place<std::remove_const_t<T>, Rank>(lhs, detail::const_view(rhs));
  return lhs;
}

/// \brief The element-wise sum of two tensors of one shape, as a new contiguous Tensor.
///
/// Each operand is a Tensor or TensorView (any strides) of the same element type and rank. Throws ShapeError
/// naming `rhs` when the shapes differ.
///
/// Shapes: lhs (any), rhs (the same) -> a Tensor of that shape.
/// \code
/// Tensor<float, 3> dx = g.d_query + g.d_key + g.d_value;   // self-attention's input gradient
/// \endcode
template <typename X, typename Y,
          typename = std::enable_if_t<detail::is_tensor<X> && detail::is_tensor<Y>>>
Tensor<detail::scalar_of<X>, detail::tensor_traits<std::decay_t<X>>::rank> operator+(const X& lhs, const Y& rhs) {
  static_assert(detail::same_tensor_kind<X, Y>,
                "selfattn: + and += need two Tensor or TensorView operands of the same element type and rank");
  static_assert(detail::summable<X>, "selfattn: + and += need numbers (float, double, integers), not bool");
  using T = detail::scalar_of<X>;
  constexpr int Rank = detail::tensor_traits<std::decay_t<X>>::rank;
  Tensor<T, Rank> sum;
  if constexpr (detail::same_tensor_kind<X, Y> && detail::summable<X>) {
    const TensorView<const T, Rank> a = detail::const_view(lhs), b = detail::const_view(rhs);
    detail::check_same_shape<Rank>("operator+", a.shape(), b.shape());
    sum = Tensor<T, Rank>(a.shape());
    const Index n = a.dim(Rank - 1);
    const std::array<std::array<Index, Rank>, 3> strides{sum.strides(), a.strides(), b.strides()};
    detail::for_each_row<Rank, 3>(a.shape(), strides, [&](const std::array<Index, 3>& at) {
      T* out = sum.data() + at[0];
      const T* x = a.data() + at[1];
      const T* y = b.data() + at[2];
      for (Index j = 0; j < n; ++j) out[j] = x[j] + y[j];
    });
  }
  return sum;
}
/// \overload
/// A temporary left operand (`a + b + c`) is reused as the result instead of allocating another tensor.
template <typename T, int Rank, typename Y, typename = std::enable_if_t<detail::is_tensor<Y>>>
Tensor<T, Rank> operator+(Tensor<T, Rank>&& lhs, const Y& rhs) {
  static_assert(detail::same_tensor_kind<Tensor<T, Rank>, Y>,
                "selfattn: + and += need two Tensor or TensorView operands of the same element type and rank");
  static_assert(detail::summable<Y>, "selfattn: + and += need numbers (float, double, integers), not bool");
  if constexpr (detail::same_tensor_kind<Tensor<T, Rank>, Y> && detail::summable<Y>) {
    detail::check_same_shape<Rank>("operator+", lhs.shape(), detail::const_view(rhs).shape());
    lhs += rhs;
  }
  return std::move(lhs);
}

}  // namespace selfattn
