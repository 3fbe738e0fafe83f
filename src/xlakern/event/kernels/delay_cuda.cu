// CUDA kernel of synaptic delays (see delay_common.h): one warp per presynaptic row; inactive
// rows return at once, active ones add their synapses into the ring with atomics (rows share
// ring entries). t is read on the device, so a traced step counter costs no copy.

#include <cuda_runtime.h>
#include <cstdint>

#include "event_common.h"
#include "delay_common.h"

namespace {

using namespace xk_event;
using namespace xk_delay;

constexpr int kThreads = 256;

template <typename W, typename I, typename S, bool B>
__global__ void deliver_kernel(W* ring, const S* ev, const W* data, const I* idx, const I* indptr,
                               const int32_t* delays, const int32_t* t, Ring g, SpikeRule<S, B> rule) {
  const int64_t r = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= g.nrows || !rule.active(ev[r])) return;
  const W f = rule.template value<W>(ev[r]);
  const int64_t t0 = floor_mod(int64_t(*t), g.nslots);
  int64_t begin, end;
  row_range(indptr, -1, g.nse, r, begin, end);
  for (int64_t e = begin + lane; e < end; e += 32) {
    const int64_t c = int64_t(idx[e]);
    if (uint64_t(c) >= uint64_t(g.ncols)) continue;
    const int64_t slot = floor_mod(t0 + floor_mod(delays[e], g.nslots), g.nslots);
    atomicAdd(ring + slot * g.ncols + c, (g.homo ? data[0] : data[e]) * f);
  }
}

}  // namespace

// @xk delay_deliver arg arg arg arg arg arg arg ret attr.weighted:bool stream
void delay_deliver(const xk::Tensor ring, const xk::Tensor events, const xk::Tensor data, const xk::Tensor indices,
                   const xk::Tensor indptr, const xk::Tensor delays, const xk::Tensor t, xk::Tensor out,
                   bool weighted, int64_t stream) {
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  const Ring g = checked_ring(ring, events, data, indices, indptr, delays, t, out);
  if (out.data_ptr() != ring.data_ptr())
    XK_CUDA_CHECK(cudaMemcpyAsync(out.data_ptr(), ring.data_ptr(), ring.nbytes(), cudaMemcpyDeviceToDevice, st));
  if (out.numel() == 0 || g.nrows == 0) return;
  const unsigned blocks = unsigned((g.nrows * 32 + kThreads - 1) / kThreads);
  auto run = [&](auto wt) {
    using W = typename decltype(wt)::type;
    dispatch_index(indices.dtype(), [&](auto it) {
      using I = typename decltype(it)::type;
      dispatch_spikes(events, !weighted, ring.dtype(), [&](auto stag, auto rule) {
        using S = typename decltype(stag)::type;
        deliver_kernel<<<blocks, kThreads, 0, st>>>(out.data_ptr<W>(), events.data_ptr<S>(), data.data_ptr<W>(),
                                                    indices.data_ptr<I>(), indptr.data_ptr<I>(),
                                                    delays.data_ptr<int32_t>(), t.data_ptr<int32_t>(), g, rule);
      });
    });
  };
  if (ring.dtype() == xk::DType::Float64) run(Tag<double>{});
  else run(Tag<float>{});
  XK_CHECK_LAUNCH();
}
