// A tensor shape for messages, as LibTorch prints it: "[2, 3, 224, 224]".
#pragma once
#include <sstream>
#include <string>

#include <c10/util/ArrayRef.h>

namespace pi0 {

inline std::string shape_str(c10::IntArrayRef shape) {
  std::ostringstream os;
  os << shape;
  return os.str();
}

}  // namespace pi0
