// The chat template interpreter on small inline templates. Every expected text here is what
// transformers' renderer (jinja2 3.1.6 with trim_blocks, lstrip_blocks, loop controls) gives
// for the same template and the conversation `user: Hi`, `assistant: Hello`.
#include <gtest/gtest.h>

#include <gmock/gmock.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "engine/chat/chat_template.h"
#include "engine/loaders/template_source.h"

namespace {

using flexh2o::engine::chat::ChatInputs;
using flexh2o::engine::chat::ChatTemplate;
using flexh2o::engine::chat::ChatTemplateError;
using flexh2o::engine::chat::RenderLimits;
using ::testing::AllOf;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

ChatInputs conversation() {
  ChatInputs in;
  in.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}])");
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  in.now = flexh2o::engine::chat::parse_date("2026-11-25");
  return in;
}

std::string render(const std::string& src, const ChatInputs& in = conversation(), RenderLimits limits = {}) {
  return ChatTemplate(src, "t.jinja", limits).render(in);
}

// The error message of rendering (or parsing) `src`; "" when it renders.
std::string error_of(const std::string& src, RenderLimits limits = {}) {
  try {
    render(src, conversation(), limits);
  } catch (const ChatTemplateError& e) {
    return e.what();
  }
  return "";
}

TEST(ChatTemplate, WhitespaceControl) {
  EXPECT_EQ(render("a\n  {% if true %}\n  b\n  {% endif %}\nc\n"), "a\n  b\nc");  // trim + lstrip, last \n dropped
  EXPECT_EQ(render("a {%- if true -%}  b  {%- endif %}\n c"), "ab c");
  EXPECT_EQ(render("x\n  {%+ if true %}y{% endif +%}\nz"), "x\n  y\nz");
  EXPECT_EQ(render("a\n  {# c #}\nb {{- \" v \" -}} c"), "a\nb v c");
  EXPECT_EQ(render("l1\r\nl2\rl3\n\n"), "l1\nl2\nl3\n");
  EXPECT_EQ(render("  {{ \"v\" }}\n  {% set x = 1 %}\n"), "  v\n");
  EXPECT_EQ(render("{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
}

TEST(ChatTemplate, LoopVariables) {
  EXPECT_EQ(render("{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
                   "{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.cycle(\"a\",\"b\") }}"
                   "{{ loop.previtem.role if loop.previtem is defined }}{{ loop.nextitem is defined }};{% endfor %}"),
            "1021TrueFalse2aTrue;2110FalseTrue2buserFalse;");
  EXPECT_EQ(render("{% for x in [1,2,3,4,5] if x is odd %}{{ loop.index }}/{{ loop.length }}:{{ x }} {% else %}none"
                   "{% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %}"),
            "1/3:1 2/3:3 3/3:5 |empty");
  EXPECT_EQ(render("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}"
                   "{{ x }}{% endfor %}"),
            "0134");
  EXPECT_EQ(render("{% for a, b in [(1, 2), (3, 4)] %}{{ a + b }}{% endfor %}{% for k, v in {\"x\": 1}.items() %}{{ k }}"
                   "{{ v }}{% endfor %}"),
            "37x1");
  EXPECT_EQ(render("{% for i in [1, 2] %}{% for j in \"ab\" %}{{ loop.index }}{{ i }}{{ j }} {% endfor %}{{ loop.index }}|"
                   "{% endfor %}"),
            "11a 21b 1|12a 22b 2|");
}

TEST(ChatTemplate, NamespaceAndScopes) {
  // A namespace carries values out of a loop; a plain set inside the loop does not leak.
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% set c = 0 %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
                   "{% set c = c + 1 %}{% endfor %}{{ ns.n }}{{ c }}"),
            "20");
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1,2] %}{{ x }}{% set x = i*10 %}{{x}};{% endfor %}{{ x }}"), "110;120;1");
  EXPECT_EQ(render("{% if true %}{% set y = 2 %}{% endif %}{{ y }}"), "2");
  EXPECT_THAT(error_of("{% set ns = namespace(x=1) %}{% set ns._y = 2 %}"),
              HasSubstr("cannot store underscore-prefixed attributes"));
  EXPECT_THAT(error_of("{% set s = 'x' %}{% set s.a = 1 %}"), HasSubstr("non-namespace"));
}

