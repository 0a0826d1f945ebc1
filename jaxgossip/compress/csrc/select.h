// Exact top-k selection of one row, shared by the native kernels (top_k.cc, fused_top_k.cc).
//
// A row is read through an accessor `x(i)` that returns the raw bits of entry i (uint32_t for
// float32, uint16_t for bfloat16 / float16), so a kernel can select on values it computes on the
// fly (fused_top_k.cc selects on x - x_hat without storing the difference).
//
// Candidates are 64-bit words: key in the high half, the complement of the index in the low half.
// Order: the total order of lax.top_k: -NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN, ties to
// the lower index. The word makes both rules one integer comparison: a larger key wins, and for
// equal keys the complement of a lower index is larger. Strategies by the row length n and k:
//   * k a large fraction of n (16 k > n): the k-th best of all n words (KthLargest), then the
//     words at or above it;
//   * rows of at least kSampleMinN entries: a threshold from a sample of the row (runs of kRun
//     contiguous entries), one vectorised pass that keeps every entry at or above it, the k best
//     of those few the same way. Exact whatever the sample says: when fewer than k entries pass,
//     the row falls back to all n words. (A heap costs O(log k) per new k-th best, and there are
//     about k ln(n / k) of them: 4x slower on a ResNet-20 conv leaf at k = 1 %.) Both leave the
//     k best in index order;
//   * shorter rows: one scan against the k-th best key seen so far, the k best in a min-heap; a
//     block of 32 entries that holds no better key is skipped with one vectorised test.
#ifndef JAXGOSSIP_CSRC_SELECT_H_
#define JAXGOSSIP_CSRC_SELECT_H_

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <thread>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace jaxgossip {

namespace ffi = xla::ffi;


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

// Accessors. Row reads raw bits from memory; Residual forms r = x - h (float32) on the fly, so a
// kernel can select on a difference it never stores. Prefetch(i) asks for the line of entry i;
// an accessor may provide FastPass<kMagnitude>(n, t, out) (the pass below, hand-vectorised), which
// returns -1 where it does not apply.
template <typename Bits>
struct Row {
  const Bits* p;
  Bits operator()(int64_t i) const { return p[i]; }
  void Prefetch(int64_t i) const { __builtin_prefetch(p + i); }
};

inline uint32_t FloatBits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof(b));
  return b;
}

// Whether the AVX2 loops run. JAXGOSSIP_NATIVE_AVX2=0 keeps the portable ones on a machine that has
// AVX2 (read once per process; the tests run them that way in a subprocess).
inline bool HasAvx2() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx2 = __builtin_cpu_supports("avx2") && [] {
    const char* v = std::getenv("JAXGOSSIP_NATIVE_AVX2");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return avx2;
#else
  return false;
#endif
}

#if defined(__x86_64__) && defined(__GNUC__)
// Pass (below) over |x - h| with AVX2: 8 entries per compare, one movemask per 8.
// Lines are requested 4 KB ahead: on rows out of cache the hardware prefetcher alone left the pass
// waiting on memory (fused Choco round, ResNet-20 x 8: 3.6 -> 2.8 ms).
// With kNorms it also sums (x - h)^2 into *rr and x^2 into *xx, in the order of SumSquaresAvx2
// (fused_top_k.cc): two 8-lane accumulators taking alternate blocks of 8, the lanes added in
// order, then the tail (< 16 entries) one by one. A row that needs its norms then costs one read.
constexpr int64_t kAhead = 1024;

