// GgufWriter: metadata, tensor infos, aligned data; written through an
// AtomicFile (a temporary beside the destination, renamed into place only
// when complete).
#include <algorithm>
#include <cstring>
#include <string>

#include "barata/atomic_file.h"
#include "barata/error.h"
#include "barata/gguf.h"

namespace barata {
namespace {

constexpr uint32_t kMagic = 0x46554747;

uint64_t align_up(uint64_t x, uint64_t a) {
  return (x + a - 1) / a * a;
}

// Where emitted bytes go: a buffered AtomicFile or a byte vector.
class FdSink {
 public:
  static constexpr bool kCounting = false;
  explicit FdSink(AtomicFile& f) : f_(f) { buf_.reserve(kBuf); }
  void put(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    if (n >= kBuf) {
      flush();
      f_.write(b, n);
      return;
    }
    if (buf_.size() + n > kBuf) flush();
    const size_t at = buf_.size();
    buf_.resize(at + n);
    std::memcpy(buf_.data() + at, b, n);
  }
  void flush() {
    f_.write(buf_.data(), buf_.size());
    buf_.clear();
  }

 private:
  static constexpr size_t kBuf = 1 << 20;
  AtomicFile& f_;
  std::vector<uint8_t> buf_;
};

// Counts the bytes without looking at them (size()).
struct CountSink {
  static constexpr bool kCounting = true;
  uint64_t n = 0;
  void put(const void*, size_t len) { n += len; }
};

class VecSink {
 public:
  static constexpr bool kCounting = false;
  void put(const void* p, size_t n) {
    const size_t at = out.size();
    out.resize(at + n);
    if (n) std::memcpy(out.data() + at, p, n);
  }
  std::vector<uint8_t> out;
};

template <typename Sink, typename T>
void put(Sink& s, T v) {
  s.put(&v, sizeof v);
}

template <typename Sink>
void put_string(Sink& s, const std::string& str) {
  put<Sink, uint64_t>(s, str.size());
  s.put(str.data(), str.size());
}

template <typename Sink>
void put_value(Sink& s, const GgufValue& v) {
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) {
          put_string(s, x);
        } else if constexpr (std::is_same_v<T, GgufArray>) {
          put<Sink, uint32_t>(s, static_cast<uint32_t>(x.elem_type));
          put<Sink, uint64_t>(s, x.items.size());
          for (const auto& item : x.items) {
            if (item.type() != x.elem_type)
              fail("GGUF writer: array of {} holds a {}", gguf_type_name(x.elem_type),
                   item.type_name());
            put_value(s, item);
          }
        } else if constexpr (std::is_same_v<T, bool>) {
          put<Sink, uint8_t>(s, x ? 1 : 0);
        } else {
          put<Sink, T>(s, x);
        }
      },
      v.v);
}

}  // namespace

GgufWriter::GgufWriter(uint32_t alignment) : alignment_(alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0)
    fail("GGUF writer: alignment {} is not a power of two", alignment);
  if (alignment != 32) set("general.alignment", GgufValue(alignment));
}

GgufWriter GgufWriter::from(const GgufFile& src) {
  GgufWriter w(src.alignment());
  for (const auto& [k, v] : src.metadata()) w.set(k, v);
  w.protect(src.name());
  return w;
}

void GgufWriter::set(const std::string& key, GgufValue value) {
  for (auto& kv : kv_) {
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  }
  kv_.emplace_back(key, std::move(value));
}

void GgufWriter::remove(const std::string& key) {
  std::erase_if(kv_, [&](const auto& kv) { return kv.first == key; });
}

void GgufWriter::add_tensor(const std::string& name, DType type, std::vector<int64_t> shape,
                            const void* data) {
  if (shape.empty() || shape.size() > 4)
    fail("GGUF writer: tensor {} has {} dimensions, expected 1 to 4", name, shape.size());
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 1) fail("GGUF writer: tensor {} has dimension {}", name, d);
    n *= d;
  }
  if (shape[0] % dtype_traits(type).block_size != 0)
    fail("GGUF writer: tensor {}: row length {} is not a multiple of the {} block size {}", name,
         shape[0], dtype_name(type), dtype_traits(type).block_size);
  for (const auto& t : tensors_)
    if (t.name == name) fail("GGUF writer: duplicate tensor name {}", name);
  const size_t n_bytes = tensor_bytes(type, shape);
  tensors_.push_back(
      {name, type, std::move(shape), static_cast<const uint8_t*>(data), n_bytes, {}});
}

