// The plain CSR / fixed-count kernels of xlakern.event's GPU products (see event_cuda.cu's header for
// what each does), shared by event_cuda.cu and event_indexed_cuda.cu. They read synapse slot p's
// weight at data[p], or at data[perm[p]] when Permuted (binary_csr*_indexed: weights kept in another
// order); the indexed products get their own instantiations so that event_cuda.cu, which every
// product compiles, does not pay for them.
#pragma once

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cstdint>

#include "event_common.h"

namespace xk_event {

__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ double widen(double x) { return x; }
__device__ __forceinline__ float widen(__half x) { return __half2float(x); }
__device__ __forceinline__ float widen(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// The row r this thread's warp takes in the warp-a-row kernels, and its slots [begin, end) (row_range);
// false past the last row (the whole warp sees the same r, so whole warps leave together).
template <typename I>
__device__ __forceinline__ bool warp_row_slots(const I* __restrict__ indptr, int64_t nconn, int64_t nse, int64_t nrows,
                                               int64_t& r, int64_t& begin, int64_t& end) {
  r = (int64_t(blockIdx.x) * kThreads + threadIdx.x) >> 5;
  if (r >= nrows) return false;
  row_range(indptr, nconn, nse, r, begin, end);
  return true;
}

// The one weight every synapse shares (homo) in the accumulation type, read once a thread; 0 (unused)
// when each synapse has its own.
template <typename A, typename W>
__device__ __forceinline__ A shared_weight(const W* __restrict__ data, bool homo) {
  return homo ? A(widen(data[0])) : A(0);
}

// The first of the rows_per_warp rows this thread's warp covers (>= nrows when it covers none; the
// whole warp sees the same value).
template <typename P>
__device__ __forceinline__ P warp_first_row(int rows_per_warp) {
  return (P(blockIdx.x) * kWarps + P(threadIdx.x >> 5)) * P(rows_per_warp);
}

// The lane's own spike, row first_row + lane's (at spk[row * stride]), or S(0), inactive under every
// SpikeRule, where the lane covers no row. A warp ballots these to find its active rows.
template <typename P, typename S>
__device__ __forceinline__ S lane_spike(const S* __restrict__ spk, P first_row, P nrows, int rows_per_warp,
                                        P stride = 1) {
  const int lane = int(threadIdx.x) & 31;
  const P mine = first_row + lane;
  return lane < rows_per_warp && mine < nrows ? spk[mine * stride] : S(0);
}

// How a walk over a warp's active rows reads their row ranges (indptr), which XLAKERN_ROW_RANGES forces:
//   kRangeAhead (2, the default)  every lane its own row's, beside its spike: the loads wait on nothing,
//                                 and a row's slots are read as soon as the ballot names the row;
//   kRangePerRow (1)              each active row's after the ballot, as the walk comes to it: one memory
//                                 latency more on each active row's chain.
// On an H100 at 400k rows of 80, 1% active, graph loops, the CSR scatter's step went from 13.1-13.5 to
// 12.6-12.9 us and the delay delivery's from 16.2 to 15.5 (bench/RESULTS.md, session 78). Reading only the
// active lanes' after the ballot, all at once, measured between the two. Fixed-count rows (nconn >= 0) read
// nothing either way.
enum RangeRead : int { kRangePerRow = 1, kRangeAhead = 2 };
inline RangeRead range_read() {
  return forced_choice("XLAKERN_ROW_RANGES", {1, 2}) == 1 ? kRangePerRow : kRangeAhead;
}

// The range of this lane's row (first_row + lane) under kRangeAhead where the lane covers a row, else the
// empty range. The walk takes a row's from the lane that covers it (walk_row_range).
template <typename I, typename P>
__device__ __forceinline__ void lane_row_range(RangeRead ranges, const I* __restrict__ indptr,
                                               typename Exactly<P>::type nconn, typename Exactly<P>::type nse,
                                               typename Exactly<P>::type first_row, typename Exactly<P>::type nrows,
                                               int rows_per_warp, P& begin, P& end) {
  const int lane = int(threadIdx.x) & 31;
  begin = end = 0;
  if (ranges == kRangeAhead && lane < rows_per_warp && first_row + lane < nrows)
    row_range(indptr, nconn, nse, P(first_row + lane), begin, end);
}

// Row r's range: from lane src, which covers it, under kRangeAhead (lane_row_range), else read now. The
// whole warp calls it together.
template <typename I, typename P>
__device__ __forceinline__ void walk_row_range(RangeRead ranges, const I* __restrict__ indptr,
                                               typename Exactly<P>::type nconn, typename Exactly<P>::type nse,
                                               typename Exactly<P>::type r, int src, P lane_begin, P lane_end,
                                               P& begin, P& end) {
  if (ranges == kRangePerRow) {
    row_range(indptr, nconn, nse, r, begin, end);
    return;
  }
  begin = __shfl_sync(0xffffffffu, lane_begin, src);
  end = __shfl_sync(0xffffffffu, lane_end, src);
}

// A warp's active rows, one after another, lowest first: row(r, src) for each set bit src of `pending`
// (a ballot over the rows first_row + lane), with r = first_row + src; src is the lane that read row
// r's spike, for __shfl_sync. The whole warp calls it together.
template <typename P, typename Row>
__device__ __forceinline__ void for_each_active_row(unsigned pending, P first_row, Row&& row) {
  while (pending) {
    const int src = __ffs(pending) - 1;
    pending &= pending - 1;
    row(P(first_row + src), src);
  }
}

// Slot p's weight in the accumulation type: data[p], or data[perm[p]] when Permuted (a perm entry
// outside [0, nse) reads 0, never outside data). The permuted weight is read at a chosen address
// (data[0] for a bad entry, p < nse says data has one), not behind a branch: a branch on the entry
// would hold the round's later slots' loads until this one's entry had arrived.
template <bool Permuted, typename A, typename W, typename I>
__device__ __forceinline__ A slot_weight(const W* __restrict__ data, const I* __restrict__ perm, int64_t nse,
                                         int64_t p) {
  if constexpr (Permuted) {
    const int64_t q = int64_t(perm[p]);
    const bool in = uint64_t(q) < uint64_t(nse);
    const A w = A(widen(data[in ? q : 0]));
    return in ? w : A(0);
  } else {
    return A(widen(data[p]));
  }
}

// Slot p's column and weight (w0 for one shared weight) for the mm gathers: column -1, adding nothing,
// where p is past the row's end, its index is outside [0, ncols) or its permutation entry outside [0, nse).
template <bool Permuted, typename A, typename W, typename I>
__device__ __forceinline__ int64_t slot_column(const W* __restrict__ data, const I* __restrict__ perm,
                                               const I* __restrict__ idx, int64_t nse, int64_t ncols, bool homo, A w0,
                                               int64_t p, int64_t end, A& w) {
  int64_t j = -1;
  w = A(0);
  if (p < end) {
    j = int64_t(idx[p]);
    if (homo) {
      w = w0;
    } else if constexpr (Permuted) {
      const int64_t q = int64_t(perm[p]);
      const bool in = uint64_t(q) < uint64_t(nse);
      w = A(widen(data[in ? q : 0]));  // (a chosen address, not a branch: see slot_weight)
      if (!in) {
        w = A(0);
        j = -1;
      }
    } else {
      w = A(widen(data[p]));
    }
  }
  return uint64_t(j) < uint64_t(ncols) ? j : int64_t(-1);
}

// A warp a row (and batch column). A lane takes U slots a round, 32 apart, in three passes whose loads
// are in flight together: the columns (and the permutation), the spikes, the weights of the active
// spikes (weight 0's address for the others, so no load waits behind a branch). A row of 80 is one
// round: three memory latencies, where a slot at a time chained three for every 32 slots. (H200, csrmv
// of a dense float vector, rows of 80: 5% faster at 400k rows, 9% at 40k; the vector's random reads,
// a 32-byte sector each, are what bound it there.)
template <bool Permuted, typename W, typename I, typename S, bool Binary>
__global__ void __launch_bounds__(kThreads) sparse_gather_kernel(
    const W* __restrict__ data, const I* __restrict__ perm, const I* __restrict__ idx, const I* __restrict__ indptr,
    const S* __restrict__ spk, typename AccOf<W>::type* __restrict__ out, int64_t nrows, int64_t ncols, int64_t batch,
    int64_t nse, int64_t nconn, bool homo, SpikeRule<S, Binary> rule) {
  using A = typename AccOf<W>::type;
  constexpr int U = 4;  // slots a lane loads a round: 128 a warp
  const int lane = threadIdx.x & 31;
  int64_t r, begin, end;
  if (!warp_row_slots(indptr, nconn, nse, nrows, r, begin, end)) return;
  const A w0 = shared_weight<A>(data, homo);
  for (int64_t b = blockIdx.y; b < batch; b += gridDim.y) {
    A acc = A(0);
    for (int64_t p0 = begin + lane; p0 < end; p0 += U * 32) {
      int64_t j[U], q[U];  // column and weight position of each slot (-1 past the row's end)
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t p = p0 + u * 32;
        j[u] = p < end ? int64_t(idx[p]) : int64_t(-1);
        if constexpr (Permuted) q[u] = p < end && !homo ? int64_t(perm[p]) : int64_t(-1);  // (homo: no perm)
        else q[u] = p;
      }
      S x[U];
#pragma unroll
      for (int u = 0; u < U; ++u)  // (an index out of range reads no spike: dropped)
        x[u] = uint64_t(j[u]) < uint64_t(ncols) ? spk[j[u] * batch + b] : S(0);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        // a permutation entry outside [0, nse) reads no weight (slot_weight's rule); homo: data[0] once
        const bool on = rule.active(x[u]) && (homo || !Permuted || uint64_t(q[u]) < uint64_t(nse));
        const A wt = homo ? w0 : A(widen(data[on ? q[u] : 0]));
        acc += on ? wt * rule.template value<A>(x[u]) : A(0);
      }
    }
    acc = warp_sum(acc);
    if (lane == 0) out[r * batch + b] = acc;
  }
}

