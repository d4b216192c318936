// Benchmark: loading a checkpoint-sized safetensors file, against a plain sequential read() of the same file.
//
//   bench_safetensors_load [--size-gb 3.2] [--path /tmp/pi0_bench_<pid>.safetensors] [--repeat 3] [--keep]
//
// Generates a file of bf16/f32 tensors shaped like a pi0 checkpoint (a 0.5 GB embedding table, 150-270 MB layer
// stacks, a few MB projections, small norms), then measures each path in a fresh child process (posix_spawn of this
// binary with --load-only), so peak RSS (VmHWM) is that path's alone and not the generator's:
//   read          read() the whole file into one reused 64 MB buffer: the I/O ceiling
//   get+copy      SafetensorsFile::get() views + copy into a freshly allocated tensor per entry, pages kept mapped
//   read_into     SafetensorsFile::read_into() into a freshly allocated tensor per entry
//   pread fresh   pread() each tensor straight into a freshly allocated tensor: what any loader into new memory pays
//   read_into*    the same into tensors allocated and touched before the clock starts: a model whose parameters
//                 already exist, so page-fault cost for new memory is not part of the load
// The page cache is warmed by one untimed read first, so every path reads from memory. Targets: peak RSS
// <= 1.2x file size and load rate >= 0.8x the read rate, for read_into (the path the model loader uses).
//
//   bench_safetensors_load --cold [--size-gb 3.5] [--repeat 3]
// measures against the disk instead (issue 15: save and load at >= 70 % of the disk's sequential speed, both on
// the same file in one run). The file is float32 throughout; before each read its pages are evicted from the page
// cache with posix_fadvise(POSIX_FADV_DONTNEED) (works unprivileged, for this file only; mincore() confirms how
// much stayed resident), and each path runs in a fresh child:
//   raw read      read() into one reused 16 MB buffer               raw O_DIRECT   the same bypassing the cache
//   load f32      read_into_many into float32 tensors that exist    load bf16      the same, converting to bf16
//   raw write     write() of as many bytes + fsync                   save           save_safetensors of the tensors
// Rounds alternate the paths (the disk is shared and its speed drifts); the median of --repeat rounds is shown.
#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "pi0/app/cli.h"
#include "pi0/common/check.h"
#include "pi0/io/safetensors.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  double size_gb = 3.2;
  std::string path;
  int repeat = 3;
  bool keep = false;
  bool cold = false;
  std::string load_only;  // child mode: read | pread_fresh | get_copy | read_into | read_into_prefaulted
};

// Flags through the shared command-line layer (--help lists them); std::nullopt when --help/--version answered.
std::optional<Args> parse_args(int argc, char** argv) {
  Args args;
  args.path = "/tmp/pi0_bench_" + std::to_string(::getpid()) + ".safetensors";
  auto cli = pi0::app::make_parser("bench_safetensors_load",
                                   "Loading a checkpoint-sized safetensors file against a plain sequential read() of "
                                   "it (--cold: against the disk, page cache evicted).");
  cli->add_option("--size-gb", args.size_gb, "file size in GB, > 0");
  cli->add_option("--path", args.path, "the generated file (default /tmp/pi0_bench_<pid>.safetensors)")
      ->check(pi0::app::non_empty());
  cli->add_option("--repeat", args.repeat, "runs per path (best, or with --cold the median)")
      ->check(pi0::app::int_in(1));
  cli->add_flag("--keep", args.keep, "keep the generated file afterwards");
  cli->add_flag("--cold", args.cold, "measure against the disk: float32 file, pages evicted before each read");
  // One measurement in a fresh process (the parent runs this binary with it).
  cli->add_option("--load-only", args.load_only, "internal: run one path in this process")->group("");
  if (pi0::app::parse(*cli, argc, argv)) return std::nullopt;
  if (args.size_gb <= 0) throw pi0::UserError("--size-gb must be > 0 (got " + std::to_string(args.size_gb) + ")");
  return args;
}

