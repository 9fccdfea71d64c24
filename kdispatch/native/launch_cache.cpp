// kdispatch's native launch cache: a torch op's hot path in C++.
//
// A Python op's call costs torch's dispatcher a trip back into Python (boxing every argument
// into a Python object) before kdispatch's own cached path runs. This library puts a boxed C++
// kernel on an op instead. It keeps, per op, the launches the op's Python path has already
// checked and compiled (one per argument layout): the tensors' device, dtype, sizes and
// strides, the compiled kernel's CUfunction, grid, block, shared memory and PDL flag, and its
// parameters as 8-byte slots (a constant, or the data pointer of one of the call's tensors).
// A call whose tensors match an entry (and whose pointers are 16-byte aligned, as Triton's
// specialization assumed) is launched here with cuLaunchKernelEx on the device's current
// stream; any other call goes on, with its arguments untouched, to a slow op (the Python
// path), which may add an entry for next time.
//
// It needs no CUDA headers or libraries at build time: the driver types come from the cuda.h
// that Triton ships, and libcuda.so.1 is opened at run time. The stream comes from torch's
// device-guard interface, so the library also builds and loads on a CPU-only torch.
//
// Ops (namespace kdispatch_native; Python: kdispatch.native.ops):
//   install(op, slow, n_tensors, dispatch_key)   the C++ kernel on `op` at `dispatch_key`
//   add(op, tensors, function, launch, kinds, values) -> id (-1: refused)
//   probe(op, tensors) -> [id, slot...] of the entry a call would launch ([-1]: none)
//   clear()   drop every entry          take_counts() -> [id, hits, ...] (and zero them)
//   entries(op) -> int

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <dlfcn.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda.h"

namespace {

constexpr size_t kMaxTensors = 16;
constexpr size_t kMaxParams = 128;
constexpr size_t kMaxEntries = 64;  // per op; a full table is cleared (the Python cache's rule)

struct Layout {
  c10::ScalarType dtype;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
};

struct Entry {
  int64_t id = 0;
  c10::DeviceType device_type = c10::DeviceType::CPU;
  c10::DeviceIndex device = -1;
  CUcontext context = nullptr;
  std::vector<Layout> tensors;
  CUfunction function = nullptr;
  unsigned grid[3] = {1, 1, 1};
  unsigned block = 32;
  unsigned shared = 0;
  bool pdl = false;
  std::vector<int64_t> kinds;   // per parameter: -1 a constant, else a tensor's index
  std::vector<int64_t> values;  // the constants' bit patterns
  int64_t hits = 0;
};

struct OpTable {
  size_t n_tensors = 0;
  std::string slow;
  std::optional<c10::OperatorHandle> slow_op;
  std::vector<Entry> entries;
};

std::mutex g_mutex;
int64_t g_next_id = 1;
std::unordered_map<std::string, std::shared_ptr<OpTable>> g_tables;
std::vector<std::unique_ptr<torch::Library>> g_libraries;

using LaunchEx = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
using CtxGetCurrent = CUresult (*)(CUcontext*);

struct Driver {
  LaunchEx launch = nullptr;
  CtxGetCurrent current = nullptr;
};

const Driver& driver() {
  static const Driver d = [] {
    Driver out;
    void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (handle == nullptr) handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      out.launch = reinterpret_cast<LaunchEx>(dlsym(handle, "cuLaunchKernelEx"));
      out.current = reinterpret_cast<CtxGetCurrent>(dlsym(handle, "cuCtxGetCurrent"));
    }
    return out;
  }();
  return d;
}

CUcontext current_context() {
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  if (d.current == nullptr || d.current(&ctx) != CUDA_SUCCESS) return nullptr;
  return ctx;
}

std::shared_ptr<OpTable> table_of(const std::string& op) {
  auto it = g_tables.find(op);
  TORCH_CHECK(it != g_tables.end(), "kdispatch_native: op ", op, " is not installed");
  return it->second;
}

bool aligned(const at::Tensor& t) {
  return (reinterpret_cast<uintptr_t>(t.data_ptr()) & 15) == 0;
}

// Whether the call's tensors have the entry's device, dtypes, sizes and strides and aligned
// pointers. (g_mutex held.)
bool matches(const Entry& e, const at::Tensor* const* ts, size_t n) {
  if (e.tensors.size() != n) return false;
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor& t = *ts[i];
    const Layout& l = e.tensors[i];
    if (!t.defined() || t.scalar_type() != l.dtype) return false;
    const c10::Device dev = t.device();
    if (dev.type() != e.device_type || dev.index() != e.device) return false;
    if (t.sizes() != c10::IntArrayRef(l.sizes) || t.strides() != c10::IntArrayRef(l.strides))
      return false;
    if (!aligned(t)) return false;
  }
  return true;
}