// The gather of several spike columns (an mm) of float or wide binary spikes, or of at most 8 one-byte
// ones (the others take sparse_gather_tile_kernel, below): a group of G lanes (8, 16 or 32; 32 / G rows a warp)
// takes a row and G batch columns, a lane a column, and walks the row's slots G at a time: the group loads
// G indices and weights coalesced, then each lane reads the spikes of its column at those G columns of
// the spike matrix, 8 slots' loads in flight together. A slot's spikes for the G columns sit side by side
// (one or two 32-byte sectors), where a warp a (row, column), sparse_gather_kernel's mv walk, read a sector
// for every spike and every index once a column: on an H200, 40k rows of 80 and 16 bool columns took 335
// µs a step that way (BrainEvent 0.3.0: 88). Each column's sum is a lane's own, in slot order: no reduction.
// A slot whose index or permutation entry is out of range adds nothing.
template <bool Permuted, typename W, typename I, typename S, bool Binary>
__global__ void __launch_bounds__(kThreads) sparse_gather_mm_kernel(
    const W* __restrict__ data, const I* __restrict__ perm, const I* __restrict__ idx, const I* __restrict__ indptr,
    const S* __restrict__ spk, typename AccOf<W>::type* __restrict__ out, int64_t nrows, int64_t ncols, int64_t batch,
    int64_t nse, int64_t nconn, bool homo, SpikeRule<S, Binary> rule, int group) {
  using A = typename AccOf<W>::type;
  constexpr int U = 8;  // slots whose spikes a lane loads together
  const int lane = threadIdx.x & 31, g = lane / group, gl = lane % group;
  const int64_t r = ((int64_t(blockIdx.x) * kThreads + threadIdx.x) >> 5) * (32 / group) + g;
  if (r >= nrows) return;  // whole groups leave together
  // the group's lanes, for its shuffles (the groups of a warp walk rows of different lengths)
  const unsigned mask = group == 32 ? 0xffffffffu : ((1u << group) - 1u) << (g * group);
  int64_t begin, end;
  row_range(indptr, nconn, nse, r, begin, end);
  const A w0 = shared_weight<A>(data, homo);
  for (int64_t b0 = int64_t(blockIdx.y) * group; b0 < batch; b0 += int64_t(gridDim.y) * group) {
    const int64_t b = b0 + gl;
    const bool column = b < batch;
    A acc = A(0);
    for (int64_t p0 = begin; p0 < end; p0 += group) {
      // slot p0 + gl's column and weight
      A wl;
      const I jl = I(slot_column<Permuted>(data, perm, idx, nse, ncols, homo, w0, p0 + gl, end, wl));
      const int n = int(end - p0 < group ? end - p0 : group);  // the group's slots this round
      for (int k0 = 0; k0 < n; k0 += U) {
        I j[U];
        A w[U];
        S x[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          j[u] = __shfl_sync(mask, jl, k0 + u, group);  // (k0 + u >= n: a lane past the row, -1)
          w[u] = __shfl_sync(mask, wl, k0 + u, group);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) x[u] = column && j[u] >= 0 ? spk[int64_t(j[u]) * batch + b] : S(0);
#pragma unroll
        for (int u = 0; u < U; ++u) acc += rule.active(x[u]) ? w[u] * rule.template value<A>(x[u]) : A(0);
      }
    }
    if (column) out[r * batch + b] = acc;
  }
}

