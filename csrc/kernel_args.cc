#include "kernel_args.h"

#include <algorithm>
#include <stdexcept>

namespace xlakern {

namespace {

struct DTypeName {
  const char* name;
  ffi::DataType dtype;
  int64_t size;
};

constexpr DTypeName kDTypes[] = {
    {"bool", ffi::DataType::PRED, 1},     {"int8", ffi::DataType::S8, 1},
    {"int16", ffi::DataType::S16, 2},     {"int32", ffi::DataType::S32, 4},
    {"int64", ffi::DataType::S64, 8},     {"uint8", ffi::DataType::U8, 1},
    {"uint16", ffi::DataType::U16, 2},    {"uint32", ffi::DataType::U32, 4},
    {"uint64", ffi::DataType::U64, 8},    {"float16", ffi::DataType::F16, 2},
    {"bfloat16", ffi::DataType::BF16, 2}, {"float32", ffi::DataType::F32, 4},
    {"float64", ffi::DataType::F64, 8},   {"complex64", ffi::DataType::C64, 8},
    {"complex128", ffi::DataType::C128, 16},
};

std::string shape_text(const int64_t* dims, int rank) {
  std::string s = "(";
  for (int i = 0; i < rank; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + (rank == 1 ? ",)" : ")");
}

std::string arg_label(size_t a, size_t n_inputs) {
  return a < n_inputs ? "input " + std::to_string(a) : "output " + std::to_string(a - n_inputs);
}

}  // namespace

ffi::DataType dtype_from_name(const std::string& name) {
  for (const auto& d : kDTypes) {
    if (name == d.name) return d.dtype;
  }
  throw std::invalid_argument("unknown dtype name '" + name + "'");
}

const char* dtype_name(ffi::DataType dtype) {
  for (const auto& d : kDTypes) {
    if (d.dtype == dtype) return d.name;
  }
  return "an unsupported XLA type";
}

int64_t dtype_size(ffi::DataType dtype) {
  for (const auto& d : kDTypes) {
    if (d.dtype == dtype) return d.size;
  }
  return 0;
}

int64_t byte_size(const ArgView& v) {
  int64_t bytes = dtype_size(v.dtype);
  for (int d = 0; d < v.rank; ++d) bytes *= v.dims[d];
  return bytes;
}

std::string collect_args(const ffi::RemainingArgs& args, const ffi::RemainingRets& rets,
                         std::vector<ArgView>* out) {
  out->clear();
  for (size_t i = 0; i < args.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (!buffer.has_value()) return "input " + std::to_string(i) + " is not an array";
    auto dims = buffer->dimensions();
    out->push_back({buffer->untyped_data(), buffer->element_type(), dims.begin(),
                    static_cast<int>(dims.size())});
  }
  for (size_t i = 0; i < rets.size(); ++i) {
    auto buffer = rets.get<ffi::AnyBuffer>(i);
    if (!buffer.has_value()) return "output " + std::to_string(i) + " is not an array";
    auto dims = (*buffer)->dimensions();
    out->push_back({(*buffer)->untyped_data(), (*buffer)->element_type(), dims.begin(),
                    static_cast<int>(dims.size())});
  }
  return {};
}

std::string BatchPlan::build(const std::vector<ArgSpec>& specs, size_t n_inputs,
                             const std::vector<ArgView>& args) {
  if (args.size() != specs.size()) {
    return "the call passes " + std::to_string(args.size()) + " arrays, the kernel takes " +
           std::to_string(specs.size());
  }
  for (size_t a = 0; a < specs.size(); ++a) {
    if (args[a].dtype != specs[a].dtype) {
      return arg_label(a, n_inputs) + " has dtype " + dtype_name(args[a].dtype) +
             ", the kernel was compiled for " + dtype_name(specs[a].dtype);
    }
    if (args[a].rank < specs[a].rank) {
      return arg_label(a, n_inputs) + " has rank " + std::to_string(args[a].rank) +
             ", the kernel was compiled for rank " + std::to_string(specs[a].rank);
    }
  }
  // The outputs' leading dimensions beyond the compiled rank are the batch.
  if (n_inputs >= args.size()) return "the kernel has no outputs";
  const ArgView& first = args[n_inputs];
  const int batch_rank = first.rank - specs[n_inputs].rank;
  batch_shape_.assign(first.dims, first.dims + batch_rank);
  for (size_t a = n_inputs + 1; a < args.size(); ++a) {
    const int extra = args[a].rank - specs[a].rank;
    if (extra != batch_rank || !std::equal(first.dims, first.dims + batch_rank, args[a].dims)) {
      return arg_label(a, n_inputs) + " has shape " + shape_text(args[a].dims, args[a].rank) +
             ", whose batch dimensions differ from output 0's " +
             shape_text(batch_shape_.data(), batch_rank);
    }
  }
  count_ = 1;
  for (int64_t d : batch_shape_) count_ *= d;
  ranks_.clear();
  byte_strides_.assign(specs.size() * batch_rank, 0);
  for (size_t a = 0; a < specs.size(); ++a) {
    ranks_.push_back(specs[a].rank);
    const int extra = args[a].rank - specs[a].rank;
    if (extra > batch_rank) {
      return arg_label(a, n_inputs) + " has shape " + shape_text(args[a].dims, args[a].rank) +
             ", more batch dimensions than the outputs' " +
             shape_text(batch_shape_.data(), batch_rank);
    }
    // Bytes of one item below batch dim j: the product of the dims after it.
    int64_t block = dtype_size(args[a].dtype);
    for (int j = args[a].rank - 1; j >= 0; --j) {
      if (j < extra) {
        const int b = batch_rank - extra + j;
        const int64_t d = args[a].dims[j];
        if (d != 1 && d != batch_shape_[b]) {
          return arg_label(a, n_inputs) + " has shape " +
                 shape_text(args[a].dims, args[a].rank) +
                 ", whose batch dimensions do not broadcast to the outputs' " +
                 shape_text(batch_shape_.data(), batch_rank);
        }
        byte_strides_[a * batch_rank + b] = d == 1 ? 0 : block;
      }
      block *= args[a].dims[j];
    }
  }
  return {};
}

void* BatchPlan::data(const std::vector<ArgView>& args, size_t a, int64_t b) const {
  const size_t batch_rank = batch_shape_.size();
  if (batch_rank == 0) return args[a].data;
  int64_t offset = 0;
  for (size_t j = batch_rank; j-- > 0;) {
    const int64_t d = batch_shape_[j];
    offset += (b % d) * byte_strides_[a * batch_rank + j];
    b /= d;
  }
  return static_cast<char*>(args[a].data) + offset;
}

}  // namespace xlakern
