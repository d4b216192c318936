#include "pi0/nn/param_device.h"

namespace pi0::nn {
namespace {
thread_local torch::Device current_device(torch::kCPU);
}  // namespace

torch::TensorOptions param_options() { return torch::TensorOptions().dtype(torch::kFloat32).device(current_device); }

ParamDeviceScope::ParamDeviceScope(torch::Device device) : previous_(current_device) { current_device = device; }

ParamDeviceScope::~ParamDeviceScope() { current_device = previous_; }

}  // namespace pi0::nn