/// Writes a checkpoint-like file of about `bytes` bytes. Each tensor is one random row expanded to its shape, so
/// the generator holds a single tensor at a time (save_safetensors materializes them one by one).
void generate(const std::string& path, uint64_t bytes, bool all_f32 = false) {
  struct Template {
    std::vector<int64_t> shape;
    torch::ScalarType dtype;
  };
  const std::vector<Template> cycle = {
      {{18, 2048, 2048}, torch::kBFloat16},  // 151 MB: q/attn_vec-like layer stack
      {{18, 2048}, torch::kFloat32},         // norm scales
      {{2048, 2048}, torch::kBFloat16},      // 8 MB
      {{27, 1152, 4304}, torch::kBFloat16},  // 268 MB: SigLIP MLP stack
      {{1024, 1024}, torch::kFloat32},       // 4 MB projection
      {{18, 1024, 4096}, torch::kBFloat16},  // 151 MB
      {{3072}, torch::kFloat32},             // bias
      {{1024, 3072}, torch::kFloat32},       // 12 MB
  };
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  uint64_t total = 0;
  auto add = [&](std::vector<int64_t> shape, torch::ScalarType dtype) {
    if (all_f32) dtype = torch::kFloat32;
    const torch::Tensor row = torch::randn({shape.back()}).to(dtype);
    char name[32];
    std::snprintf(name, sizeof(name), "t%04zu", tensors.size());
    tensors.emplace_back(name, row.expand(shape));
    total += static_cast<uint64_t>(row.element_size()) * c10::multiply_integers(shape);
  };
  add({257152, 1024}, torch::kBFloat16);  // 527 MB embedding table, the largest tensor of pi0
  for (size_t i = 0;; ++i) {
    const Template& t = cycle[i % cycle.size()];
    const uint64_t size = c10::elementSize(all_f32 ? torch::kFloat32 : t.dtype) * c10::multiply_integers(t.shape);
    if (total + size > bytes) break;
    add(t.shape, t.dtype);
  }
  if (bytes > total + 4) add({static_cast<int64_t>((bytes - total) / 4)}, torch::kFloat32);  // top up
  pi0::io::save_safetensors(path, tensors, {{"generator", "bench_safetensors_load"}});
}

/// Fields of /proc/self/status in kB (VmHWM, VmRSS, RssAnon, RssFile).
std::map<std::string, uint64_t> proc_status_kb() {
  std::map<std::string, uint64_t> out;
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = line.substr(0, colon);
    if (key == "VmHWM" || key == "VmRSS" || key == "RssAnon" || key == "RssFile") {
      out[key] = std::stoull(line.substr(colon + 1));
    }
  }
  return out;
}

/// Child: runs one load path and prints
/// "RESULT <seconds> <bytes> <VmHWM kB> <RssAnon kB> <RssFile kB> <VmRSS before loading kB>".
int run_cold_child(const Args& args);