// The pass bits of the 8 entries at x, h (|x - h| >= t as |x - h| > below); with kNorms their
// squares added to the accumulators.
template <bool kNorms>
__attribute__((target("avx2"))) inline uint32_t ResidualBlockAvx2(const float* x, const float* h, __m256i below,
                                                                 __m256& r_acc, __m256& x_acc) {
  const __m256 a = _mm256_loadu_ps(x);
  const __m256 d = _mm256_sub_ps(a, _mm256_loadu_ps(h));
  if (kNorms) {
    r_acc = _mm256_add_ps(r_acc, _mm256_mul_ps(d, d));
    x_acc = _mm256_add_ps(x_acc, _mm256_mul_ps(a, a));
  }
  const __m256i key = _mm256_and_si256(_mm256_castps_si256(d), _mm256_set1_epi32(0x7fffffff));
  return uint32_t(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(key, below))));
}

// Word of every set bit of `mask` (entry at + bit) into out[count...]; returns the new count.
inline int64_t EmitResidual(const float* x, const float* h, int64_t at, uint64_t mask, uint64_t* out,
                            int64_t count) {
  while (mask) {
    int j = __builtin_ctzll(mask);
    mask &= mask - 1;
    out[count++] = Word(int32_t(FloatBits(x[at + j] - h[at + j]) & 0x7fffffffu), at + j);
  }
  return count;
}

template <bool kNorms = false>
__attribute__((target("avx2"))) inline int64_t ResidualPassAvx2(const float* x, const float* h, int64_t n, int32_t t,
                                                                 uint64_t* out, float* rr = nullptr,
                                                                 float* xx = nullptr) {
  int64_t count = 0, i = 0;
  const __m256i below = _mm256_set1_epi32(t - 1);  // magnitude keys are >= 0, so t >= 0
  __m256 r_acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  __m256 x_acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (; i + 64 <= n; i += 64) {
    for (int j = 0; j < 64; j += 16) {
      _mm_prefetch(reinterpret_cast<const char*>(x + i + kAhead + j), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(h + i + kAhead + j), _MM_HINT_T0);
    }
    uint64_t mask = 0;
    for (int j = 0; j < 8; ++j) {
      const int64_t at = i + 8 * j;
      mask |= uint64_t(ResidualBlockAvx2<kNorms>(x + at, h + at, below, r_acc[j & 1], x_acc[j & 1])) << (8 * j);
    }
    count = EmitResidual(x, h, i, mask, out, count);
  }
  for (; i + 16 <= n; i += 16) {
    uint64_t mask = ResidualBlockAvx2<kNorms>(x + i, h + i, below, r_acc[0], x_acc[0]);
    mask |= uint64_t(ResidualBlockAvx2<kNorms>(x + i + 8, h + i + 8, below, r_acc[1], x_acc[1])) << 8;
    count = EmitResidual(x, h, i, mask, out, count);
  }
  float r = 0, q = 0;
  if (kNorms) {
    float rl[8], xl[8];
    _mm256_storeu_ps(rl, _mm256_add_ps(r_acc[0], r_acc[1]));
    _mm256_storeu_ps(xl, _mm256_add_ps(x_acc[0], x_acc[1]));
    for (int j = 0; j < 8; ++j) r += rl[j], q += xl[j];
  }
  for (; i < n; ++i) {
    const float d = x[i] - h[i];
    if (kNorms) r += d * d, q += x[i] * x[i];
    int32_t key = int32_t(FloatBits(d) & 0x7fffffffu);
    if (key >= t) out[count++] = Word(key, i);
  }
  if (kNorms) *rr = r, *xx = q;
  return count;
}
#endif

struct Residual {
  const float* x;
  const float* h;
  uint32_t operator()(int64_t i) const { return FloatBits(x[i] - h[i]); }
  void Prefetch(int64_t i) const {
    __builtin_prefetch(x + i);
    __builtin_prefetch(h + i);
  }
  template <bool kMagnitude>
  int64_t FastPass(int64_t n, int32_t t, uint64_t* out) const {
#if defined(__x86_64__) && defined(__GNUC__)
    if (kMagnitude && HasAvx2()) return ResidualPassAvx2(x, h, n, t, out);
#endif
    return -1;
  }
};

