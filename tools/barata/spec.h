// Speculative decoding on the command line: the draft flags `run`,
// `spec-bench`, `batch` and `serve` share, the drafter they describe, and
// its statistics as JSON and text (include/barata/speculative.h).
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "barata/sequence.h"
#include "barata/speculative.h"
#include "session.h"

namespace barata::cli {

// --draft FILE | --draft-self SCHEME | --lookup N, --draft-max, --draft-min,
// --draft-p-min, --draft-auto.
struct SpecArgs {
  std::string draft, draft_self;
  int lookup = 0;
  int draft_max = 8, draft_min = 0;
  float p_min = 0.0f;
  bool draft_auto = false;
  bool any() const { return !draft.empty() || !draft_self.empty() || lookup > 0; }
};
// with_tuning: also --draft-max/--draft-min/--draft-auto (spec-bench sweeps
// them itself).
void add_spec_options(CLI::App* sub, SpecArgs& a, bool with_tuning = true);

// --draft-auto, --draft-p-min, --draft-max or --draft-min without a drafter
// (--draft, --draft-self, --lookup) is a usage error.
void check_spec_args(const SpecArgs& a);

// The drafter the flags name, with the draft model and its engine when it
// has one. The draft model's vocabulary is checked against the target's.
struct DraftSetup {
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Drafter> drafter;
  std::string name;  // for reports: the file, "self q4_0", "lookup 3"
  // --draft-auto's prior for c: the draft's weight bytes over the target's (0: lookup).
  double c_prior = 0;
};
// contexts: sequences the draft engine's pool must hold at once (one per slot).
DraftSetup make_drafter(const SpecArgs& a, Session& s, const SamplerOptions& sampling,
                        int contexts = 1);

// For the scheduler (serve, batch): the setup (its drafter null) and a
// drafter per request: n-gram lookup, or a ModelDrafter over the one draft
// engine, whose pool holds `slots` contexts, at the request's own sampling.
struct DraftFactory {
  DraftSetup setup;
  std::function<std::unique_ptr<Drafter>(const Request&)> drafter_for;
};
DraftFactory make_draft_factory(const SpecArgs& a, Session& s, int slots);

// The statistics as JSON and as one stderr line.
nlohmann::json spec_json(const SpecStats& st, const SpecArgs& a, const std::string& name);
std::string spec_line(const SpecStats& st, const SpecArgs& a, const std::string& name);

}  // namespace barata::cli
