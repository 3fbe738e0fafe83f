// The mv gather's kernel and launch, which jitc_cuda_mv_shared.cu, jitc_cuda_mv_part.cu and
// jitc_cuda_mv_exact.cu instantiate, each for one way of finding skips (MvSkips).

#pragma once

#include "jitc_cuda.cuh"

namespace xk_jitc_cuda {

// *at where `take`, else 0, as a load the compiler cannot turn into a branch (a read-only word)
__device__ __forceinline__ uint32_t load_if(bool take, const uint32_t* at) {
  uint32_t v;
  asm("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\tmov.b32 %0, 0;\n\t@p ld.global.nc.u32 %0, [%1];\n\t}"
      : "=r"(v)
      : "l"(at), "r"(int(take)));
  return v;
}

// gather_mv_kernel's rows, once shared memory is filled: each group of G lanes walks its rows with `skip`.
template <int Threads, int G, int U, typename Skip, typename A, typename S, bool Binary>
__device__ inline void gather_mv_rows(const Gen& g, const Skip& skip, const A* params, const A* q, const S* spk, A* out,
                                      SpikeRule<S, Binary> rule, const uint32_t* mask, int64_t bits,
                                      const uint32_t* __restrict__ global_bits, int32_t summary_words) {
  const Lanes<G> lanes = Lanes<G>::of_thread();
  const Weights<A> wt(params, g.kind, q);
  const uint32_t seed = *g.seed;
  const int32_t gcols = int32_t(g.gcols);
  const int32_t groups = int32_t(gridDim.x) * (Threads / G);
  for (int32_t r = int32_t((blockIdx.x * Threads + threadIdx.x) / G); r < int32_t(g.grows); r += groups) {
    const uint32_t key = row_key(seed, uint32_t(r));
    A acc = A(0);
    // U draws at once: runs of U a lane (G = 32), which place a round's 32 U draws with one scan
    auto walk = [&](auto&& f) {
      if constexpr (U > 1) walk_row_runs<U>(key, gcols, skip, f);
      else walk_row<G, 1>(lanes, key, gcols, skip, f);
    };
    // a synapse's weight is drawn only when its spike is active; the test is chosen once a row
    // (a branch outside the walk, not one per synapse)
    if (Binary && bits > 0 && g.kind == kScalar) {
      // one weight for every synapse: a set bit adds it, with no weight draw and no branch a synapse
      const A w = wt.w_scalar;
      walk([&](int32_t c, uint32_t) {
        if ((mask[c >> 5] >> (c & 31)) & 1u) acc += w;  // (a predicated add)
      });
    } else if (Binary && bits > 0) {
      walk([&](int32_t c, uint32_t k) {
        if ((mask[c >> 5] >> (c & 31)) & 1u) acc += wt.of(key, k);
      });
    } else if (Binary && global_bits != nullptr && g.kind == kScalar) {
      // the bits in global memory, read where the summary says so, with no branch a synapse: a predicated
      // load and a predicated add (a branch a draw and its reconvergence cost about 15 instructions more)
      const A w = wt.w_scalar;
      if (summary_words > 0) {
        walk([&](int32_t c, uint32_t) {
          const uint32_t word = load_if(summary_has(mask, c), global_bits + (c >> 5));
          if ((word >> (c & 31)) & 1u) acc += w;
        });
      } else {
        walk([&](int32_t c, uint32_t) {
          if ((__ldg(global_bits + (c >> 5)) >> (c & 31)) & 1u) acc += w;
        });
      }
    } else if (Binary && global_bits != nullptr) {
      walk([&](int32_t c, uint32_t k) {
        if ((summary_words == 0 || summary_has(mask, c)) && ((__ldg(global_bits + (c >> 5)) >> (c & 31)) & 1u))
          acc += wt.of(key, k);
      });
    } else {
      walk([&](int32_t c, uint32_t k) {
        const S v = spk[c];
        if (rule.active(v)) acc += wt.of(key, k) * rule.template value<A>(v);
      });
    }
#pragma unroll
    for (int d = G / 2; d > 0; d >>= 1) acc += __shfl_down_sync(lanes.mask, acc, unsigned(d), G);
    if (lanes.sub == 0) out[r] = acc;
  }
}

// The gather of one spike column (mv). Blocks stay resident and stride over the rows, so what they
// put in shared memory once serves many rows: the skip table (whole, or its short end) and, for binary
// spikes that fit, the spikes as a bitmask (a warp's 32 tests at scattered columns then cost a few bank
// conflicts instead of a global load each). Wider spikes are tested as bits in global memory, behind
// their summary in shared memory (event_common.h) where it fits. Shared memory holds `cached` entries
// of the extended table, then `bits` words of bitmask or `summary_words` of summary. Columns are int32
// (the launcher checks they fit), and every draw's cost is counted: this walk is the whole kernel, and
// at K = 1,000 it is bound by instructions issued.
template <int G, int U, int Skips, typename A, typename S, bool Binary>
__global__ void __launch_bounds__(mv_threads(Skips))
    gather_mv_kernel(Gen g, const A* params, const A* q, const S* spk, A* out, SpikeRule<S, Binary> rule, int32_t cached,
                     int64_t bits, const uint32_t* __restrict__ global_bits,
                     const uint32_t* __restrict__ global_summary, int32_t summary_words, double log_keep) {
  extern __shared__ __align__(16) uint32_t smem[];
  constexpr int pow_words = Skips == kExact ? 2 * kPowDoubles : 0;  // ExactSkip's powers come first
  const auto ext = cache_ext_table<Skips == kTableShared>(g, smem + pow_words, cached);
  uint32_t* mask = smem + pow_words + cached;  // the bitmask, or the summary of the bits in global memory
  const double* pw = Skips == kExact ? fill_powers(reinterpret_cast<double*>(smem), log_keep) : nullptr;
  if constexpr (Binary) {
    for (int64_t w = threadIdx.x; w < bits; w += blockDim.x) mask[w] = spike_word(spk, w * 32, g.gcols, rule);
    for (int32_t w = threadIdx.x; w < summary_words; w += blockDim.x) mask[w] = global_summary[w];
  }
  __syncthreads();
  constexpr int T = mv_threads(Skips);
  if constexpr (Skips == kExact)
    gather_mv_rows<T, G, U>(g, ExactSkip::of(ext, pw, log_keep), params, q, spk, out, rule, mask, bits, global_bits,
                            summary_words);
  else if constexpr (Skips == kTablePart)
    gather_mv_rows<T, G, U>(g, ExtSkip{ext, 0.69314718f * inv_log_keep_of(g.table, g.ntable)}, params, q, spk,
                            out, rule, mask, bits, global_bits, summary_words);
  else
    gather_mv_rows<T, G, U>(g, NearSkip<Skips == kTableWide>::of(ext, log_keep), params, q, spk, out, rule, mask, bits,
                            global_bits, summary_words);
}

// Launches gather_mv_kernel<G, U> as planned, with as many resident blocks as fit the GPU (no more than
// the rows need), packing the spikes first where the plan reads them as bits in global memory. ExactSkip
// leaves shared memory nearly empty, and there the summary is dropped where it would cost resident
// blocks (XLAKERN_SPIKE_SUMMARY = 2 keeps it): at 4M columns (K = 80) a gather with exact skips was
// 12% faster without it (H100, 2.72 against 3.04 ms; a first, log-based ExactSkip).
template <int G, int U, int Skips, typename A, typename S, bool Binary>
void launch_gather_mv_as(const Gen& g, const A* p, const A* q, const S* v, A* o, SpikeRule<S, Binary> rule,
                         MvPlan plan, int64_t budget, double log_keep, cudaStream_t st) {
  auto* kernel = gather_mv_kernel<G, U, Skips, A, S, Binary>;
  if (budget > 48 * 1024 &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(budget)) != cudaSuccess) {
    (void)cudaGetLastError();  // mv_shared_budget asked already; a refusal shows as the launch error
  }
  constexpr int threads = mv_threads(Skips);
  const int64_t pow_words = Skips == kExact ? 2 * kPowDoubles : 0;
  size_t smem = size_t(pow_words + plan.cached + plan.bits + plan.summary_words) * 4;
  int per_sm = resident_blocks_per_sm(kernel, threads, smem);
  if (Skips == kExact && plan.summary_words > 0 && forced_choice("XLAKERN_SPIKE_SUMMARY", {2}) == 0) {
    const size_t bare = size_t(pow_words + plan.cached + plan.bits) * 4;
    const int bare_per_sm = resident_blocks_per_sm(kernel, threads, bare);
    if (bare_per_sm > per_sm) {
      plan.summary_words = 0;
      plan.global_summary = nullptr;
      smem = bare;
      per_sm = bare_per_sm;
    }
  }
  const int64_t want = (g.grows * G + threads - 1) / threads;
  const int blocks = int(std::min<int64_t>(want, int64_t(gpu_limits().sms) * per_sm));
  if constexpr (Binary) {
    if (plan.global_bits != nullptr)
      pack_bits(v, g.gcols, rule, plan.global_bits, plan.global_summary, st);
  }
  kernel<<<blocks, threads, smem, st>>>(g, p, q, v, o, rule, plan.cached, plan.bits, plan.global_bits,
                                           plan.global_summary, plan.summary_words, log_keep);
}

template <int Skips>
void launch_gather_mv_planned(const Product& p, int lanes, int rounds, const MvPlan& plan, int64_t budget,
                              double log_keep) {
  with_typed_operands(p, [&](const auto* params, const auto* q, const auto* v, auto* o, auto rule) {
    if (lanes == 32 && rounds == 4)
      launch_gather_mv_as<32, 4, Skips>(p.g, params, q, v, o, rule, plan, budget, log_keep, p.st);
    else if (lanes == 32)
      launch_gather_mv_as<32, 1, Skips>(p.g, params, q, v, o, rule, plan, budget, log_keep, p.st);
    else if (lanes == 8)
      launch_gather_mv_as<8, 1, Skips>(p.g, params, q, v, o, rule, plan, budget, log_keep, p.st);
    else
      launch_gather_mv_as<1, 1, Skips>(p.g, params, q, v, o, rule, plan, budget, log_keep, p.st);
  });
}

}  // namespace xk_jitc_cuda
