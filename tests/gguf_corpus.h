// A GGUF byte builder with every field under the test's control, and the
// corpus of malformed files built from it (shared by the tests and the fuzzer
// seed writer).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace barata::test {

class Bytes {
 public:
  template <typename T>
  Bytes& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof v);
    return *this;
  }
  Bytes& str(const std::string& s) { return str(s, s.size()); }
  Bytes& str(const std::string& s, uint64_t claimed_len) {
    put<uint64_t>(claimed_len);
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& pad_to(size_t align) {
    while (b.size() % align) b.push_back(0);
    return *this;
  }
  std::vector<uint8_t> b;
};

struct RawTensor {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t n_dims_override = 0;  // 0: dims.size()
  uint32_t type = 0;             // F32
  uint64_t offset = 0;
};

// A small, valid file: five key-values, two F32 tensors; then each field can
// be spoiled by the test.
struct RawGguf {
  uint32_t magic = 0x46554747;
  uint32_t version = 3;
  int64_t n_tensors_override = -1;
  int64_t n_kv_override = -1;
  std::vector<std::vector<uint8_t>> kvs;  // each: key, type, value
  std::vector<RawTensor> tensors;
  uint64_t data_bytes = 0;

  static RawGguf valid() {
    RawGguf g;
    g.kvs.push_back(kv_string("general.architecture", "llama"));
    g.kvs.push_back(Bytes().str("llama.block_count").put<uint32_t>(4).put<uint32_t>(5).b);
    g.kvs.push_back(Bytes().str("flag").put<uint32_t>(7).put<uint8_t>(1).b);
    g.kvs.push_back(Bytes()
                        .str("tokens")
                        .put<uint32_t>(9)
                        .put<uint32_t>(8)
                        .put<uint64_t>(2)
                        .str("ab")
                        .str("c")
                        .b);
    g.kvs.push_back(Bytes().str("ratio").put<uint32_t>(6).put<float>(0.5f).b);
    g.tensors.push_back({"tok", {8, 2}, 0, 0, 0});
    g.tensors.push_back({"out", {8}, 0, 0, 64});
    g.data_bytes = 96;
    return g;
  }

  static std::vector<uint8_t> kv_string(const std::string& k, const std::string& v) {
    return Bytes().str(k).put<uint32_t>(8).str(v).b;
  }

  std::vector<uint8_t> build() const {
    Bytes o;
    o.put(magic).put(version);
    o.put<uint64_t>(n_tensors_override >= 0 ? uint64_t(n_tensors_override) : tensors.size());
    o.put<uint64_t>(n_kv_override >= 0 ? uint64_t(n_kv_override) : kvs.size());
    for (const auto& kv : kvs) o.b.insert(o.b.end(), kv.begin(), kv.end());
    for (const auto& t : tensors) {
      o.str(t.name);
      o.put<uint32_t>(t.n_dims_override ? t.n_dims_override : uint32_t(t.dims.size()));
      for (uint64_t d : t.dims) o.put<uint64_t>(d);
      o.put<uint32_t>(t.type).put<uint64_t>(t.offset);
    }
    o.pad_to(32);
    for (uint64_t i = 0; i < data_bytes; ++i) o.b.push_back(static_cast<uint8_t>(i));
    return o.b;
  }
};

}  // namespace barata::test
