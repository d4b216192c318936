#include "pi0/data/video.h"

#include <cmath>
#include <deque>
#include <filesystem>

#include "pi0/common/check.h"
#include "pi0/common/files.h"
#include "pi0/common/fs.h"

#ifdef PI0_WITH_FFMPEG
extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/imgutils.h>
#include <libswscale/swscale.h>
}
#endif

namespace pi0::data {

#ifdef PI0_WITH_FFMPEG

namespace {

std::string av_error(int code) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
  av_strerror(code, buf, sizeof(buf));
  return buf;
}

// Frames kept after a seek. A LeRobot GOP is 2 frames (g=2); other encoders use up to a few hundred, and a query
// far inside a long GOP must decode from its keyframe anyway. Bounded so a long forward run does not hold memory.
constexpr size_t kMaxCachedFrames = 64;
// A query this far ahead of the last decoded frame decodes forward instead of seeking (a seek plus decoding from
// the keyframe costs more than a few frames of forward decoding).
constexpr double kForwardWindowS = 0.5;

}  // namespace

bool video_available() { return true; }

struct VideoDecoder::Impl {
  std::string path;
  AVFormatContext* fmt = nullptr;
  AVCodecContext* codec = nullptr;
  AVPacket* packet = nullptr;
  SwsContext* sws = nullptr;
  int stream = -1;
  double time_base = 0;
  bool eof = false;  // demuxer and decoder drained since the last seek
  struct Decoded {
    double ts;
    AVFrame* frame;
  };
  std::deque<Decoded> frames;  // decoded since the last seek, in decode (= presentation, no B-frame reorder out) order
  int64_t decoded = 0, seeks = 0;

  ~Impl() {
    clear();
    sws_freeContext(sws);
    av_packet_free(&packet);
    avcodec_free_context(&codec);
    avformat_close_input(&fmt);
  }

  void clear() {
    for (auto& d : frames) av_frame_free(&d.frame);
    frames.clear();
  }

  [[noreturn]] void fail(const std::string& what, const std::string& msg) const {
    throw UserError(path + ": " + (what.empty() ? "" : what + ": ") + msg);
  }

  void seek(double t, const std::string& what) {
    ++seeks;
    clear();
    eof = false;
    const int64_t target = static_cast<int64_t>(std::floor(t / time_base));
    int rc = av_seek_frame(fmt, stream, target, AVSEEK_FLAG_BACKWARD);
    if (rc < 0) rc = av_seek_frame(fmt, stream, 0, AVSEEK_FLAG_BACKWARD);  // t before the first keyframe's index entry
    if (rc < 0) fail(what, "seek to " + std::to_string(t) + " s failed (" + av_error(rc) + ")");
    avcodec_flush_buffers(codec);
  }

  /// Decodes the next frame into `frames`; false at the end of the stream.
  bool decode_one(const std::string& what) {
    AVFrame* frame = av_frame_alloc();
    while (true) {
      int rc = avcodec_receive_frame(codec, frame);
      if (rc == 0) {
        const int64_t pts = frame->best_effort_timestamp != AV_NOPTS_VALUE ? frame->best_effort_timestamp : frame->pts;
        frames.push_back({static_cast<double>(pts) * time_base, frame});
        ++decoded;
        if (frames.size() > kMaxCachedFrames) {
          av_frame_free(&frames.front().frame);
          frames.pop_front();
        }
        return true;
      }
      if (rc == AVERROR_EOF) {
        av_frame_free(&frame);
        eof = true;
        return false;
      }
      if (rc != AVERROR(EAGAIN)) {
        av_frame_free(&frame);
        fail(what, "corrupt video stream (" + av_error(rc) + ")");
      }
      // The decoder wants input: feed the next packet of our stream (or the flush packet at the end of the file).
      while (true) {
        rc = av_read_frame(fmt, packet);
        if (rc < 0) {
          if (rc != AVERROR_EOF) {
            av_frame_free(&frame);
            fail(what, "corrupt or truncated video file (" + av_error(rc) + ")");
          }
          avcodec_send_packet(codec, nullptr);
          break;
        }
        if (packet->stream_index != stream) {
          av_packet_unref(packet);
          continue;
        }
        rc = avcodec_send_packet(codec, packet);
        av_packet_unref(packet);
        if (rc < 0 && rc != AVERROR(EAGAIN)) {
          av_frame_free(&frame);
          fail(what, "corrupt video stream (" + av_error(rc) + ")");
        }
        break;
      }
    }
  }