int run_child(const Args& args) {
  // --cold paths keep torch's default threads, as pi0-train does (the disk is the limit there).
  for (const char* cold : {"load_f32", "load_bf16", "read_direct", "write_raw", "save"}) {
    if (args.load_only == cold) return run_cold_child(args);
  }
  torch::set_num_threads(1);  // like read(): one thread copies, so the comparison is per core
  uint64_t bytes = 0;
  std::vector<torch::Tensor> params;  // kept alive to the end, as a model's parameters would be
  if (args.load_only == "read_into_prefaulted") {
    pi0::io::SafetensorsFile file(args.path);
    for (const auto& name : file.names()) {
      params.push_back(torch::zeros(file.info(name).shape, torch::TensorOptions().dtype(file.info(name).scalar_type)));
    }
  }
  const uint64_t baseline_kb = proc_status_kb()["VmRSS"];
  const auto t0 = Clock::now();
  if (args.load_only == "read") {
    const int fd = ::open(args.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw pi0::UserError(args.path + ": cannot open (" + std::strerror(errno) + ")");
    std::vector<char> buffer(64ull << 20);
    for (;;) {
      const ssize_t n = ::read(fd, buffer.data(), buffer.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw pi0::UserError(args.path + ": read failed (" + std::strerror(errno) + ")");
      if (n == 0) break;
      bytes += static_cast<uint64_t>(n);
    }
    ::close(fd);
  } else if (args.load_only == "pread_fresh") {
    pi0::io::SafetensorsFile file(args.path);  // for the header only; the data is read with pread()
    const int fd = ::open(args.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw pi0::UserError(args.path + ": cannot open (" + std::strerror(errno) + ")");
    for (const auto& name : file.names()) {
      const auto& info = file.info(name);
      torch::Tensor param = torch::empty(info.shape, torch::TensorOptions().dtype(info.scalar_type));
      for (uint64_t done = 0; done < info.nbytes();) {
        const ssize_t n = ::pread(fd, static_cast<char*>(param.data_ptr()) + done, info.nbytes() - done,
                                  static_cast<off_t>(file.data_start() + info.data_begin + done));
        if (n <= 0) throw pi0::UserError(args.path + ": pread failed");
        done += static_cast<uint64_t>(n);
      }
      params.push_back(param);
    }
    ::close(fd);
    bytes = file.file_size();
  } else if (args.load_only == "read_into_prefaulted") {
    pi0::io::SafetensorsFile file(args.path);
    for (size_t i = 0; i < params.size(); ++i) file.read_into(file.names()[i], params[i]);
    bytes = file.file_size();
  } else if (args.load_only == "get_copy" || args.load_only == "read_into") {
    pi0::io::SafetensorsFile file(args.path, pi0::io::AccessPattern::kSequential);
    std::vector<std::string> order = file.names();  // file order: what kSequential read-ahead expects
    std::sort(order.begin(), order.end(), [&](const std::string& a, const std::string& b) {
      return file.info(a).data_begin < file.info(b).data_begin;
    });
    for (const auto& name : order) {
      const auto& info = file.info(name);
      torch::Tensor param = torch::empty(info.shape, torch::TensorOptions().dtype(info.scalar_type));
      if (args.load_only == "read_into") {
        file.read_into(name, param);
      } else {
        param.copy_(file.get(name));
      }
      params.push_back(param);
    }
    bytes = file.file_size();
  } else {
    throw pi0::UserError("--load-only " + args.load_only +
                         ": expected read, pread_fresh, get_copy, read_into or read_into_prefaulted");
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  auto status = proc_status_kb();
  std::printf("RESULT %.6f %llu %llu %llu %llu %llu\n", seconds, static_cast<unsigned long long>(bytes),
              static_cast<unsigned long long>(status["VmHWM"]), static_cast<unsigned long long>(status["RssAnon"]),
              static_cast<unsigned long long>(status["RssFile"]), static_cast<unsigned long long>(baseline_kb));
  return 0;
}

/// Child modes of --cold; same RESULT line as run_child. Setup (allocating and touching the destination
/// tensors, a model that exists) happens before the clock starts.
int run_cold_child(const Args& args) {
  const std::string& mode = args.load_only;
  pi0::io::SafetensorsFile file(args.path);
  const uint64_t bytes = file.file_size();
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  if (mode == "load_f32" || mode == "load_bf16" || mode == "save") {
    const auto dtype = mode == "load_bf16" ? torch::kBFloat16 : torch::kFloat32;
    for (const auto& name : file.names()) {
      tensors.emplace_back(name, torch::full(file.info(name).shape, 0.5, torch::TensorOptions().dtype(dtype)));
    }
  }
  std::vector<char> buffer;
  void* aligned = nullptr;
  constexpr size_t kBlock = 16u << 20;
  if (mode == "write_raw") buffer.assign(kBlock, 'x');
  if (mode == "read_direct") PI0_CHECK(::posix_memalign(&aligned, 4096, kBlock) == 0, "posix_memalign failed");
  const uint64_t baseline_kb = proc_status_kb()["VmRSS"];
  const std::string out_path = args.path + ".out";
  const auto t0 = Clock::now();
  if (mode == "load_f32" || mode == "load_bf16") {
    pi0::io::SafetensorsFile loader(args.path, pi0::io::AccessPattern::kSequential);
    loader.read_into_many(tensors);
  } else if (mode == "read_direct") {
    const int fd = ::open(args.path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0) throw pi0::UserError(args.path + ": cannot open with O_DIRECT (" + std::strerror(errno) + ")");
    for (off_t off = 0;;) {
      const ssize_t n = ::pread(fd, aligned, kBlock, off);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw pi0::UserError(args.path + ": O_DIRECT read failed (" + std::strerror(errno) + ")");
      if (n == 0) break;
      off += n;
    }
    ::close(fd);
  } else if (mode == "write_raw") {
    const int fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw pi0::UserError(out_path + ": cannot create (" + std::strerror(errno) + ")");
    for (uint64_t done = 0; done < bytes;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kBlock, bytes - done));
      const ssize_t w = ::write(fd, buffer.data(), n);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) throw pi0::UserError(out_path + ": write failed (" + std::strerror(errno) + ")");
      done += static_cast<uint64_t>(w);
    }
    if (::fsync(fd) != 0) throw pi0::UserError(out_path + ": fsync failed");
    ::close(fd);
  } else if (mode == "save") {
    pi0::io::save_safetensors(out_path, tensors);
  } else {
    throw pi0::UserError("--load-only " + mode + ": expected load_f32, load_bf16, read_direct, write_raw or save");
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  std::remove(out_path.c_str());
  std::free(aligned);
  auto status = proc_status_kb();
  std::printf("RESULT %.6f %llu %llu %llu %llu %llu\n", seconds, static_cast<unsigned long long>(bytes),
              static_cast<unsigned long long>(status["VmHWM"]), static_cast<unsigned long long>(status["RssAnon"]),
              static_cast<unsigned long long>(status["RssFile"]), static_cast<unsigned long long>(baseline_kb));
  return 0;
}

struct ChildResult {
  double seconds = 0;
  uint64_t bytes = 0, hwm_kb = 0, anon_kb = 0, file_kb = 0, baseline_kb = 0;
};

/// Spawns this binary with --load-only `mode` and parses its RESULT line. posix_spawn (not fork) gives the child
/// a fresh address space, so its VmHWM starts from zero rather than from a copy of this process.
ChildResult spawn_child(const Args& args, const std::string& mode) {
  int pipe_fds[2];
  PI0_CHECK(::pipe(pipe_fds) == 0, "pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
  std::string exe = "/proc/self/exe";
  std::vector<std::string> argv_s = {"bench_safetensors_load", "--load-only", mode, "--path", args.path};
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipe_fds[1]);
  PI0_CHECK(rc == 0, "posix_spawn failed: ", std::strerror(rc));
  std::string output;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipe_fds[0], buf, sizeof(buf))) > 0) output.append(buf, static_cast<size_t>(n));
  ::close(pipe_fds[0]);
  int wstatus = 0;
  ::waitpid(pid, &wstatus, 0);
  PI0_CHECK(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0, "child '", mode, "' failed: ", output);
  ChildResult r;
  const auto pos = output.find("RESULT ");
  PI0_CHECK(pos != std::string::npos, "child '", mode, "' printed no RESULT: ", output);
  unsigned long long bytes, hwm, anon, file, baseline;
  PI0_CHECK(std::sscanf(output.c_str() + pos, "RESULT %lf %llu %llu %llu %llu %llu", &r.seconds, &bytes, &hwm, &anon,
                        &file, &baseline) == 6,
            "unparsable child output: ", output);
  r.bytes = bytes, r.hwm_kb = hwm, r.anon_kb = anon, r.file_kb = file, r.baseline_kb = baseline;
  return r;
}