// The call's first n arguments as tensors, or false when one is not a defined tensor.
bool tensors_of(const torch::jit::Stack& stack, size_t first, size_t n,
                const at::Tensor** out) {
  if (n > kMaxTensors || stack.size() < first + n) return false;
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = stack[first + i];
    if (!v.isTensor()) return false;
    out[i] = &v.toTensor();
  }
  return true;
}

void fill_slots(const Entry& e, const at::Tensor* const* ts, uint64_t* slots) {
  for (size_t j = 0; j < e.kinds.size(); ++j) {
    const int64_t k = e.kinds[j];
    slots[j] = k < 0 ? static_cast<uint64_t>(e.values[j])
                     : static_cast<uint64_t>(reinterpret_cast<uintptr_t>(ts[k]->data_ptr()));
  }
}

void launch(const Entry& e, const at::Tensor* const* ts) {
  uint64_t slots[kMaxParams];
  void* params[kMaxParams];
  fill_slots(e, ts, slots);
  for (size_t j = 0; j < e.kinds.size(); ++j) params[j] = &slots[j];
  const c10::impl::DeviceGuardImplInterface* impl =
      c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  const c10::Stream stream = impl->getStream(c10::Device(c10::DeviceType::CUDA, e.device));
  CUlaunchAttribute attrs[1];
  CUlaunchConfig config = {};
  config.gridDimX = e.grid[0];
  config.gridDimY = e.grid[1];
  config.gridDimZ = e.grid[2];
  config.blockDimX = e.block;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.sharedMemBytes = e.shared;
  config.hStream = static_cast<CUstream>(impl->getStreamNativeHandle(stream));
  config.attrs = attrs;
  config.numAttrs = 0;
  if (e.pdl) {
    attrs[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attrs[0].value.programmaticStreamSerializationAllowed = 1;
    config.numAttrs = 1;
  }
  const CUresult r = driver().launch(&config, e.function, params, nullptr);
  TORCH_CHECK(r == CUDA_SUCCESS, "kdispatch_native: cuLaunchKernelEx failed with CUDA error ",
              static_cast<int>(r));
}

// The boxed kernel installed on an op: launch a matching entry, else call the slow op.
class FastKernel final : public c10::OperatorKernel {
 public:
  explicit FastKernel(std::shared_ptr<OpTable> table) : table_(std::move(table)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const size_t n_args = op.schema().arguments().size();
    const size_t first = stack->size() - n_args;
    const at::Tensor* ts[kMaxTensors];
    std::optional<c10::OperatorHandle> slow;
    {
      std::lock_guard<std::mutex> guard(g_mutex);
      if (tensors_of(*stack, first, table_->n_tensors, ts) && driver().launch != nullptr) {
        for (Entry& e : table_->entries) {
          if (e.device_type == c10::DeviceType::CUDA && matches(e, ts, table_->n_tensors) &&
              current_context() == e.context) {
            launch(e, ts);
            ++e.hits;
            torch::jit::drop(*stack, n_args);
            return;
          }
        }
      }
      if (!table_->slow_op) {
        table_->slow_op = c10::Dispatcher::singleton().findSchemaOrThrow(table_->slow.c_str(), "");
      }
      slow = table_->slow_op;
    }
    slow->callBoxed(stack);  // outside the lock: the slow op adds entries
  }

 private:
  std::shared_ptr<OpTable> table_;
};

void install(std::string op, std::string slow, int64_t n_tensors, std::string dispatch_key) {
  TORCH_CHECK(n_tensors > 0 && static_cast<size_t>(n_tensors) <= kMaxTensors,
              "kdispatch_native.install: n_tensors must be in [1, ", kMaxTensors, "]");
  const auto sep = op.find("::");
  TORCH_CHECK(sep != std::string::npos, "kdispatch_native.install: op must be ns::name");
  std::lock_guard<std::mutex> guard(g_mutex);
  TORCH_CHECK(g_tables.find(op) == g_tables.end(), "kdispatch_native: ", op,
              " is already installed");
  auto table = std::make_shared<OpTable>();
  table->n_tensors = static_cast<size_t>(n_tensors);
  table->slow = slow;
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, op.substr(0, sep),
                                              c10::parseDispatchKey(dispatch_key), __FILE__,
                                              __LINE__);
  lib->impl(op.substr(sep + 2).c_str(),
            torch::CppFunction::makeFromBoxedFunctor(std::make_unique<FastKernel>(table)));
  g_libraries.push_back(std::move(lib));
  g_tables.emplace(op, std::move(table));
}

