#include "pi0/data/tokenizer.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include <spdlog/spdlog.h>

#include "pi0/common/check.h"
#include "pi0/common/files.h"
#include "pi0/common/log_line.h"
#include "pi0/common/strings.h"

namespace pi0::data {

namespace {

/// Function table of the SentencePiece shim (src/spm_shim/spm_shim.cpp), loaded once per process.
struct SpmApi {
  void* (*load)(const char*, char*, int) = nullptr;
  void (*free)(void*) = nullptr;
  int (*encode)(void*, const char*, int, int*, int) = nullptr;
  int (*decode)(void*, const int*, int, char*, int) = nullptr;
  int (*bos_id)(void*) = nullptr;
  int (*eos_id)(void*) = nullptr;
  int (*piece_size)(void*) = nullptr;
};

const SpmApi& spm_api() {
  static SpmApi api;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* env = std::getenv("PI0_SPM_SHIM");
    const std::string path = env && *env ? env : PI0_SPM_SHIM_PATH;
    // RTLD_DEEPBIND: sentencepiece must bind to its bundled protobuf, not to LibTorch's (see CMakeLists.txt).
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (!h)
      throw UserError(path + ": cannot load the SentencePiece shim (" + std::string(dlerror()) +
                      "); build target pi0_spm or point PI0_SPM_SHIM at libpi0_spm.so");
    auto sym = [&](const char* name) {
      void* p = dlsym(h, name);
      PI0_CHECK(p != nullptr, "SentencePiece shim lacks ", name);
      return p;
    };
    api.load = reinterpret_cast<decltype(api.load)>(sym("pi0_spm_load"));
    api.free = reinterpret_cast<decltype(api.free)>(sym("pi0_spm_free"));
    api.encode = reinterpret_cast<decltype(api.encode)>(sym("pi0_spm_encode"));
    api.decode = reinterpret_cast<decltype(api.decode)>(sym("pi0_spm_decode"));
    api.bos_id = reinterpret_cast<decltype(api.bos_id)>(sym("pi0_spm_bos_id"));
    api.eos_id = reinterpret_cast<decltype(api.eos_id)>(sym("pi0_spm_eos_id"));
    api.piece_size = reinterpret_cast<decltype(api.piece_size)>(sym("pi0_spm_piece_size"));
  });
  return api;
}

}  // namespace

struct Tokenizer::Impl {
  void* handle = nullptr;
  ~Impl() {
    if (handle) spm_api().free(handle);
  }
};

Tokenizer::Tokenizer(const std::string& model_path) : impl_(std::make_unique<Impl>()), path_(model_path) {
  // SentencePiece reads the whole file: a FIFO would block, /dev/zero would never end.
  require_input_file(model_path, "", "a SentencePiece model file");
  char err[512] = {0};
  impl_->handle = spm_api().load(model_path.c_str(), err, sizeof(err));
  if (!impl_->handle) throw UserError(model_path + ": cannot load SentencePiece model (" + std::string(err) + ")");
}

Tokenizer::~Tokenizer() = default;

std::vector<int> Tokenizer::encode(const std::string& text, bool add_bos) const {
  std::vector<int> ids;
  if (add_bos) ids.push_back(bos_id());
  std::vector<int> body(text.size() + 8);
  int n = spm_api().encode(impl_->handle, text.data(), static_cast<int>(text.size()), body.data(),
                           static_cast<int>(body.size()));
  if (n > static_cast<int>(body.size())) {
    body.resize(static_cast<size_t>(n));
    n = spm_api().encode(impl_->handle, text.data(), static_cast<int>(text.size()), body.data(), n);
  }
  PI0_CHECK(n >= 0, "sentencepiece encode failed");
  ids.insert(ids.end(), body.begin(), body.begin() + n);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int>& ids) const {
  std::string out(ids.size() * 16 + 16, '\0');
  int n = spm_api().decode(impl_->handle, ids.data(), static_cast<int>(ids.size()), out.data(), static_cast<int>(out.size()));
  if (n > static_cast<int>(out.size())) {
    out.resize(static_cast<size_t>(n));
    n = spm_api().decode(impl_->handle, ids.data(), static_cast<int>(ids.size()), out.data(), n);
  }
  PI0_CHECK(n >= 0, "sentencepiece decode failed");
  out.resize(static_cast<size_t>(n));
  return out;
}

