// CUDA kernels of xlakern.event: the GPU twins of event_cpu.cc (same entry points, attributes,
// orientation convention, output dtypes and out-of-range policy; see that file's header).
//
//   sparse gather   one spike column (mv): one warp per row: lanes read the row's indices coalesced,
//                   four slots a lane a round with the round's loads in flight together, test the
//                   spike, read the weight only for active spikes, warp-reduce. Several columns (mm):
//                   a group of 8-32 lanes per row, a lane per batch column, the row's indices and
//                   weights read once for all of them (sparse_gather_mm_kernel). Binary
//                   spikes of an mv are tested as bits instead: in shared memory where they fit,
//                   else in the call's scratch output (packed there first) behind their summary;
//                   with int32 indices (walk32_fits) it walks in 32-bit arithmetic, and loads the
//                   weights beside the indices where they take 4 MiB or less; small products (32
//                   rows an SM, 8,192 columns at most) run in 256-thread blocks, two rows a warp;
//                   larger ones with the bits in shared memory (32-bit walk, weights of 4 bytes or
//                   fewer) walk four rows a round.
//   sparse scatter  one warp per 32 rows (fewer on small matrices, so the GPU has warps to spare):
//                   lanes read the spikes and the rows' ranges coalesced, a ballot names the active rows, then the
//                   whole warp walks each active row's synapses, 128 loads in flight a round, and
//                   atomically adds into out (inactive rows cost one coalesced read). An mv with
//                   int32 indices walks in 32-bit arithmetic (sparse_scatter_mv32_kernel).
//   dense gather    one warp per (row, batch column), skipping inactive columns.
//   dense scatter   one thread per output column; each block compacts the active rows of a
//                   256-row chunk into shared memory (ballot prefix) and every thread sums those
//                   rows' weights of its column (coalesced across threads); with few columns the
//                   rows are split over grid z and the slices add into out atomically. A product whose
//                   rows sit on 16-byte boundaries and has 2,048 threads of columns (times the
//                   batch) or more takes dense_scatter_vec_kernel: 16 bytes of columns a thread,
//                   a row slice's active rows listed at once, 8 rows' loads in flight; on sm_90 a
//                   tile's 2 or 4 slices are a thread block cluster that sums them in shared memory
//                   and writes out once (no clear, no atomics, the same bits every run).
// Outputs the kernel accumulates into are cleared on XLA's stream first (clear_before_adds in
// event_common.h: a kernel the accumulating one overlaps on sm_90, else cudaMemsetAsync), so the whole
// call stays capturable in a CUDA graph.

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cooperative_groups.h>
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "event_common.h"
#include "event_exact_scatter_cuda.cuh"
#include "event_sparse_cuda.cuh"

