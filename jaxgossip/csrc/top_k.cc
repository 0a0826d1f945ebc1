// Exact top-k selection over the last axis for XLA:CPU, registered through the XLA FFI.
//
// XLA:CPU's TopK sorts each row with a scalar comparison loop (about 14 us for the max of a
// 10,000-entry row on the project's 2-core machine). Here a row is scanned once against the k-th
// best key seen so far; a block of 32 entries that holds no better key is skipped with one
// vectorised test, so most of a row costs one compare per entry. Candidates live in a min-heap
// of k 64-bit words (key in the high half, the complement of the index in the low half), and
// when k is a large fraction of the row nth_element on all n words is cheaper than the heap.
//
// Order: the total order of lax.top_k: -NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN, ties to
// the lower index, values returned in descending order. The word makes both rules one integer
// comparison: a larger key wins, and for equal keys the complement of a lower index is larger.
//
// Handlers (x: [..., n], rows = the product of the leading dims, k static):
//   jaxgossip_top_k_{f32,bf16,f16}:      values [..., k] (x's dtype), indices [..., k] (int32)
//   jaxgossip_top_k_dense_{f32,bf16,f16}: out [..., n], the k largest |x| of each row kept in
//                                         place and every other entry +0 (a top-k compressor's
//                                         dense message).
#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// A signed integer whose order is the float total order (sign-magnitude -> two's complement).
template <bool kMagnitude, typename Bits>
inline int32_t OrderKey(Bits bits) {
  constexpr int kShift = sizeof(Bits) * 8 - 1;
  constexpr int32_t kMagMask = int32_t((int64_t(1) << kShift) - 1);
  using Signed = std::make_signed_t<Bits>;
  int32_t s = int32_t(Signed(bits));
  if (kMagnitude) return s & kMagMask;
  return s ^ ((s >> kShift) & kMagMask);
}

inline uint64_t Word(int32_t key, int64_t i) {
  return (uint64_t(uint32_t(key) ^ 0x80000000u) << 32) | uint32_t(~uint32_t(i));
}
inline int32_t KeyOf(uint64_t word) { return int32_t(uint32_t(word >> 32) ^ 0x80000000u); }
inline int64_t IndexOf(uint64_t word) { return int64_t(~uint32_t(word)); }

// The k best words of one row, best first, into `words` (resized to k).
template <bool kMagnitude, typename Bits>
void SelectRow(const Bits* x, int64_t n, int64_t k, std::vector<uint64_t>& words) {
  words.clear();
  if (k * 16 > n) {
    words.resize(n);
    for (int64_t i = 0; i < n; ++i) words[i] = Word(OrderKey<kMagnitude>(x[i]), i);
    std::nth_element(words.begin(), words.begin() + (k - 1), words.end(), std::greater<uint64_t>());
    words.resize(k);
    std::sort(words.begin(), words.end(), std::greater<uint64_t>());
    return;
  }
  for (int64_t i = 0; i < k; ++i) words.push_back(Word(OrderKey<kMagnitude>(x[i]), i));
  auto cmp = std::greater<uint64_t>();  // min-heap: the k-th best word on top
  std::make_heap(words.begin(), words.end(), cmp);
  int32_t kth = KeyOf(words.front());
  auto offer = [&](int64_t i) {
    int32_t key = OrderKey<kMagnitude>(x[i]);
    // A later index never wins a tie, so only a strictly larger key enters.
    if (key > kth) {
      std::pop_heap(words.begin(), words.end(), cmp);
      words.back() = Word(key, i);
      std::push_heap(words.begin(), words.end(), cmp);
      kth = KeyOf(words.front());
    }
  };
  constexpr int64_t kBlock = 32;
  int64_t i = k;
  for (; i + kBlock <= n; i += kBlock) {
    int any = 0;
    for (int64_t j = 0; j < kBlock; ++j) any |= OrderKey<kMagnitude>(x[i + j]) > kth;
    if (any) {
      for (int64_t j = 0; j < kBlock; ++j) offer(i + j);
    }
  }
  for (; i < n; ++i) offer(i);
  std::sort(words.begin(), words.end(), std::greater<uint64_t>());  // best first
}

template <typename Bits>
ffi::Error CheckShape(ffi::Span<const int64_t> dims, int64_t k, int64_t* rows, int64_t* n) {
  if (dims.size() == 0) return ffi::Error::InvalidArgument("top_k needs an input of rank >= 1");
  *n = dims.back();
  if (k < 1 || k > *n) return ffi::Error::InvalidArgument("top_k needs 1 <= k <= n");
  if (*n > int64_t(UINT32_MAX)) return ffi::Error::InvalidArgument("top_k rows above 2^32 entries");
  *rows = 1;
  for (size_t d = 0; d + 1 < dims.size(); ++d) *rows *= dims[d];
  return ffi::Error::Success();
}


