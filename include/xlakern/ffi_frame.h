// xlakern/ffi_frame.h -- the FFI handlers xlakern generates, on XLA's FFI C API alone.
//
// Only generated code includes this header. A handler reads its XLA_FFI_CallFrame
// directly: it answers XLA's metadata query, checks the frame against the entry
// point's signature (buffer counts and types, attribute names and types), builds
// xk::Tensor views, calls the user's entry point, and turns any C++ exception into
// an XLA_FFI_Error. XLA's typed FFI API (xla/ffi/api/ffi.h) does the same through
// templates that cost a compiler about 3 s a module; this header costs a fraction
// of a second, and it is what a cold build of a small module waits on.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>

#include "xla/ffi/api/c_api.h"
#include "xlakern/xlakern.h"

// The CUDA runtime's stream handle, declared the way driver_types.h declares
// it, so host-compiled handlers can receive XLA's stream without CUDA headers.
typedef struct CUstream_st* cudaStream_t;

#if defined(__GNUC__)
#define XK_EXPORT extern "C" __attribute__((visibility("default")))
#else
#define XK_EXPORT extern "C"
#endif

// The module's name, for the handlers' errors. The handlers' object names no module, so one
// object serves every module with the same entry points (the object store shares it); each
// library defines this array in a one-line unit compiled at its link.
extern "C" XK_HIDDEN const char xk_module_name[];

