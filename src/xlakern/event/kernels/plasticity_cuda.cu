// CUDA kernel of the plasticity updates (see plasticity_common.h and plasticity_cpu.cc):
// one warp per row; a warp whose neuron did not spike returns at once, an active one updates
// its row's synapses lane by lane. Rows own disjoint synapses, so no atomics are needed.

#include <cuda_runtime.h>
#include <cstdint>

#include "event_common.h"
#include "plasticity_common.h"

namespace {

using namespace xk_event;
using namespace xk_plastic;

constexpr int kThreads = 256;

template <typename W, typename I, typename S, bool B>
__global__ void update_kernel(W* w, const I* idx, const I* indptr, const I* perm, const S* spk, const W* trace,
                              const W* bounds, Rows g, SpikeRule<S, B> rule) {
  const int64_t r = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= g.nrows || !rule.active(spk[r])) return;
  update_row(w, idx, indptr, perm, trace, bounds[0], bounds[1], g, r, lane, 32);
}

}  // namespace

// @xk plastic_update arg arg arg arg arg arg arg ret attr.ncols:int64 attr.nconn:int64 attr.mode:int64 attr.row_stride:int64 attr.col_stride:int64 attr.permuted:bool stream
void plastic_update(const xk::Tensor weight, const xk::Tensor indices, const xk::Tensor indptr, const xk::Tensor perm,
                    const xk::Tensor spikes, const xk::Tensor trace, const xk::Tensor bounds, xk::Tensor out,
                    int64_t ncols, int64_t nconn, int64_t mode, int64_t row_stride, int64_t col_stride,
                    bool permuted, int64_t stream) {
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  const DType dt = weight.dtype();
  const Rows g = checked_rows(weight, indices, indptr, perm, spikes, trace, bounds, out, ncols, nconn, mode,
                              row_stride, col_stride, permuted);
  if (out.data_ptr() != weight.data_ptr())
    XK_CUDA_CHECK(cudaMemcpyAsync(out.data_ptr(), weight.data_ptr(), weight.nbytes(), cudaMemcpyDeviceToDevice, st));
  if (g.nrows == 0 || g.nse == 0) return;
  const unsigned blocks = unsigned((g.nrows * 32 + kThreads - 1) / kThreads);
  auto run = [&](auto wt) {
    using W = typename decltype(wt)::type;
    dispatch_index(indices.dtype(), [&](auto it) {
      using I = typename decltype(it)::type;
      dispatch_spikes(spikes, true, dt, [&](auto stag, auto rule) {
        using S = typename decltype(stag)::type;
        const I* ptr = (mode == kDense || nconn >= 0) ? nullptr : indptr.data_ptr<I>();
        update_kernel<<<blocks, kThreads, 0, st>>>(out.data_ptr<W>(), indices.data_ptr<I>(), ptr,
                                                   permuted ? perm.data_ptr<I>() : nullptr, spikes.data_ptr<S>(),
                                                   trace.data_ptr<W>(), bounds.data_ptr<W>(), g, rule);
      });
    });
  };
  if (dt == DType::Float64) run(Tag<double>{});
  else run(Tag<float>{});
  XK_CHECK_LAUNCH();
}