// The gather of several columns of one-byte binary spikes (bool), kTile batch columns at a time: a warp a
// row, lane l taking the row's slots l, l + 32 and l + 64 (a round of 96, so a row of 80 is one round). A
// lane loads its slots' indices and weights, then each slot's kTile spikes, which sit side by side in the
// (ncols, batch) spike matrix (one 16-byte load where its rows are 16-byte aligned), and adds the slot's
// weight into its own sum of each column whose byte is active (one test of the byte against the rule's
// mask and one predicated add). A butterfly of 16 shuffles then leaves column t's total in lanes 2t and
// 2t + 1. A row thus waits on memory three times (bounds, indices, spikes), and once more a round
// after its first (the next round's indices load beside this round's spikes), where
// sparse_gather_mm_kernel, a lane a column, waits twice for every 8 of a row's slots. H200, rows of 80,
// 16 bool columns, µs a step: 4k rows 12.7 to 9.6, 40k 62 to 36, 400k 568 to 336 (BrainEvent 0.3.0: 17.4,
// 88, 870). The same kernel for 4-byte spikes (binary float32 or float) was slower from 40k rows on (66
// to 78 µs at 40k, 600 to 820 at 400k): a slot's 64 bytes of spikes take 4 times the registers. So float
// spikes keep the lane groups, and wider binary spikes are first copied a byte each
// (gather_wide_binary_as_bytes; bench/RESULTS.md, session 54). A slot whose index or permutation entry is
// out of range adds nothing.
constexpr int kTile = 16;

