// libFuzzer target for load-and-decode: the input is a GGUF (the seeds are
// tiny llama / qwen2 models, d_model 32, two layers, written by
// make_fuzz_seeds); it is loaded as a Model and, when that succeeds, an
// Engine with a small context runs a 3-token prefill and one decode step.
// Loading may only fail with barata::Error; a loaded model must run, with
// finite memory and time (libFuzzer's -rss_limit_mb and -timeout catch a
// loader that believes a huge header).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <vector>

#include "barata/engine.h"
#include "barata/error.h"
#include "barata/gguf.h"
#include "barata/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::optional<barata::Model> model;
  try {
    model.emplace(
        barata::Model::from_gguf(barata::GgufFile::from_memory({data, size}, "fuzz.gguf")));
  } catch (const barata::Error&) {
    return 0;
  }
  const int64_t n_vocab = model->config().n_vocab;
  if (n_vocab <= 0) {
    std::fprintf(stderr, "fuzz_model_forward: loaded a model with %lld tokens\n",
                 static_cast<long long>(n_vocab));
    std::abort();
  }
  try {
    barata::Engine engine(*model, {.n_threads = 1, .n_ctx = 8, .cache_tokens = 0});
    const int seq = engine.new_sequence();
    const std::vector<int32_t> prompt = {static_cast<int32_t>(1 % n_vocab),
                                         static_cast<int32_t>(2 % n_vocab),
                                         static_cast<int32_t>((n_vocab - 1) % n_vocab)};
    std::vector<float> logits(static_cast<size_t>(n_vocab));
    engine.prefill(seq, prompt, logits.data());
    const int seqs[] = {seq};
    const int32_t next[] = {0};
    engine.decode(seqs, next, logits.data());
  } catch (const barata::Error& e) {
    // A model that loads must run: an error here is a check the loader missed.
    std::fprintf(stderr, "fuzz_model_forward: a loaded model failed to run: %s\n", e.what());
    std::abort();
  }
  return 0;
}