TEST(ChatTemplate, Macros) {
  EXPECT_EQ(render("{% macro m(a, b=\"B\", c=none) %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1) }}|{{ m(1, 2, 3) }}|"
                   "{{ m(c=3, a=1) }}|{{ m() }}"),
            "1BNone|123|1B3|BNone");
  EXPECT_EQ(render("{% macro v() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ v(1, 2, x=3) }}"), "(1, 2){'x': 3}");
  EXPECT_EQ(render("{% macro w() %}[{{ caller() }}]{% endmacro %}{% call w() %}in{% endcall %}"
                   "{% macro w2(x) %}{{ caller(x, 2) }}{% endmacro %}{% call(a, b) w2(1) %}{{ a + b }}{% endcall %}"),
            "[in]3");
  EXPECT_EQ(render("{% macro fact(n) %}{{ 1 if n <= 1 else n * fact(n - 1) | int }}{% endmacro %}{{ fact(5) }}"), "120");
  EXPECT_EQ(render("{% macro g() %}{{ later }}{% endmacro %}{% set later = \"seen\" %}{{ g() }}"), "seen");
  EXPECT_THAT(error_of("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}"), HasSubstr("takes not more than 1 argument"));
  EXPECT_THAT(error_of("{% macro m(a) %}{% endmacro %}{{ m(b=2) }}"), HasSubstr("no keyword argument 'b'"));
}

TEST(ChatTemplate, Slices) {
  EXPECT_EQ(render("{{ \"héllo wörld\"[1:4] }}|{{ \"héllo\"[::-1] }}|{{ \"héllo\"[-2:] }}|{{ [1,2,3,4,5][::2] }}|"
                   "{{ [1,2,3,4,5][-2::-2] }}|{{ [1,2,3][5:] }}|{{ \"abc\"[10] }}|{{ (1,2,3)[1:] }}|{{ \"héllo\"[1] }}|"
                   "{{ \"héllo\" | length }}"),
            "éll|olléh|lo|[1, 3, 5]|[4, 2]|[]||(2, 3)|é|5");
  EXPECT_THAT(error_of("{{ [1][::0] }}"), HasSubstr("slice step cannot be zero"));
}

TEST(ChatTemplate, Filters) {
  EXPECT_EQ(render("{{ [3,1,2] | sort | join(\",\") }}|{{ [\"b\",\"A\",\"a\"] | sort | list }}|"
                   "{{ [\"b\",\"A\",\"a\"] | sort(case_sensitive=true) | list }}|{{ [{\"n\":\"x\"},{\"n\":\"y\"}] | "
                   "map(attribute=\"n\") | join }}|{{ [\"a\",\"b\"] | map(\"upper\") | list }}|{{ [1,2,2,3] | unique | list }}|"
                   "{{ \"  pad  \" | trim }}|{{ \"xxaxx\" | trim(\"x\") }}|{{ none | default(\"d\") }}|{{ 1.0 | int }}|"
                   "{{ \"12\" | int + 1 }}|{{ 3.14159 | round(2) }}|{{ [1,2,3] | first }}{{ [1,2,3] | last }}{{ [] | first }}|"
                   "{{ {\"a\":1,\"b\":2} | items | list }}|{{ \"a b\" | replace(\" \", \"_\") }}|{{ [1, none] | string }}"),
            "1,2,3|['A', 'a', 'b']|['A', 'a', 'b']|xy|['A', 'B']|[1, 2, 3]|pad|a|None|1|13|3.14|13|[('a', 1), ('b', 2)]|"
            "a_b|[1, None]");
  // transformers' tojson: no HTML escaping, non-ASCII kept, its indent / separators / sort_keys.
  EXPECT_EQ(render("{{ {\"b\": \"<é>\", \"a\": [1, 2.0]} | tojson }}|{{ {\"b\": 1, \"a\": 2} | tojson(indent=2, sort_keys=true) }}"),
            "{\"b\": \"<é>\", \"a\": [1, 2.0]}|{\n  \"a\": 2,\n  \"b\": 1\n}");
  EXPECT_THAT(error_of("{{ x | tojson }}"), HasSubstr("Undefined is not JSON serializable"));
}

