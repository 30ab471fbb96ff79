// The rows of the architecture table (include/barata/arch.h), one per file.
#pragma once

#include "barata/arch.h"

namespace barata::arch {

extern const ArchSpec kLlama;
extern const ArchSpec kQwen2;
extern const ArchSpec kQwen3;
extern const ArchSpec kQwen3Moe;
extern const ArchSpec kGemma3;
extern const ArchSpec kPhi3;

}  // namespace barata::arch