/// Evicts `path` from the page cache (it must have been fsync'ed: dirty pages stay) and returns the fraction of
/// its pages still resident, from mincore().
double evict_from_page_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  PI0_CHECK(fd >= 0, path, ": cannot open");
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  struct stat st {};
  ::fstat(fd, &st);
  const auto size = static_cast<size_t>(st.st_size);
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  PI0_CHECK(map != MAP_FAILED, path, ": mmap failed");
  std::vector<unsigned char> resident((size + page - 1) / page);
  PI0_CHECK(::mincore(map, size, resident.data()) == 0, "mincore failed");
  ::munmap(map, size);
  ::close(fd);
  size_t in = 0;
  for (unsigned char r : resident) in += r & 1;
  return static_cast<double>(in) / static_cast<double>(resident.size());
}

int run_cold_parent(const Args& args) {
  struct Cleanup {
    const Args& args;
    ~Cleanup() {
      if (!args.keep) std::remove(args.path.c_str());
      std::remove((args.path + ".tmp").c_str());
      std::remove((args.path + ".out").c_str());
    }
  } cleanup{args};
  std::printf("generating %s (%.2f GB of float32 tensors)...\n", args.path.c_str(), args.size_gb);
  generate(args.path, static_cast<uint64_t>(args.size_gb * 1e9), /*all_f32=*/true);
  uint64_t file_size = 0;
  size_t num_tensors = 0;
  {
    pi0::io::SafetensorsFile file(args.path);
    file_size = file.file_size();
    num_tensors = file.size();
  }
  const double gb = static_cast<double>(file_size) / 1e9;
  std::printf("file: %.3f GB, %zu float32 tensors; page cache eviction: posix_fadvise(DONTNEED) on the file\n\n",
              gb, num_tensors);

  struct Path {
    const char* mode;
    const char* label;
    bool reads;  // evict the file first
    std::vector<double> seconds;
    double resident = 0;  // largest resident fraction seen after eviction
  };
  std::vector<Path> paths = {{"read", "raw read (read(), 64 MB buffer)", true, {}, 0},
                             {"read_direct", "raw read (O_DIRECT, 16 MB blocks)", true, {}, 0},
                             {"load_f32", "load float32 -> float32 tensors", true, {}, 0},
                             {"load_bf16", "load float32 -> bf16 tensors", true, {}, 0},
                             {"write_raw", "raw write (write() + fsync)", false, {}, 0},
                             {"save", "save_safetensors (float32)", false, {}, 0}};
  for (int round = 0; round < args.repeat; ++round) {
    for (size_t k = 0; k < paths.size(); ++k) {
      // Alternate the order each round, so a drift in the disk's speed does not favour one path.
      Path& p = paths[round % 2 == 0 ? k : paths.size() - 1 - k];
      if (p.reads) p.resident = std::max(p.resident, evict_from_page_cache(args.path));
      p.seconds.push_back(spawn_child(args, p.mode).seconds);
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  };
  std::printf("%-36s %8s %6s %6s  %s\n", "path (median of rounds)", "seconds", "GB/s", "% raw", "all rounds GB/s");
  // The disk's sequential read speed: the faster of the two raw reads (buffered reads of a cold file can fall well
  // below the disk when page-cache insertion is the bottleneck).
  const double raw_read = gb / std::min(median(paths[0].seconds), median(paths[1].seconds));
  const double raw_write = gb / median(paths[4].seconds);
  for (const Path& p : paths) {
    const double rate = gb / median(p.seconds);
    const bool is_write = std::string(p.mode) == "write_raw" || std::string(p.mode) == "save";
    std::string all;
    for (double s : p.seconds) all += (all.empty() ? "" : " ") + std::to_string(gb / s).substr(0, 4);
    std::printf("%-36s %8.3f %6.2f %5.0f%%  %s\n", p.label, median(p.seconds), rate,
                100.0 * rate / (is_write ? raw_write : raw_read), all.c_str());
  }
  double resident = 0;
  for (const Path& p : paths) resident = std::max(resident, p.resident);
  std::printf("\nafter eviction at most %.1f %% of the file was still in the page cache (mincore)\n", 100 * resident);
  const double f32 = gb / median(paths[2].seconds) / raw_read, bf16 = gb / median(paths[3].seconds) / raw_read;
  const double save = gb / median(paths[5].seconds) / raw_write;
  std::printf("target >= 70 %% of raw: load f32 %.0f %% (%s), load bf16 %.0f %% (%s), save %.0f %% (%s)\n", 100 * f32,
              f32 >= 0.7 ? "met" : "MISSED", 100 * bf16, bf16 >= 0.7 ? "met" : "MISSED", 100 * save,
              save >= 0.7 ? "met" : "MISSED");
  return 0;
}

int run_parent(const Args& args) {
  const auto target = static_cast<uint64_t>(args.size_gb * 1e9);
  std::printf("generating %s (%.2f GB requested)...\n", args.path.c_str(), args.size_gb);
  // Removes the generated file however this function exits, unless --keep.
  struct Cleanup {
    const Args& args;
    ~Cleanup() {
      if (args.keep) {
        std::printf("kept %s\n", args.path.c_str());
      } else {
        std::remove(args.path.c_str());
        std::remove((args.path + ".tmp").c_str());
      }
    }
  } cleanup{args};
  const auto t0 = Clock::now();
  generate(args.path, target);
  const double gen_s = std::chrono::duration<double>(Clock::now() - t0).count();
  uint64_t file_size = 0;
  size_t num_tensors = 0;
  {
    pi0::io::SafetensorsFile file(args.path);
    file_size = file.file_size();
    num_tensors = file.size();
  }
  const double gb = static_cast<double>(file_size) / 1e9;
  std::printf("file: %.3f GB, %zu tensors, written in %.2f s (%.2f GB/s incl. generation and fsync)\n", gb,
              num_tensors, gen_s, gb / gen_s);

  spawn_child(args, "read");  // warm-up, untimed: every path below then reads from the page cache equally
  std::printf("page cache warmed by one untimed sequential read; best of %d runs per path, 1 copy thread each\n\n",
              args.repeat);

  auto best_of = [&](const std::string& mode) {
    ChildResult best;
    for (int i = 0; i < args.repeat; ++i) {
      const ChildResult r = spawn_child(args, mode);
      if (i == 0 || r.seconds < best.seconds) best = r;
    }
    return best;
  };
  const ChildResult read = best_of("read");
  const ChildResult pread_fresh = best_of("pread_fresh");
  const ChildResult get_copy = best_of("get_copy");
  const ChildResult read_into = best_of("read_into");
  const ChildResult prefaulted = best_of("read_into_prefaulted");
  const double read_rate = gb / read.seconds;

  std::printf("%-36s %7s %6s %8s %9s %9s %10s %15s\n", "path", "seconds", "GB/s", "vs read", "peak RSS",
              "RSS/file", "(peak-base)", "end anon/file");
  std::printf("%-36s %7s %6s %8s %9s %9s %10s %15s\n", "", "", "", "", "(VmHWM)", "", "/file", "GB");
  auto row = [&](const char* label, const ChildResult& r) {
    const double rate = gb / r.seconds;
    std::printf("%-36s %7.3f %6.2f %7.2fx %6.2f GB %8.2fx %9.2fx %7.2f / %.2f\n", label, r.seconds, rate,
                rate / read_rate, r.hwm_kb * 1024.0 / 1e9, r.hwm_kb * 1024.0 / file_size,
                (static_cast<double>(r.hwm_kb) - r.baseline_kb) * 1024.0 / file_size, r.anon_kb * 1024.0 / 1e9,
                r.file_kb * 1024.0 / 1e9);
  };
  row("read() into reused 64 MB buffer", read);
  row("pread() into fresh tensors", pread_fresh);
  row("get() + copy_ into fresh tensors", get_copy);
  row("read_into fresh tensors", read_into);
  row("read_into existing tensors*", prefaulted);
  std::printf("* allocated and zeroed before the clock starts (a constructed model); baseline RSS includes them\n");

  std::printf("\ntargets: peak RSS <= 1.20x file, rate >= 0.80x read()\n");
  auto verdict = [&](const char* label, const ChildResult& r, const ChildResult& reference, const char* against) {
    const double rss_ratio = r.hwm_kb * 1024.0 / file_size;
    const double rate_ratio = reference.seconds / r.seconds;
    std::printf("  %-28s peak RSS %.2fx: %-6s rate %.2fx %s: %s\n", label, rss_ratio,
                rss_ratio <= 1.2 ? "met;" : "MISSED;", rate_ratio, against, rate_ratio >= 0.8 ? "met" : "MISSED");
  };
  verdict("read_into existing tensors", prefaulted, read, "read()");
  verdict("read_into fresh tensors", read_into, read, "read()");
  verdict("read_into fresh tensors", read_into, pread_fresh, "pread() into fresh tensors");
  std::printf("NOTE: peak RSS counts touched pages of the file mapping (RssFile) as well as the copies (RssAnon):\n"
              "get()+copy_ keeps both; read_into drops the mapped pages as it copies (they stay in the page cache).\n"
              "Fresh tensors cost one page fault per 4 KiB page whatever fills them; that is allocation, not I/O.\n"
              "base = the child's RSS before loading (libraries, ~0.1-0.2 GB), included in peak RSS.\n");

  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return pi0::app::run_app("bench_safetensors_load", [&] {
    const auto args = parse_args(argc, argv);
    if (!args) return 0;
    if (!args->load_only.empty()) return run_child(*args);
    return args->cold ? run_cold_parent(*args) : run_parent(*args);
  });
}