// jinja2's map/select/... give generators: always true, no len(), not printable; dict methods
// give views and range() a range, each printed as Python prints it.
TEST(ChatTemplate, GeneratorsViewsAndRanges) {
  EXPECT_EQ(render("{% if []|select %}T{% endif %}{% if {}.items() %}V{% endif %}{% if range(0) %}R{% endif %}"), "T");
  EXPECT_EQ(render("{{ {'a':1}.items() }}{{ {'a':1}.keys() }}{{ {'a':1}.values() }}{{ range(3) }}{{ range(1,5,2) }}"),
            "dict_items([('a', 1)])dict_keys(['a'])dict_values([1])range(0, 3)range(1, 5, 2)");
  EXPECT_EQ(render("{{ ([1,2]|reverse)|list }}{{ ([1,2]|map('string')|reverse) }}"), "[2, 1]['2', '1']");
  EXPECT_EQ(render("{{ ([1,2]|select)[0] }}|{{ range(5)[2] }}|{{ {'a':1}.items()|length }}|{{ (range(3)) is sequence }}"
                   "{{ {}.keys() is sequence }}{{ [1]|select is sequence }}{{ [1]|select is iterable }}"),
            "|2|1|TrueFalseFalseTrue");
  EXPECT_EQ(render("{{ range(3) == [0,1,2] }}{{ {'a':1}.keys() == {'a':1}.keys() }}"), "FalseTrue");
  EXPECT_THAT(error_of("{{ [1]|map('string')|length }}"), HasSubstr("object of type 'generator' has no len()"));
  EXPECT_THAT(error_of("{{ [1]|map('string')|tojson }}"), HasSubstr("Object of type generator is not JSON serializable"));
  EXPECT_THAT(error_of("{{ [1,2]|select|last }}"), HasSubstr("'generator' object is not reversible"));
  EXPECT_THAT(error_of("{{ [1]|select }}"), HasSubstr("cannot print a generator"));
}

TEST(ChatTemplate, UndefinedLikeJinja2) {
  EXPECT_EQ(render("{{ undefined_var }}|{{ undefined_var | length }}|{% for x in undefined_var %}x{% endfor %}|"
                   "{{ undefined_var is defined }}|{{ messages[0].missing is defined }}|"
                   "{{ messages[0][\"missing\"] | default(\"dflt\") }}|{{ messages[5] is defined }}"),
            "|0||False|False|dflt|False");
  // A dict's methods come before its keys for `.name`; `['name']` tries the key first.
  EXPECT_EQ(render("{{ {\"a\": 1}.a }}{{ {\"items\": 5}.items is defined }}{{ {\"items\": 5}[\"items\"] }}"
                   "{{ {}[\"items\"] is defined }}"),
            "1True5True");
  EXPECT_THAT(error_of("\n\n{{ messages[0].nosuch.deeper }}"), HasSubstr("t.jinja:3: 'dict object' has no attribute 'nosuch'"));
  EXPECT_THAT(error_of("{{ undefined_var + 1 }}"), HasSubstr("'undefined_var' is undefined"));
}

