// Exact top-k selection over the last axis for XLA:CPU, registered through the XLA FFI.
//
// XLA:CPU's TopK sorts each row with a scalar comparison loop (about 14 us for the max of a
// 10,000-entry row on the project's 2-core machine). The selection (three strategies by row length
// and k, the order and the tie rule of lax.top_k) is in select.h; values come out in descending
// order, as lax.top_k's.
//
// Handlers (x: [..., n], rows = the product of the leading dims, k static):
//   jaxgossip_top_k_{f32,bf16,f16}:      values [..., k] (x's dtype), indices [..., k] (int32)
//   jaxgossip_top_k_dense_{f32,bf16,f16}: out [..., n], the k largest |x| of each row kept in
//                                         place and every other entry +0 (a top-k compressor's
//                                         dense message).
#include "select.h"

namespace {

using namespace jaxgossip;

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
    SelectRow</*kMagnitude=*/false>(Row<Bits>{row}, n, k, /*sorted=*/true, words, sample);
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
    SelectRow</*kMagnitude=*/true>(Row<Bits>{row}, n, k, /*sorted=*/false, words, sample);
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
