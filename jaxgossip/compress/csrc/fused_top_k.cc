// One round of top-k compressed gossip with public copies (Choco-Gossip, Sparse-Push, SCSP) for
// XLA:CPU, fused into one call over all leaves and registered through the XLA FFI.
//
// For every leaf, node i, the public-copy set c of the round and the edges (j -> i, W_ij):
//
//   q_i    = TopK_{k_i}(x_i - h_i^c)                     (exact: the set lax.top_k(|r|) picks)
//   h_i^c += q_i                                         (at the k_i kept entries only)
//   s_i^c += sum_j W_ij q_j                              (self edge included iff self_in_s)
//   x_i   += gamma (s_i^c + [!self_in_s] W_ii h_i^c - h_i^c)
//
// XLA runs this as a top-k, a scatter and five dense elementwise passes that it does not fuse into
// one loop (15 reads and writes of [N, D] per round on CPU). Here: phase A, per (leaf, node), selects
// on x - h computed on the fly (nothing materialised), updates h at the kept entries and makes
// the dense update with the old s while the row is still in cache; phase B, per (leaf, receiver),
// adds each in-neighbour's K weighted entries to s and gamma times them to x. Dense traffic: read
// x, h (selection; again from cache), read s, write x. Phase B of a receiver needs phase A of itself
// and of its in-neighbours; it runs as soon as they are done, mostly right after the receiver's
// own phase A, which has just brought its rows of x and s into cache.
//
// Rounding: x gets gamma (s - h) and then gamma W_ij q_j per message, where XLA forms
// gamma ((s + sum_j W_ij q_j) - h); s gets the messages one by one, where XLA adds their sum. Both
// differ from XLA's result by float32 round-off only; the kept set and h are bitwise XLA's.
//
// SCSP's budget growth: a row of thresholds t_1 <= ... <= t_M per leaf (NaN-padded past its own
// M) gives k_i = K + #{m : t_m <= rho_i}, rho_i = ||x_i - h_i|| / max(||x_i||, FLT_MIN) of the row,
// computed in phase A from the row it selects on. The thresholds are the points where SCSP's rule
// (jaxgossip/algorithms/scsp.py, the only place it is written) steps up, so the kernel applies that
// rule without restating it; a NaN rho passes no threshold and takes K. Float32 sums: the norms,
// hence k_i at an exact step, may differ from XLA's reduction order by round-off. On rows of the
// sampled path the norms come from the selection's own pass, whose threshold is set for K + M (a
// superset of the k_i best); the k_i best are then kept from those candidates.
//
// Handler jaxgossip_fused_top_k_f32 (B... batch dims from vmap, possibly none; L leaves):
//   args: copy s32 [B...], senders s32 [B..., E], receivers s32 [B..., E], weights f32 [B..., E],
//         gamma f32 [B...], growth f32 [B..., L, M] (M >= 0; see above), kept s32 [B..., L, N] (K,
//         or SCSP's base K), then
//         x_l f32 [B..., N, ...] (L of them), h_l f32 [B..., P, N, ...] (L), s_l (L, as h_l);
//   rets: x_l, h_l, s_l (3 L), aliased to the last 3 L args (updated in place), then the counts
//         s32 [B..., L, N] actually sent;
//   attrs: self_in_s (bool).
// Edges of weight 0 (padding) carry nothing. A kept count outside [1, D_l], a copy index outside
// [0, P) or an edge endpoint outside [0, N) is an error.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "select.h"

