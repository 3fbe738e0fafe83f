// kernel_args.h -- what a generic kernel expects of its arrays, and how the
// runtime maps the arrays XLA hands over (possibly batched by jax.vmap) onto
// those expectations.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace xlakern {

namespace ffi = ::xla::ffi;

// One array parameter of a compiled kernel: element type and the rank the
// kernel was compiled for.
struct ArgSpec {
  ffi::DataType dtype;
  int rank;
};

// Maps numpy's dtype names ("float32", "bool", ...) to XLA's element types;
// throws std::invalid_argument for any other name.
ffi::DataType dtype_from_name(const std::string& name);
const char* dtype_name(ffi::DataType dtype);
// Bytes per element (0 for types a generic kernel never takes).
int64_t dtype_size(ffi::DataType dtype);

// One array as XLA passes it to a handler.
struct ArgView {
  void* data;
  ffi::DataType dtype;
  const int64_t* dims;
  int rank;
};

// Bytes of the whole buffer `v` (every batch element).
int64_t byte_size(const ArgView& v);

// Reads the buffers of a call: inputs first, then outputs.
// Returns an empty string, or a message naming the array that does not match.
std::string collect_args(const ffi::RemainingArgs& args, const ffi::RemainingRets& rets,
                         std::vector<ArgView>* out);

// With vmap_method "broadcast_all" or "expand_dims", jax.vmap hands the
// handler arrays with extra leading batch dimensions, while the kernel was
// compiled for the unbatched ranks. The runtime then runs the kernel once per
// batch element on offset pointers; an unbatched call is a batch of one.
// Inputs broadcast against the outputs' batch shape as in numpy: an input
// may have fewer batch dimensions, or size-1 ones.
class BatchPlan {
 public:
  // Checks `args` (inputs then outputs, the first `n_inputs` are inputs)
  // against `specs`; returns an empty string, or a message saying what does
  // not match.
  std::string build(const std::vector<ArgSpec>& specs, size_t n_inputs,
                    const std::vector<ArgView>& args);

  int64_t count() const { return count_; }
  // Data pointer of argument `a` for batch element `b`.
  void* data(const std::vector<ArgView>& args, size_t a, int64_t b) const;
  // Unbatched dimensions of argument `a` (its trailing `spec.rank` dims).
  const int64_t* item_dims(const std::vector<ArgView>& args, size_t a) const {
    return args[a].dims + (args[a].rank - ranks_[a]);
  }

 private:
  int64_t count_ = 1;
  std::vector<int64_t> batch_shape_;   // the outputs' leading dims
  std::vector<int64_t> byte_strides_;  // [arg][batch dim], 0 where broadcast
  std::vector<int> ranks_;             // compiled rank of each argument
};

}  // namespace xlakern