int Tokenizer::bos_id() const { return spm_api().bos_id(impl_->handle); }
int Tokenizer::eos_id() const { return spm_api().eos_id(impl_->handle); }
int64_t Tokenizer::vocab_size() const { return spm_api().piece_size(impl_->handle); }

std::string Tokenizer::clean(const std::string& prompt) {
  // Python str.strip() without arguments strips all whitespace.
  const char* ws = " \t\n\r\v\f";
  size_t b = prompt.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  size_t e = prompt.find_last_not_of(ws);
  std::string s = prompt.substr(b, e - b + 1);
  for (char& c : s)
    if (c == '_' || c == '\n') c = ' ';
  return s;
}

int64_t Tokenizer::discretize(double s) {
  // Bin edges -1 + k/128, k = 0..255 (exact in binary); digitize counts the edges <= s.
  int64_t count = 0;
  for (int k = 0; k < 256; ++k)
    if (-1.0 + k / 128.0 <= s) ++count;
  return count - 1;
}

std::string Tokenizer::pi05_prompt(const std::string& cleaned, const torch::Tensor& state) {
  torch::Tensor s = state.to(torch::kFloat64).contiguous();
  std::string digits;
  for (int64_t i = 0; i < s.numel(); ++i) {
    if (i) digits += ' ';
    digits += std::to_string(discretize(s.data_ptr<double>()[i]));
  }
  return "Task: " + cleaned + ", State: " + digits + ";\nAction: ";
}

TokenizedPrompt Tokenizer::tokenize(const std::string& prompt, int64_t max_token_len,
                                    const torch::Tensor& state) const {
  PI0_CHECK(max_token_len > 0, "max_token_len must be > 0");
  const std::string cleaned = clean(prompt);
  std::vector<int> ids;
  if (state.defined()) {
    ids = encode(pi05_prompt(cleaned, state), /*add_bos=*/true);
  } else {
    ids = encode(cleaned, /*add_bos=*/true);
    std::vector<int> nl = encode("\n");  // separate "start of answer" token(s)
    ids.insert(ids.end(), nl.begin(), nl.end());
  }
  const int64_t n = static_cast<int64_t>(ids.size());
  if (n > max_token_len) {
    // Per sample in training: said once, then counted (a long prompt repeats in every sample of its episode).
    // pi0.5 with the state in the prompt: the discretized state (one number per state dim, each a token or more)
    // is most of the prompt, so "the prompt is long" would send the user to shorten a task text that is not it.
    std::string where;
    if (state.defined()) {
      const int64_t without_state =
          static_cast<int64_t>(encode("Task: " + cleaned + ", State: ;\nAction: ", /*add_bos=*/true).size());
      where = " of which the discretized state takes " + std::to_string(n - without_state) + " (" +
              std::to_string(state.numel()) + " state dims, pi0.5's state in the prompt) and the task text " +
              std::to_string(without_state) + ";";
    }
    warn_once(state.defined() ? "tokenizer: prompt with the discretized state truncated to max_token_len"
                              : "tokenizer: prompt truncated to max_token_len",
              "tokenizer: prompt is " + std::to_string(n) + " tokens," + where + " truncated to max_token_len " +
                  std::to_string(max_token_len) + " (the end of the prompt is lost; raise model.max_token_len): " +
                  quote_value(cleaned));
  }
  TokenizedPrompt out;
  out.tokens = torch::zeros({max_token_len}, torch::kLong);
  out.mask = torch::zeros({max_token_len}, torch::kBool);
  auto* tok = out.tokens.data_ptr<int64_t>();
  auto* msk = out.mask.data_ptr<bool>();
  for (int64_t i = 0; i < std::min(n, max_token_len); ++i) {
    tok[i] = ids[static_cast<size_t>(i)];
    msk[i] = true;
  }
  return out;
}

}  // namespace pi0::data
