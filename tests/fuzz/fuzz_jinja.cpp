// libFuzzer target for the Jinja interpreter (src/jinja/): arbitrary text is a
// chat template (a GGUF's tokenizer.chat_template is untrusted), parsed and
// rendered through ChatFormatter over a conversation with a system prompt,
// tool calls, a tool result and tools, with and without the generation
// prompt. Only barata::Error may escape (a syntax error, raise_exception, or
// one of the interpreter's bounds on time, memory and nesting); a rendering
// that passes the output bound aborts.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "barata/chat_template.h"
#include "barata/error.h"

namespace {

const std::vector<barata::ChatMessage>& conversation() {
  static const std::vector<barata::ChatMessage> msgs = [] {
    std::vector<barata::ChatMessage> m = {{"system", "Be brief."}, {"user", "Weather in Oslo?"}};
    barata::ChatMessage call{"assistant", ""};
    call.tool_calls =
        R"([{"id":"c0","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Oslo\"}"}}])";
    m.push_back(call);
    barata::ChatMessage result{"tool", "{\"c\": 12}"};
    result.tool_call_id = "c0";
    result.name = "weather";
    m.push_back(result);
    m.push_back({"assistant", "12 C."});
    m.push_back({"user", "Thanks <|im_end|>"});
    return m;
  }();
  return msgs;
}

constexpr const char* kTools =
    R"([{"type":"function","function":{"name":"weather","description":"Now.","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}])";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string src(reinterpret_cast<const char*>(data), size);
  try {
    const auto f = barata::ChatFormatter::from_jinja(src, "<s>", "</s>", true);
    for (bool gen : {true, false}) {
      std::vector<barata::TextRange> ranges;
      const std::string out = f.apply(conversation(), gen, &ranges, kTools);
      if (out.size() > (size_t{16} << 20) + (size_t{1} << 20)) std::abort();
      size_t last = 0;
      for (const auto& r : ranges)  // sorted, disjoint, inside the prompt
        if (r.begin < last || r.end < r.begin || r.end > out.size())
          std::abort();
        else
          last = r.end;
    }
  } catch (const barata::Error&) {
  }
  return 0;
}
