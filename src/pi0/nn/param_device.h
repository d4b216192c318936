// Where modules create their parameters. A full-size model built on the CPU and then moved costs ~13 GB of host
// memory and tens of seconds of single-threaded random init; inside a ParamDeviceScope every module of this
// library (Dense, norms, embeddings, the patch convolution) creates and initializes its parameters directly on the
// scope's device. Thread-local, so loader or rank threads are unaffected.
#pragma once
#include <torch/torch.h>

namespace pi0::nn {

/// Options for a new parameter: float32 on the current scope's device (CPU outside any scope).
torch::TensorOptions param_options();

class ParamDeviceScope {
 public:
  explicit ParamDeviceScope(torch::Device device);
  ~ParamDeviceScope();
  ParamDeviceScope(const ParamDeviceScope&) = delete;
  ParamDeviceScope& operator=(const ParamDeviceScope&) = delete;

 private:
  torch::Device previous_;
};

}  // namespace pi0::nn
