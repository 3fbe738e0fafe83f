// xlakern/ffi_frame_errors.h -- the out-of-line half of the frame glue (ffi_frame.h): its
// error paths and its answer to XLA's metadata query.
//
// Include it in exactly one translation unit of a library whose handlers include ffi_frame.h.
// xlakern's loaders compile a unit that does (_codegen.FRAME_ERRORS_UNIT, one object for every
// module built with the same compiler and flags) and link it into each module. Kept out of the
// handlers' unit because none of this runs on a call that succeeds, and compiling it there cost a
// third of a small module's handler build.
#pragma once

#include <string>

#include "xlakern/ffi_frame.h"

namespace xk {
namespace frame {
namespace {

XLA_FFI_Error* error_of(const XLA_FFI_Api* api, XLA_FFI_Error_Code code, const std::string& message) {
  XLA_FFI_Error_Create_Args args;
  args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
  args.extension_start = nullptr;
  args.message = message.c_str();
  args.errc = code;
  return api->XLA_FFI_Error_Create(&args);
}

// "<module>.<function>", as the user registered it.
std::string target_of(const Signature& sig) { return std::string(xk_module_name) + "." + sig.function; }

std::string dtype_label(XLA_FFI_DataType t) {
  const DType dt = dtype_from_xla(t);
  return dt == DType::Invalid ? "XLA type " + std::to_string(static_cast<int>(t)) : std::string(dtype_name(dt));
}

std::string buffer_label(size_t a, size_t n_inputs) {
  return (a < n_inputs ? "input " : "output ") + std::to_string(loop_error::index(a, n_inputs));
}

}  // namespace

XLA_FFI_Error* answer_metadata(const XLA_FFI_Api* api, XLA_FFI_Metadata_Extension* ext,
                               XLA_FFI_Handler_Traits traits) {
  if (ext->extension_base.struct_size < XLA_FFI_Metadata_Extension_STRUCT_SIZE || ext->metadata == nullptr ||
      ext->metadata->struct_size < XLA_FFI_Metadata_STRUCT_SIZE) {
    return error_of(api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                    "xlakern handler: XLA's metadata query is older than the FFI headers the module was "
                    "built with; rebuild it against the installed jaxlib");
  }
  XLA_FFI_Metadata* md = ext->metadata;
  md->api_version.struct_size = XLA_FFI_Api_Version_STRUCT_SIZE;
  md->api_version.extension_start = nullptr;
  md->api_version.major_version = XLA_FFI_API_MAJOR;
  md->api_version.minor_version = XLA_FFI_API_MINOR;
  md->traits = traits;
  md->state_type_id = XLA_FFI_UNKNOWN_TYPE_ID;
  return nullptr;
}

XLA_FFI_Error* called_wrongly(const XLA_FFI_Api* api, const Signature& sig, const char* why) {
  return error_of(api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                  detail::utf8_safe("xlakern handler '" + target_of(sig) + "' was called wrongly: " + why));
}

XLA_FFI_Error* frame_mismatch(const XLA_FFI_CallFrame* f, const Signature& sig) {
  std::string why;
  if (f->stage != XLA_FFI_ExecutionStage_EXECUTE) {
    why = "it was called at execution stage " + std::to_string(static_cast<int>(f->stage)) +
          "; xlakern handlers run only at the execute stage";
  } else if (f->args.size != sig.n_args || f->rets.size != sig.n_rets) {
    why = "it takes " + std::to_string(sig.n_args) + " input(s) and " + std::to_string(sig.n_rets) +
          " output(s), the call passed " + std::to_string(f->args.size) + " and " + std::to_string(f->rets.size);
  } else {
    for (int64_t i = 0; why.empty() && i < f->args.size; ++i)
      if (f->args.types[i] != XLA_FFI_ArgType_BUFFER) why = "input " + std::to_string(i) + " is not a buffer";
    for (int64_t i = 0; why.empty() && i < f->rets.size; ++i)
      if (f->rets.types[i] != XLA_FFI_RetType_BUFFER) why = "output " + std::to_string(i) + " is not a buffer";
  }
  if (why.empty()) {  // the buffers fit, so the attributes' names do not
    std::string want, got;
    for (int64_t i = 0; i < sig.n_attrs; ++i) want += (i ? ", " : "") + std::string(sig.attr_names[i]);
    for (int64_t i = 0; i < f->attrs.size; ++i)
      got += (i ? ", " : "") + std::string(f->attrs.names[i]->ptr, f->attrs.names[i]->len);
    why = "it takes the attributes [" + want + "], the call passed [" + got + "]";
  }
  return called_wrongly(f->api, sig, why.c_str());
}

XLA_FFI_Error* wrong_frame_size(const XLA_FFI_CallFrame* f, const Signature& sig) {
  return error_of(f->api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                  "xlakern handler '" + target_of(sig) + "': XLA's call frame is " + std::to_string(f->struct_size) +
                      " bytes, the module was built for " + std::to_string(XLA_FFI_CallFrame_STRUCT_SIZE) +
                      "; rebuild it against the installed jaxlib");
}

XLA_FFI_Error* kernel_failed(const XLA_FFI_Api* api, const Signature& sig, const char* what) {
  const std::string head = "xlakern kernel '" + target_of(sig) + "' failed: ";
  return error_of(api, XLA_FFI_Error_Code_INTERNAL,
                  what ? detail::utf8_safe(head + what) : head + "a C++ exception of unknown type was thrown");
}

void bad_buffer(const XLA_FFI_Buffer& buffer, const char* role, int64_t index) {
  const std::string which = std::string(role) + " " + std::to_string(index);
  if (dtype_from_xla(buffer.dtype) == DType::Invalid) {
    throw Error(which + " has an element type xlakern kernels do not take (XLA type id " +
                std::to_string(static_cast<int>(buffer.dtype)) + "); use one of the 15 JAX dtypes bool..complex128");
  }
  throw Error(which + " has " + std::to_string(buffer.rank) + " dimensions; xk::Tensor holds at most " +
              std::to_string(kMaxDims) + ", reshape before the call");
}

void bad_attr(const XLA_FFI_CallFrame* f, int64_t slot, XLA_FFI_DataType want, bool array) {
  const XLA_FFI_AttrType got = f->attrs.types[slot];
  const void* attr = f->attrs.attrs[slot];
  std::string passed = "a string or a dictionary";
  if (got == XLA_FFI_AttrType_SCALAR)
    passed = "a scalar of dtype " + dtype_label(static_cast<const XLA_FFI_Scalar*>(attr)->dtype);
  else if (got == XLA_FFI_AttrType_ARRAY)
    passed = "an array of dtype " + dtype_label(static_cast<const XLA_FFI_Array*>(attr)->dtype);
  throw CallMismatch("attribute '" + std::string(f->attrs.names[slot]->ptr, f->attrs.names[slot]->len) +
                     "' must be " + (array ? "an array" : "a scalar") + " of dtype " + dtype_label(want) +
                     ", the call passed " + passed +
                     (array ? "" : " (pass a NumPy scalar of that dtype, e.g. np.float32(0.5))"));
}

void no_stream(const XLA_FFI_Api* api, XLA_FFI_Error* error) {
  destroy_error(api, error);
  throw Error("XLA gave this call no platform stream");
}

namespace loop_error {
void control_size(int64_t size, size_t buffers) {
  throw Error("the xlakern_ctl attribute has " + std::to_string(size) + " entries, the function has " +
              std::to_string(buffers) +
              " buffers; call it as mod.fn(...) or through jax.ffi.ffi_call(\"<module>.<fn>\")");
}
void rank(size_t a, size_t n_inputs, int rank, int traced) {
  throw Error(buffer_label(a, n_inputs) + " has rank " + std::to_string(rank) + ", fewer than the " +
              std::to_string(traced) + " it was traced with");
}
void batch_rank() { throw Error("more than " + std::to_string(kMaxDims) + " vmap batch dimensions"); }
void batch_count(size_t a, size_t n_inputs, int extra, int batch_rank) {
  throw Error(buffer_label(a, n_inputs) + " has " + std::to_string(extra) + " batch dimension(s), the outputs " +
              std::to_string(batch_rank));
}
void batch_dim(size_t a, size_t n_inputs, int own, int64_t d, int64_t batch) {
  throw Error(buffer_label(a, n_inputs) + "'s batch dimension " + std::to_string(own) + " is " + std::to_string(d) +
              ", the outputs' is " + std::to_string(batch));
}
}  // namespace loop_error

}  // namespace frame
}  // namespace xk
