// CUDA kernels of xlakern.event's per-synapse CSR products (see csr_synapse_cpu.cc for what each
// computes). A warp takes 256 consecutive slots, 8 a lane (32 apart), and finds their rows together
// (lane_rows): each lane loads one row start, and ballots and shuffles place the slots among them.
// Reads and writes of the slots are coalesced, and every slot is written, so the outputs need no
// clearing.

#include <cuda_runtime.h>
#include <cstdint>

#include "event_common.h"
#include "event_sparse_cuda.cuh"
#include "csr_rows.h"
#include "csr_tools_common.h"

namespace {

using namespace xk_event;

constexpr int kSlotsPerLane = 8;
constexpr int64_t kSlotsPerWarp = 32 * kSlotsPerLane;

// Adds to the row of each of this lane's slots (base + 32 k + lane) the number of marked lanes whose
// row start lies at or before the slot; `offset` is a lane's start minus base, in (0, 256) where marked.
__device__ __forceinline__ void count_starts(unsigned marked, int offset, int lane, int64_t (&rows)[kSlotsPerLane]) {
  for (unsigned m = marked; m != 0; m &= m - 1) {
    const int b = __shfl_sync(0xffffffffu, offset, __ffs(m) - 1);
#pragma unroll
    for (int k = 0; k < kSlotsPerLane; ++k) rows[k] += k * 32 + lane >= b;
  }
}

// The rows of this lane's slots base + 32 k + lane (k < kSlotsPerLane), the whole warp calling.
// Each lane loads the start of one of 32 rows around find_row's first guess (the row of slot base were
// all rows one length): one load in flight a lane, no chain. A slot's row is then the last of those
// rows whose start is at or before it: the rows starting at or before base are counted by a ballot,
// the few starting inside the warp's 256 slots through shuffles. (Before, the warp searched, then each
// lane stepped from row to row, 8 dependent loads: on an H200, 400k rows of 80 in a loop, this took
// dt2t from 170 to 146 µs a step and the CSR weight gradient from 190 to 154.) Where the 32 rows do not
// cover the window (the guess is off, or rows are shorter than 8 slots) the warp searches from slot
// base and loads the next 32 starts, else steps. For a non-decreasing indptr every way gives
// find_row's answer; for a malformed one, some row in [-1, rows].
template <typename I>
__device__ __forceinline__ void lane_rows(const I* __restrict__ indptr, int64_t nrows, int64_t nse, int64_t base,
                                          int lane, int64_t (&rows)[kSlotsPerLane]) {
  const int64_t end = base + kSlotsPerWarp;
  int64_t g = nse > 0 ? int64_t(double(base) / double(nse) * double(nrows)) : 0;
  g = g < 0 ? 0 : (g > nrows ? nrows : g);
  // row -1 starts before every slot, rows past the last after every one
  const int64_t r = g - 1 + lane;
  const int64_t s = r < 0 ? INT64_MIN : (r > nrows ? INT64_MAX : clamped_start(indptr, r, nse));
  const unsigned before = __ballot_sync(0xffffffffu, s <= base), inside = __ballot_sync(0xffffffffu, s < end);
  if ((before & 1u) && !(inside >> 31)) {
    // the last lane starting at or before base holds the row of slot base; later rows in the window add
#pragma unroll
    for (int k = 0; k < kSlotsPerLane; ++k) rows[k] = g - 2 + __popc(before);
    count_starts(inside & ~before, s > base && s < end ? int(s - base) : 0, lane, rows);
    return;
  }
  const int64_t r0 = find_row(indptr, nrows, nse, base);
  const int64_t next = r0 + 1 + lane;  // >= 0: r0 >= -1
  const int64_t start = next <= nrows ? clamped_start(indptr, next, nse) : INT64_MAX;
  const unsigned ahead = __ballot_sync(0xffffffffu, start < end);
  if (ahead != 0xffffffffu) {
    // rows past r0 + 32 start after the window (were the indptr non-decreasing), so none is counted
#pragma unroll
    for (int k = 0; k < kSlotsPerLane; ++k) rows[k] = r0;
    count_starts(ahead, start <= base ? 0 : int(start - base), lane, rows);
    return;
  }
  int64_t row = r0;
#pragma unroll
  for (int k = 0; k < kSlotsPerLane; ++k) {
    const int64_t p = base + k * 32 + lane;
    if (p < nse) row = next_row(indptr, nrows, nse, row, p);
    rows[k] = row;
  }
}

template <typename W, typename I>
__global__ void __launch_bounds__(kThreads) dt2t_rows_kernel(const W* __restrict__ y, const W* __restrict__ w,
                                                             const I* __restrict__ indptr,
                                                             typename AccOf<W>::type* __restrict__ out, int64_t nrows,
                                                             int64_t nse, int64_t batch) {
  using A = typename AccOf<W>::type;
  const int64_t base = ((int64_t(blockIdx.x) * kThreads + threadIdx.x) >> 5) * kSlotsPerWarp;
  const int lane = threadIdx.x & 31;
  if (base >= nse) return;
  // The first batch row's weights are loaded before the rows are found, so their latency overlaps the
  // search's (H100, 400k rows of 80, a step of a jitted loop: 192 -> 133 µs; a kernel that only copies
  // w takes 124).
  A wv[kSlotsPerLane];
#pragma unroll
  for (int k = 0; k < kSlotsPerLane; ++k) {
    const int64_t p = base + k * 32 + lane;
    wv[k] = p < nse ? A(widen(w[p])) : A(0);
  }
  int64_t rows[kSlotsPerLane];
  lane_rows(indptr, nrows, nse, base, lane, rows);
  if (batch == 1) {  // all 8 row factors in flight together, then the stores
    A v[kSlotsPerLane];
#pragma unroll
    for (int k = 0; k < kSlotsPerLane; ++k)
      v[k] = rows[k] >= 0 && rows[k] < nrows && base + k * 32 + lane < nse ? wv[k] * A(widen(y[rows[k]])) : A(0);
#pragma unroll
    for (int k = 0; k < kSlotsPerLane; ++k)
      if (base + k * 32 + lane < nse) out[base + k * 32 + lane] = v[k];
    return;
  }
  for (int64_t b = 0; b < batch; ++b) {
#pragma unroll
    for (int k = 0; k < kSlotsPerLane; ++k) {
      const int64_t p = base + k * 32 + lane;
      if (p >= nse) break;
      const bool inside = rows[k] >= 0 && rows[k] < nrows;
      const A wb = b == 0 ? wv[k] : A(widen(w[b * nse + p]));
      out[b * nse + p] = inside ? wb * A(widen(y[b * nrows + rows[k]])) : A(0);
    }
  }
}

// nconn >= 0: fixed-count rows, nconn slots each (no indptr is read).
template <typename A, typename I>
__global__ void __launch_bounds__(kThreads) row_col_kernel(const A* __restrict__ a, const A* __restrict__ bb,
                                                           const I* __restrict__ idx, const I* __restrict__ indptr,
                                                           A* __restrict__ out, int64_t nrows, int64_t ncols,
                                                           int64_t nse, int64_t batch, int64_t nconn) {
  const int64_t base = ((int64_t(blockIdx.x) * kThreads + threadIdx.x) >> 5) * kSlotsPerWarp;
  const int lane = threadIdx.x & 31;
  if (base >= nse) return;
  int64_t rows[kSlotsPerLane];
  if (nconn > 0) {
    // One division a lane, then steps: a 64-bit division a slot cost more than the loads (slots 32
    // apart cross at most one row boundary when rows hold 32 or more).
    const int64_t p0 = base + lane;
    int64_t r = p0 / nconn, rem = p0 - r * nconn;
#pragma unroll
    for (int k = 0; k < kSlotsPerLane; ++k) {
      rows[k] = r;
      rem += 32;
      if (nconn >= 32) {
        if (rem >= nconn) {
          rem -= nconn;
          ++r;
        }
      } else {
        const int64_t q = int64_t(uint32_t(rem) / uint32_t(nconn));
        r += q;
        rem -= q * nconn;
      }
    }
  } else {
    lane_rows(indptr, nrows, nse, base, lane, rows);
  }
  // every slot's first row factor in flight at once, then the columns of the non-silent ones
  A first[kSlotsPerLane];
#pragma unroll
  for (int k = 0; k < kSlotsPerLane; ++k) {
    const bool ok = base + k * 32 + lane < nse && rows[k] >= 0 && rows[k] < nrows;
    first[k] = ok ? a[rows[k] * batch] : A(0);
  }
  if (batch == 1) {
    // one factor a row: each phase's loads of all 8 slots are in flight together (indices of the
    // non-silent rows only, then their columns), and every slot is written
    int64_t j[kSlotsPerLane];
#pragma unroll
    for (int k = 0; k < kSlotsPerLane; ++k) j[k] = first[k] != A(0) ? int64_t(idx[base + k * 32 + lane]) : -1;
    A v[kSlotsPerLane];
#pragma unroll
    for (int k = 0; k < kSlotsPerLane; ++k) v[k] = uint64_t(j[k]) < uint64_t(ncols) ? first[k] * bb[j[k]] : A(0);
#pragma unroll
    for (int k = 0; k < kSlotsPerLane; ++k)
      if (base + k * 32 + lane < nse) out[base + k * 32 + lane] = v[k];
    return;
  }
#pragma unroll
  for (int k = 0; k < kSlotsPerLane; ++k) {
    const int64_t p = base + k * 32 + lane;
    if (p >= nse) break;
    A v = A(0);
    if (rows[k] >= 0 && rows[k] < nrows) {
      const A* ar = a + rows[k] * batch;
      bool any = first[k] != A(0);
      for (int64_t b = 1; b < batch; ++b) any |= ar[b] != A(0);
      const int64_t j = any ? int64_t(idx[p]) : -1;  // a silent row: its columns are never read
      if (uint64_t(j) < uint64_t(ncols)) {
        v = first[k] * bb[j * batch];
        for (int64_t b = 1; b < batch; ++b) v += ar[b] * bb[j * batch + b];
      }
    }
    out[p] = v;
  }
}

// Each lane writes its 8 slots' rows (csr_rows.h), coalesced.
template <typename I, typename O>
__global__ void __launch_bounds__(kThreads) slot_rows_kernel(const I* __restrict__ indptr, O* __restrict__ out,
                                                             int64_t nrows, int64_t nse) {
  const int64_t base = ((int64_t(blockIdx.x) * kThreads + threadIdx.x) >> 5) * kSlotsPerWarp;
  const int lane = threadIdx.x & 31;
  if (base >= nse) return;
  int64_t rows[kSlotsPerLane];
  lane_rows(indptr, nrows, nse, base, lane, rows);
#pragma unroll
  for (int k = 0; k < kSlotsPerLane; ++k)
    if (base + k * 32 + lane < nse) out[base + k * 32 + lane] = O(rows[k]);
}

unsigned blocks_for_slots(int64_t nse) { return grid_for_warps((nse + kSlotsPerWarp - 1) / kSlotsPerWarp); }

}  // namespace

