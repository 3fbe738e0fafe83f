// Shared by the event kernels (CPU and CUDA): spike rules, row ranges, the CPU walk over active rows
// (walk_active_rows, prefetch_values), dtype dispatch and the entry points' argument checks.
// (xk::float16_t / bfloat16_t are CUDA's own types under nvcc.)
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <utility>

namespace xk_event {

using xk::DType;

template <typename T> struct Tag { using type = T; };

// Accumulation type: float32 for 16- and 32-bit weights, float64 for float64.
template <typename W> struct AccOf { using type = float; };
template <> struct AccOf<double> { using type = double; };

// A binary spike is read as raw bits: active when a bit outside the float sign bit is set, so
// -0.0 is inactive and NaN is active, for every width, without converting the array.
template <typename S, bool Binary> struct SpikeRule;
template <typename S> struct SpikeRule<S, true> {
  static constexpr bool kBinary = true;
  S mask;
  XK_HOST_DEVICE bool active(S x) const { return (x & mask) != 0; }
  template <typename A> XK_HOST_DEVICE A value(S) const { return A(1); }
};
template <typename S> struct SpikeRule<S, false> {
  static constexpr bool kBinary = false;
  XK_HOST_DEVICE bool active(S x) const { return x != S(0); }
  template <typename A> XK_HOST_DEVICE A value(S x) const { return A(x); }
};

// Names T where a template argument must not be deduced from it (std::type_identity, C++20).
template <typename T> struct Exactly { using type = T; };

// Row r's synapses: [r*nconn, (r+1)*nconn) for fixed-count rows (nconn >= 0), else indptr's
// entries clamped into [0, nse] so a malformed indptr never reads outside the arrays. P, the
// positions' type, is begin's: int64_t, or int32_t for the GPU walks in 32-bit arithmetic.
template <typename I, typename P>
XK_HOST_DEVICE inline void row_range(const I* indptr, typename Exactly<P>::type nconn, typename Exactly<P>::type nse,
                                     typename Exactly<P>::type r, P& begin, P& end) {
  if (nconn >= 0) {
    begin = r * nconn;
    end = begin + nconn;
    return;
  }
  const P b = P(indptr[r]), e = P(indptr[r + 1]);
  begin = b < 0 ? 0 : (b > nse ? nse : b);
  end = e < begin ? begin : (e > nse ? nse : e);
}

// Asks the caches for the first bytes (at most 1 KiB) of n values at p, ahead of a CPU walk that will
// read them. Active rows lie far apart, and a walk that only starts loading a row when it gets there
// waits a memory latency a row, before the hardware prefetcher has found the row's stream.
template <typename T>
inline void prefetch_values(const T* p, int64_t n) {
  const char* bytes = reinterpret_cast<const char*>(p);
  const int64_t size = std::min<int64_t>(n * int64_t(sizeof(T)), 1024);
  for (int64_t o = 0; o < size; o += 64) __builtin_prefetch(bytes + o);
}

// Calls visit(r) for each row r in [a, b) whose spike is active, in order, and request(r) for each such
// row `Ahead` active rows before visiting it (request asks the caches for the row's slots, with
// prefetch_values). One cursor finds the active rows, so the spikes are read once; the next `Ahead`
// wait in a ring.
template <int Ahead, typename S, typename Rule, typename Request, typename Visit>
inline void walk_active_rows(const S* spk, int64_t a, int64_t b, Rule rule, Request&& request, Visit&& visit) {
  int64_t ring[Ahead];
  int head = 0, count = 0;
  int64_t cursor = a;  // rows before it are in the ring or visited
  auto push_next_active = [&] {
    while (cursor < b && !rule.active(spk[cursor])) ++cursor;
    if (cursor == b) return;
    request(cursor);
    ring[(head + count++) % Ahead] = cursor++;
  };
  for (int i = 0; i < Ahead; ++i) push_next_active();
  while (count > 0) {
    const int64_t r = ring[head];
    head = (head + 1) % Ahead;
    --count;
    push_next_active();
    visit(r);
  }
}

#ifdef __CUDACC__
// What a launch helper needs to know of the GPU: its SM count and the shared memory a block may opt in
// to. The calling thread's device is the stream's (XLA sets it); cudaStreamGetDevice is refused while
// XLA captures the stream into a CUDA graph.
struct GpuLimits {
  int sms = 0, smem_optin = 0, major = 0;
};
inline GpuLimits gpu_limits() {
  int dev = 0;
  GpuLimits limits;
  XK_CUDA_CHECK(cudaGetDevice(&dev));
  XK_CUDA_CHECK(cudaDeviceGetAttribute(&limits.sms, cudaDevAttrMultiProcessorCount, dev));
  XK_CUDA_CHECK(cudaDeviceGetAttribute(&limits.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  XK_CUDA_CHECK(cudaDeviceGetAttribute(&limits.major, cudaDevAttrComputeCapabilityMajor, dev));
  return limits;
}

// Blocks of `threads` threads and `smem` dynamic shared bytes that one SM holds at once; 1 where the
// runtime cannot say (the error is cleared, so the launch that follows reports only its own).
template <typename Kernel>
int resident_blocks_per_sm(Kernel* kernel, int threads, size_t smem) {
  int per_sm = 1;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess || per_sm < 1) {
    (void)cudaGetLastError();
    per_sm = 1;
  }
  return per_sm;
}

// The 32 binary spikes of columns [c0, c0 + 32) (fewer at the end) as one word of bits: a one-byte
// spike vector is read 32 bytes at a time when aligned.
template <typename S>
__device__ __forceinline__ uint32_t spike_word(const S* spk, int64_t c0, int64_t ncols, SpikeRule<S, true> rule) {
  uint32_t word = 0u;
  if (sizeof(S) == 1 && c0 + 32 <= ncols && reinterpret_cast<uintptr_t>(spk + c0) % 16 == 0) {
    const uint4 a = *reinterpret_cast<const uint4*>(spk + c0), b = *reinterpret_cast<const uint4*>(spk + c0 + 16);
    const uint32_t v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 32; ++i) word |= uint32_t(((v[i >> 2] >> (8 * (i & 3))) & 0xffu) != 0u) << i;
    return word;
  }
  for (int i = 0; i < 32 && c0 + i < ncols; ++i) word |= uint32_t(rule.active(spk[c0 + i])) << i;
  return word;
}

// Binary spikes as words of bits in global memory (a thread per word), for the gathers whose bitmask
// does not fit a block's shared memory: a random test then reads a bit of an array 8x smaller than a
// one-byte spike vector (4M columns: 500 KB, half of it in an SM's L1), not a 32-byte L2 sector a test.
//
// Beside the bits, pack_bits can write their summary: one bit per byte of bits (8 columns) saying
// whether any of them is active. It is 32x smaller (4M columns: 62.5 KB), so a gather keeps it in
// shared memory and reads the bits in global memory only for synapses whose byte is active (at 1%
// activity 8% of them). Column c's summary bit is bit (c >> 3) & 31 of word c >> 8: a test costs two
// shifts and a funnel shift. (Sized as before, whole groups of four words: spike_summary_words.)
XK_HOST_DEVICE inline int64_t spike_summary_words(int64_t ncols) { return ((ncols + 31) / 32 + 31) / 32 * 4; }

__device__ __forceinline__ bool summary_has(const uint32_t* summary, uint32_t c) {
  // (the funnel shift takes its amount modulo 32: c >> 3 needs no mask)
  return __funnelshift_r(summary[c >> 8], 0u, c >> 3) & 1u;
}

template <typename S>
__global__ void pack_bits_kernel(const S* __restrict__ spk, int64_t ncols, SpikeRule<S, true> rule,
                                 uint32_t* __restrict__ bits, uint32_t* __restrict__ summary) {
  const int64_t words = (ncols + 31) / 32;
  const int64_t w = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint32_t word = w < words ? spike_word(spk, w * 32, ncols, rule) : 0u;
  if (w < words) bits[w] = word;
  if (summary == nullptr) return;  // (the whole grid)
  // word w's four bytes are summary bits 4 (w & 7) + k of word w >> 3: eight lanes' nibbles OR together
  // (every lane takes part in the shuffles; the grid's threads cover every summary word)
  uint32_t nibble = 0u;
#pragma unroll
  for (int k = 0; k < 4; ++k) nibble |= uint32_t(((word >> (8 * k)) & 0xffu) != 0u) << k;
  uint32_t part = nibble << (4 * (w & 7));
  part |= __shfl_xor_sync(0xffffffffu, part, 1);
  part |= __shfl_xor_sync(0xffffffffu, part, 2);
  part |= __shfl_xor_sync(0xffffffffu, part, 4);
  if ((w & 7) == 0 && (w >> 3) < spike_summary_words(ncols)) summary[w >> 3] = part;
}

// Packs the spikes into `bits`, and their summary into `summary` unless it is nullptr.
template <typename S>
void pack_bits(const S* spk, int64_t ncols, SpikeRule<S, true> rule, uint32_t* bits, uint32_t* summary,
               cudaStream_t st) {
  const int64_t words = (ncols + 31) / 32;
  if (words > 0) pack_bits_kernel<<<unsigned((words + 255) / 256), 256, 0, st>>>(spk, ncols, rule, bits, summary);
}

// The scratch a gather may pack its spikes into (the entry points' second output; no contents
// expected): `bits` when it is uint32 and holds one word per 32 columns, `summary` when it holds the
// summary's words after those; nullptr where it does not (the caller then reads the spikes, or goes
// without the summary).
struct SpikeScratch {
  uint32_t* bits = nullptr;
  uint32_t* summary = nullptr;
};
inline SpikeScratch spike_scratch(xk::Tensor& scratch, int64_t ncols) {
  SpikeScratch out;
  const int64_t words = (ncols + 31) / 32;
  if (scratch.dtype() != DType::UInt32 || scratch.numel() < words) return out;
  out.bits = scratch.data_ptr<uint32_t>();
  if (scratch.numel() >= words + spike_summary_words(ncols)) out.summary = out.bits + words;
  return out;
}

// The same scratch output as bytes, where gather_wide_binary_as_bytes copies wide binary spikes a byte
// each (size 0: none unless it is uint32).
struct ScratchBytes {
  uint8_t* data = nullptr;
  int64_t size = 0;
};
inline ScratchBytes scratch_bytes(xk::Tensor& scratch) {
  if (scratch.dtype() != DType::UInt32) return {};
  return {reinterpret_cast<uint8_t*>(scratch.data_ptr<uint32_t>()), scratch.numel() * 4};
}

// An integer the environment forces (one of `allowed`), else 0. The launchers' knobs exist to time
// their choices against each other and to test every path. Read at each launch, not cached, so that a
// test can change them between calls: it costs the host well under a microsecond, and a loop replayed
// as a CUDA graph does not run the launcher at all.
inline int forced_choice(const char* name, std::initializer_list<int> allowed) {
  const char* value = std::getenv(name);
  if (value == nullptr) return 0;
  const int v = std::atoi(value);
  for (int a : allowed)
    if (v == a) return v;
  return 0;
}

// Whether a GPU walk whose positions stay below these extents (rows, columns, synapses, ring entries) may
// run in 32-bit arithmetic, which takes an active row in about 40% fewer instructions (session 46): each
// under 2^31 with 512 to spare, so that no row, slot or round of loads past the last overflows.
// XLAKERN_WALK32=1 forces the 64-bit walks, so that tests reach both and a bench can time them.
inline bool walk32_fits(std::initializer_list<int64_t> extents) {
  constexpr int64_t kMost = (int64_t(1) << 31) - 512;
  for (int64_t e : extents)
    if (e >= kMost) return false;
  return forced_choice("XLAKERN_WALK32", {1, 2}) != 1;
}

// Whether a gather with its spike bits in global memory keeps their summary in shared memory
// (XLAKERN_SPIKE_SUMMARY = 1 forces it off, 2 on; on by default).
inline bool use_spike_summary() { return forced_choice("XLAKERN_SPIKE_SUMMARY", {1, 2}) != 1; }

// ---- An accumulated output's clear, overlapped with the kernel that adds into it.
// On sm_90 and up the clear is clear_bytes_kernel, and the accumulating kernel is launched after it
// programmatically (cudaLaunchAttributeProgrammaticStreamSerialization): it starts while the clear
// runs, reads its spikes, rows and weights, and waits (pdl_wait) only before its first add. A stream
// capture keeps that edge in XLA's CUDA graphs. Below sm_90, or with XLAKERN_PDL = 1, the clear is
// cudaMemsetAsync and the launch a plain one. On an H200 this took up to 1.5 us off the small CSR and
// dense scatter steps (graph loops, 4k-400k rows), and nothing where the adds dominate (session 43).
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// Holds the thread until the kernel before this one on the stream has finished and its stores are
// visible; returns at once for a kernel launched without the attribute.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// The next kernel on the stream waits only for the kernel launched after the clear, not for the clear:
// so that one must not finish before the clear does, even with nothing to add. Thread 0 of block 0
// waits for it (and the kernel's adding threads wait anyway).
__device__ __forceinline__ void pdl_hold_grid() {
  if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == 0) pdl_wait();
}

