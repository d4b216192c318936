// Error handling: programmer errors go through PI0_CHECK (TORCH_CHECK), user errors through pi0::UserError,
// which apps turn into a one-line message and a non-zero exit code. Library code never calls exit().
#pragma once
#include <stdexcept>
#include <string>

#include <c10/util/Exception.h>

namespace pi0 {

/// An error caused by the user's input (config key, file, value). `what()` is one line naming the key or file,
/// the value received and what was expected.
class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& msg) : std::runtime_error(msg) {}
};

}  // namespace pi0

#define PI0_CHECK(cond, ...) TORCH_CHECK(cond, __VA_ARGS__)