namespace {

using namespace jaxgossip;

// sum_t (x_t - h_t)^2 and sum_t x_t^2 in float32, in 32 lanes (the order differs from XLA's
// reduction: round-off only).
void SumSquaresBase(const float* x, const float* h, int64_t n, float* rr, float* xx) {
  float r_acc[8] = {0}, x_acc[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) {
      const float d = x[i + j] - h[i + j];
      r_acc[j] += d * d;
      x_acc[j] += x[i + j] * x[i + j];
    }
  }
  for (; i < n; ++i) {
    const float d = x[i] - h[i];
    r_acc[0] += d * d;
    x_acc[0] += x[i] * x[i];
  }
  float r = 0, q = 0;
  for (int j = 0; j < 8; ++j) r += r_acc[j], q += x_acc[j];
  *rr = r;
  *xx = q;
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) void SumSquaresAvx2(const float* x, const float* h, int64_t n, float* rr, float* xx) {
  __m256 r0 = _mm256_setzero_ps(), r1 = _mm256_setzero_ps(), x0 = _mm256_setzero_ps(), x1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(x + i + kAhead), _MM_HINT_T0);  // as the pass (select.h)
    _mm_prefetch(reinterpret_cast<const char*>(h + i + kAhead), _MM_HINT_T0);
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    const __m256 da = _mm256_sub_ps(a, _mm256_loadu_ps(h + i)), db = _mm256_sub_ps(b, _mm256_loadu_ps(h + i + 8));
    r0 = _mm256_add_ps(r0, _mm256_mul_ps(da, da));
    r1 = _mm256_add_ps(r1, _mm256_mul_ps(db, db));
    x0 = _mm256_add_ps(x0, _mm256_mul_ps(a, a));
    x1 = _mm256_add_ps(x1, _mm256_mul_ps(b, b));
  }
  float rl[8], xl[8];
  _mm256_storeu_ps(rl, _mm256_add_ps(r0, r1));
  _mm256_storeu_ps(xl, _mm256_add_ps(x0, x1));
  float r = 0, q = 0;
  for (int j = 0; j < 8; ++j) r += rl[j], q += xl[j];
  for (; i < n; ++i) {
    const float d = x[i] - h[i];
    r += d * d;
    q += x[i] * x[i];
  }
  *rr = r;
  *xx = q;
}
#endif

void SumSquares(const float* x, const float* h, int64_t n, float* rr, float* xx) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (HasAvx2()) return SumSquaresAvx2(x, h, n, rr, xx);
#endif
  SumSquaresBase(x, h, n, rr, xx);
}

// Steps of SCSP's budget (see the header) that the row's squared norms pass.
int64_t Growth(float rr, float xx, const float* steps, int64_t m) {
  const float rho = std::sqrt(rr) / std::max(std::sqrt(xx), std::numeric_limits<float>::min());
  return std::partition_point(steps, steps + m, [rho](float t) { return t <= rho; }) - steps;
}

// x += g (s - h) (kSelfInS), else x += g ((s + a h) - h), in that order of operations.
template <bool kSelfInS>
void DenseUpdateBase(float* x, const float* s, const float* h, int64_t d, float g, float a) {
  if (kSelfInS) {
    for (int64_t t = 0; t < d; ++t) x[t] = x[t] + g * (s[t] - h[t]);
  } else {
    for (int64_t t = 0; t < d; ++t) x[t] = x[t] + g * ((s[t] + a * h[t]) - h[t]);
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
// x and h are in cache from the selection; s is not: its lines are asked for kAhead entries ahead.
template <bool kSelfInS>
__attribute__((target("avx2"))) void DenseUpdateAvx2(float* x, const float* s, const float* h, int64_t d, float g,
                                                     float a) {
  const __m256 gv = _mm256_set1_ps(g), av = _mm256_set1_ps(a);
  int64_t t = 0;
  for (; t + 16 <= d; t += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(s + t + kAhead), _MM_HINT_T0);
    for (int j = 0; j < 16; j += 8) {
      const __m256 sv = _mm256_loadu_ps(s + t + j), hv = _mm256_loadu_ps(h + t + j);
      const __m256 in = kSelfInS ? sv : _mm256_add_ps(sv, _mm256_mul_ps(av, hv));
      const __m256 step = _mm256_mul_ps(gv, _mm256_sub_ps(in, hv));
      _mm256_storeu_ps(x + t + j, _mm256_add_ps(_mm256_loadu_ps(x + t + j), step));
    }
  }
  DenseUpdateBase<kSelfInS>(x + t, s + t, h + t, d - t, g, a);
}
#endif

template <bool kSelfInS>
void DenseUpdate(float* x, const float* s, const float* h, int64_t d, float g, float a) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (HasAvx2()) return DenseUpdateAvx2<kSelfInS>(x, s, h, d, g, a);
#endif
  DenseUpdateBase<kSelfInS>(x, s, h, d, g, a);
}

