// Exact top-k selection over the last axis for XLA:CPU, registered through the XLA FFI.
//
// XLA:CPU's TopK sorts each row with a scalar comparison loop (about 14 us for the max of a
// 10,000-entry row on the project's 2-core machine). Three strategies, by the row length n and k
// (candidates are 64-bit words: key in the high half, the complement of the index in the low half):
//   * k a large fraction of n (16 k > n): nth_element on all n words;
//   * rows of at least kSampleMinN entries: a threshold from a sample of the row (runs of kRun
//     contiguous entries), one vectorised pass that keeps every entry at or above it, nth_element
//     on those few. Exact whatever the sample says: when fewer than k entries pass, the row falls
//     back to nth_element on all n words. (A heap costs O(log k) per new k-th best, and there are
//     about k ln(n / k) of them: 4x slower on a ResNet-20 conv leaf at k = 1 %.);
//   * shorter rows: one scan against the k-th best key seen so far, the k best in a min-heap; a
//     block of 32 entries that holds no better key is skipped with one vectorised test.
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
#include <cmath>
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

constexpr int64_t kBlock = 32;
// Rows of at least this many entries take the sampled threshold (below, the sample's cost is not
// repaid). Measured: n = 36864, k = 368, one row cache-hot: heap 69 us, sampled 17 us; [8, 2304],
// k = 23, one call: 42.6 us with the heap, 38.3 us sampled.
constexpr int64_t kSampleMinN = 1024;
constexpr int64_t kMaxSample = 1024;
constexpr int64_t kRun = 16;

// The k best of all n words of a row, in any order, into words[0, k). `words` is scratch that
// only grows, so no row pays for initialising n words it then overwrites.
template <bool kMagnitude, typename Bits>
void SelectAll(const Bits* x, int64_t n, int64_t k, std::vector<uint64_t>& words) {
  if (int64_t(words.size()) < n) words.resize(n);
  for (int64_t i = 0; i < n; ++i) words[i] = Word(OrderKey<kMagnitude>(x[i]), i);
  std::nth_element(words.begin(), words.begin() + (k - 1), words.begin() + n, std::greater<uint64_t>());
}

// One pass over a row: writes Word(key, i) of every entry with key >= t to `out` (room for n words)
// and returns how many. A 64-bit mask per 64 entries, then one store per set bit: with AVX2 the
// mask is a few vector compares (about 0.25 ns per entry here, 4-5x the SSE2 build); the pass is
// compiled for both and chosen at run time.
#define JAXGOSSIP_PASS_BODY                                                                     \
  int64_t count = 0, i = 0;                                                                     \
  for (; i + 64 <= n; i += 64) {                                                                \
    uint64_t mask = 0;                                                                          \
    for (int64_t j = 0; j < 64; ++j) mask |= uint64_t(OrderKey<kMagnitude>(x[i + j]) >= t) << j; \
    while (mask) {                                                                              \
      int j = __builtin_ctzll(mask);                                                            \
      mask &= mask - 1;                                                                         \
      out[count++] = Word(OrderKey<kMagnitude>(x[i + j]), i + j);                               \
    }                                                                                           \
  }                                                                                             \
  for (; i < n; ++i) {                                                                          \
    int32_t key = OrderKey<kMagnitude>(x[i]);                                                   \
    if (key >= t) out[count++] = Word(key, i);                                                  \
  }                                                                                             \
  return count;

template <bool kMagnitude, typename Bits>
int64_t PassBase(const Bits* x, int64_t n, int32_t t, uint64_t* out) {
  JAXGOSSIP_PASS_BODY
}

#if defined(__x86_64__) && defined(__GNUC__)
template <bool kMagnitude, typename Bits>
__attribute__((target("avx2"))) int64_t PassAvx2(const Bits* x, int64_t n, int32_t t, uint64_t* out) {
  JAXGOSSIP_PASS_BODY
}
#endif

template <bool kMagnitude, typename Bits>
int64_t Pass(const Bits* x, int64_t n, int32_t t, uint64_t* out) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return PassAvx2<kMagnitude>(x, n, t, out);
#endif
  return PassBase<kMagnitude>(x, n, t, out);
}

