// One forward call's rows: any mix of sequences, each row a token at a
// position, some rows wanting logits. Several sequences' prefill and other
// sequences' decode rows can share one call.
//
// The caller fills tokens, positions, seq_ids and want_logits (add()). The
// engine then checks the batch against the KV cache, before any state
// changes, and fills the flattened arrays a device kernel reads: each row's
// cache slot and where its sequence's block table starts.
#pragma once

#include <cstdint>
#include <vector>

namespace barata {

// Per row, what a kernel needs to find its K/V: laid out for direct upload.
struct BatchRowMeta {
  int32_t pos = 0;    // position in its sequence
  int32_t table = 0;  // offset of its sequence's block table in each group's Batch::block_tables
  int32_t slot =
      0;  // physical cache slot in layer group 0: block id * block tokens + pos % block tokens
  int32_t seq = 0;  // sequence id
};
static_assert(sizeof(BatchRowMeta) == 16);

struct Batch {
  std::vector<int32_t> tokens;
  std::vector<int64_t> positions;
  std::vector<int32_t> seq_ids;
  std::vector<uint8_t> want_logits;  // 1: this row's logits are returned

  // Filled by the engine (Engine::plan) once the batch is accepted.
  std::vector<BatchRowMeta> rows;
  // Every sequence's table in the batch, concatenated, once per KV layer
  // group: group g's tables start at g * group_stride (a row's table offset
  // is the same in every group).
  std::vector<int32_t> block_tables;
  int32_t group_stride = 0;
  std::vector<int32_t> logit_rows;  // indices of the rows that want logits, in order
  int64_t max_pos = 0;              // largest position of any row

  // Scratch of plan_batch, kept so that a step allocates nothing once warm:
  // the batch's distinct sequences in ascending order, the position each
  // continues at, and its table offset.
  std::vector<int32_t> plan_seqs;
  std::vector<int64_t> plan_next;
  std::vector<int32_t> plan_table_at;

  // Empties the batch and keeps every vector's capacity.
  void clear() {
    tokens.clear();
    positions.clear();
    seq_ids.clear();
    want_logits.clear();
    rows.clear();
    block_tables.clear();
    group_stride = 0;
    logit_rows.clear();
    max_pos = 0;
  }
  void add(int32_t token, int64_t pos, int32_t seq, bool logits) {
    tokens.push_back(token);
    positions.push_back(pos);
    seq_ids.push_back(seq);
    want_logits.push_back(logits ? 1 : 0);
  }
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
  int64_t n_logits() const {
    int64_t n = 0;
    for (uint8_t w : want_logits) n += w;
    return n;
  }
};

}  // namespace barata