struct Leaf {
  float* x;    // [B, N, D]
  float* h;    // [B, P, N, D]
  float* s;    // [B, P, N, D]
  int64_t d;   // entries per node
  int64_t kmax;
  int64_t offset;  // start of this leaf's messages in the scratch, per batch
};

ffi::Error Fail(const std::string& what) { return ffi::Error::InvalidArgument("fused_top_k: " + what); }

template <bool kSelfInS>
ffi::Error Round(ffi::ThreadPool& pool, ffi::RemainingArgs& args, ffi::RemainingRets& rets) {
  const int64_t num_args = int64_t(args.size());
  constexpr int64_t kFirst = 7;  // the first leaf operand
  if (num_args < kFirst + 3 || (num_args - kFirst) % 3 != 0) return Fail("expected 7 + 3 L operands");
  const int64_t num_leaves = (num_args - kFirst) / 3;
  if (int64_t(rets.size()) != 3 * num_leaves + 1) return Fail("expected 3 L + 1 results");
  auto arg = [&](int64_t i) { return args.get<ffi::AnyBuffer>(i).value(); };
  ffi::AnyBuffer copy = arg(0), senders = arg(1), receivers = arg(2), weights = arg(3), gamma = arg(4),
                 growth = arg(5), kept = arg(6);
  if (copy.element_type() != ffi::S32 || senders.element_type() != ffi::S32 ||
      receivers.element_type() != ffi::S32 || weights.element_type() != ffi::F32 ||
      gamma.element_type() != ffi::F32 || growth.element_type() != ffi::F32 || kept.element_type() != ffi::S32) {
    return Fail("operand dtypes must be s32 copy, s32 senders/receivers, f32 weights/gamma/growth, s32 kept");
  }
  const int64_t batch = int64_t(gamma.element_count());
  if (int64_t(copy.element_count()) != batch) return Fail("copy and gamma need the same batch shape");
  const auto kdims = kept.dimensions();
  if (kdims.size() < 2 || kdims[kdims.size() - 2] != num_leaves) return Fail("kept must be [B..., L, N]");
  const int64_t n = kdims.back();
  if (n < 1 || int64_t(kept.element_count()) != batch * num_leaves * n) return Fail("kept must be [B..., L, N]");
  const auto gdims = growth.dimensions();
  const int64_t num_steps = gdims.size() == 0 ? 0 : gdims.back();
  if (gdims.size() < 2 || gdims[gdims.size() - 2] != num_leaves ||
      int64_t(growth.element_count()) != batch * num_leaves * num_steps) {
    return Fail("growth must be [B..., L, M]");
  }
  // Each (batch, leaf) row's own M: its thresholds before the NaN padding.
  const float* growth_d = growth.typed_data<float>();
  std::vector<int64_t> steps(batch * num_leaves, 0);
  for (int64_t u = 0; u < batch * num_leaves; ++u) {
    const float* g = growth_d + u * num_steps;
    while (steps[u] < num_steps && !std::isnan(g[steps[u]])) ++steps[u];
  }
  const int64_t e = senders.dimensions().size() == 0 ? 0 : senders.dimensions().back();
  if (int64_t(senders.element_count()) != batch * e || int64_t(receivers.element_count()) != batch * e ||
      int64_t(weights.element_count()) != batch * e) {
    return Fail("senders, receivers and weights must be [B..., E]");
  }
  const int32_t* copy_d = copy.typed_data<int32_t>();
  const int32_t* snd = senders.typed_data<int32_t>();
  const int32_t* rcv = receivers.typed_data<int32_t>();
  const float* wgt = weights.typed_data<float>();
  const float* gam = gamma.typed_data<float>();
  const int32_t* kd = kept.typed_data<int32_t>();
  auto counts_out = rets.get<ffi::AnyBuffer>(3 * num_leaves).value();
  if (counts_out->element_type() != ffi::S32 || int64_t(counts_out->element_count()) != batch * num_leaves * n) {
    return Fail("the counts result must be s32 [B..., L, N]");
  }
  int32_t* sent = reinterpret_cast<int32_t*>(counts_out->untyped_data());

  // Leaves: results alias the operands; if XLA ever hands separate buffers, start from a copy.
  std::vector<Leaf> leaves(num_leaves);
  int64_t num_copies = -1, per_batch = 0, entries = 0;
  for (int64_t l = 0; l < num_leaves; ++l) {
    float* ptrs[3];
    int64_t counts[3];
    for (int64_t part = 0; part < 3; ++part) {
      ffi::AnyBuffer in = arg(kFirst + part * num_leaves + l);
      auto out = rets.get<ffi::AnyBuffer>(part * num_leaves + l).value();
      if (in.element_type() != ffi::F32 || out->element_type() != ffi::F32) return Fail("leaves must be float32");
      if (out->untyped_data() != in.untyped_data()) std::memcpy(out->untyped_data(), in.untyped_data(), in.size_bytes());
      ptrs[part] = reinterpret_cast<float*>(out->untyped_data());
      counts[part] = int64_t(in.element_count());
    }
    if (counts[0] % (batch * n) != 0 || counts[0] == 0) return Fail("leaf " + std::to_string(l) + " is not [B..., N, ...]");
    const int64_t d = counts[0] / (batch * n);
    if (counts[1] != counts[2] || counts[1] % counts[0] != 0) return Fail("h and s must be [B..., P, N, ...]");
    const int64_t p = counts[1] / counts[0];
    if (num_copies >= 0 && p != num_copies) return Fail("every leaf needs the same number P of copy sets");
    num_copies = p;
    int64_t kmax = 0;
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t k = kd[(b * num_leaves + l) * n + i];
        const int64_t grown = k + steps[b * num_leaves + l];
        if (k < 1 || k > d) return Fail("kept count " + std::to_string(k) + " out of range [1, " + std::to_string(d) + "]");
        if (grown > d) {
          return Fail("kept count " + std::to_string(k) + " plus " + std::to_string(grown - k) +
                      " budget steps exceeds the leaf's " + std::to_string(d) + " entries");
        }
        kmax = std::max(kmax, grown);
      }
    }
    leaves[l] = Leaf{ptrs[0], ptrs[1], ptrs[2], d, kmax, per_batch};
    per_batch += n * kmax;
    entries += batch * n * d;
  }
  for (int64_t b = 0; b < batch; ++b) {
    if (copy_d[b] < 0 || copy_d[b] >= num_copies) return Fail("copy index out of range [0, P)");
  }
  for (int64_t i = 0; i < batch * e; ++i) {
    if (snd[i] < 0 || snd[i] >= n || rcv[i] < 0 || rcv[i] >= n) return Fail("edge endpoint out of range [0, N)");
  }

  // Per batch: the in-edges of every receiver (CSR, self edge excluded unless self_in_s) and the
  // self weights W_ii.
  std::vector<int64_t> start(batch * (n + 1), 0);
  std::vector<int32_t> from;
  std::vector<float> weight_of, self_w(batch * n, 0.0f);
  from.reserve(batch * e);
  weight_of.reserve(batch * e);
  for (int64_t b = 0; b < batch; ++b) {
    int64_t* st = start.data() + b * (n + 1);
    const int64_t base = int64_t(from.size());
    std::vector<int64_t> count(n, 0);
    for (int64_t j = 0; j < e; ++j) {
      const int64_t q = b * e + j;
      if (wgt[q] == 0.0f) continue;
      if (snd[q] == rcv[q]) self_w[b * n + rcv[q]] += wgt[q];
      if (snd[q] != rcv[q] || kSelfInS) ++count[rcv[q]];
    }
    st[0] = base;
    for (int64_t i = 0; i < n; ++i) st[i + 1] = st[i] + count[i];
    from.resize(st[n]);
    weight_of.resize(st[n]);
    std::vector<int64_t> fill(st, st + n);
    for (int64_t j = 0; j < e; ++j) {
      const int64_t q = b * e + j;
      if (wgt[q] == 0.0f || (snd[q] == rcv[q] && !kSelfInS)) continue;
      from[fill[rcv[q]]] = snd[q];
      weight_of[fill[rcv[q]]++] = wgt[q];
    }
  }

  // The messages: uninitialised (a std::vector would zero them, ~1 MB a round at N = 16), every
  // slot that phase B reads is written by phase A first.
  std::unique_ptr<int32_t[]> q_index(new int32_t[batch * per_batch]);
  std::unique_ptr<float[]> q_value(new float[batch * per_batch]);
  // Work: for every unit u = (batch member b, leaf l), N items of phase A (per node: select,
  // update the own copy, dense update of x with the old s) and N of phase B (per receiver: add the
  // in-neighbours' messages to s, gamma times them to x). B(u, i) needs A(u, i) (the dense update
  // reads the old s) and A(u, j) of every in-neighbour j (their messages). The threads take the A
  // items in order; whoever completes the last of those prerequisites runs B(u, i) at once, so B
  // of a node whose in-neighbours are done finds its rows of x and s still in L2 from its own A
  // (N = 16, SCSP at its cap: the message phase was ~17 ns an entry on rows gone to L3). Any such
  // order gives the same result: B(u, i) adds the messages in the in-edges' order whoever runs it.
  const int64_t units = batch * num_leaves;
  const int64_t mean_entries = std::max<int64_t>(1, entries / (units * n));
  // Out-edges of every sender (CSR, per batch): the receivers whose B an A brings closer.
  std::vector<int64_t> out_start(batch * (n + 1), 0);
  std::vector<int32_t> to(from.size());
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t* st = start.data() + b * (n + 1);
    int64_t* os = out_start.data() + b * (n + 1);
    std::vector<int64_t> count(n, 0);
    for (int64_t m = st[0]; m < st[n]; ++m) ++count[from[m]];
    os[0] = st[0];
    for (int64_t j = 0; j < n; ++j) os[j + 1] = os[j] + count[j];
    std::vector<int64_t> fill(os, os + n);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t m = st[r]; m < st[r + 1]; ++m) to[fill[from[m]]++] = int32_t(r);
    }
  }
  // pending[u n + i]: the prerequisites of B(u, i) not yet done, A(u, i) and one per in-edge. Each
  // A decrements its own and its out-neighbours' counts; the thread that brings one to 0 runs that
  // B (acq_rel: it then sees every message and dense update the others wrote before decrementing).
  // O(E) a leaf, whatever the degrees.
  std::unique_ptr<std::atomic<int64_t>[]> pending(new std::atomic<int64_t>[units * n]);
  for (int64_t u = 0; u < units; ++u) {
    const int64_t* st = start.data() + (u / num_leaves) * (n + 1);
    for (int64_t i = 0; i < n; ++i) pending[u * n + i].store(1 + st[i + 1] - st[i], std::memory_order_relaxed);
  }
  auto phase_a = [&](int64_t b, int64_t l, int64_t i) {
    thread_local std::vector<uint64_t> words;
    thread_local std::vector<int32_t> sample;
    const Leaf& leaf = leaves[l];
    const int64_t d = leaf.d, c = copy_d[b];
    float* x = leaf.x + (b * n + i) * d;
    float* h = leaf.h + ((b * num_copies + c) * n + i) * d;
    const float* s = leaf.s + ((b * num_copies + c) * n + i) * d;
    int64_t k = kd[(b * num_leaves + l) * n + i];
    const Residual r{x, h};
    const int64_t m = steps[b * num_leaves + l];
    if (m > 0) {
      const float* g = growth_d + (b * num_leaves + l) * num_steps;
      const int64_t k_max = k + m;
      float rr, xx;
      if (HasAvx2() && d >= kSampleMinN && k_max * 16 <= d) {
        // One read of the row for the norms and the candidates: a threshold for k_max >= k_i
        // keeps a superset of the k_i best (SCSP 1 % at its cap, ResNet-20 x 8: 4.1 -> 3.5 ms).
        const int32_t t = SampledThreshold</*kMagnitude=*/true>(r, d, k_max, sample);
        if (int64_t(words.size()) < d) words.resize(d);
        const int64_t count = ResidualPassAvx2</*kNorms=*/true>(x, h, d, t, words.data(), &rr, &xx);
        k += Growth(rr, xx, g, m);
        KeepFromCandidates</*kMagnitude=*/true>(r, d, k, count, words);
      } else {
        SumSquares(x, h, d, &rr, &xx);
        k += Growth(rr, xx, g, m);
        SelectRow</*kMagnitude=*/true>(r, d, k, /*sorted=*/false, words, sample);
      }
    } else {
      SelectRow</*kMagnitude=*/true>(r, d, k, /*sorted=*/false, words, sample);
    }
    sent[(b * num_leaves + l) * n + i] = int32_t(k);
    int32_t* qi = q_index.get() + b * per_batch + leaf.offset + i * leaf.kmax;
    float* qv = q_value.get() + b * per_batch + leaf.offset + i * leaf.kmax;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t idx = IndexOf(words[j]);
      const float v = x[idx] - h[idx];
      qi[j] = int32_t(idx);
      qv[j] = v;
      h[idx] = h[idx] + v;
    }
    DenseUpdate<kSelfInS>(x, s, h, d, gam[b], self_w[b * n + i]);
  };
  auto phase_b = [&](int64_t b, int64_t l, int64_t i) {
    const Leaf& leaf = leaves[l];
    const int64_t d = leaf.d, c = copy_d[b];
    float* x = leaf.x + (b * n + i) * d;
    float* s = leaf.s + ((b * num_copies + c) * n + i) * d;
    const float g = gam[b];
    const int64_t* st = start.data() + b * (n + 1);
    for (int64_t m = st[i]; m < st[i + 1]; ++m) {
      const int64_t j = from[m];
      const float w = weight_of[m];
      const int64_t k = sent[(b * num_leaves + l) * n + j];
      const int32_t* qi = q_index.get() + b * per_batch + leaf.offset + j * leaf.kmax;
      const float* qv = q_value.get() + b * per_batch + leaf.offset + j * leaf.kmax;
      for (int64_t t = 0; t < k; ++t) {
        const float wv = w * qv[t];
        s[qi[t]] += wv;
        x[qi[t]] += g * wv;
      }
    }
  };
  auto done_one = [&](int64_t b, int64_t l, int64_t u, int64_t i) {
    if (pending[u * n + i].fetch_sub(1, std::memory_order_acq_rel) == 1) phase_b(b, l, i);
  };
  ForEachRow(pool, units * n, mean_entries, [&](int64_t r) {
    const int64_t u = r / n, i = r % n;
    const int64_t b = u / num_leaves, l = u % num_leaves;
    phase_a(b, l, i);
    done_one(b, l, u, i);
    const int64_t* os = out_start.data() + b * (n + 1);
    for (int64_t m = os[i]; m < os[i + 1]; ++m) done_one(b, l, u, to[m]);
  });
  return ffi::Error::Success();
}

ffi::Error FusedTopK(ffi::ThreadPool pool, ffi::RemainingArgs args, ffi::RemainingRets rets, bool self_in_s) {
  return self_in_s ? Round<true>(pool, args, rets) : Round<false>(pool, args, rets);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxgossip_fused_top_k_f32, FusedTopK,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<bool>("self_in_s"));