template <typename Src, typename = void>
struct HasFastPass : std::false_type {};
template <typename Src>
struct HasFastPass<Src, std::void_t<decltype(&Src::template FastPass<true>)>> : std::true_type {};

constexpr int64_t kBlock = 32;
// Rows of at least this many entries take the sampled threshold (below, the sample's cost is not
// repaid). Measured: n = 36864, k = 368, one row cache-hot: heap 69 us, sampled 17 us; [8, 2304],
// k = 23, one call: 42.6 us with the heap, 38.3 us sampled.
constexpr int64_t kSampleMinN = 1024;
constexpr int64_t kMaxSample = 1024;
constexpr int64_t kRun = 16;

// The rank-th largest of v[0, n) (1 <= rank <= n) for T = int32_t keys or uint64_t words: one
// histogram of the values' top bits between their minimum and maximum, then nth_element among the
// members of the bucket that holds it only. nth_element on all n costs ~10 ns per entry on data it
// has not seen before (its branches are unpredictable); the histogram's passes are branch-free
// (sampled threshold of a ResNet-20 x 8 round, 1024 keys a row: 1.3 -> 0.3 ms).
constexpr int kBucketBits = 11;
constexpr int64_t kHistogramMinN = 128;  // below, nth_element's cost is less than the histogram's

inline uint32_t CoarseKey(int32_t key) { return uint32_t(key) ^ 0x80000000u; }
inline uint32_t CoarseKey(uint64_t word) { return uint32_t(word >> 32); }

// The histogram of v[0, n)'s top bits between their min and max (n >= rank >= 1), and the bucket
// that holds the rank-th largest: its members are the values with ((CoarseKey - lo) >> shift) ==
// bucket, `above` values lie in higher buckets.
struct RankBucket {
  uint32_t lo;
  int shift;
  uint32_t bucket;
  int64_t above;
  uint32_t size;  // members of the bucket
};

template <typename T>
RankBucket FindRankBucket(const T* v, int64_t n, int64_t rank) {
  uint32_t lo = ~0u, hi = 0;
  for (int64_t c = 0; c < n; ++c) {
    const uint32_t key = CoarseKey(v[c]);
    lo = std::min(lo, key);
    hi = std::max(hi, key);
  }
  int shift = 0;
  while (((hi - lo) >> shift) >> kBucketBits) ++shift;
  uint32_t hist[1 << kBucketBits] = {0};
  for (int64_t c = 0; c < n; ++c) ++hist[(CoarseKey(v[c]) - lo) >> shift];
  int64_t above = 0;
  uint32_t b = (hi - lo) >> shift;
  while (above + hist[b] < rank) above += hist[b--];  // the buckets hold all n >= rank values
  return RankBucket{lo, shift, b, above, hist[b]};
}

template <typename T>
T KthLargest(T* v, int64_t n, int64_t rank) {
  if (n < kHistogramMinN) {
    std::nth_element(v, v + (rank - 1), v + n, std::greater<T>());
    return v[rank - 1];
  }
  const RankBucket rb = FindRankBucket(v, n, rank);
  // The wanted value is the (rank - above)-th largest of the bucket. The append writes before it
  // tests, hence one spare slot.
  thread_local std::vector<T> side;
  side.resize(rb.size + 1);
  int64_t m = 0;
  for (int64_t c = 0; c < n; ++c) {
    side[m] = v[c];
    m += ((CoarseKey(v[c]) - rb.lo) >> rb.shift) == rb.bucket;
  }
  const int64_t need = rank - rb.above;
  std::nth_element(side.begin(), side.begin() + (need - 1), side.begin() + m, std::greater<T>());
  return side[need - 1];
}

// A key t at or below the rank-th largest of v[0, n) (1 <= rank <= n), with at least `rank`
// values >= t: the lower edge of the histogram bucket (as in KthLargest) that holds the rank-th
// largest. Cheaper than KthLargest (no gather of the bucket, no nth_element) where any such
// threshold will do: the sampled threshold only decides how many candidates a pass keeps.
inline int32_t RankFloor(int32_t* v, int64_t n, int64_t rank) {
  if (n < kHistogramMinN) return KthLargest(v, n, rank);
  const RankBucket rb = FindRankBucket(v, n, rank);
  return int32_t((rb.lo + (rb.bucket << rb.shift)) ^ 0x80000000u);
}