// Runs row(r) for r in [0, rows) on the calling thread and on XLA's intra-op pool. Rows are
// handed out by one atomic counter, so a pool task that starts late finds nothing left and touches
// only the shared counters (kept alive by the shared_ptr); the caller returns once every row is done.
template <typename F>
void ForEachRow(ffi::ThreadPool& pool, int64_t rows, F row) {
  struct Shared {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
  };
  auto shared = std::make_shared<Shared>();
  auto work = [shared, rows, row]() {
    for (int64_t r; (r = shared->next.fetch_add(1)) < rows;) {
      row(r);
      shared->done.fetch_add(1, std::memory_order_release);
    }
  };
  int64_t helpers = std::min<int64_t>(pool.num_threads(), rows - 1);
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule(decltype(work)(work));
  work();
  while (shared->done.load(std::memory_order_acquire) < rows) std::this_thread::yield();
}

template <ffi::DataType T, typename Bits>
ffi::Error TopK(ffi::ThreadPool pool, ffi::Buffer<T> x, ffi::ResultBuffer<T> values,
                ffi::ResultBuffer<ffi::S32> indices, int64_t k) {
  int64_t rows, n;
  if (auto err = CheckShape<Bits>(x.dimensions(), k, &rows, &n); err.failure()) return err;
  const Bits* xd = reinterpret_cast<const Bits*>(x.untyped_data());
  Bits* vd = reinterpret_cast<Bits*>(values->untyped_data());
  int32_t* id = indices->typed_data();
  ForEachRow(pool, rows, [=](int64_t r) {
    thread_local std::vector<uint64_t> words;
    const Bits* row = xd + r * n;
    SelectRow</*kMagnitude=*/false>(row, n, k, words);
    for (int64_t j = 0; j < k; ++j) {
      int64_t idx = IndexOf(words[j]);
      id[r * k + j] = int32_t(idx);
      vd[r * k + j] = row[idx];
    }
  });
  return ffi::Error::Success();
}

template <ffi::DataType T, typename Bits>
ffi::Error TopKDense(ffi::ThreadPool pool, ffi::Buffer<T> x, ffi::ResultBuffer<T> out, int64_t k) {
  int64_t rows, n;
  if (auto err = CheckShape<Bits>(x.dimensions(), k, &rows, &n); err.failure()) return err;
  const Bits* xd = reinterpret_cast<const Bits*>(x.untyped_data());
  Bits* od = reinterpret_cast<Bits*>(out->untyped_data());
  ForEachRow(pool, rows, [=](int64_t r) {
    thread_local std::vector<uint64_t> words;
    const Bits* row = xd + r * n;
    Bits* out_row = od + r * n;
    SelectRow</*kMagnitude=*/true>(row, n, k, words);
    std::memset(out_row, 0, sizeof(Bits) * size_t(n));  // all-zero bits are +0 in every float type
    for (int64_t j = 0; j < k; ++j) {
      int64_t idx = IndexOf(words[j]);
      out_row[idx] = row[idx];
    }
  });
  return ffi::Error::Success();
}

}  // namespace

#define JAXGOSSIP_TOP_K(SUFFIX, DTYPE, BITS)                                                     \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxgossip_top_k_##SUFFIX, (TopK<DTYPE, BITS>),                 \
                                ffi::Ffi::Bind()                                                \
                                    .Ctx<ffi::ThreadPool>()                                     \
                                    .Arg<ffi::Buffer<DTYPE>>()                                  \
                                    .Ret<ffi::Buffer<DTYPE>>()                                  \
                                    .Ret<ffi::Buffer<ffi::S32>>()                               \
                                    .Attr<int64_t>("k"));                                       \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxgossip_top_k_dense_##SUFFIX, (TopKDense<DTYPE, BITS>),      \
                                ffi::Ffi::Bind()                                                \
                                    .Ctx<ffi::ThreadPool>()                                     \
                                    .Arg<ffi::Buffer<DTYPE>>()                                  \
                                    .Ret<ffi::Buffer<DTYPE>>()                                  \
                                    .Attr<int64_t>("k"));

JAXGOSSIP_TOP_K(f32, ffi::F32, uint32_t)
JAXGOSSIP_TOP_K(bf16, ffi::BF16, uint16_t)
JAXGOSSIP_TOP_K(f16, ffi::F16, uint16_t)