namespace {

using namespace xk_event;



// Binary gather with the spikes as bits. When they fit in shared memory, every block packs the spikes
// into a bitmask once (a thread per 32 columns); otherwise (Global) pack_bits has put them in a global
// scratch array first, read through L1, with their summary (event_common.h) copied into shared memory
// (Summary): a bit is read only for a synapse whose byte of bits is active. Each warp walks its share
// of the rows, two or four at a time, testing each synapse's column in the bitmask (the loop below says
// how).
// The random spike reads of the plain gather (a 32-byte L2 sector for each synapse's one-byte spike)
// become shared-memory or L1 reads.
//
// A round's slots are straight-line code in three passes (the loop says why): its loads then wait on
// memory together, not one slot after another. Summary is a template argument, not a test a slot;
// columns are 32-bit (the launcher takes fewer than 2^31). On an H100 at 4M rows of 80 this took
// the gather from 1.37 to 0.89 ms at 1% activity and from 1.64 to 1.18 ms at 5% (session 32; before,
// each slot branched around its loads, and its bit's L2 latency waited for the slot before it).
constexpr int kBitsThreads = 1024;
constexpr int kSmallGatherThreads = 256;  // the small products' blocks (launch_bitmask_gather)

// A row's index, read once per call: *p where `on`, else -1. Evict-first (ld.global.cs), so the streamed
// indices leave L1 and L2 to the bits and weights (4M rows of 80: 4% faster on an H100); one predicated
// load (written as a C++ conditional, ptxas rebuilt each slot's address and reread the kernel's parameter
// for it).
template <typename I>
__device__ __forceinline__ I load_streamed_if(const I* p, bool on) {
  I v = I(-1);
  if constexpr (sizeof(I) == 8)
    asm("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %2, 0;\n\t@q ld.global.cs.b64 %0, [%1];\n\t}"
        : "+l"(v) : "l"(p), "r"(uint32_t(on)));
  else
    asm("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %2, 0;\n\t@q ld.global.cs.b32 %0, [%1];\n\t}"
        : "+r"(v) : "l"(p), "r"(uint32_t(on)));
  return v;
}

// P is the positions' type: int32_t where rows, columns and slots fit (walk32_fits), which takes a
// round in fewer instructions and registers (the kernel is partly bound by its instruction issue at
// 40k rows), else int64_t.
//
// Eager (small products, see the launcher): each slot's weight is loaded beside its index, whether or not
// its spike is active, so a row waits on memory for its bounds and then its indices and weights together,
// not for the weights after the bits as well.
template <typename P, typename W, typename I, typename S, bool Global, bool Summary, bool Eager>
__global__ void __launch_bounds__(kBitsThreads) bitmask_gather_kernel(
    const W* __restrict__ data, const I* __restrict__ idx, const I* __restrict__ indptr, const S* __restrict__ spk,
    typename AccOf<W>::type* __restrict__ out, P nrows, P ncols, P nse, P nconn, bool homo, SpikeRule<S, true> rule,
    const uint32_t* __restrict__ global_bits, const uint32_t* __restrict__ global_summary, int32_t summary_words) {
  using A = typename AccOf<W>::type;
  // index loads a lane issues per row and round: 96 int32 slots hold a row of 80 (the common K) in
  // one round with few idle lanes
  constexpr int U = sizeof(I) == 8 ? 2 : 3;
  constexpr int kRound = U * 32;  // synapses of a row a round
  // rows a round: four in the 32-bit walk of weights of 4 bytes or fewer with the bits in shared memory
  // (a warp then waits on memory for half as many rounds: H200, 400k rows of 80, 80 to 65 us a step at 1%
  // active), two elsewhere (registers: more spill; the small products' warps hold two rows)
  constexpr int H = (sizeof(P) == 4 && sizeof(I) == 4 && sizeof(W) <= 4 && !Global && !Eager) ? 4 : 2;
  extern __shared__ uint32_t shared_bits[];
  const uint32_t ncols32 = uint32_t(ncols);
  const int lane = threadIdx.x & 31;
  // one shared weight: held in a register (bits in shared memory) or read by every active slot from
  // data[0] (the global bits: the slots' weight pointers do not move)
  const P wstep = homo ? 0 : 32;
  const W w0 = homo ? data[0] : W(0);
  // Each warp takes a contiguous share of the rows, 32 at a time (a group): one coalesced load brings
  // the group's bounds into the lanes. The rows are walked H at a time in rounds of kRound synapses a
  // row; a round's weight loads (of weight 0 for inactive synapses) and the next round's index loads
  // are issued before the round's weights are added, so a round costs one memory latency, not two.
  // (With one block an SM a warp walks ~100 rows of 80-odd synapses at 400k: that chain is what a
  // step costs.)
  const P warps = P(gridDim.x) * P(blockDim.x >> 5);
  const P share = (nrows + warps - 1) / warps;
  const P lo = (P(blockIdx.x) * P(blockDim.x >> 5) + P(threadIdx.x >> 5)) * share;
  const P hi = lo + share < nrows ? lo + share : nrows;
  // group state: rows g0 .. g0 + n - 1, lane l holding row g0 + l's bounds (lanes past the rows hold an
  // empty row); round state: rows g0 + i to g0 + i + H - 1 (empty rows past n), synapses from offset o;
  // left[h]: the row's synapses from o on, at most a round's (the same in every lane)
  P g0 = lo, lane_begin = 0, lane_end = 0, o = 0, begin[H], end[H];
  int n = 0, i = 0, left[H];
  I j[H][U];
  W we[H][Eager ? U : 1];  // Eager: the slots' weights (of in-range slots; 0 past the row)
  auto bounds = [&](int at) {  // (at + H - 1 <= 31: at is a multiple of H, which divides 32)
#pragma unroll
    for (int h = 0; h < H; ++h) {
      begin[h] = __shfl_sync(0xffffffffu, lane_begin, at + h);
      end[h] = __shfl_sync(0xffffffffu, lane_end, at + h);
    }
  };
  auto load = [&]() {
#pragma unroll
    for (int h = 0; h < H; ++h) {
      const P rest = end[h] - begin[h] - o;
      left[h] = rest < kRound ? int(rest) : kRound;  // (<= 0 once the row is done)
      const I* p = idx + P(begin[h] + o + lane);
#pragma unroll
      for (int u = 0; u < U; ++u) j[h][u] = load_streamed_if(p + u * 32, u * 32 + lane < left[h]);
      if constexpr (Eager) {
        const W* wp = data + P(begin[h] + o + lane);
#pragma unroll
        for (int u = 0; u < U; ++u) {
          W v = homo ? w0 : W(0);
          if (!homo && u * 32 + lane < left[h]) v = wp[u * 32];
          we[h][u] = v;
        }
      }
    }
  };
  auto start_group = [&]() {
    n = int(hi - g0 < 32 ? hi - g0 : 32);
    lane_begin = lane_end = 0;
    if (lane < n) row_range(indptr, nconn, nse, P(g0 + lane), lane_begin, lane_end);
    i = 0;
    o = 0;
    bounds(0);
    load();
  };
  // The first group's bounds and indices are loaded before the block packs the spikes, and wait on memory
  // beside the spikes' loads rather than after the barrier (they do not read the bits).
  if (g0 < hi) start_group();
  if constexpr (!Global) {
    const P words = (ncols + 31) / 32;
    for (P w = threadIdx.x; w < words; w += blockDim.x) shared_bits[w] = spike_word(spk, int64_t(w) * 32, ncols, rule);
  } else if constexpr (Summary) {
    for (int32_t w = threadIdx.x; w < summary_words; w += blockDim.x) shared_bits[w] = global_summary[w];
  }
  __syncthreads();
  while (g0 < hi) {
    A acc[H];
#pragma unroll
    for (int h = 0; h < H; ++h) acc[h] = A(0);
    while (true) {
      // The round's slots in three passes, so that each pass's loads are in flight together: the
      // columns (and the summary's bits in shared memory), the bit words, the weights. With the bits
      // in global memory every lane issues every load, from column 0 or weight 0 where it has nothing
      // to read: ptxas turned a predicated load into a branch there, and a branch a slot waiting on its
      // bit's load would chain the slots' memory latencies. A bit in shared memory is known at once, so
      // there a weight is loaded only for an active slot (a predicated load: half the instructions of
      // a load from a selected address).
      uint32_t col[H][U];
      bool maybe[H][U];  // in range (and, with the summary, its byte of bits active)
#pragma unroll
      for (int h = 0; h < H; ++h)
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const I jj = j[h][u];
          const bool in = sizeof(I) == 8 ? uint64_t(jj) < uint64_t(ncols) : uint32_t(jj) < ncols32;
          // clamped into range rather than selected (one instruction; ncols >= 1): out-of-range slots are off
          const uint32_t c = sizeof(I) == 8 ? uint32_t(min(uint64_t(jj), uint64_t(ncols - 1)))
                                            : min(uint32_t(jj), ncols32 - 1u);
          col[h][u] = c;
          maybe[h][u] = in;
          if constexpr (Global && Summary) maybe[h][u] = in & summary_has(shared_bits, c);
        }
      uint32_t word[H][U];
#pragma unroll
      for (int h = 0; h < H; ++h)
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if constexpr (Global) word[h][u] = __ldg(global_bits + (maybe[h][u] ? col[h][u] >> 5 : 0u));
          else word[h][u] = shared_bits[col[h][u] >> 5];
        }
      A w[H][U];
#pragma unroll
      for (int h = 0; h < H; ++h) {
        const W* wp = data + (homo ? P(0) : P(begin[h] + o + lane));
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const bool on = maybe[h][u] & bool((word[h][u] >> (col[h][u] & 31)) & 1u);
          if constexpr (Eager) {
            w[h][u] = on ? A(widen(we[h][u])) : A(0);
          } else if constexpr (!Global) {
            W v = W(0);
            if (on) v = homo ? w0 : wp[u * 32];
            w[h][u] = A(widen(v));
          } else {
            const W v = *(on ? wp + u * wstep : data);
            w[h][u] = on ? A(widen(v)) : A(0);
          }
        }
      }
      const P out_row = g0 + i;
      o += kRound;
      bool rows_left = false;
#pragma unroll
      for (int h = 0; h < H; ++h) rows_left |= begin[h] + o < end[h];
      const bool rows_done = !rows_left;
      if (rows_done) {
        i += H;
        o = 0;
        if (i < n) bounds(i);
      }
      const bool more = !rows_done || i < n;
      if (more) load();  // the next round's indices, in flight while this round's weights arrive
#pragma unroll
      for (int h = 0; h < H; ++h)
#pragma unroll
        for (int u = 0; u < U; ++u) acc[h] += w[h][u];
      if (rows_done) {
#pragma unroll
        for (int h = 0; h < H; ++h) acc[h] = warp_sum(acc[h]);
        if (lane == 0) {
#pragma unroll
          for (int h = 0; h < H; ++h)
            if (out_row + h < g0 + n) out[out_row + h] = acc[h];
        }
#pragma unroll
        for (int h = 0; h < H; ++h) acc[h] = A(0);
      }
      if (!more) break;
    }
    g0 += 32;
    if (g0 < hi) start_group();
  }
}