// y: (rows,) or (batch, rows); w and out: (nse,) or (batch, nse); out in the accumulation dtype.
// @xk csr_dt2t_rows arg arg arg ret stream
void csr_dt2t_rows(const xk::Tensor y, const xk::Tensor w, const xk::Tensor indptr, xk::Tensor out, int64_t stream) {
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  const SynapseGeometry g = checked_dt2t_rows(y, w, indptr, out);
  if (out.numel() == 0) return;
  dispatch_weights(w.dtype(), [&](auto wt) {
    using W = typename decltype(wt)::type;
    using A = typename AccOf<W>::type;
    dispatch_index(indptr.dtype(), [&](auto it) {
      using I = typename decltype(it)::type;
      dt2t_rows_kernel<<<blocks_for_slots(g.nse), kThreads, 0, st>>>(y.data_ptr<W>(), w.data_ptr<W>(),
                                                                     indptr.data_ptr<I>(), out.data_ptr<A>(), g.nrows,
                                                                     g.nse, g.batch);
    });
  });
  XK_CHECK_LAUNCH();
}

// a: (rows,) or (rows, batch); bb: (cols,) or (cols, batch); out: (nse,); all float32 or all float64.
// nconn >= 0: fixed-count rows of nconn slots (indptr unread); else CSR rows.
// @xk csr_row_col_product arg arg arg arg ret attr.nconn:int64 stream
void csr_row_col_product(const xk::Tensor a, const xk::Tensor bb, const xk::Tensor indices, const xk::Tensor indptr,
                         xk::Tensor out, int64_t nconn, int64_t stream) {
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  const SynapseGeometry g = checked_row_col(a, bb, indices, indptr, out, nconn);
  if (g.nse == 0) return;
  auto run = [&](auto at) {
    using A = typename decltype(at)::type;
    dispatch_index(indices.dtype(), [&](auto it) {
      using I = typename decltype(it)::type;
      row_col_kernel<<<blocks_for_slots(g.nse), kThreads, 0, st>>>(a.data_ptr<A>(), bb.data_ptr<A>(),
                                                                   indices.data_ptr<I>(), indptr.data_ptr<I>(),
                                                                   out.data_ptr<A>(), g.nrows, g.ncols, g.nse,
                                                                   g.batch, nconn);
    });
  };
  if (a.dtype() == DType::Float64) run(Tag<double>{});
  else run(Tag<float>{});
  XK_CHECK_LAUNCH();
}

// indptr: (rows + 1,); out: (nse,) int32 or int64: the row of each slot, -1 before the first row and
// `rows` after the last. For a non-decreasing indptr that is the jnp reference's answer; for a
// malformed one each slot gets a row in [-1, rows] (the CPU kernel counts exactly; a GPU check of
// the whole indptr would cost a launch in every call).
// @xk csr_slot_rows arg ret stream
void csr_slot_rows(const xk::Tensor indptr, xk::Tensor out, int64_t stream) {
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  const SynapseGeometry g = checked_slot_rows(indptr, out);
  dispatch_index(indptr.dtype(), [&](auto it) {
    dispatch_row_numbers(out.dtype(), [&](auto ot) {
      using I = typename decltype(it)::type;
      using O = typename decltype(ot)::type;
      if (g.nse > 0)
        slot_rows_kernel<<<blocks_for_slots(g.nse), kThreads, 0, st>>>(indptr.data_ptr<I>(), out.data_ptr<O>(),
                                                                       g.nrows, g.nse);
    });
  });
  XK_CHECK_LAUNCH();
}