// The kTile one-byte spikes of column j in the tile from b0 (nb of them in the matrix; the rest read as
// 0) as four words, spike t in byte t % 4 of word t / 4: as one 16-byte load where `vec` (the same in
// every thread: the launcher found the matrix's rows 16-byte aligned) and the tile is whole.
__device__ __forceinline__ void load_tile_words(const uint8_t* __restrict__ spk, int64_t j, int64_t batch, int64_t b0,
                                                int nb, bool vec, uint32_t (&word)[kTile / 4]) {
  const uint8_t* src = spk + j * batch + b0;
  if (vec && nb == kTile) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(src));
    word[0] = raw.x;
    word[1] = raw.y;
    word[2] = raw.z;
    word[3] = raw.w;
  } else {
#pragma unroll
    for (int k = 0; k < kTile / 4; ++k) word[k] = 0u;
#pragma unroll
    for (int t = 0; t < kTile; ++t)
      if (t < nb) word[t / 4] |= uint32_t(src[t]) << (8 * (t % 4));
  }
}

// One byte a spike, 1 where active under the rule: wider binary spikes (float32 0/1, say) copied into a
// call's scratch for the tile gather, whose 16 spikes a slot then take one 16-byte load and 4 registers
// instead of up to 8 loads and 32 registers.
template <typename S>
__global__ void __launch_bounds__(kThreads) spike_bytes_kernel(const S* __restrict__ spk, int64_t n,
                                                               SpikeRule<S, true> rule, uint8_t* __restrict__ bytes) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads)
    bytes[i] = rule.active(spk[i]) ? 1 : 0;
}

// Half of a lane's n sums go to the lane `bit` away and half stay, each added to the partner's: after
// the steps 16, 8, 4, 2 a lane holds one column's sum over 16 lanes (lane >> 1's), lanes with `bit` set
// keeping the upper half.
template <int n, typename A>
__device__ __forceinline__ void butterfly_step(const A (&in)[n], A (&out)[n / 2], int bit) {
  const bool upper = (int(threadIdx.x) & bit) != 0;
#pragma unroll
  for (int i = 0; i < n / 2; ++i) {
    const A send = upper ? in[i] : in[i + n / 2];
    const A keep = upper ? in[i + n / 2] : in[i];
    out[i] = keep + __shfl_xor_sync(0xffffffffu, send, unsigned(bit));
  }
}