// jinja2 3.x: an unknown filter or test inside an `if` (or an if-expression) fails only when it
// runs, so a template may use one (DeepSeek V3.2's `from_json`) on a branch transformers never takes.
TEST(ChatTemplate, UnknownFiltersInConditionsFailWhenTheyRun) {
  EXPECT_EQ(render("{% if false %}{{ x | nosuch }}{% endif %}ok"), "ok");
  EXPECT_EQ(render("{% if false %}{% set x = 1 | nosuch %}{% endif %}ok"), "ok");
  EXPECT_EQ(render("{{ x | nosuch if false else 'b' }}"), "b");
  EXPECT_EQ(error_of("{% if true %}{{ 1 | nosuch }}{% endif %}"), "t.jinja:1: No filter named 'nosuch' found.");
  EXPECT_EQ(error_of("{{ 'a' if x is nosuchtest else 'b' }}"), "t.jinja:1: No test named 'nosuchtest' found.");
  EXPECT_EQ(error_of("{{ [1] | map('nosuch') | list }}"), "t.jinja:1: No filter named 'nosuch'.");
  // A loop, macro or block inside the if is a frame of its own: checked when the template parses.
  EXPECT_EQ(error_of("{% if false %}{% for m in messages %}{{ m | nosuch }}{% endfor %}{% endif %}"),
            "t.jinja:1: No filter named 'nosuch'.");
  EXPECT_EQ(error_of("{% if false %}{% set x %}{{ 1 | nosuch }}{% endset %}{% endif %}"),
            "t.jinja:1: No filter named 'nosuch'.");
  EXPECT_EQ(error_of("{% if false %}{% macro f() %}{{ 1 | nosuch }}{% endmacro %}{% endif %}"),
            "t.jinja:1: No filter named 'nosuch'.");
}

TEST(ChatTemplate, PythonArithmetic) {
  EXPECT_EQ(render("{{ \"a\" * 3 }}{{ [0] * 2 }}{{ 10 // 3 }}{{ 2 ** -1 }}{{ 5 % -3 }}{{ -5.5 // 2 }}{{ 7.5 % 2 }}"),
            "aaa[0, 0]30.5-1-3.01.5");
  EXPECT_THAT(error_of("{{ 1 + \"a\" }}"), HasSubstr("unsupported operand type(s) for +: 'int' and 'str'"));
  EXPECT_THAT(error_of("{{ 1 // 0 }}"), HasSubstr("division or modulo by zero"));
  EXPECT_THAT(error_of("{{ 9223372036854775807 + 1 }}"), HasSubstr("integer overflow"));
}

TEST(ChatTemplate, ErrorsNameTheLine) {
  EXPECT_EQ(error_of("line1\n{{ x | nosuchfilter }}"), "t.jinja:2: No filter named 'nosuchfilter'.");
  EXPECT_EQ(error_of("{{ x is nosuchtest }}"), "t.jinja:1: No test named 'nosuchtest'.");
  EXPECT_EQ(error_of("a\nb\n{{ raise_exception(\"custom \" ~ 42) }}"), "t.jinja:3: custom 42");
  EXPECT_THAT(error_of("{{ messages.append(1) }}"), HasSubstr("access to attribute 'append' of 'list' object is unsafe."));
  EXPECT_THAT(error_of("\n{% include \"x.jinja\" %}"), HasSubstr("t.jinja:2: '{% include %}' is not supported"));
  EXPECT_THAT(error_of("{% break %}"), HasSubstr("outside a for loop"));
  EXPECT_THAT(error_of("{% if true %}\nno end"), HasSubstr("expected {% elif %} or {% else %} or {% endif %}"));
  EXPECT_THAT(error_of("{% frobnicate %}"), HasSubstr("unknown tag 'frobnicate'"));
  EXPECT_THAT(error_of("{{ 1 "), HasSubstr("t.jinja:1: unclosed '{{'"));
  EXPECT_THAT(error_of("{# never closed"), HasSubstr("missing end of comment tag"));
  EXPECT_THAT(error_of("{{ 'x' | groupby('a') }}"), HasSubstr("filter 'groupby' is not implemented"));
  EXPECT_THAT(error_of("{{ 'a'.expandtabs() }}"), HasSubstr("str.expandtabs() is not implemented"));
  EXPECT_THAT(error_of("{% for x in recursive_thing recursive %}{% endfor %}"), HasSubstr("recursive for loops"));
  EXPECT_THAT(error_of("{{ 'x' | map }}"), HasSubstr("map needs a filter name"));
}