// Launches bitmask_gather_kernel (positions of type P) with the bitmask in shared memory when it fits this
// GPU's, else in `scratch` (packed first) when the caller has one; false otherwise (the caller then runs the
// plain gather).
template <typename P, typename W, typename I, typename S>
bool launch_bitmask_gather(const W* data, const I* idx, const I* ptr, const S* spk, typename AccOf<W>::type* out,
                           int64_t nrows, int64_t ncols, int64_t nse, int64_t nconn, bool homo,
                           SpikeRule<S, true> rule, SpikeScratch scratch, const GpuLimits& gpu, cudaStream_t st) {
  // the kernel's columns are 32-bit; and its inactive slots read weight 0 and bit word 0, so it wants both
  if (ncols >= (int64_t(1) << 31) || ncols == 0 || nse == 0) return false;
  const int sms = gpu.sms, optin = gpu.smem_optin;
  const int64_t smem = (ncols + 31) / 32 * 4;
  const int64_t want = (nrows + 31) / 32;  // warps of 32 rows' bounds
  // Eager where all the weights take at most 4 MiB: such a gather waits on memory, not on its bytes, and
  // reading every weight costs less than the latency it saves (4k rows of 80, 5% active, on an H200:
  // 7.3-7.5 to 6.8-6.9 us a step; level at 1% within the spread); beyond that it reads far more bytes
  // than it saves (at 4M rows of 80, 1% active, 128 MB more a call). Only in the 32-bit walk (every such
  // product with int32 indices takes it) and for weights of 4 bytes or fewer (float64 would spill), so
  // that it adds few kernels to compile.
  auto* shared = bitmask_gather_kernel<P, W, I, S, false, false, false>;
  if constexpr (sizeof(W) <= 4 && std::is_same_v<P, int32_t>)
    if (nse * int64_t(sizeof(W)) <= (int64_t(4) << 20)) shared = bitmask_gather_kernel<P, W, I, S, false, false, true>;
  if (smem + 1024 <= optin &&
      (smem <= 48 * 1024 || cudaFuncSetAttribute(shared, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)) ==
                                cudaSuccess)) {
    // one block an SM: each block packs the whole bitmask, so more blocks would re-read the spikes
    int64_t blocks = want < sms ? (want > 0 ? want : 1) : sms;
    int threads = kBitsThreads;
    // Small products (32 rows an SM at most, a bitmask of no more words than a small block has threads):
    // blocks of 8 warps that walk two rows each. The walk takes its rows in pairs here (Eager), so a warp
    // of one row left half of each round idle; and the rows now spread over every SM, each block packing its few
    // words in one pass. 4k rows of 80 on an H200, medians of 9 alternating processes: 7.1 to 6.8 us a
    // step at 1% active, 7.5 to 7.0 at 5%. Not for wide bitmasks: every block packs all of it.
    if (want <= sms && (ncols + 31) / 32 <= kSmallGatherThreads) {
      threads = kSmallGatherThreads;
      const int64_t warps = (nrows + 1) / 2, per_block = kSmallGatherThreads / 32;
      blocks = std::max<int64_t>(1, (warps + per_block - 1) / per_block);
    }
    shared<<<int(blocks), threads, size_t(smem), st>>>(data, idx, ptr, spk, out, P(nrows), P(ncols), P(nse),
                                                       P(nconn), homo, rule, nullptr, nullptr, 0);
    return true;
  }
  (void)cudaGetLastError();  // a refused opt-in: clear it
  if (scratch.bits == nullptr) return false;
  // The summary, where it fits beside two blocks an SM (4M columns: 62.5 KB a block).
  const int64_t summary_bytes = spike_summary_words(ncols) * 4;
  uint32_t* summary = use_spike_summary() && 2 * (summary_bytes + 1024) <= optin ? scratch.summary : nullptr;
  pack_bits(spk, ncols, rule, scratch.bits, summary, st);
  // The global variant re-reads nothing per block, so it fills every SM; its bit reads want L1 (no more
  // shared memory asked for than the summary: a hint, ignored where refused).
  auto* global = summary != nullptr ? bitmask_gather_kernel<P, W, I, uint8_t, true, true, false>
                                    : bitmask_gather_kernel<P, W, I, uint8_t, true, false, false>;
  const size_t dyn = summary != nullptr ? size_t(summary_bytes) : 0;
  if (dyn > 48 * 1024 &&
      cudaFuncSetAttribute(global, cudaFuncAttributeMaxDynamicSharedMemorySize, int(dyn)) != cudaSuccess)
    return false;  // (cannot happen where the opt-in limit allows it; the plain gather is always right)
  if (cudaFuncSetAttribute(global, cudaFuncAttributePreferredSharedMemoryCarveout, dyn == 0 ? 0 : -1) != cudaSuccess)
    (void)cudaGetLastError();
  const int per_sm = resident_blocks_per_sm(global, kBitsThreads, dyn);
  const int blocks = int(std::min<int64_t>(std::max<int64_t>(want, 1), int64_t(sms) * per_sm));
  global<<<blocks, kBitsThreads, dyn, st>>>(data, idx, ptr, nullptr, out, P(nrows), P(ncols), P(nse), P(nconn), homo,
                                            SpikeRule<uint8_t, true>{uint8_t(0xffu)}, scratch.bits, summary,
                                            int32_t(dyn / 4));
  return true;
}


