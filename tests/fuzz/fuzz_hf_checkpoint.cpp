// libFuzzer target for the Hugging Face checkpoint reader (src/convert/):
// config.json, tokenizer.json, tokenizer_config.json, the safetensors header
// and the shard index. The input is split into files of a checkpoint
// directory (fuzz_split.h), the loader runs on it, every tensor is loaded, and
// the converted tokenizer metadata goes through a GGUF and Tokenizer::from_gguf
// as `barata quantize` would. Anything but barata::Error escaping is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "barata/convert.h"
#include "barata/error.h"
#include "barata/gguf.h"
#include "barata/tokenizer.h"
#include "convert/safetensors.h"
#include "fuzz_split.h"

namespace {

namespace fs = std::filesystem;

const fs::path& work_dir() {
  static const fs::path dir = [] {
    std::string tmpl = (fs::temp_directory_path() / "barata-fuzz-hf-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      std::perror("fuzz_hf_checkpoint: mkdtemp");
      std::abort();
    }
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(work_dir(), ec);
    });
    return fs::path(tmpl);
  }();
  return dir;
}

void put(const fs::path& p, std::string_view bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) {
    std::fprintf(stderr, "fuzz_hf_checkpoint: cannot write %s\n", p.c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fs::path& dir = work_dir();
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) fs::remove(e.path(), ec);

  const std::vector<std::string_view> parts = barata::fuzz::split(data, size);
  for (size_t i = 0; i < parts.size() && i < barata::fuzz::kHfFiles.size(); ++i)
    put(dir / barata::fuzz::kHfFiles[i], parts[i]);
  // With an index, the safetensors part is also the shard it names.
  if (parts.size() > 4) put(dir / barata::fuzz::kHfShard, parts[2]);

  if (parts.size() > 2) {
    try {  // the safetensors header on its own
      auto st = barata::SafetensorsFile::from_memory(
          {reinterpret_cast<const uint8_t*>(parts[2].data()), parts[2].size()}, "fuzz");
      for (const auto& t : st->tensors()) (void)barata::safetensors_to_f32(t);
    } catch (const barata::Error&) {
    }
  }

  try {
    const barata::SourceModel m = barata::load_hf_checkpoint(dir);
    for (const auto& t : m.tensors) {
      const std::vector<float> v = t.load();
      if (static_cast<int64_t>(v.size()) != t.n_elements()) {
        std::fprintf(stderr, "fuzz_hf_checkpoint: %s loaded %zu values for %lld elements\n",
                     t.name.c_str(), v.size(), static_cast<long long>(t.n_elements()));
        std::abort();
      }
    }
    barata::GgufWriter w;
    for (const auto& [k, v] : m.metadata) w.set(k, v);
    const std::vector<uint8_t> bytes = w.to_bytes();
    const barata::GgufFile f = barata::GgufFile::from_memory(bytes, "converted.gguf");
    const barata::Tokenizer tok = barata::Tokenizer::from_gguf(f);
    const auto ids = tok.encode("Hello world <|im_start|>", tok.add_bos_default(), true);
    (void)tok.decode(ids);
  } catch (const barata::Error&) {
  }
  return 0;
}