// str.format / format_map (string.Formatter through jinja2's sandbox) and printf-style `%` and
// `| format`: every expected text and message is what transformers' renderer gives.
TEST(ChatTemplate, PythonStringFormatting) {
  EXPECT_EQ(render("{{ '<x{}y{}>'.format(1, 'a') }}|{{ '{0}{1}{0}'.format('a', 2) }}|{{ '{n}-{m!r}'.format(n=3, m='q') }}|"
                   "{{ '{{}}{:>5}|{:<4}|{:^7}|{:*^7}'.format('ab', 'c', 'mid', 'x') }}"),
            "<x1ya>|a2a|3-'q'|{}   ab|c   |  mid  |***x***");
  EXPECT_EQ(render("{{ '{:+d} {: d} {:05d} {:,} {:_x} {:#x} {:#o} {:b} {:X} {:c}'.format(42, 42, -42, 1234567, "
                   "1048575, 255, 8, 5, 255, 65) }}"),
            "+42  42 -0042 1,234,567 f_ffff 0xff 0o10 101 FF A");
  EXPECT_EQ(render("{{ '{:.2f} {:.3e} {:g} {:.3} {:%} {:10.3f}| {:,.2f} {} {:.1f}'.format(3.14159, 12345.678, "
                   "0.00001, 1.0, 0.25, -2.5, 1234567.891, 1e16, 2.25) }}"),
            "3.14 1.235e+04 1e-05 1.0 25.000000%     -2.500| 1,234,567.89 1e+16 2.2");
  EXPECT_EQ(render("{{ '{0[role]}: {0[content]} / {1.content}'.format(messages[0], messages[1]) }}|"
                   "{{ '{a}{b}'.format_map({'a': 1, 'b': none}) }}|{{ '{:010,}'.format(1234) }}|{{ '{!a}'.format('é') }}|"
                   "{{ '{:>{w}}'.format('r', w=4) }}"),
            "user: Hi / Hello|1None|00,001,234|'\\xe9'|   r");
  EXPECT_EQ(render("{{ '{} {}'.format(true, none) }}|{{ '{:d}'.format(true) }}|{{ '{:5}'.format(true) }}|"
                   "{{ '{:5}|{:<5}'.format(7, 1.5) }}|{{ '{:.2}'.format('abc') }}|{{ '{0.nope}|'.format(messages[0]) }}"),
            "True None|1|    1|    7|1.5  |ab||");
  EXPECT_EQ(render("{{ '%s-%d-%05.1f-%x-%r-%%-%c' % ('a', 3.9, 2.25, 255, 'q', 65) }}|{{ '%(a)s=%(b)03d' % {'a': 'k', "
                   "'b': 7} }}|{{ '%s' % [1, 2] }}|{{ '%s' % {'a': 1} }}|{{ '%-5s|%5s|%.2s' % ('ab', 'cd', 'xyz') }}|"
                   "{{ '%+d % d %#o %#X %.3d %e %g' % (5, 5, 8, 255, 7, 1234.5, 0.0001) }}"),
            "a-3-002.2-ff-'q'-%-A|k=007|[1, 2]|{'a': 1}|ab   |   cd|xy|+5  5 0o10 0XFF 007 1.234500e+03 0.0001");
  EXPECT_EQ(render("{{ '%s and %s' | format('a', 'b') }}|{{ '%(x)s!' | format(x=1) }}|{{ '%s' % 'solo' }}|"
                   "{{ '%5.1f%%' % 99.44 }}|{{ '%i|%u' % (3, 4) }}|{{ '%*d|%-*d|' % (4, 1, 3, 2) }}"),
            "a and b|1!|solo| 99.4%|3|4|   1|2  |");
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"{{ '{0}{}'.format(1) }}", "cannot switch from manual field specification to automatic field numbering"},
      {"{{ '{}{0}'.format(1) }}", "cannot switch from manual field specification to automatic field numbering"},
      {"{{ '{2}'.format(1) }}", "tuple index out of range"},
      {"{{ '{x}'.format(y=1) }}", "'x'"},
      {"{{ '}'.format(1) }}", "Single '}' encountered in format string"},
      {"{{ '{:d}'.format('a') }}", "Unknown format code 'd' for object of type 'str'"},
      {"{{ '{:5}'.format(none) }}", "unsupported format string passed to NoneType.__format__"},
      {"{{ '{:+s}'.format('a') }}", "Sign not allowed in string format specifier"},
      {"{{ '{:.2d}'.format(1) }}", "Precision not allowed in integer format specifier"},
      {"{{ '%s %s' % ('a',) }}", "not enough arguments for format string"},
      {"{{ '%s' % ('a', 'b') }}", "not all arguments converted during string formatting"},
      {"{{ 'x' % 'a' }}", "not all arguments converted during string formatting"},
      {"{{ '%d' % 'a' }}", "%d format: a real number is required, not str"},
      {"{{ '%x' % 1.5 }}", "%x format: an integer is required, not float"},
      {"{{ '%q' % 1 }}", "unsupported format character 'q' (0x71) at index 1"},
      {"{{ '%(a)s' % (1,) }}", "format requires a mapping"},
      {"{{ '%s' | format(1, x=2) }}", "can't handle positional and keyword arguments at the same time"},
      {"{{ '%' % () }}", "incomplete format"},
      {"{{ '%f' % 'a' }}", "must be real number, not str"},
  };
  for (const auto& [src, message] : refused) EXPECT_EQ(error_of(src), "t.jinja:1: " + message) << src;
}

