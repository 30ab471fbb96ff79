// libFuzzer target for the GGUF parser: any input must either parse or raise
// barata::Error; sanitizers catch every bad read on the way.
#include <cstddef>
#include <cstdint>

#include "barata/error.h"
#include "barata/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const barata::GgufFile f = barata::GgufFile::from_memory({data, size}, "fuzz");
    // Touch what a loader touches: every key, every tensor's first and last byte.
    size_t sink = 0;
    for (const auto& [k, v] : f.metadata()) sink += k.size() + v.type_name().size();
    for (const auto& t : f.tensors())
      if (t.n_bytes > 0) sink += t.data[0] + t.data[t.n_bytes - 1];
    (void)sink;
  } catch (const barata::Error&) {
  }
  return 0;
}
