#include "barata/arch.h"

#include <array>

#include "arch/rows.h"

namespace barata {

std::span<const ArchSpec> architectures() {
  // Copied once, at first use: the rows are constants of other translation
  // units (no static initialisation order to rely on).
  static const std::array<ArchSpec, 6> kRows = {arch::kLlama,    arch::kQwen2,  arch::kQwen3,
                                                arch::kQwen3Moe, arch::kGemma3, arch::kPhi3};
  return kRows;
}

const ArchSpec* find_architecture(std::string_view name) {
  for (const ArchSpec& a : architectures())
    if (a.name == name) return &a;
  return nullptr;
}

std::string architecture_names() {
  std::string s;
  for (const ArchSpec& a : architectures()) {
    if (!s.empty()) s += ", ";
    s += a.name;
  }
  return s;
}

}  // namespace barata