// launch: [grid0, grid1, grid2, block, shared, pdl]
int64_t add(std::string op, at::TensorList tensors, int64_t function, c10::IntArrayRef launch_dims,
            c10::IntArrayRef kinds, c10::IntArrayRef values) {
  TORCH_CHECK(launch_dims.size() == 6, "kdispatch_native.add: launch needs 6 values");
  TORCH_CHECK(kinds.size() == values.size() && kinds.size() <= kMaxParams,
              "kdispatch_native.add: kinds and values differ in length or are too long");
  std::lock_guard<std::mutex> guard(g_mutex);
  auto table = table_of(op);
  if (tensors.size() != table->n_tensors || tensors.empty()) return -1;
  Entry e;
  e.device_type = tensors[0].device().type();
  e.device = tensors[0].device().index();
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || t.device() != tensors[0].device() || !aligned(t)) return -1;
    e.tensors.push_back(Layout{t.scalar_type(), t.sizes().vec(), t.strides().vec()});
  }
  for (int64_t k : kinds) {
    if (k >= static_cast<int64_t>(tensors.size()) || k < -1) return -1;
  }
  if (e.device_type == c10::DeviceType::CUDA) {
    if (driver().launch == nullptr) return -1;
    e.context = current_context();
    if (e.context == nullptr) return -1;
  }
  e.function = reinterpret_cast<CUfunction>(static_cast<uintptr_t>(function));
  for (int i = 0; i < 3; ++i) {
    if (launch_dims[i] < 1) return -1;
    e.grid[i] = static_cast<unsigned>(launch_dims[i]);
  }
  e.block = static_cast<unsigned>(launch_dims[3]);
  e.shared = static_cast<unsigned>(launch_dims[4]);
  e.pdl = launch_dims[5] != 0;
  e.kinds = kinds.vec();
  e.values = values.vec();
  if (table->entries.size() >= kMaxEntries) table->entries.clear();
  e.id = g_next_id++;
  table->entries.push_back(std::move(e));
  return table->entries.back().id;
}

std::vector<int64_t> probe(std::string op, at::TensorList tensors) {
  std::lock_guard<std::mutex> guard(g_mutex);
  auto table = table_of(op);
  std::vector<int64_t> out{-1};
  if (tensors.size() != table->n_tensors || tensors.size() > kMaxTensors) return out;
  const at::Tensor* ts[kMaxTensors];
  for (size_t i = 0; i < tensors.size(); ++i) ts[i] = &tensors[i];
  for (const Entry& e : table->entries) {
    if (matches(e, ts, tensors.size())) {
      uint64_t slots[kMaxParams];
      fill_slots(e, ts, slots);
      out[0] = e.id;
      for (size_t j = 0; j < e.kinds.size(); ++j) out.push_back(static_cast<int64_t>(slots[j]));
      return out;
    }
  }
  return out;
}

void clear() {
  std::lock_guard<std::mutex> guard(g_mutex);
  for (auto& kv : g_tables) kv.second->entries.clear();
}

std::vector<int64_t> take_counts() {
  std::lock_guard<std::mutex> guard(g_mutex);
  std::vector<int64_t> out;
  for (auto& kv : g_tables) {
    for (Entry& e : kv.second->entries) {
      if (e.hits) {
        out.push_back(e.id);
        out.push_back(e.hits);
        e.hits = 0;
      }
    }
  }
  return out;
}

int64_t entries(std::string op) {
  std::lock_guard<std::mutex> guard(g_mutex);
  auto it = g_tables.find(op);
  return it == g_tables.end() ? -1 : static_cast<int64_t>(it->second->entries.size());
}

}  // namespace

TORCH_LIBRARY(kdispatch_native, m) {
  m.def("install(str op, str slow, int n_tensors, str dispatch_key) -> ()", &install);
  m.def("add(str op, Tensor[] tensors, int function, int[] launch, int[] kinds, int[] values)"
        " -> int", &add);
  m.def("probe(str op, Tensor[] tensors) -> int[]", &probe);
  m.def("clear() -> ()", &clear);
  m.def("take_counts() -> int[]", &take_counts);
  m.def("entries(str op) -> int", &entries);
}
