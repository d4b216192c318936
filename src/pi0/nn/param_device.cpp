#include "pi0/nn/param_device.h"

namespace pi0::nn {
namespace {
thread_local torch::Device current_device(torch::kCPU);
thread_local bool skip_init_flag = false;
}  // namespace

torch::TensorOptions param_options() { return torch::TensorOptions().dtype(torch::kFloat32).device(current_device); }

ParamDeviceScope::ParamDeviceScope(torch::Device device) : previous_(current_device) { current_device = device; }

ParamDeviceScope::~ParamDeviceScope() { current_device = previous_; }

bool skip_init() { return skip_init_flag; }

SkipInitScope::SkipInitScope(bool skip) : previous_(skip_init_flag) { skip_init_flag = skip; }

SkipInitScope::~SkipInitScope() { skip_init_flag = previous_; }

torch::Tensor filled_param(at::IntArrayRef sizes, double value) {
  if (skip_init_flag) return torch::empty(sizes, param_options());
  return torch::full(sizes, value, param_options());
}

}  // namespace pi0::nn