template <bool Permuted, typename W, typename I>
__global__ void __launch_bounds__(kThreads) sparse_gather_tile_kernel(
    const W* __restrict__ data, const I* __restrict__ perm, const I* __restrict__ idx, const I* __restrict__ indptr,
    const uint8_t* __restrict__ spk, typename AccOf<W>::type* __restrict__ out, int64_t nrows, int64_t ncols,
    int64_t batch, int64_t nse, int64_t nconn, bool homo, SpikeRule<uint8_t, true> rule, bool vec) {
  using A = typename AccOf<W>::type;
  constexpr int U = 3;  // slots a lane a round
  const int lane = threadIdx.x & 31;
  int64_t r, begin, end;
  if (!warp_row_slots(indptr, nconn, nse, nrows, r, begin, end)) return;
  const A w0 = shared_weight<A>(data, homo);
  const uint32_t mask = uint32_t(rule.mask) * 0x01010101u;  // the rule's byte mask in each byte
  // the columns (-1: past the row, out of range, or its permutation entry is) and weights of the round
  // of slots from p0
  auto load_slots = [&](int64_t p0, int64_t (&j)[U], A (&w)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u)
      j[u] = slot_column<Permuted>(data, perm, idx, nse, ncols, homo, w0, p0 + u * 32 + lane, end, w[u]);
  };
  for (int64_t b0 = int64_t(blockIdx.y) * kTile; b0 < batch; b0 += int64_t(gridDim.y) * kTile) {
    const int nb = int(batch - b0 < kTile ? batch - b0 : kTile);
    A acc[kTile];
#pragma unroll
    for (int t = 0; t < kTile; ++t) acc[t] = A(0);
    int64_t jn[U];
    A wn[U];
    if (begin < end) load_slots(begin, jn, wn);
    for (int64_t p0 = begin; p0 < end; p0 += U * 32) {  // (the same rounds in every lane)
      int64_t j[U];
      A w[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        j[u] = jn[u];
        w[u] = wn[u];
      }
      if (p0 + U * 32 < end) load_slots(p0 + U * 32, jn, wn);  // in flight beside this round's spikes
      // every lane loads (column 0 for a slot with none: the launcher saw ncols > 0), then clears the
      // words of a slot with none
      uint32_t word[U][kTile / 4];
#pragma unroll
      for (int u = 0; u < U; ++u) load_tile_words(spk, j[u] >= 0 ? j[u] : 0, batch, b0, nb, vec, word[u]);
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int k = 0; k < kTile / 4; ++k) word[u][k] = j[u] >= 0 ? word[u][k] & mask : 0u;
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int t = 0; t < kTile; ++t)
          if (word[u][t / 4] & (0xffu << (8 * (t % 4)))) acc[t] += w[u];
    }
    A s8[8], s4[4], s2[2], s1[1];
    butterfly_step<16>(acc, s8, 16);
    butterfly_step<8>(s8, s4, 8);
    butterfly_step<4>(s4, s2, 4);
    butterfly_step<2>(s2, s1, 2);
    const A total = s1[0] + __shfl_xor_sync(0xffffffffu, s1[0], 1u);
    const int t = lane >> 1;
    if ((lane & 1) == 0 && t < nb) out[r * batch + b0 + t] = total;
  }
}

