// A model, its tokenizer and a one-thread engine over it, for the tests that
// run models side by side (agreement, speculative decoding).
#pragma once

#include <cstdint>
#include <filesystem>
#include <utility>

#include "barata/engine.h"
#include "barata/model.h"
#include "barata/tokenizer.h"

namespace barata::test {

struct LoadedModel {
  explicit LoadedModel(const std::filesystem::path& p, int64_t n_ctx = 128)
      : LoadedModel(Model::load(p), n_ctx) {}
  explicit LoadedModel(Model m, int64_t n_ctx = 128)
      : model(std::move(m)),
        tok(Tokenizer::from_gguf(model.file())),
        engine(model, {.n_threads = 1, .n_ctx = n_ctx}) {}
  Model model;
  Tokenizer tok;
  Engine engine;
};

}  // namespace barata::test