template <typename W, typename S, bool Binary>
__global__ void __launch_bounds__(kThreads) dense_gather_kernel(
    const W* __restrict__ w, const S* __restrict__ spk, typename AccOf<W>::type* __restrict__ out, int64_t nrows,
    int64_t ncols, int64_t batch, SpikeRule<S, Binary> rule) {
  using A = typename AccOf<W>::type;
  const int64_t r = (int64_t(blockIdx.x) * kThreads + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= nrows) return;
  const W* row = w + r * ncols;
  for (int64_t b = blockIdx.y; b < batch; b += gridDim.y) {
    A acc = A(0);
    for (int64_t c = lane; c < ncols; c += 32) {
      const S s = spk[c * batch + b];
      if (rule.active(s)) acc += A(widen(row[c])) * rule.template value<A>(s);
    }
    acc = warp_sum(acc);
    if (lane == 0) out[r * batch + b] = acc;
  }
}

template <typename W, typename S, bool Binary>
__global__ void __launch_bounds__(kThreads) dense_scatter_kernel(
    const W* __restrict__ w, const S* __restrict__ spk, typename AccOf<W>::type* __restrict__ out, int64_t nrows,
    int64_t ncols, int64_t batch, int64_t rows_per_part, SpikeRule<S, Binary> rule) {
  using A = typename AccOf<W>::type;
  __shared__ int64_t rows[kThreads];
  __shared__ A vals[kThreads];
  __shared__ int warp_counts[kWarps];
  const int64_t c = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // blockIdx.z picks a slice of the rows; slices add their partial sums atomically (out was cleared)
  const int64_t r_begin = int64_t(blockIdx.z) * rows_per_part;
  const int64_t r_end = min(nrows, r_begin + rows_per_part);
  for (int64_t b = blockIdx.y; b < batch; b += gridDim.y) {
    A acc = A(0);
    for (int64_t r0 = r_begin; r0 < r_end; r0 += kThreads) {
      const int64_t r = r0 + threadIdx.x;
      S s = S(0);
      if (r < r_end) s = spk[r * batch + b];
      const bool on = r < r_end && rule.active(s);
      const unsigned ballot = __ballot_sync(0xffffffffu, on);
      if (lane == 0) warp_counts[warp] = __popc(ballot);
      __syncthreads();
      int offset = 0, total = 0;
      for (int k = 0; k < kWarps; ++k) {
        if (k < warp) offset += warp_counts[k];
        total += warp_counts[k];
      }
      if (on) {
        const int slot = offset + __popc(ballot & ((1u << lane) - 1u));
        rows[slot] = r;
        vals[slot] = rule.template value<A>(s);
      }
      __syncthreads();
      if (c < ncols)
        for (int k = 0; k < total; ++k) acc += A(widen(w[rows[k] * ncols + c])) * vals[k];
      __syncthreads();
    }
    if (c < ncols) {
      if (gridDim.z > 1) {
        pdl_wait();  // the output's clear has finished (clear_before_adds; thread 0 holds the grid)
        atomicAdd(out + c * batch + b, acc);
      } else {
        out[c * batch + b] = acc;
      }
    }
  }
}

