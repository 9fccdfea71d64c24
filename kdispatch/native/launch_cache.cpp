// kdispatch's native launch cache: a torch op's hot path in C++.
//
// A Python op's call costs torch's dispatcher a trip back into Python (boxing every argument
// into a Python object) before kdispatch's own cached path runs. This library puts a boxed C++
// kernel on an op instead. It keeps, per op, what the op's Python path has already checked,
// planned and compiled for one argument layout (an entry): the call's tensors' device,
// dtype, sizes and strides and which of them share a data pointer; the buffers a call
// allocates (an output, a workspace; zero-filled or not); tensors the launches read that
// the entry keeps alive; and the launches: each compiled kernel's CUfunction, grid, block,
// shared memory and PDL flag, and its parameters as 8-byte slots. A slot is a constant, a
// call tensor's or an allocation's data pointer plus a byte offset, or a float argument of
// the call times a factor, passed as fp32. A call whose tensors match an entry (with 16-byte
// aligned pointers, as Triton's specialization assumed, finite float arguments, and the
// entry's CUDA context current) is served here: buffers allocated on the device, kernels
// launched with cuLaunchKernelEx on its current stream, the returned buffer pushed. Any
// other call goes on, arguments untouched, to a slow op (the Python path), which may add an
// entry for next time.
//
// It needs no CUDA headers or libraries at build time: the driver types come from the cuda.h
// that Triton ships, and libcuda.so.1 is opened at run time. The stream comes from torch's
// device-guard interface, so the library also builds and loads on a CPU-only torch.
//
// Ops (namespace kdispatch_native; Python: kdispatch.native.ops):
//   install(op, slow, tensor_args, dispatch_key)  the C++ kernel on `op` at `dispatch_key`;
//       the call's tensors are the arguments at positions `tensor_args`
//   add(op, tensors, keep, alloc_like, alloc_zero, returns, launches) -> id (-1: refused)
//   probe(op, tensors, args) -> ([id, slot...], allocations) what a call would launch
//   clear()   drop every entry          take_counts() -> [id, hits, ...] (and zero them)
//   entries(op) -> int

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <cstring>
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
// slot kinds: kConst, a call tensor's index (< kAlloc), kAlloc + allocation, kScalar + the
// index of a float argument
constexpr int64_t kConst = -1;
constexpr int64_t kAlloc = 1000;
constexpr int64_t kScalar = 2000;
constexpr int64_t kEnd = 3000;

struct Layout {
  c10::ScalarType dtype;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t alias;  // the first earlier tensor with this data pointer, or -1
};

struct Alloc {
  c10::ScalarType dtype;
  std::vector<int64_t> sizes;
  bool zero;
};

struct Launch {
  CUfunction function = nullptr;
  unsigned grid[3] = {1, 1, 1};
  unsigned block = 32;
  unsigned shared = 0;
  bool pdl = false;
  std::vector<int64_t> kinds;
  std::vector<int64_t> values;
};

struct Entry {
  int64_t id = 0;
  c10::DeviceType device_type = c10::DeviceType::CPU;
  c10::DeviceIndex device = -1;
  CUcontext context = nullptr;
  std::vector<Layout> tensors;
  std::vector<at::Tensor> keep;
  std::vector<Alloc> allocs;
  std::vector<int64_t> scalars;  // argument indices whose floats a launch reads
  std::vector<Launch> launches;
  int64_t returns = -1;
  int64_t hits = 0;
};

struct OpTable {
  size_t n_tensors = 0;
  std::vector<size_t> positions;  // the argument positions of the call's tensors
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

uintptr_t address(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()); }

int64_t alias_of(const at::Tensor* const* ts, size_t i) {
  for (size_t j = 0; j < i; ++j) {
    if (address(*ts[j]) == address(*ts[i])) return static_cast<int64_t>(j);
  }
  return -1;
}

// Whether the call's tensors have the entry's device, dtypes, sizes, strides and pointer
// sharing, with aligned pointers. (g_mutex held.)
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
    if ((address(t) & 15) != 0 || alias_of(ts, i) != l.alias) return false;
  }
  return true;
}