// jinja2's Markup (`| safe`, `| escape`): a plain str joined to it with + (Functionary v3.1 does
// `"..."|safe + name`), formatted into it or passed to its str methods is HTML-escaped; `~`,
// `| join` and `| replace` give plain str. Expected texts from transformers' renderer.
TEST(ChatTemplate, MarkupEscapesWhatIsAddedToIt) {
  EXPECT_EQ(render("{{ \"it's\"|safe + \" a <b> 'q'\" }}|{{ 'x' + ('<y>'|safe) }}|{{ ('<a>'|e) + '<b>' }}|{{ '<c>'|e|e }}|"
                   "{{ '<d>'|forceescape|forceescape }}|{{ ('a'|safe) ~ '<' }}|{{ ('<%s>'|safe) % '&' }}|"
                   "{{ ('{}'|safe).format('<') }}|{{ ('ab'|safe|upper) + '<' }}|{{ ('a b'|safe).split()[1] + '&' }}|"
                   "{{ ('-'|safe).join(['<', '>']) }}|{{ ('a'|safe).replace('a', '<') }}|{{ (' a '|safe|trim) + '\"' }}|"
                   "{{ ('x'|safe|string) + '>' }}|{{ ('<%s>'|safe)|format('&') }}|{{ ('ab'|safe)[0] + '<' }}|"
                   "{{ ('a'|safe) * 2 + '<' }}|{{ ('<x>'|safe|replace('x', 'y')) + '<' }}|{{ ('a'|safe).startswith('a') }}"),
            "it's a &lt;b&gt; &#39;q&#39;|x<y>|&lt;a&gt;&lt;b&gt;|&lt;c&gt;|&amp;lt;d&amp;gt;|a<|<&amp;>|&lt;|AB&lt;|b&amp;|"
            "&lt;-&gt;|&lt;|a&#34;|x&gt;|<&amp;>|a&lt;|aa&lt;|<y><|True");
}

// select, reject, selectattr, rejectattr and map start with jinja2's `if value:`: a None (an
// absent `tools`, as Functionary v3.1 filters it) gives nothing, its arguments unchecked.
TEST(ChatTemplate, SelectAndMapOfNothingGiveNothing) {
  EXPECT_EQ(render("{{ none | selectattr('type', 'equalto', 'x') | list }}|{{ none | map('nosuch') | list }}|"
                   "{{ 0 | reject | list }}|{{ '' | select('nosuchtest') | list }}"),
            "[]|[]|[]|[]");
}

