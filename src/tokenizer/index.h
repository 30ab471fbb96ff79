// Open-addressing hash tables for the tokenizer's two hot lookups: token text
// -> id (every SentencePiece pair, every BPE word start) and (left id, right
// id) -> merge. Flat arrays with linear probing: one or two cache lines per
// lookup where std::unordered_map chases a node per step, which made loading
// a 150k-token vocabulary slow.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace barata::tok {

inline uint64_t mix64(uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline size_t table_size(size_t n) {  // a power of two, at most half full
  size_t cap = 16;
  while (cap < 2 * n) cap *= 2;
  return cap;
}

// Token text -> id over texts owned elsewhere (the vocabulary's token list).
class TextIndex {
 public:
  void reserve(size_t n) {
    slots_.assign(table_size(n), Slot{0, -1});
    mask_ = slots_.size() - 1;
  }
  // Adds `id` (whose text is texts[id]); returns the id already holding that
  // text instead if there is one.
  template <typename Texts>
  int32_t insert(const Texts& texts, int32_t id) {
    const std::string_view s = texts[id];
    const uint64_t h = hash(s);
    for (uint64_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& slot = slots_[i];
      if (slot.id < 0) {
        slot = Slot{static_cast<uint32_t>(h >> 32), id};
        return id;
      }
      if (slot.tag == static_cast<uint32_t>(h >> 32) && texts[slot.id] == s) return slot.id;
    }
  }
  template <typename Texts>
  int32_t find(const Texts& texts, std::string_view s) const {
    if (slots_.empty()) return -1;
    const uint64_t h = hash(s);
    for (uint64_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& slot = slots_[i];
      if (slot.id < 0) return -1;
      if (slot.tag == static_cast<uint32_t>(h >> 32) && texts[slot.id] == s) return slot.id;
    }
  }

 private:
  struct Slot {
    uint32_t tag;  // high half of the hash, to skip most string compares
    int32_t id;    // -1: empty
  };
  static uint64_t hash(std::string_view s) { return mix64(std::hash<std::string_view>{}(s)); }
  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
};

struct Merge {
  int32_t rank;
  int32_t result;  // id of the merged token
};

// (left id, right id) -> merge rank and result.
class MergeTable {
 public:
  void reserve(size_t n) {
    slots_.assign(table_size(n), Slot{kEmpty, {}});
    mask_ = slots_.size() - 1;
  }
  // Keeps the first merge given for a pair (the lowest rank).
  void insert(int32_t left, int32_t right, Merge m) {
    const uint64_t k = key(left, right);
    for (uint64_t i = mix64(k) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == k) return;
      if (slots_[i].key == kEmpty) {
        slots_[i] = Slot{k, m};
        ++size_;
        return;
      }
    }
  }
  const Merge* find(int32_t left, int32_t right) const {
    if (slots_.empty()) return nullptr;
    const uint64_t k = key(left, right);
    for (uint64_t i = mix64(k) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == k) return &slots_[i].merge;
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~0ull;  // ids are below 2^31, so no pair is this
  static uint64_t key(int32_t l, int32_t r) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
  }
  struct Slot {
    uint64_t key;
    Merge merge;
  };
  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace barata::tok