namespace xk {
namespace frame {

inline DType dtype_from_xla(XLA_FFI_DataType t) {
  switch (t) {
    case XLA_FFI_DataType_PRED: return DType::Bool;
    case XLA_FFI_DataType_S8: return DType::Int8;
    case XLA_FFI_DataType_S16: return DType::Int16;
    case XLA_FFI_DataType_S32: return DType::Int32;
    case XLA_FFI_DataType_S64: return DType::Int64;
    case XLA_FFI_DataType_U8: return DType::UInt8;
    case XLA_FFI_DataType_U16: return DType::UInt16;
    case XLA_FFI_DataType_U32: return DType::UInt32;
    case XLA_FFI_DataType_U64: return DType::UInt64;
    case XLA_FFI_DataType_F16: return DType::Float16;
    case XLA_FFI_DataType_BF16: return DType::BFloat16;
    case XLA_FFI_DataType_F32: return DType::Float32;
    case XLA_FFI_DataType_F64: return DType::Float64;
    case XLA_FFI_DataType_C64: return DType::Complex64;
    case XLA_FFI_DataType_C128: return DType::Complex128;
    default: return DType::Invalid;
  }
}

// The XLA scalar type an attribute parameter of C++ type T is sent as.
template <typename T> struct AttrType;
template <> struct AttrType<bool> { static constexpr XLA_FFI_DataType kType = XLA_FFI_DataType_PRED; };
template <> struct AttrType<int8_t> { static constexpr XLA_FFI_DataType kType = XLA_FFI_DataType_S8; };
template <> struct AttrType<int16_t> { static constexpr XLA_FFI_DataType kType = XLA_FFI_DataType_S16; };
template <> struct AttrType<int32_t> { static constexpr XLA_FFI_DataType kType = XLA_FFI_DataType_S32; };
template <> struct AttrType<int64_t> { static constexpr XLA_FFI_DataType kType = XLA_FFI_DataType_S64; };
template <> struct AttrType<uint8_t> { static constexpr XLA_FFI_DataType kType = XLA_FFI_DataType_U8; };
template <> struct AttrType<uint16_t> { static constexpr XLA_FFI_DataType kType = XLA_FFI_DataType_U16; };
template <> struct AttrType<uint32_t> { static constexpr XLA_FFI_DataType kType = XLA_FFI_DataType_U32; };
template <> struct AttrType<uint64_t> { static constexpr XLA_FFI_DataType kType = XLA_FFI_DataType_U64; };
template <> struct AttrType<float> { static constexpr XLA_FFI_DataType kType = XLA_FFI_DataType_F32; };
template <> struct AttrType<double> { static constexpr XLA_FFI_DataType kType = XLA_FFI_DataType_F64; };

// The glue's error paths, and its once-per-registration answer to XLA's metadata query, are out of
// line, in xlakern/ffi_frame_errors.h: a library includes that header in one unit (xlakern's loaders
// link a generated unit that does, one object for every module), so each module's handlers compile
// without them (hidden: see XK_HIDDEN).
struct Signature;
// Tells XLA the FFI version the handler was built against and its traits (XLA asks once, at registration).
XK_HIDDEN XK_COLD XLA_FFI_Error* answer_metadata(const XLA_FFI_Api* api, XLA_FFI_Metadata_Extension* ext,
                                                       XLA_FFI_Handler_Traits traits);
// A call the handler refuses (INVALID_ARGUMENT, naming "<module>.<function>").
XK_HIDDEN XK_COLD XLA_FFI_Error* called_wrongly(const XLA_FFI_Api* api, const Signature& sig, const char* why);
// What differs, for a frame that frame_fits refuses.
XK_HIDDEN XK_COLD XLA_FFI_Error* frame_mismatch(const XLA_FFI_CallFrame* f, const Signature& sig);
XK_HIDDEN XK_COLD XLA_FFI_Error* wrong_frame_size(const XLA_FFI_CallFrame* f, const Signature& sig);
// A C++ exception from the entry point (or from decoding), as the FFI error XLA reports; what is
// null for an exception of unknown type.
XK_HIDDEN XK_COLD XLA_FFI_Error* kernel_failed(const XLA_FFI_Api* api, const Signature& sig, const char* what);
// A buffer no xk::Tensor can view (an element type outside the table, or too many dimensions).
[[noreturn]] XK_HIDDEN XK_COLD void bad_buffer(const XLA_FFI_Buffer& buffer, const char* role, int64_t index);
// An attribute of another kind or dtype than the signature's (throws CallMismatch).
[[noreturn]] XK_HIDDEN XK_COLD void bad_attr(const XLA_FFI_CallFrame* f, int64_t slot, XLA_FFI_DataType want,
                                                   bool array);
[[noreturn]] XK_HIDDEN XK_COLD void no_stream(const XLA_FFI_Api* api, XLA_FFI_Error* error);

inline void destroy_error(const XLA_FFI_Api* api, XLA_FFI_Error* error) {
  XLA_FFI_Error_Destroy_Args args;
  args.struct_size = XLA_FFI_Error_Destroy_Args_STRUCT_SIZE;
  args.extension_start = nullptr;
  args.error = error;
  api->XLA_FFI_Error_Destroy(&args);
}

// What the generator knows about one handler. attr_names are in the order XLA
// passes attributes (sorted by name); the generated code asks for each
// attribute by its position in that order, and the name is checked there.
struct Signature {
  const char* function;  // the entry point's name; the target is "<module>.<function>"
  int64_t n_args;
  int64_t n_rets;
  const char* const* attr_names;
  int64_t n_attrs;
  XLA_FFI_Handler_Traits traits;
};

// Whether the frame fits the signature: the execute stage, the buffer counts and kinds, and the
// attribute names (names hold no NUL, so strncmp stops at the first difference or at the end of
// the wanted name).
inline bool frame_fits(const XLA_FFI_CallFrame* f, const Signature& sig) {
  if (f->stage != XLA_FFI_ExecutionStage_EXECUTE || f->args.size != sig.n_args || f->rets.size != sig.n_rets ||
      f->attrs.size != sig.n_attrs) {
    return false;
  }
  for (int64_t i = 0; i < f->args.size; ++i)
    if (f->args.types[i] != XLA_FFI_ArgType_BUFFER) return false;
  for (int64_t i = 0; i < f->rets.size; ++i)
    if (f->rets.types[i] != XLA_FFI_RetType_BUFFER) return false;
  for (int64_t i = 0; i < sig.n_attrs; ++i) {
    const XLA_FFI_ByteSpan* name = f->attrs.names[i];
    if (std::strncmp(sig.attr_names[i], name->ptr, name->len) != 0 || sig.attr_names[i][name->len] != '\0')
      return false;
  }
  return true;
}

inline Tensor to_tensor(const XLA_FFI_Buffer& buffer, const char* role, int64_t index) {
  const DType dt = dtype_from_xla(buffer.dtype);
  if (dt == DType::Invalid || buffer.rank > kMaxDims) bad_buffer(buffer, role, index);
  return Tensor(buffer.data, dt, buffer.dims, static_cast<int>(buffer.rank));
}

// A bytes count of a buffer, from its XLA element type (0 for types no xk::Tensor takes).
inline int64_t element_bytes(const XLA_FFI_Buffer& buffer) {
  const DType dt = dtype_from_xla(buffer.dtype);
  return dt == DType::Invalid ? 0 : static_cast<int64_t>(dtype_size(dt));
}

inline int64_t buffer_bytes(const XLA_FFI_Buffer& buffer) {
  int64_t bytes = element_bytes(buffer);
  for (int64_t j = 0; j < buffer.rank; ++j) bytes *= buffer.dims[j];
  return bytes;
}

// A call whose attributes do not fit the signature (found while decoding them): reported as
// an invalid call, like a frame_mismatch, not as a failure of the kernel.
struct CallMismatch : Error {
  using Error::Error;
};

// One call's frame, checked against its Signature (frame_mismatch) before any of these is asked.
class Frame {
 public:
  explicit Frame(XLA_FFI_CallFrame* f) : f_(f) {}