// The dense scatter when every row starts on a 16-byte boundary: each thread sums 16 bytes of
// columns (4 float32, 8 float16/bfloat16, 2 float64) with 16-byte evict-first loads, 8 rows' loads in
// flight. For its batch column (grid y), a block first lists the active rows of its row slice (up to
// kSliceRows) in shared memory, every warp testing a contiguous share of the slice's spikes with all
// its loads issued together, so the slice costs one spike latency and two barriers, not two barriers a
// 256-row chunk; then its threads stream those rows. Rows are summed in ascending order within a slice,
// as in dense_scatter_kernel. Where the launcher puts a tile's slices in one thread block cluster
// (sm_90), they are summed through distributed shared memory (sum_slices_in_cluster), and out is
// written once, with no clear and no atomics; otherwise slices add into out atomically (out was
// cleared).
constexpr int kSliceRows = 4096;
constexpr int kSliceChunks = kSliceRows / kThreads;  // spike loads a lane makes for its warp's share

constexpr int kMaxClusterSlices = 16;  // the most blocks a cluster of dense_scatter_vec_kernel takes

// Blocks in this block's cluster: 1 unless the kernel was launched in clusters (sm_90 and up).
__device__ __forceinline__ unsigned blocks_in_cluster() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cooperative_groups::this_cluster().num_blocks();
#else
  return 1;
#endif
}

// The slices of one column tile, one block each in a cluster, sum their partials: every block puts its
// threads' sums in its shared memory (`scratch`, whose earlier contents every thread has finished
// with), then sums its share of the tile's columns over all the cluster's blocks, in rank order, and
// stores it. The order is fixed, so the product is the same bit for bit on every run.
template <typename A, int V>
__device__ __forceinline__ void sum_slices_in_cluster(const A (&acc)[V], unsigned char* scratch, A* __restrict__ out,
                                                      int64_t col0, int64_t ncols, int64_t batch, int64_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  constexpr int kTile = kThreads * V;  // columns of a block
  static_assert(kTile * sizeof(A) <= kSliceRows * sizeof(int32_t), "the partials fit in the row list's memory");
  A* partial = reinterpret_cast<A*>(scratch);
  __syncthreads();  // the slice's row list, in the same memory, has been read
#pragma unroll
  for (int i = 0; i < V; ++i) partial[threadIdx.x * V + i] = acc[i];
  cluster.sync();  // every block's partials are in place
  const int blocks = int(cluster.num_blocks()), share = (kTile + blocks - 1) / blocks;
  const int first = int(cluster.block_rank()) * share, last = min(kTile, first + share);
  for (int e = first + int(threadIdx.x); e < last; e += kThreads) {
    A part[kMaxClusterSlices];  // every block's partial is loaded before the first add: one latency, not 16
#pragma unroll
    for (int q = 0; q < kMaxClusterSlices; ++q)
      if (q < blocks) part[q] = cluster.map_shared_rank(partial, q)[e];
    A sum = A(0);
#pragma unroll
    for (int q = 0; q < kMaxClusterSlices; ++q)
      if (q < blocks) sum += part[q];
    if (col0 + e < ncols) out[(col0 + e) * batch + b] = sum;
  }
  cluster.sync();  // no block leaves while another still reads its partials
#endif
}

