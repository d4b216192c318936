// TensorBoard event files without TensorFlow or protobuf (train.tensorboard: true): what users of openpi and LeRobot
// watch training with. Debian has no maintained C++ TensorBoard writer, and the format needs only a handful of
// protobuf fields, so they are encoded by hand here. The format, as TensorBoard's reader
// (tensorboard/backend/event_processing/event_file_loader.py) expects it:
//   file   = TFRecord*; each record = uint64 length (little-endian), masked CRC32C of those 8 bytes, the data, masked
//            CRC32C of the data (masked: ((crc >> 15) | (crc << 17)) + 0xa282ead8)
//   data   = an Event protobuf (tensorboard/compat/proto/event.proto): wall_time = 1 (double), step = 2 (int64),
//            file_version = 3 ("brain.Event:2", the first record), summary = 5, session_log = 7
//   Summary.value = 1 (repeated Value: tag = 1, simple_value = 2 (float), image = 4)
//   Summary.Image: height = 1, width = 2, colorspace = 3 (3 = RGB), encoded_image_string = 4 (PNG bytes)
// One file per start of the trainer (named events.out.tfevents.<unix seconds>.<hostname>, TensorBoard reads every
// file in a directory in name order); each record is flushed as written, so a killed run loses at most the record
// it was writing, whose truncated tail the reader skips.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace pi0::train {

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of TFRecord framing.
uint32_t crc32c(const void* data, size_t size);
/// TFRecord's masked form of crc32c(data): ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t size);

/// `data` framed as one TFRecord.
std::string tfrecord(const std::string& data);
/// The records of a TFRecord byte string, in order, up to the first one that is incomplete or fails its checksums
/// (the tail a killed writer leaves); `complete` (optional) says whether every byte belonged to a valid record.
std::vector<std::string> read_tfrecords(const std::string& bytes, bool* complete = nullptr);

/// A PNG image for an event: its tag and size.
struct EventImage {
  std::string tag;  ///< e.g. "camera_views/0"
  int64_t height = 0, width = 0;
  std::string png;  ///< the encoded file
};

/// Event protobufs, encoded. `wall_time` in seconds since the Unix epoch.
std::string event_file_version(double wall_time);
std::string event_scalars(double wall_time, int64_t step, const std::map<std::string, double>& values);
std::string event_images(double wall_time, int64_t step, const std::vector<EventImage>& images);
/// SessionLog START at `step`: TensorBoard drops the events it already holds at steps >= step (a restarted run).
std::string event_session_start(double wall_time, int64_t step);

/// The fields of an encoded Event that the writer reads back (older files are pruned on resume).
struct EventInfo {
  int64_t step = 0;
  bool file_version = false;  ///< the file's first record, kept whatever its step
};
/// UserError when `event` is not a well-formed protobuf message.
EventInfo decode_event(const std::string& event);

/// openpi's "camera_views": for each of the first `max_samples` samples of a batch, its camera images side by side
/// (every slot, in model::kCameraNames order, as the model sees them: [-1, 1] mapped to 0..255), as PNG.
/// `images`: one [B,3,S,S] tensor per slot. Tags "camera_views/<sample>".
std::vector<EventImage> camera_views(const std::vector<torch::Tensor>& images, int64_t max_samples = 5);

/// The event file of one start of the trainer (rank 0), in the run directory.
class TensorBoardWriter {
 public:
  /// Creates a new event file in `dir` (events.out.tfevents.<unix seconds>.<hostname>, with ".1", ".2", ... added
  /// when a file of that name exists: a second start within the same second) and writes its file_version record.
  /// The run continues after `step` (0, or the checkpoint's step on --resume): earlier event files in `dir` lose
  /// their records of steps after it (as metrics.jsonl does; at step 0, everything, and a file left empty is
  /// removed), each rewritten through a temporary file, so no step appears twice; a resumed run also writes a
  /// SessionLog START for a TensorBoard that read the old records before. UserError if a file cannot be written.
  TensorBoardWriter(const std::string& dir, int64_t step);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  /// One event with every value as a float32 simple_value (NaN and infinities as they are), flushed.
  void add_scalars(int64_t step, const std::map<std::string, double>& values);
  /// One event with the images, flushed.
  void add_images(int64_t step, const std::vector<EventImage>& images);

  const std::string& path() const { return path_; }

 private:
  void append(const std::string& event);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace pi0::train