// Keeps the k best of words[0, count) in words[0, k), in their order (the passes write words by
// increasing index, so the kept set comes out by index: its updates then walk memory forward).
inline void KeepBest(uint64_t* words, int64_t count, int64_t k) {
  if (k == count) return;
  const uint64_t kth = KthLargest(words, count, k);
  int64_t out = 0;
  for (int64_t c = 0; c < count; ++c) {
    const uint64_t w = words[c];
    words[out] = w;
    out += w >= kth;
  }
}

// The k best of all n words of a row, by index, into words[0, k). `words` is scratch that
// only grows, so no row pays for initialising n words it then overwrites.
template <bool kMagnitude, typename Src>
void SelectAll(const Src& x, int64_t n, int64_t k, std::vector<uint64_t>& words) {
  if (int64_t(words.size()) < n) words.resize(n);
  for (int64_t i = 0; i < n; ++i) words[i] = Word(OrderKey<kMagnitude>(x(i)), i);
  KeepBest(words.data(), n, k);
}

// One pass over a row: writes Word(key, i) of every entry with key >= t to `out` (room for n words)
// and returns how many. A 64-bit mask per 64 entries, then one store per set bit: with AVX2 the
// mask is a few vector compares (about 0.25 ns per entry here, 4-5x the SSE2 build); the pass is
// compiled for both and chosen at run time.
#define JAXGOSSIP_PASS_BODY                                                                     \
  int64_t count = 0, i = 0;                                                                     \
  for (; i + 64 <= n; i += 64) {                                                                \
    uint64_t mask = 0;                                                                          \
    for (int64_t j = 0; j < 64; ++j) mask |= uint64_t(OrderKey<kMagnitude>(x(i + j)) >= t) << j; \
    while (mask) {                                                                              \
      int j = __builtin_ctzll(mask);                                                            \
      mask &= mask - 1;                                                                         \
      out[count++] = Word(OrderKey<kMagnitude>(x(i + j)), i + j);                               \
    }                                                                                           \
  }                                                                                             \
  for (; i < n; ++i) {                                                                          \
    int32_t key = OrderKey<kMagnitude>(x(i));                                                   \
    if (key >= t) out[count++] = Word(key, i);                                                  \
  }                                                                                             \
  return count;

template <bool kMagnitude, typename Src>
int64_t PassBase(const Src& x, int64_t n, int32_t t, uint64_t* out) {
  JAXGOSSIP_PASS_BODY
}

#if defined(__x86_64__) && defined(__GNUC__)
template <bool kMagnitude, typename Src>
__attribute__((target("avx2"))) int64_t PassAvx2(const Src& x, int64_t n, int32_t t, uint64_t* out) {
  JAXGOSSIP_PASS_BODY
}
#endif

template <bool kMagnitude, typename Src>
int64_t Pass(const Src& x, int64_t n, int32_t t, uint64_t* out) {
  if constexpr (HasFastPass<Src>::value) {
    const int64_t count = x.template FastPass<kMagnitude>(n, t, out);
    if (count >= 0) return count;
  }
#if defined(__x86_64__) && defined(__GNUC__)
  if (HasAvx2()) return PassAvx2<kMagnitude>(x, n, t, out);
#endif
  return PassBase<kMagnitude>(x, n, t, out);
}