// Zeroes nbytes at p (16 bytes a store where p is aligned), letting the next kernel start at once.
// (static: each translation unit of a module that includes this header has its own.)
static __global__ void __launch_bounds__(256) clear_bytes_kernel(unsigned char* __restrict__ p, int64_t nbytes) {
  pdl_launch_dependents();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t head = 0;
  if (reinterpret_cast<uintptr_t>(p) % 16 == 0) {
    const int64_t vecs = nbytes / 16;
    uint4* q = reinterpret_cast<uint4*>(p);
    for (int64_t i = t; i < vecs; i += stride) q[i] = make_uint4(0u, 0u, 0u, 0u);
    head = vecs * 16;
  }
  for (int64_t i = head + t; i < nbytes; i += stride) p[i] = 0;
}

// Clears nbytes at p on the stream. True when the kernel that adds into it must be launched with
// launch_after_clear(true, ...), wait with pdl_wait before its first add, and hold its grid
// (pdl_hold_grid) until the clear ends. `gpu` is the stream's device (gpu_limits).
inline bool clear_before_adds(void* p, int64_t nbytes, cudaStream_t st, const GpuLimits& gpu) {
  if (gpu.major < 9 || forced_choice("XLAKERN_PDL", {1, 2}) == 1) {
    XK_CUDA_CHECK(cudaMemsetAsync(p, 0, size_t(nbytes), st));
    return false;
  }
  // one pass of the grid where it fits four 256-thread blocks an SM: all of them start at once, so the
  // next kernel can too
  const int64_t blocks = std::min<int64_t>(((nbytes + 15) / 16 + 255) / 256, int64_t(gpu.sms) * 4);
  clear_bytes_kernel<<<unsigned(blocks > 0 ? blocks : 1), 256, 0, st>>>(static_cast<unsigned char*>(p), nbytes);
  return true;
}

