// PNG decoding (libpng) for LeRobot `image` features, whose parquet rows hold whole PNG files.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include <torch/torch.h>

namespace pi0::data {

/// True when the library was built with libpng.
bool png_available();

/// Decodes a PNG (any bit depth / colour type; alpha dropped, grey expanded) into a [H,W,3] uint8 RGB tensor.
/// `what` names the file, column and row for the error message.
torch::Tensor decode_png(const uint8_t* data, size_t size, const std::string& what);

}  // namespace pi0::data