TEST(ChatTemplate, LimitsStopRunawayTemplates) {
  RenderLimits small;
  small.max_steps = 10000;
  EXPECT_THAT(error_of("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", small),
              HasSubstr("steps (a runaway loop?)"));
  EXPECT_THAT(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"), HasSubstr("nested more than 200 deep"));
  EXPECT_THAT(error_of("{{ 'x' * 1000000000 }}"), HasSubstr("bytes; stopped"));
  EXPECT_THAT(error_of("{{ range(1000000) | length }}"), HasSubstr("Range too big"));
  // Nesting that would overflow the C++ stack is refused.
  EXPECT_THAT(error_of("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}"),
              HasSubstr("more than 500 deep"));
  EXPECT_EQ(error_of(std::string(20000, '-') + "1"), "");  // text, not an expression
  EXPECT_THAT(error_of("{{ " + std::string(20000, '-') + "1 }}"), HasSubstr("more than 500 deep"));
  EXPECT_THAT(error_of("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}"), HasSubstr("contains itself"));
  EXPECT_THAT(error_of("{% set ns = namespace(x=[]) %}{% for i in range(3000) %}{% set ns.x = [ns.x] %}{% endfor %}"
                       "{{ ns.x }}"),
              HasSubstr("nested more than 1000 levels"));
  ChatInputs deep = conversation();
  deep.messages = nlohmann::ordered_json::parse("[{\"content\": " + std::string(5000, '[') + std::string(5000, ']') + "}]");
  EXPECT_THAT([&] { render("x", deep); }, ::testing::ThrowsMessage<ChatTemplateError>(HasSubstr("levels deep")));
}

// A width or a replacement that would make a string past 64 MiB is an error before the string
// is made (center(3e9) allocated 3 GB first), naming the template line.
TEST(ChatTemplate, PaddingAndReplacingPastTheStringBoundAreErrorsBeforeAllocating) {
  const std::string bound = "more than 67108864";
  EXPECT_THAT(error_of("x\n{{ 'a'.center(3000000000) }}"),
              AllOf(HasSubstr("t.jinja:2:"), HasSubstr("would make a string of"), HasSubstr(bound)));
  EXPECT_THAT(error_of("{{ 'a' | center(3000000000) }}"), HasSubstr(bound));
  EXPECT_THAT(error_of("{{ 'a'.rjust(9223372036854775807, 'x') }}"), HasSubstr(bound));
  EXPECT_THAT(error_of("{{ 'a\nb' | indent(3000000000) }}"), HasSubstr(bound));
  EXPECT_THAT(error_of("{{ ('a' * 1000000) | replace('a', 'b' * 100) }}"), HasSubstr(bound));
  EXPECT_THAT(error_of("{{ ('a' * 1000000).replace('', 'b' * 100) }}"), HasSubstr(bound));
  EXPECT_THAT(error_of("{{ '%*s' % (3000000000, 'x') }}"), HasSubstr(bound));
  EXPECT_EQ(render("{{ 'ab'.center(6, '*') }}|{{ 'a' | center(3) }}|{{ 'aXa'.replace('a', 'bc') }}"), "**ab**| a |bcXbc");
}

TEST(ChatTemplate, GlobalsAndInputs) {
  EXPECT_EQ(render("{{ strftime_now(\"%d %b %Y\") }}|{{ strftime_now(\"%Y-%m-%d %A %B\") }}"),
            "25 Nov 2026|2026-11-25 Wednesday November");
  EXPECT_EQ(render("{{ bos_token }}{{ eos_token }}{{ add_generation_prompt }}{{ tools }}{{ documents }}"), "<s></s>TrueNoneNone");
  // transformers' TemplateDict: dict() and dict.fromkeys().
  EXPECT_EQ(render("{{ dict.fromkeys(['a', 'b'], 0) }}|{{ dict.fromkeys('xy') }}|{{ dict.fromkeys([]) }}|{{ dict(a=1) }}"),
            "{'a': 0, 'b': 0}|{'x': None, 'y': None}|{}|{'a': 1}");
  EXPECT_EQ(error_of("{{ dict.fromkeys() }}"), "t.jinja:1: fromkeys expected at least 1 argument, got 0");
  EXPECT_EQ(error_of("{{ dict.fromkeys(1) }}"), "t.jinja:1: 'int' object is not iterable");
  ChatInputs in = conversation();
  in.bos_token.reset();
  in.add_generation_prompt = false;
  in.extra["enable_thinking"] = false;
  EXPECT_EQ(render("{{ bos_token is defined }}{{ add_generation_prompt }}{{ enable_thinking }}", in), "FalseFalseFalse");
  // As transformers: a message's reasoning reads under every name templates use.
  in.messages = nlohmann::ordered_json::parse(R"([{"role": "assistant", "content": "x", "reasoning_content": "r"}])");
  EXPECT_EQ(render("{{ messages[0] | tojson }}", in),
            "{\"thinking\": \"r\", \"role\": \"assistant\", \"content\": \"x\", \"reasoning_content\": \"r\"}");
  EXPECT_THROW(flexh2o::engine::chat::parse_date("2026-02-30"), std::invalid_argument);
  EXPECT_THROW(flexh2o::engine::chat::parse_date("25/11/2026"), std::invalid_argument);
}

// ---- where models keep their templates ----

class TemplateSource : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("flexh2o_chat_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    fs::create_directories((dir_ / name).parent_path());
    std::ofstream(dir_ / name) << text;
  }
  fs::path dir_;
};