void GgufWriter::add_tensor(const std::string& name, DType type, std::vector<int64_t> shape,
                            Producer produce) {
  add_tensor(name, type, std::move(shape), nullptr);
  tensors_.back().produce = std::make_shared<Producer>(std::move(produce));
}

void GgufWriter::add_tensor(const std::string& name, DType type, std::vector<int64_t> shape,
                            std::vector<uint8_t> owned) {
  auto buf = std::make_shared<std::vector<uint8_t>>(std::move(owned));
  add_tensor(name, type, std::move(shape), buf->data());
  if (tensors_.back().n_bytes != buf->size()) {
    const size_t want = tensors_.back().n_bytes;
    tensors_.pop_back();
    fail("GGUF writer: tensor {} needs {} bytes, {} given", name, want, buf->size());
  }
  tensors_.back().owned = std::move(buf);
}

template <typename Sink>
void GgufWriter::emit(Sink& s) const {
  put<Sink, uint32_t>(s, kMagic);
  put<Sink, uint32_t>(s, version_);
  put<Sink, uint64_t>(s, tensors_.size());
  put<Sink, uint64_t>(s, kv_.size());
  uint64_t pos = 24;
  VecSink head;  // metadata + infos, to learn where the data section starts
  for (const auto& [k, v] : kv_) {
    put_string(head, k);
    put<VecSink, uint32_t>(head, static_cast<uint32_t>(v.type()));
    put_value(head, v);
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    put_string(head, t.name);
    put<VecSink, uint32_t>(head, static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) put<VecSink, uint64_t>(head, static_cast<uint64_t>(d));
    put<VecSink, uint32_t>(head, static_cast<uint32_t>(t.type));
    put<VecSink, uint64_t>(head, offset);
    offset = align_up(offset + t.n_bytes, alignment_);
  }
  s.put(head.out.data(), head.out.size());
  pos += head.out.size();
  static const std::vector<uint8_t> zeros(1 << 16, 0);
  auto pad = [&](uint64_t to) {
    while (pos < to) {
      const uint64_t n = std::min<uint64_t>(to - pos, zeros.size());
      s.put(zeros.data(), n);
      pos += n;
    }
  };
  pad(align_up(pos, alignment_));
  for (const auto& t : tensors_) {
    if (t.produce && !Sink::kCounting) {
      const std::vector<uint8_t> bytes = (*t.produce)();
      if (bytes.size() != t.n_bytes)
        fail("GGUF writer: tensor {} produced {} bytes, expected {}", t.name, bytes.size(),
             t.n_bytes);
      s.put(bytes.data(), bytes.size());
    } else {
      s.put(t.data, t.n_bytes);
    }
    pos += t.n_bytes;
    pad(align_up(pos, alignment_));
  }
}

uint64_t GgufWriter::size() const {
  CountSink s;
  emit(s);
  return s.n;
}

std::vector<uint8_t> GgufWriter::to_bytes() const {
  VecSink s;
  emit(s);
  return std::move(s.out);
}

void GgufWriter::write(const std::filesystem::path& out) const {
  namespace fs = std::filesystem;
  if (version_ != 2 && version_ != 3) fail("GGUF writer: version {} is not 2 or 3", version_);
  std::error_code ec;
  for (const auto& in : protected_) {
    if (fs::exists(out, ec) && fs::equivalent(out, in, ec))
      fail("{}: refusing to overwrite the input file", out.string());
  }
  AtomicFile file(out);  // unnamed or self-removing temporary, renamed when complete
  FdSink sink(file);
  emit(sink);
  sink.flush();
  file.commit();
}

}  // namespace barata