// The k best words of a row, in any order, into words[0, k), through a sampled threshold t: every
// entry whose key is >= t is a candidate. If at least k entries pass, the k-th largest key is >= t,
// so the k best are all among the candidates; otherwise the row takes SelectAll.
template <bool kMagnitude, typename Bits>
void SelectSampled(const Bits* x, int64_t n, int64_t k, std::vector<uint64_t>& words,
                   std::vector<int32_t>& sample) {
  // Runs of kRun contiguous entries spread evenly over the row: one cache line per run (a sample
  // of single entries at a stride touches a line per entry, which cost 2x on rows out of cache).
  const int64_t size = std::min<int64_t>(kMaxSample, n / 4) / kRun * kRun;
  const int64_t step = n / (size / kRun);
  sample.resize(size);
  for (int64_t r = 0; r < size / kRun; ++r) {
    for (int64_t j = 0; j < kRun; ++j) sample[r * kRun + j] = OrderKey<kMagnitude>(x[r * step + j]);
  }
  // Expected sampled entries above the k-th best: m = k size / n; aim a few deviations lower, so
  // that the pass keeps about k + 4 sqrt(m) n / size entries and rarely fewer than k.
  const double m = double(k) * double(size) / double(n);
  const int64_t rank = std::min<int64_t>(size, int64_t(1.25 * m + 4.0 * std::sqrt(m) + 4.0));
  std::nth_element(sample.begin(), sample.begin() + (rank - 1), sample.end(), std::greater<int32_t>());
  const int32_t t = sample[rank - 1];
  if (int64_t(words.size()) < n) words.resize(n);
  const int64_t count = Pass<kMagnitude>(x, n, t, words.data());
  if (count < k) {
    SelectAll<kMagnitude>(x, n, k, words);
    return;
  }
  std::nth_element(words.begin(), words.begin() + (k - 1), words.begin() + count, std::greater<uint64_t>());
}

// The k best words of one row into words[0, k): best first if `sorted`, else in any order (the
// dense message needs only the set).
template <bool kMagnitude, typename Bits>
void SelectRow(const Bits* x, int64_t n, int64_t k, bool sorted, std::vector<uint64_t>& words,
               std::vector<int32_t>& sample) {
  if (k * 16 > n || n >= kSampleMinN) {
    if (k * 16 > n) {
      SelectAll<kMagnitude>(x, n, k, words);
    } else {
      SelectSampled<kMagnitude>(x, n, k, words, sample);
    }
    if (sorted) std::sort(words.begin(), words.begin() + k, std::greater<uint64_t>());
    return;
  }
  words.clear();
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
  int64_t i = k;
  for (; i + kBlock <= n; i += kBlock) {
    int any = 0;
    for (int64_t j = 0; j < kBlock; ++j) any |= OrderKey<kMagnitude>(x[i + j]) > kth;
    if (any) {
      for (int64_t j = 0; j < kBlock; ++j) offer(i + j);
    }
  }
  for (; i < n; ++i) offer(i);
  if (sorted) std::sort(words.begin(), words.end(), std::greater<uint64_t>());  // best first
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
// Calls with fewer than kSerialMaxEntries entries in all run on the calling thread: waking a pool
// thread costs more than they do (a ResNet-20 batch-norm leaf [8, 16] took 6.7 us with helpers
// against 1.8 us for XLA's own TopK).
constexpr int64_t kSerialMaxEntries = 16384;

template <typename F>
void ForEachRow(ffi::ThreadPool& pool, int64_t rows, int64_t n, F row) {
  if (rows * n < kSerialMaxEntries) {
    for (int64_t r = 0; r < rows; ++r) row(r);
    return;
  }
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
  ForEachRow(pool, rows, n, [=](int64_t r) {
    thread_local std::vector<uint64_t> words;
    thread_local std::vector<int32_t> sample;
    const Bits* row = xd + r * n;
    SelectRow</*kMagnitude=*/false>(row, n, k, /*sorted=*/true, words, sample);
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
  ForEachRow(pool, rows, n, [=](int64_t r) {
    thread_local std::vector<uint64_t> words;
    thread_local std::vector<int32_t> sample;
    const Bits* row = xd + r * n;
    Bits* out_row = od + r * n;
    SelectRow</*kMagnitude=*/true>(row, n, k, /*sorted=*/false, words, sample);
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
