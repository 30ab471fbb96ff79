// barata's Jinja interpreter (src/jinja/) on cases whose expected output
// is Python's jinja2 3.1.4 configured as transformers renders chat templates
// (trim_blocks, lstrip_blocks, loop controls, json.dumps-based tojson); the
// real templates of the models and families are compared against jinja2
// itself in ServerPy.templates. Also: errors name their line, and hostile
// templates are refused, not crashed on.
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "barata/error.h"
#include "barata/jinja.h"

namespace barata {
namespace {

std::string render(const std::string& src, const std::string& ctx = "{}") {
  return jinja::Template(src).render(nlohmann::ordered_json::parse(ctx));
}

TEST(Jinja, RendersAsJinja2) {
  struct Case {
    std::string src, ctx, want;
  };
  const Case cases[] = {
      {R"J({% for m in messages %}{{ loop.index }}/{{ loop.length }} {{ m.role|upper }}: {{ m.content|trim }}{% if not loop.last %}
{% endif %}{% endfor %})J",
       R"J({"messages": [{"role": "user", "content": " hi "}, {"role": "assistant", "content": "yo"}]})J",
       R"J(1/2 USER: hi2/2 ASSISTANT: yo)J"},
      {R"J({%- set ns = namespace(n=0, names=[]) -%}
{%- for x in xs if x > 1 -%}
  {%- set ns.n = ns.n + x -%}
{%- endfor -%}
{{ ns.n }} {{ xs|length }} {{ xs[::-1] }} {{ xs[1:3] }} {{ 'a,b,,c'.split(',') }} {{ 7 // 2 }} {{ 7 / 2 }} {{ -7 % 3 }} {{ 2 ** 10 }})J",
       R"J({"xs": [1, 2, 3, 4]})J",
       R"J(9 4 [4, 3, 2, 1] [2, 3] ['a', 'b', '', 'c'] 3 3.5 2 1024)J"},
      {R"J({% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', punct='?') }} {{ tools|tojson }} {{ tools|tojson(indent=2) }})J",
       R"J({"tools": [{"name": "f", "a": [1, 2.5, null, true, "café\n\"q\""]}]})J",
       R"J(Hi Ann! Hi Bob? [{"name": "f", "a": [1, 2.5, null, true, "café\n\"q\""]}] [
  {
    "name": "f",
    "a": [
      1,
      2.5,
      null,
      true,
      "café\n\"q\""
    ]
  }
])J"},
      {R"J(  {% if x is defined and x is not none %}x={{ x }}{% elif y is string %}y{% else %}none{% endif %}
  {# c #}
{{ d.get('k', 'dflt') }} {{ d.items()|list }} {{ 'k' in d }} {{ 'z' not in d }} {{ (1, 2) }} {{ none }} {{ true }} {{ 1.0 }} {{ 'x' ~ 1 ~ none }})J",
       R"J({"y": "s", "d": {"k": 1}})J",
       R"J(y1 [('k', 1)] True True (1, 2) None True 1.0 x1None)J"},
      {R"J({%- for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for x in [] %}a{% else %}empty{% endfor %}|{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{% if i == 1 %}{% continue %}{% endif %}{{ i }}{% endfor %}|{{ 'Hello World'.lower().replace('world', 'there').title() }}|{{ ' a b '.strip().startswith('a') }}|{{ [3,1,2]|sort|join('-') }}|{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='c')|join(',') }})J",
       R"J({"d": {"b": 2, "a": 1}, "msgs": [{"role": "user", "c": "1"}, {"role": "bot", "c": "2"}, {"role": "user", "c": "3"}]})J",
       R"J(b=2;a=1;|empty|02|Hello There|True|1-2-3|1,3)J"},
      {R"J({% set x %}inner {{ 1 + 1 }}{% endset %}[{{ x }}]{% filter upper %}shout{% endfilter %}{{ "}}" }}{{ 'it\'s' }}{{ 'abc'|reverse }}{{ 'ab\ncd'|indent(2) }}{{ '<a>'|e }}{{ 5 if false }}{{ [1,2][5] }})J",
       R"J({})J",
       R"J([inner 2]SHOUT}}it'scbaab
  cd&lt;a&gt;)J"},
  };
  for (const Case& c : cases) EXPECT_EQ(render(c.src, c.ctx), c.want) << c.src;
}

