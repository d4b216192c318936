// JPEG decode/encode for ALOHA 2's compressed image rows (each row = one JPEG, zero-padded). libjpeg decodes to
// RGB, which is what openpi's converter produces (cv2.imdecode + BGR2RGB), so no channel swap is applied.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace pi0::data {

/// True when the library was built with libjpeg.
bool jpeg_available();

/// Decodes a JPEG held in `data[0..size)` (trailing zero padding is fine) into a [H,W,3] uint8 tensor.
/// `what` names the file and key for the error message.
torch::Tensor decode_jpeg(const uint8_t* data, size_t size, const std::string& what);

/// Encodes a [H,W,3] uint8 tensor (tests and example data).
std::vector<uint8_t> encode_jpeg(const torch::Tensor& hwc, int quality = 90);

}  // namespace pi0::data