// Launches kernel(args...) on the stream, with one launch attribute unless `attr` is nullptr.
template <typename... Params, typename... Args>
void launch_with(const cudaLaunchAttribute* attr, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                 cudaStream_t st, Args&&... args) {
  cudaLaunchAttribute one = {};
  if (attr != nullptr) one = *attr;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cfg.attrs = &one;
  cfg.numAttrs = attr != nullptr ? 1u : 0u;
  XK_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// Launches kernel(args...) on the stream, programmatically after the clear when `programmatic`.
template <typename... Params, typename... Args>
void launch_after_clear(bool programmatic, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                        cudaStream_t st, Args&&... args) {
  cudaLaunchAttribute after = {};
  after.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  after.val.programmaticStreamSerializationAllowed = 1;
  launch_with(programmatic ? &after : nullptr, kernel, grid, block, smem, st, std::forward<Args>(args)...);
}

// Launches kernel(args...) on the stream with its blocks in clusters of cluster_z blocks along grid z
// (sm_90 and up; gridDim.z a multiple of cluster_z). Over 8 a cluster is not portable: the kernel is
// allowed it first, and false (nothing launched) if the runtime refuses.
template <typename... Params, typename... Args>
bool launch_in_clusters(unsigned cluster_z, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                        cudaStream_t st, Args&&... args) {
  if (cluster_z > 8 && cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  cudaLaunchAttribute cluster = {};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 1;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = cluster_z;
  launch_with(&cluster, kernel, grid, block, smem, st, std::forward<Args>(args)...);
  return true;
}
#endif

inline DType acc_dtype(DType w) { return w == DType::Float64 ? DType::Float64 : DType::Float32; }
inline int64_t batch_of(const xk::Tensor& spikes) { return spikes.ndim() == 2 ? spikes.shape(1) : 1; }

// A module may be built for one combination of operand dtypes (xlakern.event._kernels.operand_module):
// -DXK_EVENT_ONLY_WEIGHTS=<DType enumerator> (the weights', or a JITC product's parameters'),
// -DXK_EVENT_ONLY_INDICES=<DType enumerator> and -DXK_EVENT_ONLY_SPIKES=<bytes of a binary spike, or 0
// for float spikes> leave every other combination's kernels out of it. A first product then compiles
// one combination, not ~50 (event_cuda.cu on 2 cores: 6 s instead of 40 s). Without them a build serves
// every dtype. A dtype a build leaves out raises (only a direct FFI call can bring one).
template <DType D> constexpr bool weights_built() {
#ifdef XK_EVENT_ONLY_WEIGHTS
  return D == DType::XK_EVENT_ONLY_WEIGHTS;
#else
  return true;
#endif
}
template <DType D> constexpr bool indices_built() {
#ifdef XK_EVENT_ONLY_INDICES
  return D == DType::XK_EVENT_ONLY_INDICES;
#else
  return true;
#endif
}
template <int Bytes> constexpr bool spikes_built() {  // Bytes: a binary spike's width; 0: float spikes
#ifdef XK_EVENT_ONLY_SPIKES
  return Bytes == XK_EVENT_ONLY_SPIKES;
#else
  return true;
#endif
}

inline void not_built(const char* what, DType dt) {
  XK_CHECK(false) << "this build of the event kernels leaves out " << what << " " << xk::dtype_name(dt)
                  << " (xlakern builds one module per combination of operand dtypes)";
}

// f(Tag<T>{}) where Built, else the error that says this build left T out.
template <bool Built, typename T, typename F>
void call_built(F&& f, const char* what, DType dt) {
  if constexpr (Built) f(Tag<T>{});
  else not_built(what, dt);
}

// f(Tag<S>{}, the binary rule of `mask`) where Built, else the same error.
template <typename S, bool Built, typename F>
void call_binary(F&& f, S mask, DType dt) {
  if constexpr (Built) f(Tag<S>{}, SpikeRule<S, true>{mask});
  else not_built("binary spikes", dt);
}

template <typename F>
void dispatch_weights(DType dt, F&& f) {
  switch (dt) {
    case DType::Float16: call_built<weights_built<DType::Float16>(), xk::float16_t>(f, "weights", dt); break;
    case DType::BFloat16: call_built<weights_built<DType::BFloat16>(), xk::bfloat16_t>(f, "weights", dt); break;
    case DType::Float32: call_built<weights_built<DType::Float32>(), float>(f, "weights", dt); break;
    case DType::Float64: call_built<weights_built<DType::Float64>(), double>(f, "weights", dt); break;
    default: XK_CHECK(false) << "weights must be float16, bfloat16, float32 or float64, got " << xk::dtype_name(dt);
  }
}

// The accumulation type's tag (float64 for float64, else float32), for kernels typed by it alone (JITC).
template <typename F>
void dispatch_accumulator(DType acc, F&& f) {
  if (acc == DType::Float64) call_built<weights_built<DType::Float64>(), double>(f, "parameters", acc);
  else call_built<weights_built<DType::Float32>(), float>(f, "parameters", acc);
}

template <typename F>
void dispatch_index(DType dt, F&& f) {
  if (dt == DType::Int32) call_built<indices_built<DType::Int32>(), int32_t>(f, "indices", dt);
  else if (dt == DType::Int64) call_built<indices_built<DType::Int64>(), int64_t>(f, "indices", dt);
  else XK_CHECK(false) << "indices must be int32 or int64, got " << xk::dtype_name(dt);
}

// The int32/int64 type of an output of row or slot numbers, which every build has: it is the
// caller's choice, not an operand's dtype (csr_slot_rows gives int64 rows for int32 indptrs).
template <typename F>
void dispatch_row_numbers(DType dt, F&& f) {
  if (dt == DType::Int32) f(Tag<int32_t>{});
  else if (dt == DType::Int64) f(Tag<int64_t>{});
  else XK_CHECK(false) << "row numbers must be int32 or int64, got " << xk::dtype_name(dt);
}

// Calls f(Tag<S>, rule) with the spikes' storage type and the rule for their dtype.
template <typename F>
void dispatch_spikes(const xk::Tensor& spikes, bool binary, DType acc, F&& f) {
  const DType dt = spikes.dtype();
  if (!binary) {
    XK_CHECK(dt == acc) << "float spikes must be " << xk::dtype_name(acc) << ", got " << xk::dtype_name(dt);
    if constexpr (spikes_built<0>()) {
      if (dt == DType::Float64) f(Tag<double>{}, SpikeRule<double, false>{});
      else f(Tag<float>{}, SpikeRule<float, false>{});
    } else {
      not_built("float spikes", dt);
    }
    return;
  }
  const bool is_float = dt == DType::Float16 || dt == DType::BFloat16 || dt == DType::Float32 || dt == DType::Float64;
  switch (xk::dtype_size(dt)) {
    case 1: call_binary<uint8_t, spikes_built<1>()>(f, uint8_t(0xffu), dt); break;
    case 2: call_binary<uint16_t, spikes_built<2>()>(f, uint16_t(is_float ? 0x7fffu : 0xffffu), dt); break;
    case 4: call_binary<uint32_t, spikes_built<4>()>(f, is_float ? 0x7fffffffu : 0xffffffffu, dt); break;
    case 8: call_binary<uint64_t, spikes_built<8>()>(f, is_float ? ~(uint64_t(1) << 63) : ~uint64_t(0), dt); break;
    default: XK_CHECK(false) << "unsupported spike dtype " << xk::dtype_name(dt);
  }
}

// Calls f(Tag<W>, Tag<I>, Tag<S>, rule) with a sparse product's weight, index and spike storage types.
template <typename F>
void dispatch_sparse(const xk::Tensor& data, const xk::Tensor& indices, const xk::Tensor& spikes, bool binary,
                     F&& f) {
  dispatch_weights(data.dtype(), [&](auto wt) {
    dispatch_index(indices.dtype(), [&](auto it) {
      dispatch_spikes(spikes, binary, acc_dtype(data.dtype()), [&](auto st, auto rule) { f(wt, it, st, rule); });
    });
  });
}

// The checks both platforms run before touching memory (Python validated already; these keep a
// direct FFI call from reading out of bounds).
inline void check_sparse(const xk::Tensor& data, const xk::Tensor& indices, const xk::Tensor& indptr,
                         const xk::Tensor& spikes, const xk::Tensor& out, int64_t nrows, int64_t ncols,
                         int64_t nconn, bool transpose) {
  const int64_t batch = batch_of(spikes);
  XK_CHECK(out.dtype() == acc_dtype(data.dtype())) << "output dtype does not match the weights";
  XK_CHECK(spikes.numel() == (transpose ? nrows : ncols) * batch) << "spike count does not match the structure";
  XK_CHECK(out.numel() == (transpose ? ncols : nrows) * batch) << "output size does not match the structure";
  XK_CHECK(nconn >= 0 ? indices.numel() == nrows * nconn : indptr.numel() == nrows + 1) << "bad row structure";
  XK_CHECK(data.numel() == 1 || data.numel() == indices.numel()) << "data must hold one weight or one per synapse";
  XK_CHECK(nconn >= 0 || indptr.dtype() == indices.dtype()) << "indptr and indices dtypes differ";
}

inline void check_dense(const xk::Tensor& weights, const xk::Tensor& spikes, const xk::Tensor& out, bool transpose) {
  XK_CHECK(weights.ndim() == 2) << "weights must be a matrix";
  const int64_t batch = batch_of(spikes);
  XK_CHECK(out.dtype() == acc_dtype(weights.dtype())) << "output dtype does not match the weights";
  XK_CHECK(spikes.numel() == (transpose ? weights.shape(0) : weights.shape(1)) * batch)
      << "spike count does not match the matrix";
  XK_CHECK(out.numel() == (transpose ? weights.shape(1) : weights.shape(0)) * batch)
      << "output size does not match the matrix";
}

}  // namespace xk_event
