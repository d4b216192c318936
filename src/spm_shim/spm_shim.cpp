// C interface to SentencePiece, built as its own shared library and loaded with dlopen(RTLD_DEEPBIND).
//
// Why: Debian's libsentencepiece bundles protobuf-lite 3.14 and exports those symbols, while LibTorch pulls in the
// system libprotobuf 3.21. Linked normally, sentencepiece's calls bind to the 3.21 runtime and abort with a
// protobuf version-mismatch error. Loaded through this shim with RTLD_DEEPBIND, sentencepiece binds to its own
// bundled copy first. Only plain C types cross this boundary.
#include <cstring>
#include <string>
#include <vector>

#include <sentencepiece_processor.h>

extern "C" {

/// Loads a model; returns a handle or nullptr with the reason copied into err (err_len bytes).
void* pi0_spm_load(const char* path, char* err, int err_len) {
  auto* sp = new sentencepiece::SentencePieceProcessor();
  auto status = sp->Load(path);
  if (!status.ok()) {
    std::strncpy(err, status.ToString().c_str(), static_cast<size_t>(err_len - 1));
    err[err_len - 1] = '\0';
    delete sp;
    return nullptr;
  }
  return sp;
}

void pi0_spm_free(void* h) { delete static_cast<sentencepiece::SentencePieceProcessor*>(h); }

/// Encodes text into ids; returns the number of ids (may exceed cap: call again with a bigger buffer), -1 on error.
int pi0_spm_encode(void* h, const char* text, int text_len, int* ids, int cap) {
  std::vector<int> out;
  if (!static_cast<sentencepiece::SentencePieceProcessor*>(h)->Encode(std::string(text, static_cast<size_t>(text_len)), &out).ok())
    return -1;
  for (size_t i = 0; i < out.size() && static_cast<int>(i) < cap; ++i) ids[i] = out[i];
  return static_cast<int>(out.size());
}

/// Decodes ids into buf; returns the byte length (may exceed cap), -1 on error.
int pi0_spm_decode(void* h, const int* ids, int n, char* buf, int cap) {
  std::string out;
  if (!static_cast<sentencepiece::SentencePieceProcessor*>(h)->Decode(std::vector<int>(ids, ids + n), &out).ok())
    return -1;
  std::memcpy(buf, out.data(), std::min(out.size(), static_cast<size_t>(cap)));
  return static_cast<int>(out.size());
}

int pi0_spm_bos_id(void* h) { return static_cast<sentencepiece::SentencePieceProcessor*>(h)->bos_id(); }
int pi0_spm_eos_id(void* h) { return static_cast<sentencepiece::SentencePieceProcessor*>(h)->eos_id(); }
int pi0_spm_piece_size(void* h) { return static_cast<sentencepiece::SentencePieceProcessor*>(h)->GetPieceSize(); }

}  // extern "C"