  torch::Tensor to_rgb(const AVFrame* f) {
    sws = sws_getCachedContext(sws, f->width, f->height, static_cast<AVPixelFormat>(f->format), f->width, f->height,
                               AV_PIX_FMT_RGB24, SWS_BILINEAR, nullptr, nullptr, nullptr);
    PI0_CHECK(sws != nullptr, "sws_getCachedContext failed for ", path);
    torch::Tensor out = torch::empty({f->height, f->width, 3}, torch::kUInt8);
    uint8_t* dst[4] = {out.data_ptr<uint8_t>(), nullptr, nullptr, nullptr};
    int dst_stride[4] = {3 * f->width, 0, 0, 0};
    sws_scale(sws, f->data, f->linesize, 0, f->height, dst, dst_stride);
    return out;
  }
};

VideoDecoder::VideoDecoder(const std::string& path, int threads) : impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  d.path = path;
  av_log_set_level(AV_LOG_ERROR);  // errors reach the user through UserError; FFmpeg's info lines are noise
  if (!pi0::posix_fs::exists(path)) throw UserError(path + ": video file not found");
  require_input_file(path, "", "a video file");
  int rc = avformat_open_input(&d.fmt, path.c_str(), nullptr, nullptr);
  if (rc < 0) throw UserError(path + ": not a readable video file (" + av_error(rc) + ")");
  rc = avformat_find_stream_info(d.fmt, nullptr);
  if (rc < 0) d.fail("", "not a readable video file (" + av_error(rc) + ")");
  const AVCodec* dec = nullptr;
  d.stream = av_find_best_stream(d.fmt, AVMEDIA_TYPE_VIDEO, -1, -1, &dec, 0);
  if (d.stream < 0 || dec == nullptr) d.fail("", "no decodable video stream (" + av_error(d.stream) + ")");
  const AVStream* st = d.fmt->streams[d.stream];
  d.time_base = av_q2d(st->time_base);
  d.codec = avcodec_alloc_context3(dec);
  avcodec_parameters_to_context(d.codec, st->codecpar);
  d.codec->thread_count = threads;
  d.codec->thread_type = FF_THREAD_SLICE;  // frame threading delays every frame by the thread count: bad for seeking
  rc = avcodec_open2(d.codec, dec, nullptr);
  if (rc < 0) d.fail("", std::string("cannot open the ") + dec->name + " decoder (" + av_error(rc) + ")");
  d.packet = av_packet_alloc();
}

VideoDecoder::~VideoDecoder() = default;

const std::string& VideoDecoder::path() const { return impl_->path; }
int64_t VideoDecoder::frames_decoded() const { return impl_->decoded; }
int64_t VideoDecoder::seeks() const { return impl_->seeks; }

torch::Tensor VideoDecoder::frame_at(double t, double tolerance_s, const std::string& what) {
  Impl& d = *impl_;
  const bool covered = !d.frames.empty() && t >= d.frames.front().ts - tolerance_s &&
                       (t <= d.frames.back().ts + tolerance_s || d.eof);
  const bool ahead = !d.frames.empty() && t > d.frames.back().ts && t - d.frames.back().ts <= kForwardWindowS;
  if (!covered && !ahead) d.seek(t, what);
  // Decode until a frame at or past t - tolerance (the nearest one is then among the decoded frames).
  while (!d.eof && (d.frames.empty() || d.frames.back().ts < t - tolerance_s)) d.decode_one(what);
  // One more frame when the last is before t: a later one may be nearer.
  if (!d.eof && !d.frames.empty() && d.frames.back().ts < t) d.decode_one(what);
  if (d.frames.empty()) d.fail(what, "no frame decoded near t=" + std::to_string(t) + " s (empty or corrupt video)");
  const Impl::Decoded* best = &d.frames.front();
  for (const auto& f : d.frames)
    if (std::abs(f.ts - t) < std::abs(best->ts - t)) best = &f;
  if (std::abs(best->ts - t) > tolerance_s) {
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  "no frame at timestamp %.6f s: the nearest decoded frame is at %.6f s (tolerance %g s; the video "
                  "is shorter than the episode, or its timestamps do not match the parquet's)",
                  t, best->ts, tolerance_s);
    d.fail(what, buf);
  }
  return d.to_rgb(best->frame);
}

#else  // no FFmpeg

bool video_available() { return false; }

struct VideoDecoder::Impl {
  std::string path;
};

VideoDecoder::VideoDecoder(const std::string& path, int) {
  throw UserError(path + ": LeRobot video features need FFmpeg, which this build lacks (Debian: apt-get install "
                  "libavformat-dev libavcodec-dev libswscale-dev, then re-run cmake)");
}
VideoDecoder::~VideoDecoder() = default;
const std::string& VideoDecoder::path() const { return impl_->path; }
int64_t VideoDecoder::frames_decoded() const { return 0; }
int64_t VideoDecoder::seeks() const { return 0; }
torch::Tensor VideoDecoder::frame_at(double, double, const std::string&) { return {}; }

#endif

}  // namespace pi0::data
