#include "pi0/nn/checkpoint.h"

namespace pi0::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The recompute function travels to backward inside the autograd context as a capsule.
struct FnHolder : torch::CustomClassHolder {
  CheckpointFn fn;
  std::vector<bool> input_defined;   // which of the original inputs were defined
  std::vector<bool> output_defined;  // which of fn's outputs were defined
};

// Re-expands the compacted (defined-only) list to the original positions.
TensorList expand(const variable_list& compact, const std::vector<bool>& defined) {
  TensorList full(defined.size());
  size_t j = 0;
  for (size_t i = 0; i < defined.size(); ++i)
    if (defined[i]) full[i] = compact[j++];
  return full;
}

variable_list compact(const TensorList& full) {
  variable_list out;
  for (const auto& t : full)
    if (t.defined()) out.push_back(t);
  return out;
}

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  static variable_list forward(AutogradContext* ctx, at::TensorList input_refs, c10::IValue holder_value) {
    variable_list inputs = input_refs.vec();
    auto holder = c10::static_intrusive_pointer_cast<FnHolder>(holder_value.toCapsule());
    ctx->saved_data["fn"] = holder_value;
    ctx->save_for_backward(inputs);
    TensorList outputs;
    {
      torch::NoGradGuard no_grad;
      outputs = holder->fn(expand(inputs, holder->input_defined));
    }
    holder->output_defined.clear();
    for (const auto& t : outputs) holder->output_defined.push_back(t.defined());
    return compact(outputs);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto holder = c10::static_intrusive_pointer_cast<FnHolder>(ctx->saved_data["fn"].toCapsule());
    auto saved = ctx->get_saved_variables();
    variable_list detached;
    for (const auto& t : saved) detached.push_back(t.detach().requires_grad_(t.requires_grad()));
    variable_list outputs;
    {
      torch::AutoGradMode enable_grad(true);
      outputs = compact(holder->fn(expand(detached, holder->input_defined)));
    }
    variable_list roots, grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    if (!roots.empty()) torch::autograd::backward(roots, grads);
    variable_list input_grads;
    for (const auto& t : detached) input_grads.push_back(t.requires_grad() ? t.grad() : torch::Tensor());
    input_grads.push_back(torch::Tensor());  // for the holder argument
    return input_grads;
  }
};

}  // namespace

TensorList checkpoint(const CheckpointFn& fn, const TensorList& inputs) {
  if (!torch::GradMode::is_enabled()) return fn(inputs);
  auto holder = c10::make_intrusive<FnHolder>();
  holder->fn = fn;
  for (const auto& t : inputs) holder->input_defined.push_back(t.defined());
  // NOTE: pass an ArrayRef, not a std::vector: Function::apply only counts TensorList arguments as
  // differentiable inputs (a vector would match its catch-all overload and silently detach the graph).
  const auto compacted = compact(inputs);
  auto outputs = CheckpointFunction::apply(at::TensorList(compacted), c10::IValue::make_capsule(holder));
  return expand(outputs, holder->output_defined);
}

}  // namespace pi0::nn
