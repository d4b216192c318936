#include "pi0/data/png.h"

#include "pi0/common/check.h"

#ifdef PI0_WITH_PNG
#include <png.h>
#endif

namespace pi0::data {

#ifdef PI0_WITH_PNG
bool png_available() { return true; }

torch::Tensor decode_png(const uint8_t* data, size_t size, const std::string& what) {
  // libpng's simplified API: converts any PNG to 8-bit RGB and reports errors in image.message (no longjmp).
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, data, size))
    throw UserError(what + ": not a valid PNG image (" + image.message + ")");
  image.format = PNG_FORMAT_RGB;
  torch::Tensor out = torch::empty({image.height, image.width, 3}, torch::kUInt8);
  if (!png_image_finish_read(&image, nullptr, out.data_ptr<uint8_t>(), 0, nullptr)) {
    png_image_free(&image);
    throw UserError(what + ": corrupt PNG image (" + image.message + ")");
  }
  return out;
}
#else
bool png_available() { return false; }

torch::Tensor decode_png(const uint8_t*, size_t, const std::string& what) {
  throw UserError(what + ": PNG images need libpng, which this build lacks (Debian: apt-get install libpng-dev, then "
                  "re-run cmake)");
}
#endif

}  // namespace pi0::data