  const XLA_FFI_Buffer& input_buffer(int64_t i) const { return *static_cast<XLA_FFI_Buffer*>(f_->args.args[i]); }
  const XLA_FFI_Buffer& output_buffer(int64_t i) const { return *static_cast<XLA_FFI_Buffer*>(f_->rets.rets[i]); }
  Tensor input(int64_t i) const { return to_tensor(input_buffer(i), "input", i); }
  Tensor output(int64_t i) const { return to_tensor(output_buffer(i), "output", i); }

  // The scalar attribute at position `slot` of XLA's (name-sorted) attributes.
  template <typename T>
  T attr(int64_t slot) const {
    const auto* scalar = static_cast<const XLA_FFI_Scalar*>(f_->attrs.attrs[slot]);
    if (f_->attrs.types[slot] != XLA_FFI_AttrType_SCALAR || scalar->dtype != AttrType<T>::kType)
      bad_attr(f_, slot, AttrType<T>::kType, false);
    T value;
    std::memcpy(&value, scalar->value, sizeof(T));
    return value;
  }

  // The int64 array attribute at position `slot` (the control handlers' xlakern_ctl).
  void int64_array(int64_t slot, const int64_t** data, int64_t* size) const {
    const auto* array = static_cast<const XLA_FFI_Array*>(f_->attrs.attrs[slot]);
    if (f_->attrs.types[slot] != XLA_FFI_AttrType_ARRAY || array->dtype != XLA_FFI_DataType_S64)
      bad_attr(f_, slot, XLA_FFI_DataType_S64, true);
    *data = static_cast<const int64_t*>(array->data);
    *size = static_cast<int64_t>(array->size);
  }

  // XLA's stream for this call (CUDA modules).
  cudaStream_t stream() const {
    XLA_FFI_Stream_Get_Args args;
    args.struct_size = XLA_FFI_Stream_Get_Args_STRUCT_SIZE;
    args.extension_start = nullptr;
    args.ctx = f_->ctx;
    args.stream = nullptr;
    if (XLA_FFI_Error* error = f_->api->XLA_FFI_Stream_Get(&args)) no_stream(f_->api, error);
    return static_cast<cudaStream_t>(args.stream);
  }

 private:
  XLA_FFI_CallFrame* f_;
};

// XLA's intra-op thread pool of this call as the handle xk::parallel_for runs on (CPU
// modules). A task goes to XLA as it is, with no copy on the heap; where XLA has no pool
// the task runs on the calling thread.
class FramePool {
 public:
  FramePool(const XLA_FFI_Api* api, XLA_FFI_ExecutionContext* ctx) : api_(api), ctx_(ctx) {
    ref_.pool = this;
    ref_.count_threads = &FramePool::count_threads;
    ref_.schedule = &FramePool::schedule;
  }
  FramePool(const FramePool&) = delete;  // ref_ points at this object
  FramePool& operator=(const FramePool&) = delete;
  detail::ThreadPoolRef* ref() { return &ref_; }