template <typename W, typename S, bool Binary>
__global__ void __launch_bounds__(kThreads) dense_scatter_vec_kernel(
    const W* __restrict__ w, const S* __restrict__ spk, typename AccOf<W>::type* __restrict__ out, int64_t nrows,
    int64_t ncols, int64_t batch, int64_t rows_per_part, SpikeRule<S, Binary> rule) {
  using A = typename AccOf<W>::type;
  constexpr int V = 16 / int(sizeof(W));
  constexpr int U = 8;
  extern __shared__ __align__(16) unsigned char slice_smem[];
  int32_t* rows = reinterpret_cast<int32_t*>(slice_smem);
  A* vals = reinterpret_cast<A*>(slice_smem + kSliceRows * sizeof(int32_t));
  __shared__ int warp_counts[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t r_begin = int64_t(blockIdx.z) * rows_per_part;
  const int64_t r_end = min(nrows, r_begin + rows_per_part);
  // warp `warp` tests rows [wb, wb + 32 * chunks) of the slice
  const int chunks = int((rows_per_part + kThreads - 1) / kThreads);
  const int64_t wb = r_begin + int64_t(warp) * chunks * 32;
  const int64_t col = (int64_t(blockIdx.x) * kThreads + threadIdx.x) * V;
  const W* base = w + r_begin * ncols + col;
  const unsigned below = (1u << lane) - 1u;
  const int64_t b = blockIdx.y;  // the batch column (the launcher keeps batch within grid y)
  // The lane's rows are wb + lane + 32 j for j < chunks, those below r_end: `left` rows from its first, so
  // that a chunk costs one compare and a pointer step, not 64-bit row arithmetic. Every load is issued
  // (predicated) before the first ballot: one spike latency for the slice.
  const int64_t rows_left = r_end - (wb + lane);
  const int32_t left = rows_left <= 0 ? 0 : int32_t(rows_left < chunks * 32 ? rows_left : chunks * 32);
  const S* lane_spk = spk + ((wb + lane) * batch + b);  // read only at rows below r_end
  const int64_t chunk_step = 32 * batch;
  S sv[kSliceChunks];
#pragma unroll
  for (int j = 0; j < kSliceChunks; ++j) {
    sv[j] = j * 32 < left ? *lane_spk : S(0);  // S(0) is inactive under every rule
    lane_spk += chunk_step;
  }
  unsigned masks[kSliceChunks];
  A values[kSliceChunks];
  int count = 0;
#pragma unroll
  for (int j = 0; j < kSliceChunks; ++j) {
    const bool on = rule.active(sv[j]);
    values[j] = on ? rule.template value<A>(sv[j]) : A(0);
    masks[j] = __ballot_sync(0xffffffffu, on);
    count += __popc(masks[j]);
  }
  if (lane == 0) warp_counts[warp] = count;
  __syncthreads();
  int offset = 0, total = 0;
  for (int k = 0; k < kWarps; ++k) {
    if (k < warp) offset += warp_counts[k];
    total += warp_counts[k];
  }
  const int32_t lane_first = int32_t(wb - r_begin) + lane;  // the lane's first row within the slice
#pragma unroll
  for (int j = 0; j < kSliceChunks; ++j) {
    if (j >= chunks) break;
    if ((masks[j] >> lane) & 1u) {
      const int slot = offset + __popc(masks[j] & below);
      rows[slot] = lane_first + j * 32;
      if constexpr (!Binary) vals[slot] = values[j];
    }
    offset += __popc(masks[j]);
  }
  __syncthreads();
  A acc[V];
#pragma unroll
  for (int i = 0; i < V; ++i) acc[i] = A(0);
  auto add_row = [&](const uint4& raw, A v) {
    W e[V];
    memcpy(e, &raw, 16);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      if constexpr (Binary) acc[i] += A(widen(e[i]));
      else acc[i] += A(widen(e[i])) * v;
    }
  };
  // a round's loads are all issued before its adds, the last (partial) round's too: one memory latency
  // a round (a remainder walked row by row cost one a row: 2 us more at 4k rows, 5% active)
  const int rows_here = col < ncols ? total : 0;  // a tile's last block may run past the columns
  for (int k = 0; k < rows_here; k += U) {
    uint4 raw[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (k + u < rows_here) raw[u] = __ldcs(reinterpret_cast<const uint4*>(base + int64_t(rows[k + u]) * ncols));
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (k + u < rows_here) add_row(raw[u], Binary ? A(1) : vals[k + u]);
  }
  if (blocks_in_cluster() > 1) {
    sum_slices_in_cluster(acc, slice_smem, out, int64_t(blockIdx.x) * kThreads * V, ncols, batch, b);
    return;
  }
  if (col >= ncols) return;
  if (gridDim.z > 1) pdl_wait();  // the output's clear has finished (clear_before_adds; thread 0 holds the grid)
#pragma unroll
  for (int i = 0; i < V; ++i) {
    if (gridDim.z > 1) atomicAdd(out + (col + i) * batch + b, acc[i]);
    else out[(col + i) * batch + b] = acc[i];
  }
}

// Whether the slices of dense_scatter_vec_kernel sum their partials in clusters (one cluster a column
// tile), else atomically into the cleared output: for 2 or 4 slices on sm_90 and up. On an H200 (graph
// loops, 4k x 4k float32, batch 16) 4 slices in clusters took 12.1-12.8 us a step at 1% active against
// 12.8-13.6 atomically; at 2 they tied, and at 8 and 16 the clusters lost (16 at 40k: 381 us against
// 298), as a cluster's blocks wait for its slowest. XLAKERN_DENSE_CLUSTER = 1 turns clusters off; 2 puts
// any 2, 4, 8 or 16 slices in clusters (bench/RESULTS.md, session 44).
constexpr int kClusterSlicesByDefault = 4;
inline bool slices_in_clusters(int64_t parts, const GpuLimits& gpu) {
  const int forced = forced_choice("XLAKERN_DENSE_CLUSTER", {1, 2});
  if (gpu.major < 9 || forced == 1 || parts < 2 || parts > kMaxClusterSlices || (parts & (parts - 1)) != 0)
    return false;
  return forced == 2 || parts <= kClusterSlicesByDefault;
}

// The launch of dense_scatter_vec_kernel, or false where it does not apply: rows not on 16-byte
// boundaries, more rows than slices can take, more batch columns than grid y, or fewer than 2,048
// threads' worth of columns over the batch (an mv of 4k float32 columns ran as fast or faster on the
// one-column threads of dense_scatter_kernel, four times as many, on an H200; a batch of 16 there ran
// ~10% faster here). Enough row slices to give the GPU about four blocks an SM (an mv) or two (a
// batch) beside the batch columns' blocks (few columns mean more slices), at most kSliceRows rows each.
// Every slice adds a whole output's worth of partial sums. A batch's blocks each stream few rows, so
// there the adds cost more than the blocks gain: 4k x 4k float32, batch 16 (4 slices where there were
// 9 at four blocks an SM) went from 16.6-17.7 to 12.8-13.6 us a step at 1% active. An mv's blocks
// stream many: at 40k x 40k, 5% active, 10 slices took 104-106 us against 97-99 at 14 (H200, graph
// loops). A few slices sum in clusters (slices_in_clusters); the others add into the cleared output
// atomically. XLAKERN_DENSE_SLICES = 1, 2, 4, ... 64 forces the slices (no fewer than the rows need).
// With `deterministic`, only where its slices need no atomic add (one slice, or slices in clusters).
template <typename W, typename S, bool Binary>
bool launch_dense_scatter_vec(const W* w, const S* spk, typename AccOf<W>::type* out, int64_t nrows, int64_t ncols,
                              int64_t batch, SpikeRule<S, Binary> rule, bool deterministic, cudaStream_t st) {
  using A = typename AccOf<W>::type;
  constexpr int64_t V = 16 / int64_t(sizeof(W));
  if (nrows == 0 || batch > 65535 || (ncols / V) * batch < 2048 || (ncols * int64_t(sizeof(W))) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(w) % 16 != 0)
    return false;
  const GpuLimits gpu = gpu_limits();
  const int64_t col_blocks = (ncols / V + kThreads - 1) / kThreads;
  const int64_t spread = col_blocks * batch;
  const int64_t want = int64_t(gpu.sms) * (batch > 1 ? 2 : 4);
  // slices of 256 rows or more (for a batch, a power of two, so that a few can sum in a cluster), but no
  // fewer than kSliceRows rows each need
  const int64_t fewest = (nrows + kSliceRows - 1) / kSliceRows;
  int64_t parts = std::min<int64_t>((want + spread - 1) / spread, std::max<int64_t>(1, nrows / 256));
  if (batch > 1)
    while (parts & (parts - 1)) parts &= parts - 1;  // the largest power of two not above it
  if (const int forced = forced_choice("XLAKERN_DENSE_SLICES", {1, 2, 4, 8, 16, 32, 64})) parts = forced;
  parts = std::max<int64_t>(parts, fewest);
  const bool clustered = slices_in_clusters(parts, gpu);
  if (parts > 65535 || col_blocks > 0x7fffffff || (deterministic && parts > 1 && !clustered)) return false;
  const int64_t rows_per_part = (nrows + parts - 1) / parts;
  const size_t smem = kSliceRows * (sizeof(int32_t) + (Binary ? 0 : sizeof(A)));
  auto kernel = dense_scatter_vec_kernel<W, S, Binary>;
  // float64 spike values take the slice past 48 KiB with the static counts: opt in, or leave it to the
  // plain kernel
  if (smem + sizeof(int) * kWarps > 48 * 1024 &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  const dim3 grid{unsigned(col_blocks), unsigned(batch), unsigned(parts)};
  if (clustered && launch_in_clusters(unsigned(parts), kernel, grid, dim3(kThreads), smem, st, w, spk, out, nrows,
                                     ncols, batch, rows_per_part, rule))
    return true;
  if (deterministic && parts > 1) return false;  // the clusters were refused: no atomic slices instead
  const bool after_clear = parts > 1 && clear_before_adds(out, int64_t(ncols * batch * sizeof(A)), st, gpu);
  launch_after_clear(after_clear, kernel, grid, dim3(kThreads), smem, st, w, spk, out, nrows, ncols, batch,
                     rows_per_part, rule);
  return true;
}

// The bitmask gather serves binary spikes, one column of them (mv); the others take the plain one.
template <typename W, typename I, typename S, bool Binary>
bool gather_by_bitmask(const W* data, const I* idx, const I* ptr, const S* spk, typename AccOf<W>::type* out,
                       int64_t nrows, int64_t ncols, int64_t batch, int64_t nse, int64_t nconn, bool homo,
                       SpikeRule<S, Binary> rule, SpikeScratch scratch, cudaStream_t st) {
  if constexpr (Binary) {
    if (batch == 1) {
      const GpuLimits gpu = gpu_limits();
      if constexpr (std::is_same_v<I, int32_t>) {
        // A warp's share starts below nrows + warps (the last warps' shares lie past the rows), and a grid
        // holds at most 64 warps an SM (two blocks of 1,024): that sum must fit 32 bits too.
        if (walk32_fits({nrows + int64_t(gpu.sms) * 64, ncols, nse}))
          return launch_bitmask_gather<int32_t>(data, idx, ptr, spk, out, nrows, ncols, nse, nconn, homo, rule,
                                                scratch, gpu, st);
      }
      return launch_bitmask_gather<int64_t>(data, idx, ptr, spk, out, nrows, ncols, nse, nconn, homo, rule, scratch,
                                            gpu, st);
    }
  }
  return false;
}


}  // namespace

// `scratch` (uint32, no contents expected: spike_scratch says what it holds) is where a binary mv gather
// too wide for shared memory packs its spikes, and a binary mm gather of spikes wider than a byte copies
// them a byte each (gather_wide_binary_as_bytes); any smaller array leaves it to read the spikes instead.
// With `deterministic` a scatter (transpose) sums in fixed point instead, the same bits on every run
// (event_exact_scatter_cuda.cuh); `scratch` then holds exact_scatter_words(outputs) words.
// @xk event_sparse arg arg arg arg ret ret attr.nrows:int64 attr.ncols:int64 attr.nconn:int64 attr.transpose:bool attr.binary:bool attr.deterministic:bool stream
void event_sparse(const xk::Tensor data, const xk::Tensor indices, const xk::Tensor indptr, const xk::Tensor spikes,
                  xk::Tensor out, xk::Tensor scratch, int64_t nrows, int64_t ncols, int64_t nconn, bool transpose,
                  bool binary, bool deterministic, int64_t stream) {
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  const int64_t batch = batch_of(spikes), nse = indices.numel();
  const bool homo = data.numel() == 1;
  check_sparse(data, indices, indptr, spikes, out, nrows, ncols, nconn, transpose);
  if (transpose && deterministic) {
    if (out.numel() == 0) return;
    const ExactSums sums = exact_sums(scratch, out.numel());
    dispatch_sparse(data, indices, spikes, binary, [&](auto wt, auto it, auto stag, auto rule) {
      using W = typename decltype(wt)::type;
      using A = typename AccOf<W>::type;
      using I = typename decltype(it)::type;
      using S = typename decltype(stag)::type;
      launch_exact_scatter<false>(data.data_ptr<W>(), static_cast<const I*>(nullptr), indices.data_ptr<I>(),
                           nconn >= 0 ? nullptr : indptr.data_ptr<I>(),
                           spikes.data_ptr<S>(), out.data_ptr<A>(), sums, nrows, ncols, batch, nse, nconn, homo, rule,
                           st);
    });
    XK_CHECK_LAUNCH();
    return;
  }
  PlainLaunch launch;
  if (!plain_launch(out, nrows, batch, transpose, st, launch)) return;
  const dim3 grid = launch.grid;
  const int rows_per_warp = launch.rows_per_warp;
  dispatch_sparse(data, indices, spikes, binary, [&](auto wt, auto it, auto stag, auto rule) {
    using W = typename decltype(wt)::type;
    using A = typename AccOf<W>::type;
    using I = typename decltype(it)::type;
    using S = typename decltype(stag)::type;
    const I* ptr = nconn >= 0 ? nullptr : indptr.data_ptr<I>();
    const I* no_perm = nullptr;
    constexpr bool kBinary = decltype(rule)::kBinary;
    if constexpr (std::is_same_v<I, int32_t>) {
      if (transpose && batch == 1 && walk32_fits({nrows, ncols, nse})) {
        launch_after_clear(launch.after_clear, sparse_scatter_mv32_kernel<W, S, kBinary>, grid, dim3(kThreads), 0, st,
                           data.data_ptr<W>(), indices.data_ptr<I>(), ptr, spikes.data_ptr<S>(), out.data_ptr<A>(),
                           int32_t(nrows), int32_t(ncols), int32_t(nse), int32_t(nconn), homo, rule, rows_per_warp,
                           range_read());
        return;
      }
    }
    if (transpose)
      launch_after_clear(launch.after_clear, sparse_scatter_kernel<false, W, I, S, kBinary>, grid,
                         dim3(kThreads), 0, st, data.data_ptr<W>(), no_perm, indices.data_ptr<I>(), ptr,
                         spikes.data_ptr<S>(), out.data_ptr<A>(), nrows, ncols, batch, nse, nconn, homo, rule,
                         rows_per_warp, range_read());
    else if (!gather_by_bitmask(data.data_ptr<W>(), indices.data_ptr<I>(), ptr, spikes.data_ptr<S>(),
                                out.data_ptr<A>(), nrows, ncols, batch, nse, nconn, homo, rule,
                                spike_scratch(scratch, ncols), st) &&
             !gather_wide_binary_as_bytes(data.data_ptr<W>(), indices.data_ptr<I>(), ptr, spikes.data_ptr<S>(),
                                          out.data_ptr<A>(), nrows, ncols, batch, nse, nconn, homo, rule,
                                          scratch_bytes(scratch), st))
      launch_sparse_gather<false>(data.data_ptr<W>(), no_perm, indices.data_ptr<I>(), ptr, spikes.data_ptr<S>(),
                                  out.data_ptr<A>(), nrows, ncols, batch, nse, nconn, homo, rule, st);
  });
  XK_CHECK_LAUNCH();
}

// With `deterministic` a scatter adds no partial sums atomically (a thread sums its column over every row, or
// slices sum in clusters): the same bits on every run.
// @xk event_dense arg arg ret attr.transpose:bool attr.binary:bool attr.deterministic:bool stream
void event_dense(const xk::Tensor weights, const xk::Tensor spikes, xk::Tensor out, bool transpose, bool binary,
                 bool deterministic, int64_t stream) {
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  check_dense(weights, spikes, out, transpose);
  const int64_t nrows = weights.shape(0), ncols = weights.shape(1), batch = batch_of(spikes);
  if (out.numel() == 0) return;
  dispatch_weights(weights.dtype(), [&](auto wt) {
    using W = typename decltype(wt)::type;
    using A = typename AccOf<W>::type;
    dispatch_spikes(spikes, binary, acc_dtype(weights.dtype()), [&](auto stag, auto rule) {
      using S = typename decltype(stag)::type;
      if (!transpose) {
        dense_gather_kernel<<<dim3(grid_for_warps(nrows), grid_y(batch)), kThreads, 0, st>>>(
            weights.data_ptr<W>(), spikes.data_ptr<S>(), out.data_ptr<A>(), nrows, ncols, batch, rule);
        return;
      }
      if (launch_dense_scatter_vec(weights.data_ptr<W>(), spikes.data_ptr<S>(), out.data_ptr<A>(), nrows, ncols,
                                   batch, rule, deterministic, st))
        return;
      // One thread per column, and enough row slices (grid z) to fill the GPU when there are few columns.
      const int64_t col_blocks = (ncols + kThreads - 1) / kThreads;
      int64_t parts = std::min<int64_t>((1024 + col_blocks - 1) / col_blocks, (nrows + kThreads - 1) / kThreads);
      parts = deterministic ? 1 : std::max<int64_t>(std::min<int64_t>(parts, 65535), 1);
      const int64_t rows_per_part = (nrows + parts - 1) / parts;
      const bool after_clear = parts > 1 && clear_before_adds(out.data_ptr(), int64_t(out.nbytes()), st, gpu_limits());
      launch_after_clear(after_clear, dense_scatter_kernel<W, S, decltype(rule)::kBinary>,
                         dim3(unsigned(col_blocks), grid_y(batch), unsigned(parts)), dim3(kThreads), 0, st,
                         weights.data_ptr<W>(), spikes.data_ptr<S>(), out.data_ptr<A>(), nrows, ncols, batch,
                         rows_per_part, rule);
    });
  });
  XK_CHECK_LAUNCH();
}
