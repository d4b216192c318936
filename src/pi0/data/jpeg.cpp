#include "pi0/data/jpeg.h"

#include <csetjmp>
#include <cstdio>

#include "pi0/common/check.h"

#ifdef PI0_WITH_JPEG
#include <jpeglib.h>
#endif

namespace pi0::data {

#ifdef PI0_WITH_JPEG
namespace {

struct ErrorMgr {
  jpeg_error_mgr pub;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void on_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorMgr*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  longjmp(err->jump, 1);
}

}  // namespace

bool jpeg_available() { return true; }

torch::Tensor decode_jpeg(const uint8_t* data, size_t size, const std::string& what) {
  jpeg_decompress_struct cinfo;
  ErrorMgr err;
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = on_error;
  torch::Tensor out;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    throw UserError(what + ": invalid JPEG row (" + err.message + ")");
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, const_cast<unsigned char*>(data), static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&cinfo);
  out = torch::empty({cinfo.output_height, cinfo.output_width, 3}, torch::kUInt8);
  uint8_t* base = out.data_ptr<uint8_t>();
  const size_t stride = static_cast<size_t>(cinfo.output_width) * 3;
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = base + stride * cinfo.output_scanline;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return out;
}

std::vector<uint8_t> encode_jpeg(const torch::Tensor& hwc_in, int quality) {
  torch::Tensor hwc = hwc_in.contiguous();
  PI0_CHECK(hwc.dim() == 3 && hwc.size(2) == 3 && hwc.scalar_type() == torch::kUInt8, "encode_jpeg wants [H,W,3] u8");
  jpeg_compress_struct cinfo;
  jpeg_error_mgr jerr;
  cinfo.err = jpeg_std_error(&jerr);
  jpeg_create_compress(&cinfo);
  unsigned char* buf = nullptr;
  unsigned long len = 0;
  jpeg_mem_dest(&cinfo, &buf, &len);
  cinfo.image_width = static_cast<JDIMENSION>(hwc.size(1));
  cinfo.image_height = static_cast<JDIMENSION>(hwc.size(0));
  cinfo.input_components = 3;
  cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  const uint8_t* base = hwc.data_ptr<uint8_t>();
  const size_t stride = static_cast<size_t>(hwc.size(1)) * 3;
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(base + stride * cinfo.next_scanline);
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  std::vector<uint8_t> out(buf, buf + len);
  jpeg_destroy_compress(&cinfo);
  free(buf);
  return out;
}

#else

bool jpeg_available() { return false; }

torch::Tensor decode_jpeg(const uint8_t*, size_t, const std::string& what) {
  throw UserError(what + ": JPEG-compressed images need libjpeg; rebuild with libjpeg-dev installed");
}

std::vector<uint8_t> encode_jpeg(const torch::Tensor&, int) {
  throw UserError("encode_jpeg: built without libjpeg (install libjpeg-dev and rebuild)");
}

#endif

}  // namespace pi0::data
