// Where modules create their parameters. A full-size model built on the CPU and then moved costs ~13 GB of host
// memory and tens of seconds of single-threaded random init; inside a ParamDeviceScope every module of this
// library (Dense, norms, embeddings, the patch convolution) creates and initializes its parameters directly on the
// scope's device. Thread-local, so loader or rank threads are unaffected.
#pragma once
#include <torch/torch.h>

namespace pi0::nn {

/// Options for a new parameter: float32 on the current scope's device (CPU outside any scope).
torch::TensorOptions param_options();

/// True inside a SkipInitScope(true): modules create their parameters with torch::empty and skip the random
/// initialization (and its zeros/ones), because every value is about to be read from a file. Untouched pages of
/// an empty CPU tensor are not even resident, so a skipped model costs neither time nor memory until loaded.
bool skip_init();

class ParamDeviceScope {
 public:
  explicit ParamDeviceScope(torch::Device device);
  ~ParamDeviceScope();
  ParamDeviceScope(const ParamDeviceScope&) = delete;
  ParamDeviceScope& operator=(const ParamDeviceScope&) = delete;

 private:
  torch::Device previous_;
};

/// Parameters created while one of these is alive (on this thread) are left uninitialized when `skip` is true
/// (resume, export, inference, init_weights). Nests; the destructor restores the previous setting.
class SkipInitScope {
 public:
  explicit SkipInitScope(bool skip = true);
  ~SkipInitScope();
  SkipInitScope(const SkipInitScope&) = delete;
  SkipInitScope& operator=(const SkipInitScope&) = delete;

 private:
  bool previous_;
};

/// A new parameter of `sizes` filled with `value`, or left uninitialized inside a SkipInitScope.
torch::Tensor filled_param(at::IntArrayRef sizes, double value);

}  // namespace pi0::nn
