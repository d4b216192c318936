#include "pi0/distributed/grad_hooks.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "pi0/common/check.h"

namespace pi0::distributed {
namespace {
struct AccumulatedHook final : torch::autograd::FunctionPostHook {
  AccumulatedHook(std::weak_ptr<std::function<void(size_t)>> cb, size_t i) : callback(std::move(cb)), index(i) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    if (auto cb = callback.lock()) (*cb)(index);
    return outputs;
  }
  std::weak_ptr<std::function<void(size_t)>> callback;
  size_t index;
};
}  // namespace

GradAccumulationHooks::GradAccumulationHooks(const std::vector<torch::Tensor>& params,
                                             std::function<void(size_t)> on_accumulated)
    : callback_(std::make_shared<std::function<void(size_t)>>(std::move(on_accumulated))) {
  for (size_t i = 0; i < params.size(); ++i) {
    PI0_CHECK(params[i].requires_grad() && params[i].is_leaf(), "gradient hooks: parameter ", i,
              " is not a trainable leaf");
    auto acc = torch::autograd::impl::grad_accumulator(params[i]);
    PI0_CHECK(acc, "gradient hooks: no gradient accumulator for parameter ", i);
    const auto key = acc->add_post_hook(std::make_unique<AccumulatedHook>(callback_, i));
    hooks_.emplace_back(std::move(acc), key);
  }
}

GradAccumulationHooks::~GradAccumulationHooks() {
  for (auto& [node, key] : hooks_) node->del_post_hook(key);
}

}  // namespace pi0::distributed