// A threshold t for the k best of a row, from a sample: about 1.25 k + O(sqrt k) entries have a key
// >= t, rarely fewer than k.
template <bool kMagnitude, typename Src>
int32_t SampledThreshold(const Src& x, int64_t n, int64_t k, std::vector<int32_t>& sample) {
  // Runs of kRun contiguous entries spread evenly over the row: one cache line per run (a sample
  // of single entries at a stride touches a line per entry, which cost 2x on rows out of cache).
  const int64_t size = std::min<int64_t>(kMaxSample, n / 4) / kRun * kRun;
  const int64_t step = n / (size / kRun);
  sample.resize(size);
  // The runs lie far apart: ask for all their lines first, so that the misses overlap.
  for (int64_t r = 0; r < size / kRun; ++r) x.Prefetch(r * step);
  for (int64_t r = 0; r < size / kRun; ++r) {
    for (int64_t j = 0; j < kRun; ++j) sample[r * kRun + j] = OrderKey<kMagnitude>(x(r * step + j));
  }
  // Expected sampled entries above the k-th best: m = k size / n; aim a few deviations lower, so
  // that the pass keeps about k + 4 sqrt(m) n / size entries and rarely fewer than k.
  const double m = double(k) * double(size) / double(n);
  const int64_t rank = std::min<int64_t>(size, int64_t(1.25 * m + 4.0 * std::sqrt(m) + 4.0));
  return RankFloor(sample.data(), size, rank);
}

// The k best words of a row, by index, into words[0, k), from the `count` candidates a pass at a
// threshold t left in words (every entry whose key is >= t). If at least k entries passed, the
// k-th largest key is >= t, so the k best are all among them; otherwise the row takes SelectAll.
template <bool kMagnitude, typename Src>
void KeepFromCandidates(const Src& x, int64_t n, int64_t k, int64_t count, std::vector<uint64_t>& words) {
  if (count < k) {
    SelectAll<kMagnitude>(x, n, k, words);
    return;
  }
  KeepBest(words.data(), count, k);
}

// The k best words of a row, by index, into words[0, k), through a sampled threshold.
template <bool kMagnitude, typename Src>
void SelectSampled(const Src& x, int64_t n, int64_t k, std::vector<uint64_t>& words,
                   std::vector<int32_t>& sample) {
  const int32_t t = SampledThreshold<kMagnitude>(x, n, k, sample);
  if (int64_t(words.size()) < n) words.resize(n);
  KeepFromCandidates<kMagnitude>(x, n, k, Pass<kMagnitude>(x, n, t, words.data()), words);
}

// The k best words of one row into words[0, k): best first if `sorted`, else in any order (the
// dense message needs only the set).
template <bool kMagnitude, typename Src>
void SelectRow(const Src& x, int64_t n, int64_t k, bool sorted, std::vector<uint64_t>& words,
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
  for (int64_t i = 0; i < k; ++i) words.push_back(Word(OrderKey<kMagnitude>(x(i)), i));
  auto cmp = std::greater<uint64_t>();  // min-heap: the k-th best word on top
  std::make_heap(words.begin(), words.end(), cmp);
  int32_t kth = KeyOf(words.front());
  auto offer = [&](int64_t i) {
    int32_t key = OrderKey<kMagnitude>(x(i));
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
    for (int64_t j = 0; j < kBlock; ++j) any |= OrderKey<kMagnitude>(x(i + j)) > kth;
    if (any) {
      for (int64_t j = 0; j < kBlock; ++j) offer(i + j);
    }
  }
  for (; i < n; ++i) offer(i);
  if (sorted) std::sort(words.begin(), words.end(), std::greater<uint64_t>());  // best first
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
  // The caller works too: num_threads - 1 helpers keep one thread per core (XLA sizes its pool to
  // the cores; one helper more ran 3 threads on 2 cores and cost ~10 % here).
  int64_t helpers = std::min<int64_t>(pool.num_threads() - 1, rows - 1);
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule(decltype(work)(work));
  work();
  while (shared->done.load(std::memory_order_acquire) < rows) std::this_thread::yield();
}


}  // namespace jaxgossip

#endif  // JAXGOSSIP_CSRC_SELECT_H_