TEST_F(TemplateSource, TokenizerConfigString) {
  write("tokenizer_config.json",
        R"({"chat_template": "{{ bos_token }}x", "bos_token": {"content": "<B>", "lstrip": false}, "eos_token": "<E>"})");
  const auto src = flexh2o::engine::chat::load_model_template(dir_.string(), "", false);
  EXPECT_EQ(src.text, "{{ bos_token }}x");
  EXPECT_EQ(src.bos_token, "<B>");
  EXPECT_EQ(src.eos_token, "<E>");
}

TEST_F(TemplateSource, NamedTemplatesAndJinjaFile) {
  write("tokenizer_config.json",
        R"({"chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]})");
  using flexh2o::engine::chat::load_model_template;
  EXPECT_EQ(load_model_template(dir_.string(), "", false).text, "D");
  EXPECT_EQ(load_model_template(dir_.string(), "", true).text, "T");  // tools pick tool_use, as transformers
  EXPECT_EQ(load_model_template(dir_.string(), "tool_use", false).text, "T");
  EXPECT_THAT([&] { load_model_template(dir_.string(), "rag", false); },
              ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("no chat template named 'rag' (it has: default, tool_use)")));
  write("chat_template.jinja", "J");  // transformers' own file wins over the config
  EXPECT_EQ(load_model_template(dir_.string(), "", false).text, "J");
}

TEST_F(TemplateSource, MissingTemplateSaysWhatToDo) {
  write("tokenizer_config.json", R"({"bos_token": "<s>"})");
  EXPECT_THAT([&] { flexh2o::engine::chat::load_model_template(dir_.string(), "", false); },
              ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("has no chat template")));
  EXPECT_THAT([&] { flexh2o::engine::chat::load_model_template((dir_ / "nope").string(), "", false); },
              ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("no such file or directory")));
}

TEST(TemplateSourceGguf, FileWithoutTemplate) {
  const std::string gguf = std::string(FLEXH2O_TEST_DATA_DIR) + "/gguf/tiny-llama.gguf";
  EXPECT_THAT([&] { flexh2o::engine::chat::load_model_template(gguf, "", false); },
              ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("has no tokenizer.chat_template")));
}

// SmolLM2-135M-Instruct's GGUF (scripts/models/make_smollm2.sh; skipped when absent): its template
// is the one in tests/data/chat_templates, its BOS and EOS the tokens its ids name.
TEST(TemplateSourceGguf, SmolLM2) {
  const char* root = std::getenv("FLEXH2O_MODELS");
  const char* home = std::getenv("HOME");
  const fs::path models = root ? fs::path(root) : fs::path(home ? home : ".") / ".cache/flexh2o/models";
  const fs::path gguf = models / "smollm2-135m-instruct.Q4_1.gguf";
  if (!fs::exists(gguf)) GTEST_SKIP() << gguf.string() << " is absent (scripts/models/make_smollm2.sh makes it)";
  const auto src = flexh2o::engine::chat::load_model_template(gguf.string(), "", false);
  std::ifstream in(std::string(FLEXH2O_TEST_DATA_DIR) + "/chat_templates/HuggingFaceTB-SmolLM2-135M-Instruct.jinja");
  const std::string committed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(src.text, committed);
  EXPECT_EQ(src.bos_token, "<|im_start|>");
  EXPECT_EQ(src.eos_token, "<|im_end|>");
}

}  // namespace