std::string error_of(const std::string& src, const std::string& ctx = "{}") {
  try {
    render(src, ctx);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Jinja, ErrorsNameTheirLine) {
  EXPECT_EQ(error_of("a\n{{ raise_exception('Only user and assistant roles') }}"),
            "template: raise_exception: Only user and assistant roles");
  EXPECT_EQ(error_of("x\n{% if a %}"), "template: line 2: missing {% endif %}");
  EXPECT_EQ(error_of("{% frobnicate %}"), "template: line 1: unknown tag 'frobnicate'");
  EXPECT_EQ(error_of("{{ x|nosuch }}"), "template: line 1: unknown filter 'nosuch'");
  EXPECT_EQ(error_of("\n\n{{ 'abc }}"), "template: line 3: '{{' is not closed");
  EXPECT_EQ(error_of("{{ 1 + }}"), "template: line 1: an expression ends too early");
  EXPECT_EQ(error_of("{{ 'a' + 1 }}"),
            "template: line 1: unsupported operand types for +: 'a' and 1");
  EXPECT_EQ(error_of("{{ x(1) }}", R"({"x": 3})"), "template: line 1: 'x' is not callable");
  EXPECT_EQ(error_of("{{ 1 // 0 }}"), "template: line 1: division by zero");
  EXPECT_EQ(error_of("{{ a"), "template: line 1: '{{' is not closed");
}

TEST(Jinja, HostileTemplatesAreRefusedNotCrashed) {
  EXPECT_NE(error_of("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}")
                .find("nested too deeply"),
            std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(5000, '-') + "1 }}").find("nested too deeply"),
            std::string::npos);
  std::string ifs;
  for (int i = 0; i < 500; ++i) ifs += "{% if true %}";
  EXPECT_NE(error_of(ifs).find("nest too deeply"), std::string::npos);
  EXPECT_NE(error_of("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}").find("nest too deeply"),
            std::string::npos);
  EXPECT_NE(error_of("{{ range(100000000)|length }}").find("range() too long"), std::string::npos);
  // Time and memory: loops, strings, lists and the output are bounded.
  EXPECT_NE(error_of("{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}"
                     "{% endfor %}")
                .find("loop iterations"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 'x' * 1000000000000 }}").find("over 16 MiB"), std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(s='ab') %}{% for i in range(40) %}"
                     "{% set ns.s = ns.s ~ ns.s %}{% endfor %}")
                .find("over 16 MiB"),
            std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(l=[1]) %}{% for i in range(40) %}"
                     "{% set ns.l = ns.l + ns.l %}{% endfor %}")
                .find("list of over"),
            std::string::npos);
  EXPECT_NE(error_of("{% for i in range(99999) %}{{ 'y' * 1000 }}{% endfor %}").find("over 16 MiB"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 'a,b'.replace('a', 'x' * 1000000).replace('x', 'y' * 20) }}")
                .find("over 16 MiB"),
            std::string::npos);
}

TEST(Jinja, IntegersAsPythonOrAnOverflowError) {
  EXPECT_EQ(
      render("{{ -7 // 2 }} {{ 7 // -2 }} {{ 7 % -2 }} {{ -7 % 3 }} {{ 2 ** 62 }} {{ 2 ** -1 }} "
             "{{ 9223372036854775806 + 1 }} {{ True + True }} {{ 0 ** 100 }} {{ (-1) ** 101 }}"),
      "-4 -4 -1 2 4611686018427387904 0.5 9223372036854775807 2 0 -1");
  for (const char* t : {"{{ 9223372036854775807 + 1 }}", "{{ -9223372036854775807 - 2 }}",
                        "{{ 4294967296 * 4294967296 }}", "{{ 2 ** 64 }}", "{{ 3 ** 1000000 }}",
                        "{{ (-9223372036854775807 - 1) // -1 }}"})
    EXPECT_NE(error_of(t).find("integer overflow"), std::string::npos) << t;
  EXPECT_EQ(render("{{ (-9223372036854775807 - 1) % -1 }}"), "0");
  EXPECT_NE(error_of("{{ (-9223372036854775807 - 1)|abs }}").find("integer overflow"),
            std::string::npos);
  EXPECT_EQ(render("{{ 3.7|int }} {{ (-3.7)|int }} {{ range(-5, 9223372036854775807, "
                   "9223372036854775807)|list }}"),
            "3 -3 [-5, 9223372036854775802]");
  EXPECT_NE(error_of("{{ 1e300|int }}").find("does not fit a 64-bit integer"), std::string::npos);
}

}  // namespace
}  // namespace barata
