// Where the default model lives: models/ next to the build folder of this
// binary (what scripts/fetch-model.sh fills), else models/ under the cwd.
#pragma once

#include <filesystem>
#include <string>

namespace barata::cli {

inline std::string default_model_path() {
  namespace fs = std::filesystem;
  const char* name = "SmolLM2-135M-Instruct.Q4_1.gguf";
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (fs::path dir = exe.parent_path(); !dir.empty() && dir != dir.parent_path();
         dir = dir.parent_path()) {
      if (fs::exists(dir / "models" / name)) return (dir / "models" / name).string();
    }
  }
  return (fs::path("models") / name).string();
}

}  // namespace barata::cli