// The 64-bit scatter walk of a warp's rows (sparse_scatter_kernel, the reproducible scatter of
// event_exact_scatter_cuda.cuh): for each batch column b (grid y) and each active row among the warp's
// rows_per_warp from first_row (< nrows), the row's slots U * 32 a round, every load of the round issued
// first, so a row costs one memory latency a round, not one a synapse; then round(j, wv, v, b) with the
// round's columns j[U] (-1 past the row's end), weights wv[U] (0 there) and the row's spike value v.
template <bool Permuted, int U, typename A, typename W, typename I, typename S, bool Binary, typename Round>
__device__ __forceinline__ void walk_scatter_rows(const W* __restrict__ data, const I* __restrict__ perm,
                                                  const I* __restrict__ idx, const I* __restrict__ indptr,
                                                  const S* __restrict__ spk, int64_t first_row, int64_t nrows,
                                                  int64_t batch, int64_t nse, int64_t nconn, bool homo,
                                                  SpikeRule<S, Binary> rule, int rows_per_warp, RangeRead ranges,
                                                  Round&& round) {
  const int lane = threadIdx.x & 31;
  const A w0 = shared_weight<A>(data, homo);
  int64_t lane_begin, lane_end;  // the same for every batch column
  lane_row_range(ranges, indptr, nconn, nse, first_row, nrows, rows_per_warp, lane_begin, lane_end);
  for (int64_t b = blockIdx.y; b < batch; b += gridDim.y) {
    const S s = lane_spike(spk + b, first_row, nrows, rows_per_warp, batch);
    for_each_active_row(__ballot_sync(0xffffffffu, rule.active(s)), first_row, [&](int64_t r, int src) {
      const A v = __shfl_sync(0xffffffffu, rule.template value<A>(s), src);  // (src's spike is active)
      int64_t begin, end;
      walk_row_range(ranges, indptr, nconn, nse, r, src, lane_begin, lane_end, begin, end);
      for (int64_t p0 = begin; p0 < end; p0 += U * 32) {
        int64_t j[U];
        A wv[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t p = p0 + u * 32 + lane;
          j[u] = p < end ? int64_t(idx[p]) : int64_t(-1);
          wv[u] = homo ? w0 : (p < end ? slot_weight<Permuted, A>(data, perm, nse, p) : A(0));
        }
        round(j, wv, v, b);
      }
    });
  }
}

// rows_per_warp (a power of two, at most 32) is chosen by the host: 32 on large matrices, where one
// coalesced read of 32 spikes a warp is what keeps inactive rows cheap; fewer where that would leave
// the GPU with too few warps and each warp walking several active rows one after another.
template <bool Permuted, typename W, typename I, typename S, bool Binary>
__global__ void __launch_bounds__(kThreads) sparse_scatter_kernel(
    const W* __restrict__ data, const I* __restrict__ perm, const I* __restrict__ idx, const I* __restrict__ indptr,
    const S* __restrict__ spk, typename AccOf<W>::type* __restrict__ out, int64_t nrows, int64_t ncols, int64_t batch,
    int64_t nse, int64_t nconn, bool homo, SpikeRule<S, Binary> rule, int rows_per_warp, RangeRead ranges) {
  using A = typename AccOf<W>::type;
  constexpr int U = 4;  // synapses a lane loads before its atomic adds: 128 a warp per round
  pdl_hold_grid();
  const int64_t first_row = warp_first_row<int64_t>(rows_per_warp);
  if (first_row >= nrows) return;
  walk_scatter_rows<Permuted, U, A>(data, perm, idx, indptr, spk, first_row, nrows, batch, nse, nconn, homo, rule,
                                    rows_per_warp, ranges, [&](const int64_t* j, const A* wv, A v, int64_t b) {
    pdl_wait();  // the output's clear has finished (clear_before_adds)
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (uint64_t(j[u]) < uint64_t(ncols)) atomicAdd(out + j[u] * batch + b, wv[u] * v);  // else dropped
  });
}

// sparse_scatter_kernel's mv form with int32 indices, for matrices whose rows, columns and slots fit in
// 31 bits (walk32_fits): the same walk in 32-bit arithmetic, without a batch stride. At 400k rows
// and 1% active an H200 step waits mostly on the instructions and loads of a few active rows one after
// another, and the 64-bit walk spends about a third more instructions on each (session 46).
template <typename W, typename S, bool Binary>
__global__ void __launch_bounds__(kThreads) sparse_scatter_mv32_kernel(
    const W* __restrict__ data, const int32_t* __restrict__ idx, const int32_t* __restrict__ indptr,
    const S* __restrict__ spk, typename AccOf<W>::type* __restrict__ out, int32_t nrows, int32_t ncols, int32_t nse,
    int32_t nconn, bool homo, SpikeRule<S, Binary> rule, int rows_per_warp, RangeRead ranges) {
  using A = typename AccOf<W>::type;
  constexpr int U = 4;  // synapses a lane loads before its atomic adds: 128 a warp per round
  pdl_hold_grid();
  const int32_t first_row = warp_first_row<int32_t>(rows_per_warp);
  const int lane = threadIdx.x & 31;
  if (first_row >= nrows) return;
  const A w0 = shared_weight<A>(data, homo);
  const S s = lane_spike(spk, first_row, nrows, rows_per_warp);
  int32_t lane_begin, lane_end;
  lane_row_range(ranges, indptr, nconn, nse, first_row, nrows, rows_per_warp, lane_begin, lane_end);
  for_each_active_row(__ballot_sync(0xffffffffu, rule.active(s)), first_row, [&](int32_t r, int src) {
    const A v = __shfl_sync(0xffffffffu, rule.template value<A>(s), src);  // (src's spike is active)
    int32_t begin, end;
    walk_row_range(ranges, indptr, nconn, nse, r, src, lane_begin, lane_end, begin, end);
    for (int32_t p0 = begin + lane; p0 < end; p0 += U * 32) {
      int32_t j[U];
      A wv[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int32_t p = p0 + u * 32;
        j[u] = p < end ? idx[p] : -1;
        wv[u] = homo ? w0 : (p < end ? A(widen(data[p])) : A(0));
      }
      pdl_wait();  // the output's clear has finished (clear_before_adds)
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (uint32_t(j[u]) < uint32_t(ncols)) atomicAdd(out + j[u], wv[u] * v);  // else dropped
    }
  });
}