// A float argument the launches may read: a finite double.
bool scalar_ok(const c10::IValue& v) { return v.isDouble() && std::isfinite(v.toDouble()); }

// The call's tensor arguments (at `positions`, after `first`), or false when one is not
// a defined tensor.
bool tensors_of(const torch::jit::Stack& stack, size_t first,
                const std::vector<size_t>& positions, const at::Tensor** out) {
  for (size_t i = 0; i < positions.size(); ++i) {
    if (stack.size() <= first + positions[i]) return false;
    const c10::IValue& v = stack[first + positions[i]];
    if (!v.isTensor()) return false;
    out[i] = &v.toTensor();
  }
  return true;
}

std::vector<at::Tensor> allocate(const Entry& e) {
  std::vector<at::Tensor> out;
  out.reserve(e.allocs.size());
  const c10::Device dev(e.device_type, e.device);
  for (const Alloc& a : e.allocs) {
    const auto opts = at::TensorOptions().dtype(a.dtype).device(dev);
    out.push_back(a.zero ? at::zeros(a.sizes, opts) : at::empty(a.sizes, opts));
  }
  return out;
}

uint64_t fp32_bits(double x) {
  const float f = static_cast<float>(x);
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

// `scalar(i)`: the call's float argument i.
template <class Scalar>
void fill_slots(const Launch& l, const at::Tensor* const* ts,
                const std::vector<at::Tensor>& allocs, Scalar scalar, uint64_t* slots) {
  for (size_t j = 0; j < l.kinds.size(); ++j) {
    const int64_t k = l.kinds[j];
    const uint64_t v = static_cast<uint64_t>(l.values[j]);
    if (k == kConst) {
      slots[j] = v;
    } else if (k < kAlloc) {
      slots[j] = address(*ts[k]) + v;
    } else if (k < kScalar) {
      slots[j] = address(allocs[k - kAlloc]) + v;
    } else {
      double factor;
      std::memcpy(&factor, &l.values[j], sizeof(factor));
      slots[j] = fp32_bits(scalar(k - kScalar) * factor);
    }
  }
}

void launch(const Entry& e, const Launch& l, const uint64_t* slots_in) {
  uint64_t slots[kMaxParams];
  void* params[kMaxParams];
  for (size_t j = 0; j < l.kinds.size(); ++j) {
    slots[j] = slots_in[j];
    params[j] = &slots[j];
  }
  const c10::impl::DeviceGuardImplInterface* impl =
      c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  const c10::Stream stream = impl->getStream(c10::Device(c10::DeviceType::CUDA, e.device));
  CUlaunchAttribute attrs[1];
  CUlaunchConfig config = {};
  config.gridDimX = l.grid[0];
  config.gridDimY = l.grid[1];
  config.gridDimZ = l.grid[2];
  config.blockDimX = l.block;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.sharedMemBytes = l.shared;
  config.hStream = static_cast<CUstream>(impl->getStreamNativeHandle(stream));
  config.attrs = attrs;
  config.numAttrs = 0;
  if (l.pdl) {
    attrs[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attrs[0].value.programmaticStreamSerializationAllowed = 1;
    config.numAttrs = 1;
  }
  const CUresult r = driver().launch(&config, l.function, params, nullptr);
  TORCH_CHECK(r == CUDA_SUCCESS, "kdispatch_native: cuLaunchKernelEx failed with CUDA error ",
              static_cast<int>(r));
}

// The boxed kernel installed on an op: serve a matching entry, else call the slow op.
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
      if (tensors_of(*stack, first, table_->positions, ts) && driver().launch != nullptr) {
        for (Entry& e : table_->entries) {
          if (serve(e, *stack, first, n_args, ts)) return;
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
  // Launch `e` for this call if it matches (g_mutex held); true when served.
  bool serve(Entry& e, torch::jit::Stack& stack, size_t first, size_t n_args,
             const at::Tensor* const* ts) {
    if (e.device_type != c10::DeviceType::CUDA || !matches(e, ts, table_->n_tensors))
      return false;
    for (int64_t s : e.scalars) {
      if (static_cast<size_t>(s) >= n_args || !scalar_ok(stack[first + s])) return false;
    }
    if (current_context() != e.context) return false;
    const std::vector<at::Tensor> allocs = allocate(e);
    auto scalar = [&](int64_t i) { return stack[first + i].toDouble(); };
    uint64_t slots[kMaxParams];
    for (const Launch& l : e.launches) {
      fill_slots(l, ts, allocs, scalar, slots);
      launch(e, l, slots);
    }
    ++e.hits;
    torch::jit::drop(stack, n_args);
    if (e.returns >= 0) stack.emplace_back(allocs[e.returns]);
    return true;
  }

  std::shared_ptr<OpTable> table_;
};

void install(std::string op, std::string slow, c10::IntArrayRef tensor_args,
             std::string dispatch_key) {
  TORCH_CHECK(!tensor_args.empty() && tensor_args.size() <= kMaxTensors,
              "kdispatch_native.install: 1 to ", kMaxTensors, " tensor_args");
  const auto sep = op.find("::");
  TORCH_CHECK(sep != std::string::npos, "kdispatch_native.install: op must be ns::name");
  std::lock_guard<std::mutex> guard(g_mutex);
  TORCH_CHECK(g_tables.find(op) == g_tables.end(), "kdispatch_native: ", op,
              " is already installed");
  auto table = std::make_shared<OpTable>();
  for (int64_t p : tensor_args) {
    TORCH_CHECK(p >= 0, "kdispatch_native.install: tensor_args must be >= 0");
    table->positions.push_back(static_cast<size_t>(p));
  }
  table->n_tensors = table->positions.size();
  table->slow = slow;
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, op.substr(0, sep),
                                              c10::parseDispatchKey(dispatch_key), __FILE__,
                                              __LINE__);
  lib->impl(op.substr(sep + 2).c_str(),
            torch::CppFunction::makeFromBoxedFunctor(std::make_unique<FastKernel>(table)));
  g_libraries.push_back(std::move(lib));
  g_tables.emplace(op, std::move(table));
}

// Parse one launch of add()'s flat list at `pos`: [function, grid0, grid1, grid2, block,
// shared, pdl, n, kind * n, value * n]; false when malformed.
bool parse_launch(c10::IntArrayRef flat, size_t& pos, size_t n_tensors, size_t n_allocs,
                  Launch& l, std::vector<int64_t>& scalars) {
  if (flat.size() < pos + 8) return false;
  l.function = reinterpret_cast<CUfunction>(static_cast<uintptr_t>(flat[pos]));
  for (int i = 0; i < 3; ++i) {
    if (flat[pos + 1 + i] < 1) return false;
    l.grid[i] = static_cast<unsigned>(flat[pos + 1 + i]);
  }
  l.block = static_cast<unsigned>(flat[pos + 4]);
  l.shared = static_cast<unsigned>(flat[pos + 5]);
  l.pdl = flat[pos + 6] != 0;
  const int64_t n = flat[pos + 7];
  pos += 8;
  if (n < 0 || static_cast<size_t>(n) > kMaxParams || flat.size() < pos + 2 * n) return false;
  l.kinds.assign(flat.begin() + pos, flat.begin() + pos + n);
  l.values.assign(flat.begin() + pos + n, flat.begin() + pos + 2 * n);
  pos += 2 * n;
  for (int64_t k : l.kinds) {
    const bool ok = k == kConst || (k >= 0 && static_cast<size_t>(k) < n_tensors) ||
                    (k >= kAlloc && static_cast<size_t>(k - kAlloc) < n_allocs) ||
                    (k >= kScalar && k < kEnd);
    if (!ok) return false;
    if (k >= kScalar) scalars.push_back(k - kScalar);
  }
  return true;
}

int64_t add(std::string op, at::TensorList tensors, at::TensorList keep,
            at::TensorList alloc_like, c10::IntArrayRef alloc_zero, int64_t returns,
            c10::IntArrayRef launches) {
  std::lock_guard<std::mutex> guard(g_mutex);
  auto table = table_of(op);
  const size_t n = tensors.size();
  if (n != table->n_tensors || n == 0 || alloc_zero.size() != alloc_like.size()) return -1;
  if (returns >= static_cast<int64_t>(alloc_like.size()) || returns < -1) return -1;
  Entry e;
  e.device_type = tensors[0].device().type();
  e.device = tensors[0].device().index();
  const at::Tensor* ts[kMaxTensors];
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor& t = tensors[i];
    if (!t.defined() || t.device() != tensors[0].device() || (address(t) & 15) != 0) return -1;
    ts[i] = &t;
    e.tensors.push_back(Layout{t.scalar_type(), t.sizes().vec(), t.strides().vec(),
                               alias_of(ts, i)});
  }
  for (size_t i = 0; i < alloc_like.size(); ++i) {
    e.allocs.push_back(Alloc{alloc_like[i].scalar_type(), alloc_like[i].sizes().vec(),
                             alloc_zero[i] != 0});
  }
  e.keep = keep.vec();
  size_t pos = 0;
  while (pos < launches.size()) {
    Launch l;
    if (!parse_launch(launches, pos, n, e.allocs.size(), l, e.scalars)) return -1;
    e.launches.push_back(std::move(l));
  }
  if (e.launches.empty()) return -1;
  if (e.device_type == c10::DeviceType::CUDA) {
    if (driver().launch == nullptr) return -1;
    e.context = current_context();
    if (e.context == nullptr) return -1;
  }
  e.returns = returns;
  if (table->entries.size() >= kMaxEntries) table->entries.clear();
  e.id = g_next_id++;
  table->entries.push_back(std::move(e));
  return table->entries.back().id;
}

// What a call of these tensors and float arguments (`args[i]`: argument i) would launch:
// the entry's id and every launch's slots, and the buffers it allocated; [-1] and none
// when no entry matches. Launches nothing.
std::tuple<std::vector<int64_t>, std::vector<at::Tensor>> probe(std::string op,
                                                                at::TensorList tensors,
                                                                c10::ArrayRef<double> args) {
  std::lock_guard<std::mutex> guard(g_mutex);
  auto table = table_of(op);
  std::vector<int64_t> out{-1};
  if (tensors.size() != table->n_tensors || tensors.size() > kMaxTensors) return {out, {}};
  const at::Tensor* ts[kMaxTensors];
  for (size_t i = 0; i < tensors.size(); ++i) ts[i] = &tensors[i];
  for (const Entry& e : table->entries) {
    if (!matches(e, ts, tensors.size())) continue;
    bool ok = true;
    for (int64_t s : e.scalars) {
      ok = ok && static_cast<size_t>(s) < args.size() && std::isfinite(args[s]);
    }
    if (!ok) continue;
    std::vector<at::Tensor> allocs = allocate(e);
    auto scalar = [&](int64_t i) { return args[i]; };
    out[0] = e.id;
    uint64_t slots[kMaxParams];
    for (const Launch& l : e.launches) {
      fill_slots(l, ts, allocs, scalar, slots);
      for (size_t j = 0; j < l.kinds.size(); ++j) out.push_back(static_cast<int64_t>(slots[j]));
    }
    return {out, allocs};
  }
  return {out, {}};
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
  m.def("install(str op, str slow, int[] tensor_args, str dispatch_key) -> ()", &install);
  m.def("add(str op, Tensor[] tensors, Tensor[] keep, Tensor[] alloc_like, int[] alloc_zero, "
        "int returns, int[] launches) -> int", &add);
  m.def("probe(str op, Tensor[] tensors, float[] args) -> (int[], Tensor[])", &probe);
  m.def("clear() -> ()", &clear);
  m.def("take_counts() -> int[]", &take_counts);
  m.def("entries(str op) -> int", &entries);
}
