// A GGUF file as a quantization source: its metadata and its tensors
// dequantized to fp32 one at a time.
#include <algorithm>
#include <memory>
#include <system_error>

#include "barata/convert.h"
#include "barata/error.h"
#include "barata/model_config.h"

namespace barata {

SourceModel load_gguf_source(const std::filesystem::path& path) {
  auto file = std::make_shared<GgufFile>(GgufFile::open(path));
  SourceModel m;
  m.description = "GGUF file " + path.filename().string();
  for (const auto& [key, value] : file->metadata()) {
    // Keys that describe the old tensor types; the writer sets its own.
    if (key == "general.file_type" || key == "general.quantization_version" ||
        key.rfind("barata.quant.", 0) == 0)
      continue;
    m.metadata.emplace_back(key, value);
  }
  for (const GgufTensorInfo& t : file->tensors()) {
    SourceTensor s;
    s.name = t.name;
    s.shape = t.shape;
    s.source_type = dtype_name(t.type);
    const GgufTensorInfo* info = &t;
    s.load = [info]() {
      std::vector<float> v(static_cast<size_t>(info->n_elements));
      dequantize_tensor(info->type, info->data, info->shape[0], info->n_rows(), v.data());
      return v;
    };
    m.tensors.push_back(std::move(s));
  }
  m.inputs.push_back(path);
  m.keep_alive = file;
  // A model of an architecture barata runs must come out loadable: the same
  // checks as a load, before anything is written. (Other architectures are
  // converted as they are, for other engines to run.)
  const std::string arch = file->get_or<std::string>("general.architecture", "");
  const auto& archs = ModelConfig::supported_architectures();
  if (std::find(archs.begin(), archs.end(), arch) != archs.end()) check_source_layout(m);
  return m;
}

SourceModel load_source(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail("{}: no such file or directory", path.string());
  if (std::filesystem::is_directory(path, ec)) return load_hf_checkpoint(path);
  return load_gguf_source(path);
}

}  // namespace barata