 private:
  static int64_t count_threads(void* self) {
    auto* pool = static_cast<FramePool*>(self);
    int64_t n = 0;
    XLA_FFI_ThreadPool_NumThreads_Args args;
    args.struct_size = XLA_FFI_ThreadPool_NumThreads_Args_STRUCT_SIZE;
    args.extension_start = nullptr;
    args.ctx = pool->ctx_;
    args.num_threads = &n;
    if (XLA_FFI_Error* error = pool->api_->XLA_FFI_ThreadPool_NumThreads(&args)) {
      destroy_error(pool->api_, error);
      return 0;
    }
    return n;
  }
  static void schedule(void* self, void (*task)(void*), void* arg) {
    auto* pool = static_cast<FramePool*>(self);
    XLA_FFI_ThreadPool_Schedule_Args args;
    args.struct_size = XLA_FFI_ThreadPool_Schedule_Args_STRUCT_SIZE;
    args.extension_start = nullptr;
    args.ctx = pool->ctx_;
    args.task = task;
    args.data = arg;
    if (XLA_FFI_Error* error = pool->api_->XLA_FFI_ThreadPool_Schedule(&args)) {
      destroy_error(pool->api_, error);
      task(arg);
    }
  }

  const XLA_FFI_Api* api_;
  XLA_FFI_ExecutionContext* ctx_;
  detail::ThreadPoolRef ref_;
};

// What ElementLoop reports when a control handler's buffers do not fit its xlakern_ctl.
namespace loop_error {
inline int64_t index(size_t a, size_t n_inputs) { return static_cast<int64_t>(a < n_inputs ? a : a - n_inputs); }
[[noreturn]] XK_HIDDEN XK_COLD void control_size(int64_t size, size_t buffers);
[[noreturn]] XK_HIDDEN XK_COLD void rank(size_t a, size_t n_inputs, int rank, int traced);
[[noreturn]] XK_HIDDEN XK_COLD void batch_rank();
[[noreturn]] XK_HIDDEN XK_COLD void batch_count(size_t a, size_t n_inputs, int extra, int batch_rank);
[[noreturn]] XK_HIDDEN XK_COLD void batch_dim(size_t a, size_t n_inputs, int own, int64_t d, int64_t batch);
}  // namespace loop_error

// The handlers that mod.fn(...) calls (target "<module>.<fn>.xk") take one
// control attribute, xlakern_ctl = [zero mask, unbatched rank of each buffer
// (inputs, then outputs)]. With jax.vmap's "broadcast_all"/"expand_dims" the
// buffers carry leading batch dimensions beyond those ranks: the entry point
// is then called once per batch element on views at offset pointers, as the
// Numba bridges do. Inputs broadcast against the outputs' batch shape (fewer
// or size-1 batch dims). Everything lives on the stack: no allocation per call.
template <size_t N>
class ElementLoop {
 public:
  ElementLoop(const Frame& frame, size_t n_inputs, int64_t ctl_slot) : n_inputs_(n_inputs) {
    const int64_t* ctl = nullptr;
    int64_t ctl_size = 0;
    frame.int64_array(ctl_slot, &ctl, &ctl_size);
    if (ctl_size != static_cast<int64_t>(N) + 1) loop_error::control_size(ctl_size, N);
    for (size_t a = 0; a < N; ++a)
      bufs_[a] = a < n_inputs_ ? &frame.input_buffer(a) : &frame.output_buffer(a - n_inputs_);
    zero_mask_ = ctl[0];
    for (size_t a = 0; a < N; ++a) {
      ranks_[a] = static_cast<int>(ctl[a + 1]);
      const int rank = static_cast<int>(bufs_[a]->rank);
      if (ranks_[a] < 0 || ranks_[a] > rank || ranks_[a] > kMaxDims) loop_error::rank(a, n_inputs_, rank, ranks_[a]);
    }
    if (n_inputs_ < N) {  // a function without outputs runs once
      const XLA_FFI_Buffer& out = *bufs_[n_inputs_];
      batch_rank_ = static_cast<int>(out.rank) - ranks_[n_inputs_];
      if (batch_rank_ > kMaxDims) loop_error::batch_rank();
      for (int j = 0; j < batch_rank_; ++j) count_ *= (batch_[j] = out.dims[j]);
    }
    for (size_t a = 0; a < N; ++a) {
      const XLA_FFI_Buffer& buf = *bufs_[a];
      const int extra = static_cast<int>(buf.rank) - ranks_[a];
      if (extra > batch_rank_ || (a >= n_inputs_ && extra != batch_rank_))
        loop_error::batch_count(a, n_inputs_, extra, batch_rank_);
      int64_t block = element_bytes(buf);
      for (int j = static_cast<int>(buf.rank) - 1; j >= extra; --j) block *= buf.dims[j];
      for (int j = batch_rank_ - 1; j >= 0; --j) {
        const int own = j - (batch_rank_ - extra);  // this buffer's dim for batch dim j
        const int64_t d = own >= 0 ? buf.dims[own] : 1;
        if (d != 1 && d != batch_[j]) loop_error::batch_dim(a, n_inputs_, own, d, batch_[j]);
        byte_strides_[a][j] = d == 1 ? 0 : block;
        block *= d;
      }
    }
  }