// Blocks along y cover batch columns (the kernels stride over the rest).
inline unsigned grid_y(int64_t batch) { return unsigned(batch < 65535 ? batch : 65535); }
inline unsigned grid_for_warps(int64_t warps) { return unsigned((warps + kWarps - 1) / kWarps); }

// Whether a gather of several columns of one-byte binary spikes takes the tiles: above 8 columns (where a
// tile of 16 is at least half used), else the lane groups. XLAKERN_MM_GATHER forces the lane groups (1)
// or the tiles (2). The one rule for bool spikes and for wider ones copied to bytes.
inline bool mm_gather_takes_tiles(int64_t batch) {
  const int forced = forced_choice("XLAKERN_MM_GATHER", {1, 2});
  return forced == 2 || (forced == 0 && batch > 8);
}

// Launches sparse_gather_tile_kernel on one-byte spikes, active where a byte meets `mask`.
template <bool Permuted, typename W, typename I>
void launch_tile_gather(const W* data, const I* perm, const I* idx, const I* indptr, const uint8_t* spk,
                        typename AccOf<W>::type* out, int64_t nrows, int64_t ncols, int64_t batch, int64_t nse,
                        int64_t nconn, bool homo, uint8_t mask, cudaStream_t st) {
  if (ncols == 0) {  // every slot is out of range: the sums are 0 (and a tile would read a spike)
    XK_CUDA_CHECK(cudaMemsetAsync(out, 0, size_t(nrows * batch) * sizeof(*out), st));
    return;
  }
  const bool vec = reinterpret_cast<uintptr_t>(spk) % 16 == 0 && batch % 16 == 0;
  const dim3 grid(grid_for_warps(nrows), grid_y((batch + kTile - 1) / kTile));
  sparse_gather_tile_kernel<Permuted><<<grid, kThreads, 0, st>>>(data, perm, idx, indptr, spk, out, nrows, ncols,
                                                                 batch, nse, nconn, homo,
                                                                 SpikeRule<uint8_t, true>{mask}, vec);
}

// Launches the plain gather: sparse_gather_kernel for one spike column (a warp a row); for several,
// sparse_gather_tile_kernel (one-byte binary spikes, more than 8 columns: a warp a row and 16 columns, a lane
// a slot) or sparse_gather_mm_kernel (a group of lanes a row, a lane a column).
template <bool Permuted, typename W, typename I, typename S, bool Binary>
void launch_sparse_gather(const W* data, const I* perm, const I* idx, const I* indptr, const S* spk,
                          typename AccOf<W>::type* out, int64_t nrows, int64_t ncols, int64_t batch, int64_t nse,
                          int64_t nconn, bool homo, SpikeRule<S, Binary> rule, cudaStream_t st) {
  if (nrows == 0 || batch == 0) return;
  if (batch == 1) {
    sparse_gather_kernel<Permuted><<<dim3(grid_for_warps(nrows), 1), kThreads, 0, st>>>(
        data, perm, idx, indptr, spk, out, nrows, ncols, batch, nse, nconn, homo, rule);
    return;
  }
  if constexpr (Binary && sizeof(S) == 1) {
    if (mm_gather_takes_tiles(batch))
      return launch_tile_gather<Permuted>(data, perm, idx, indptr, reinterpret_cast<const uint8_t*>(spk), out, nrows,
                                          ncols, batch, nse, nconn, homo, uint8_t(rule.mask), st);
  }
  const int group = batch <= 8 ? 8 : (batch <= 16 ? 16 : 32);
  const int64_t warps = (nrows + 32 / group - 1) / (32 / group), tiles = (batch + group - 1) / group;
  sparse_gather_mm_kernel<Permuted><<<dim3(grid_for_warps(warps), grid_y(tiles)), kThreads, 0, st>>>(
      data, perm, idx, indptr, spk, out, nrows, ncols, batch, nse, nconn, homo, rule, group);
}

