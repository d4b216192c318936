// Random-access video frame decoding (FFmpeg libavformat/libavcodec/libswscale) for LeRobot `video` features.
//
// One VideoDecoder per file and worker thread stays open across samples. A query seeks to the keyframe at or before
// the timestamp, decodes forward, and keeps the decoded frames (refcounted AVFrames, converted to RGB only when
// returned), so neighbouring timestamps in the same GOP, or a little ahead of it, decode nothing or only the frames
// in between. Frames are matched by time as LeRobot does (decode_video_frames_pyav): the frame whose pts·time_base
// is nearest the query, which must be within the tolerance (LeRobot: 1e-4 s) or the query is an error.
// Debian's FFmpeg decodes AV1 with libdav1d; H.264/HEVC with FFmpeg's own decoders.
#pragma once
#include <memory>
#include <string>

#include <torch/torch.h>

namespace pi0::data {

/// True when the library was built with FFmpeg.
bool video_available();

class VideoDecoder {
 public:
  /// Opens `path`'s best video stream; UserError naming the file if it is missing or not a readable video.
  /// `threads`: decoder threads (FFmpeg's thread_count; 0 = FFmpeg's choice, one per core).
  explicit VideoDecoder(const std::string& path, int threads = 1);
  ~VideoDecoder();
  VideoDecoder(const VideoDecoder&) = delete;
  VideoDecoder& operator=(const VideoDecoder&) = delete;

  /// The frame nearest `t` seconds (stream time) as [H,W,3] uint8 RGB. UserError naming the file, `what` (episode
  /// and frame) and `t` if the nearest frame is further than `tolerance_s` away (timestamp outside the video, a
  /// video shorter than its episode, drifting timestamps) or the stream is corrupt.
  torch::Tensor frame_at(double t, double tolerance_s, const std::string& what);

  const std::string& path() const;
  /// Frames decoded since opening (for tests and the benchmark: shows GOP reuse).
  int64_t frames_decoded() const;
  /// Seeks performed since opening.
  int64_t seeks() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pi0::data