  int64_t count() const { return count_; }

  // The view of buffer `a` (inputs, then outputs) for batch element `b`.
  Tensor tensor(size_t a, int64_t b) const {
    const XLA_FFI_Buffer& buf = *bufs_[a];
    const DType dt = dtype_from_xla(buf.dtype);
    if (dt == DType::Invalid) bad_buffer(buf, a < n_inputs_ ? "input" : "output", loop_error::index(a, n_inputs_));
    int64_t offset = 0;
    for (int j = batch_rank_ - 1; j >= 0; --j) {
      offset += (b % batch_[j]) * byte_strides_[a][j];
      b /= batch_[j];
    }
    return Tensor(static_cast<char*>(buf.data) + offset, dt, buf.dims + (buf.rank - ranks_[a]), ranks_[a]);
  }

  // Clears each output whose bit is set in the mask, the whole batched buffer
  // at once, with set(pointer, bytes).
  template <typename Set>
  void zero_outputs(Set&& set) const {
    for (size_t o = 0; zero_mask_ != 0 && o < 63 && n_inputs_ + o < N; ++o) {
      const int64_t bytes = buffer_bytes(*bufs_[n_inputs_ + o]);
      if (((zero_mask_ >> o) & 1) && bytes > 0) set(bufs_[n_inputs_ + o]->data, static_cast<size_t>(bytes));
    }
  }

 private:

  std::array<const XLA_FFI_Buffer*, N> bufs_ = {};
  size_t n_inputs_ = 0;
  int ranks_[N > 0 ? N : 1] = {};
  int64_t byte_strides_[N > 0 ? N : 1][kMaxDims] = {};
  int64_t batch_[kMaxDims] = {};
  int batch_rank_ = 0;
  int64_t count_ = 1;
  int64_t zero_mask_ = 0;
};

// Runs one call of a generated handler: the metadata query, the frame check, then
// body(frame) with every C++ exception turned into an FFI error that names the kernel
// (nothing may escape into XLA). CPU handlers install the call's thread pool first.
template <bool kCpu, typename Body>
XLA_FFI_Error* handle(XLA_FFI_CallFrame* f, const Signature& sig, Body&& body) {
  const XLA_FFI_Api* api = f->api;
  if (f->struct_size != XLA_FFI_CallFrame_STRUCT_SIZE) return wrong_frame_size(f, sig);
  if (f->extension_start != nullptr && f->extension_start->type == XLA_FFI_Extension_Metadata) {
    return answer_metadata(api, reinterpret_cast<XLA_FFI_Metadata_Extension*>(f->extension_start), sig.traits);
  }
  if (!frame_fits(f, sig)) return frame_mismatch(f, sig);
  try {
    const Frame frame(f);
    if constexpr (kCpu) {
      FramePool pool(api, f->ctx);
      detail::ThreadPoolScope scope(pool.ref());
      body(frame);
    } else {
      body(frame);
    }
    return nullptr;
  } catch (const CallMismatch& e) {
    return called_wrongly(api, sig, e.what());
  } catch (const std::exception& e) {
    return kernel_failed(api, sig, e.what());
  } catch (...) {
    return kernel_failed(api, sig, nullptr);
  }
}

}  // namespace frame
}  // namespace xk