// The mm gather of binary spikes wider than a byte: copied a byte a spike into `scratch` (when it holds
// them), then the tile gather, where the default or XLAKERN_MM_GATHER=2 picks the tiles (more than 8
// columns); false otherwise (the caller runs launch_sparse_gather on the spikes as they are).
// H200, rows of 80, 16 float32 0/1 columns, µs a step: 40k rows 66-71 to 37-40, 400k 606-609 to 353-354
// (bench/RESULTS.md, session 54).
template <typename W, typename I, typename S, bool Binary>
bool gather_wide_binary_as_bytes(const W* data, const I* idx, const I* indptr, const S* spk,
                                 typename AccOf<W>::type* out, int64_t nrows, int64_t ncols, int64_t batch,
                                 int64_t nse, int64_t nconn, bool homo, SpikeRule<S, Binary> rule,
                                 ScratchBytes scratch, cudaStream_t st) {
  if constexpr (Binary && sizeof(S) > 1) {
    const int64_t n = ncols * batch;
    if (batch == 1 || scratch.size < n || nrows == 0 || n == 0 || !mm_gather_takes_tiles(batch)) return false;
    const unsigned blocks = unsigned(std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t(1) << 20));
    spike_bytes_kernel<<<blocks, kThreads, 0, st>>>(spk, n, rule, scratch.data);
    launch_tile_gather<false>(data, static_cast<const I*>(nullptr), idx, indptr, scratch.data, out, nrows, ncols,
                              batch, nse, nconn, homo, uint8_t(1u), st);
    return true;
  }
  return false;
}

// Rows a scatter's warp takes: as many (a power of two, at most 32) as still leaves about 48 warps an
// SM (a full H100 holds 64). XLAKERN_SCATTER_ROWS (1, 2, 4, ..., 32) forces it, for the CSR and
// fixed-count scatters, plasticity and delays alike.
inline int scatter_rows_per_warp(int64_t nrows, int64_t batch, const GpuLimits& gpu) {
  if (const int forced = forced_choice("XLAKERN_SCATTER_ROWS", {1, 2, 4, 8, 16, 32})) return forced;
  int rows_per_warp = 1;
  const int64_t want_warps = int64_t(gpu.sms) * 48, spread = nrows * int64_t(grid_y(batch));
  while (rows_per_warp < 32 && spread / (2 * rows_per_warp) >= want_warps) rows_per_warp *= 2;
  return rows_per_warp;
}

// The grid and rows a warp of the plain gather (one row a warp) or scatter; a scatter's output is
// cleared first, on the stream. False when there is nothing to launch.
struct PlainLaunch {
  dim3 grid;
  int rows_per_warp;
  bool after_clear = false;  // the scatter goes after its output's clear (launch_after_clear)
};

inline bool plain_launch(xk::Tensor& out, int64_t nrows, int64_t batch, bool transpose, cudaStream_t st,
                         PlainLaunch& launch) {
  if (out.numel() == 0) return false;
  const GpuLimits gpu = transpose ? gpu_limits() : GpuLimits{};  // the gather needs none
  if (transpose) launch.after_clear = clear_before_adds(out.data_ptr(), int64_t(out.nbytes()), st, gpu);
  if (nrows == 0) return false;
  launch.rows_per_warp = transpose ? scatter_rows_per_warp(nrows, batch, gpu) : 1;
  launch.grid = dim3(grid_for_warps((nrows + launch.rows_per_warp - 1) / launch.rows_per_warp), grid_y(batch));
  return true;
}

}  // namespace xk_event
