#!/usr/bin/env python3
"""
make_template_fixtures.py — golden data for cinfer's chat-template engine
(src/tokenizer/chat-template.c, tested by tests/test-chat-template.c).

Run on the GPU machine (transformers installed):
    python3 tests/reference/make_template_fixtures.py TOKDIR OUTDIR
where TOKDIR holds qwen3/, llama3/, gemma3/ each with tokenizer.json (or
tokenizer.json.gz) and tokenizer_config.json. It writes OUTDIR/{qwen3,llama3,
gemma3,micro}.json: lists of cases
    {name, template_name, call: {messages, tools, add_generation_prompt, kwargs},
     context: <the exact variables the template sees>, expected | expected_error}
`expected` is transformers' apply_chat_template(..., tokenize=False). `context`
is what cinfer's tmpl_render gets; the script checks that rendering the
template with that context through transformers' own Jinja environment gives
the same text, so the fixture is self-consistent.

micro.json holds small feature templates (loops, filters, tests, whitespace
control, printing, errors) rendered through transformers' Jinja environment.
`--extra-only OUTDIR` writes extra.json, a larger edge-case set, without
transformers (jinja2 3.1.6, configured as transformers does; no device needed)
(trim_blocks, lstrip_blocks, its tojson/raise_exception). Without transformers
(e.g. on a dev machine: `--micro-only`) an equivalent environment is built
from jinja2 directly, mirroring transformers' _compile_jinja_template.
"""
import gzip
import json
import os
import shutil
import sys


def jinja_env():
    """transformers' compiled-template environment, or a faithful copy."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
        return lambda src: _compile_jinja_template(src), "transformers"
    except Exception:
        pass
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from datetime import datetime

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    class Generation(jinja2.ext.Extension):   # transformers' AssistantTracker, untracked
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_gen"), [], [], body).set_lineno(lineno)

        def _gen(self, caller):
            return caller()

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda f: datetime.now().strftime(f)
    return (lambda src: env.from_string(src)), "jinja2-" + jinja2.__version__


SYSTEM = "You are a helpful assistant.  Answer briefly."
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city — température incluse, 天气",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7.5}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web\nwith a query",
        "parameters": {"type": "object", "properties": {
            "q": {"type": "string"}, "safe": {"type": "boolean", "default": True},
            "tags": {"type": "array", "items": {"type": "string"}, "default": None}},
            "required": ["q"]}}},
]
MULTI = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "Hello! How are you?"},
    {"role": "assistant", "content": "I'm fine, thanks.  And you?"},
    {"role": "user", "content": "  Tell me a joke about C.\n\nWith newlines\ttabs — and ünïcødé 😀 中文.  "},
]
NOSYS = MULTI[1:]


def qwen3_cases():
    tc_msgs = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What's the weather in Paris and Tokyo?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}},
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "東京", "days": 2}}}]},
        {"role": "tool", "content": "{\"temp\": 21}"},
        {"role": "tool", "content": "{\"temp\": 18.5}"},
        {"role": "assistant", "content": "Paris is 21°C and Tokyo 18.5°C."},
        {"role": "user", "content": "Thanks. Search for umbrellas."},
        {"role": "assistant", "content": "Let me search.", "tool_calls": [
            {"type": "function", "function": {"name": "search", "arguments": "{\"q\": \"umbrellas\"}"}}]},
        {"role": "tool", "content": "<results>3 shops</results>"},
    ]
    think_msgs = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nSimple arithmetic.\n</think>\n\n4"},
        {"role": "user", "content": "and 3+3?"},
        {"role": "assistant", "content": "<think>\nAgain simple.\n</think>\n\n6"},
    ]
    rc_msgs = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "The user greets me."},
        {"role": "user", "content": "<tool_response>x</tool_response>"},
        {"role": "assistant", "content": "ok", "reasoning_content": None},
    ]
    return [
        ("multi_turn_gen", MULTI, None, True, {}),
        ("multi_turn_nogen", MULTI, None, False, {}),
        ("no_system_gen", NOSYS, None, True, {}),
        ("no_thinking", MULTI, None, True, {"enable_thinking": False}),
        ("thinking_true", MULTI, None, True, {"enable_thinking": True}),
        ("tools_system", MULTI, TOOLS, True, {}),
        ("tools_no_system", NOSYS, TOOLS, True, {}),
        ("tool_calls", tc_msgs, TOOLS, True, {}),
        ("tool_calls_nogen", tc_msgs, TOOLS, False, {"enable_thinking": False}),
        ("think_history", think_msgs, None, False, {}),
        ("reasoning_content", rc_msgs, None, True, {}),
    ]


def llama3_cases():
    return [
        ("multi_turn_gen", MULTI, None, True, {}),
        ("multi_turn_nogen", MULTI, None, False, {}),
        ("no_system", NOSYS, None, True, {}),
        ("tools", MULTI, TOOLS, True, {}),
        ("single_user", [{"role": "user", "content": "\n\n  hi  \n"}], None, True, {}),
    ]


def gemma3_cases():
    parts = [
        {"role": "system", "content": [{"type": "text", "text": "  Be terse. "}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?  "}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
        {"role": "user", "content": "And this?"},
    ]
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    return [
        ("multi_turn_gen", MULTI, None, True, {}),
        ("multi_turn_nogen", MULTI, None, False, {}),
        ("no_system", NOSYS, None, True, {}),
        ("content_parts", parts, None, True, {}),
        ("not_alternating", bad, None, True, {}),
    ]


# Small feature templates: (name, template, context). Rendered with the same
# environment; an exception is recorded as expected_error (its message).
MICRO = [
    ("print_types", "{{ none }}|{{ true }}|{{ false }}|{{ 1 }}|{{ 1.0 }}|{{ 0.1 }}|{{ 1e20 }}|{{ 1.5e-7 }}|{{ -0.0 }}|{{ 3.14159 }}|{{ 10/4 }}|{{ 10//4 }}|{{ 7 % 3 }}|{{ 2**10 }}|{{ -7 // 2 }}|{{ -7 % 3 }}", {}),
    ("print_containers", "{{ [1, 'a', none, true, 2.5] }}|{{ {'a': 1, 'b': [1,2]} }}|{{ (1, 2) }}|{{ (1,) }}|{{ x }}|{{ [\"it's\", 'say \"hi\"', 'both \\' \"', 'nl\\n', '\\u00e9\\t'] }}", {"x": {"k": [1, {"z": None}]}}),
    ("print_undefined", "[{{ nothing }}][{{ d.missing }}][{{ d['missing'] }}]", {"d": {}}),
    ("strings", "{{ 'a' ~ 1 ~ none ~ true }}|{{ 'ab' + 'cd' }}|{{ 'x' * 3 }}|{{ \"dq\" }}|{{ 'adj' 'acent' }}|{{ 'esc\\\\n\\'' }}", {}),
    ("string_methods", "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.strip(' H!') }}|{{ s.upper() }}|{{ s.lower() }}|{{ s.title() }}|{{ s.capitalize() }}|{{ s.replace('l', 'L') }}|{{ s.replace('l', 'L', 1) }}|{{ s.startswith('  He') }}|{{ s.endswith('!  ') }}|{{ s.startswith(('x', '  ')) }}|{{ s.find('o') }}|{{ s.count('l') }}", {"s": "  Hello world!  "}),
    ("split", "{{ 'a,b,,c'.split(',') }}|{{ '  a  b c '.split() }}|{{ 'a<x>b<x>c'.split('<x>')[-1] }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}|{{ 'abc'.split('z') }}|{{ '-'.join(['a','b']) }}", {}),
    ("slicing", "{{ l[::-1] }}|{{ l[1:] }}|{{ l[:2] }}|{{ l[-1] }}|{{ l[1:-1] }}|{{ l[::2] }}|{{ s[::-1] }}|{{ s[1:3] }}|{{ s[-2:] }}|{{ l[10:] }}|{{ s[0] }}", {"l": [1, 2, 3, 4, 5], "s": "héllo"}),
    ("loop_vars", "{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{% if not loop.first %}{{ loop.previtem }}{% endif %}{% if not loop.last %}{{ loop.nextitem }}{% endif %}{{ loop.cycle('a','b') }};{% endfor %}", {"l": ["x", "y", "z"]}),
    ("for_else_filter", "{% for x in l if x > 2 %}{{ x }}{% else %}none{% endfor %}|{% for x in [] %}{{ x }}{% else %}empty{% endfor %}|{% for x in l if x > 1 %}{{ loop.index }}/{{ loop.length }}{{ ',' if not loop.last }}{% endfor %}", {"l": [1, 2, 3, 4]}),
    ("for_dict", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}{% for k in d.keys() %}{{ k }}{% endfor %}{% for v in d.values() %}{{ v }}{% endfor %}|{% for k, v in d|items %}{{ k }}{{ v }}{% endfor %}|{% for a, b in [[1, 2], (3, 4)] %}{{ a + b }}{% endfor %}", {"d": {"z": 1, "a": 2, "m": 3}}),
    ("for_string", "{% for c in 'abc' %}[{{ c }}]{% endfor %}", {}),
    ("nested_loops", "{% for a in l %}{% for b in l %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }}|{% endfor %}", {"l": [1, 2]}),
    ("break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("range", "{{ range(3)|list }}{{ range(1, 4)|list }}{{ range(10, 0, -3)|list }}{{ range(0)|list }}", {}),
    ("if_elif", "{% for x in [1, 2, 3, 0] %}{% if x == 1 %}one{% elif x == 2 %}two{% elif x %}many{% else %}zero{% endif %},{% endfor %}", {}),
    ("truthiness", "{% for v in [0, 1, '', 'a', [], [0], {}, {'a': 1}, none, 0.0, true, false] %}{{ 'T' if v else 'F' }}{% endfor %}|{{ 'T' if nothing else 'F' }}", {}),
    ("cond_expr", "{{ 'a' if x else 'b' }}|{{ 'a' if not x }}|[{{ 'a' if x }}]", {"x": True}),
    ("bool_ops", "{{ 1 and 2 }}|{{ 0 and 2 }}|{{ 0 or 'x' }}|{{ '' or [] }}|{{ not 1 }}|{{ none or 5 }}|{{ 1 < 2 < 3 }}|{{ 3 > 2 > 2 }}|{{ 1 == 1.0 }}|{{ 'a' != 'b' }}|{{ [1, 2] == [1, 2] }}|{{ 'a' < 'b' }}", {}),
    ("in_ops", "{{ 'a' in 'cat' }}|{{ 'z' not in 'cat' }}|{{ 2 in [1, 2] }}|{{ 'k' in d }}|{{ 'v' in d }}|{{ not 'k' in d }}", {"d": {"k": "v"}}),
    ("arith", "{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 7 / 2 }}|{{ 1 + 1.5 }}|{{ -x }}|{{ +x }}|{{ 2 ** 3 ** 2 }}|{{ 10 - 2 - 3 }}|{{ 0.1 + 0.2 }}|{{ 1 / 3 }}|{{ 2.0 * 3 }}|{{ 6 / 3 }}|{{ true + 1 }}", {"x": 5}),
    ("set_scoping", "{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}|{{ x }}{% if true %}{% set x = 9 %}{% endif %}|{{ x }}", {}),
    ("namespace", "{% set ns = namespace(count=0, found=false, name='n') %}{% for i in [1, 2, 3] %}{% set ns.count = ns.count + i %}{% if i == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }}{{ ns.found }}{{ ns.name }}", {}),
    ("set_tuple_block", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set blk %}  in {{ a }} block  {% endset %}[{{ blk }}]", {}),
    ("macro", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Bob') }} {{ greet('Al', punct='?') }} {{ greet(name='Z') }}", {}),
    ("macro_recursive", "{% macro show(v) %}{% if v is mapping %}{ {% for k, x in v.items() %}{{ k }}: {{ show(x) }} {% endfor %}}{% elif v is iterable and v is not string %}[{% for x in v %}{{ show(x) }},{% endfor %}]{% else %}{{ v }}{% endif %}{% endmacro %}{{ show(d) }}", {"d": {"a": [1, {"b": "c"}], "e": None}}),
    ("filters_basic", "{{ ' x '|trim }}|{{ 'aBc'|upper }}|{{ 'aBc'|lower }}|{{ 'hello world'|title }}|{{ 'hello'|capitalize }}|{{ l|length }}|{{ 'abc'|length }}|{{ d|length }}|{{ l|first }}|{{ l|last }}|{{ l|join(', ') }}|{{ l|join }}|{{ 5|string ~ 'x' }}|{{ '42'|int + 1 }}|{{ '3.5'|float }}|{{ 3.9|int }}|{{ 'x'|int }}|{{ l|reverse|list }}|{{ l|sum }}|{{ [3, 1, 2]|sort }}|{{ l|min }}|{{ l|max }}|{{ -3|abs }}|{{ 'a'|replace('a', 'b') }}|{{ l|count }}", {"l": [1, 2, 3], "d": {"a": 1}}),
    ("filter_default", "{{ nothing|default('dflt') }}|{{ ''|default('e') }}|{{ ''|default('e', true) }}|{{ none|default('n') }}|{{ 'v'|d('x') }}|{{ d.x|default(7) }}", {"d": {}}),
    ("filters_attr", "{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|join(',') }}|{{ msgs|rejectattr('role', 'equalto', 'user')|list|length }}|{{ msgs|map(attribute='role')|list }}|{{ msgs|selectattr('tool')|list|length }}|{{ [1, 2, 3]|select('odd')|list }}|{{ [1, 2, 3]|reject('odd')|list }}|{{ ['a', 'B']|map('upper')|list }}|{{ msgs|map(attribute='missing', default='m')|list }}", {"msgs": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "tool": 1}, {"role": "user", "content": "c"}]}),
    ("filter_unique_batch", "{{ [1, 2, 1, 3]|unique|list }}|{{ d|dictsort }}|{{ [1, 2, 3]|batch(2)|list }}|{{ 'a\\nb'|indent(2) }}|{{ 'a b c'|wordcount }}|{{ [[1], [2]]|sum(start=[]) }}", {"d": {"b": 1, "a": 2}}),
    ("tojson", "{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ l|tojson }}|{{ 'é\"\\n\\t<>&\\'\\u0001'|tojson }}|{{ none|tojson }}|{{ true|tojson }}|{{ 1.0|tojson }}|{{ 1e100|tojson }}|{{ d|tojson(sort_keys=true) }}|{{ {}|tojson(indent=2) }}|{{ []|tojson(indent=4) }}|{{ d|tojson(separators=(',', ':')) }}|{{ 'é'|tojson(ensure_ascii=true) }}", {"d": {"z": [1, 2.5, None, True], "a": {"b": "ü😀"}, "e": {}, "f": []}, "l": ["x", 1]}),
    ("tests", "{% for v in [none, 1, 1.5, 'a', [1], {'a': 1}, true] %}{{ v is none }}{{ v is number }}{{ v is integer }}{{ v is float }}{{ v is string }}{{ v is sequence }}{{ v is mapping }}{{ v is iterable }}{{ v is boolean }}{{ v is true }}{{ v is false }}{{ v is defined }};{% endfor %}{{ x is undefined }}{{ x is defined }}{{ 4 is even }}{{ 3 is odd }}{{ 9 is divisibleby 3 }}{{ 'A' is upper }}{{ 'a' is lower }}{{ 1 is eq 1 }}{{ 2 is gt 1 }}{{ 'a' is in 'abc' }}{{ none is not none }}", {}),
    ("dict_methods", "{{ d.get('a') }}|{{ d.get('zz') }}|{{ d.get('zz', 'dflt') }}|{{ d['a'] }}|{{ d.a }}|{{ d.items()|list }}|{{ d.keys()|list }}|{{ d.values()|list }}|{{ 'a' in d.keys() }}", {"d": {"a": 1, "b": [2]}}),
    ("whitespace_control", "a  {{- ' b ' -}}  c\n  {%- if true -%}  d  {%- endif -%}\n  e {# comment #} f {#- c -#} g\n", {}),
    ("trim_lstrip", "line1\n    {% if true %}\n    inner\n    {% endif %}\nline2 {% if true %}x{% endif %}\n  {{ 'v' }}\n  {# c #}\nend\n\n", {}),
    ("lstrip_plus", "a\n    {%+ if true %}x{% endif +%}\nb\n  {%- if true %}\ny{% endif %}", {}),
    ("crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc\r\n", {}),
    ("raw", "{% raw %}{{ not rendered }} {% if %}{% endraw %}|done", {}),
    ("comments_multiline", "a{#\n multi\n line {{ x }}\n#}b", {}),
    ("string_escapes", "{{ 'tab\\there' }}|{{ \"q\\\"q\" }}|{{ '\\x41\\u00e9\\U0001F600' }}|{{ 'back\\\\slash' }}|{{ 'unknown\\d' }}", {}),
    ("filter_block", "{% filter upper %}abc {{ 'd' }}{% endfilter %}", {}),
    ("with_block", "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]", {}),
    ("generation_tag", "{% for m in msgs %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}", {"msgs": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]}),
    ("unicode_case", "{{ 'ÉCOLE straße'|lower }}|{{ 'école'|upper }}|{{ 'ñ'|length }}|{{ '😀x'[1] }}", {}),
    ("attr_vs_item", "{{ d.items is defined }}|{{ d['items'] }}|{{ d.get('items') }}", {"d": {"items": "ITEMS"}}),
    ("list_ops", "{{ [1] + [2, 3] }}|{{ l|length > 1 }}|{{ l[0] if l else 'none' }}|{{ [] is iterable }}", {"l": [5]}),
    ("int_float_json", "{{ i }}|{{ f }}|{{ big }}|{{ i + f }}|{{ neg }}", {"i": 3, "f": 2.0, "big": 12345678901234, "neg": -0.5}),
    ("is_not_chains", "{{ x is not defined }}|{{ not x is defined }}|{{ y is not string }}", {"y": 3}),
    ("format", "{{ '%s and %d'|format('a', 3) }}|{{ '{} {}'.format('x', 1) }}", {}),
    ("raise_exception", "{{ raise_exception('Bad role: ' ~ r) }}", {"r": "robot"}),
    ("syntax_error_unclosed", "{% if true %}never closed", {}),
    ("syntax_error_expr", "{{ 1 + }}", {}),
    ("syntax_error_endfor", "{% for x in y %}{% endif %}", {}),
    ("unknown_filter", "{{ 'a'|nosuchfilter }}", {}),
    ("unknown_test", "{{ 'a' is nosuchtest }}", {}),
    ("undefined_attr_error", "{{ nothing.attr }}", {}),
    ("undefined_add_error", "{{ nothing + 'a' }}", {}),
    ("type_error_add", "{{ 'a' + 1 }}", {}),
    ("index_error", "{{ [1, 2][5] }}", {}),
    ("immutable_append", "{% set l = [1] %}{{ l.append(2) }}", {}),
    ("recursion_macro", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", {}),
]


def extra_cases():
    """Edge cases of whitespace control, expressions, filters, methods and
    statements (and syntax/runtime errors): (name, template, context)."""
    out = []
    # whitespace control edge cases
    ws = [
     "  {% if true %}x{% endif %}  ",
     "a\n  {% if true %}\n  b\n  {% endif %}\n",
     "a\n  {%- if true %}\n  b\n  {%+ endif %}\n",
     "{{ 'x' }}\n{{ 'y' }}\n",
     "{% set x = 1 %}\n\n{{ x }}",
     "a {# c #}\n b",
     "a\n    {# c #}\n b",
     "  {#- c #}  x",
     "x  {{- 'y' }}\n  z",
     "{% for i in [1,2] %}\n  {{ i }}\n{% endfor %}\n",
     "{% for i in [1,2] -%}\n  {{ i }}\n{%- endfor %}",
     "\t  {% if true %}\tx\n{% endif %}",
     "a\r\n  {% if true %}\r\nb{% endif %}",
     "{% raw -%}   x  {%- endraw %}",
     "  {% raw %}\n{{ x }}\n  {% endraw %}\n",
     "a{%- raw %} x {% endraw -%}   b",
     "{%- if true -%}\n\n  x  \n\n{%- endif -%}",
     "x\n{%- set a = 1 -%}\ny",
     "{{- '  a  ' -}}",
     "   {{ 'a' }}   {% if true %}   {% endif %}",
     "\u00a0\u2003{%- if true %}x{% endif %}",
     "x {%+ if true %}y{% endif %}",
     "line\n   {% if true %}   inline {% endif %}\n",
     "{% if true %}\n{% endif %}\n{% if true %}\n{% endif %}\nEND",
     "{% macro m() %}\n  body\n{% endmacro %}\n[{{ m() }}]",
     "{% set s %}\n  block\n{% endset %}\n[{{ s }}]",
     "a #} b %} c }}",
     "{{ '{{' }} {{ '}}' }} {{ '{%' }}",
     "{ {x} } {{ {'a': {'b': 1}} }}",
     "{{ 'a' ~ '}}' }}",
     "{# {{ x }} {% if %} #}ok",
     "{#\n#}\n  x",
    ]
    out += [("ws%d" % i, t, {"x": 1}) for i, t in enumerate(ws)]

    exprs = [
     "{{ 1 + 2 * 3 - 4 / 2 }}", "{{ 2 ** -1 }}", "{{ -2 ** 2 }}", "{{ 7 // -2 }}", "{{ -7 % -3 }}", "{{ 7.5 // 2 }}", "{{ -7.5 % 2 }}",
     "{{ 1e3 }}{{ 1E-3 }}{{ 1.5e+3 }}{{ 100000000000000000.0 }}{{ 1234567890123456.0 }}{{ 0.0001 }}{{ 0.00001 }}{{ 123456789.123456789 }}",
     "{{ 1_000_000 }}{{ 0.1 * 3 }}{{ 2.675 }}{{ 1/7 }}{{ 1e16 }}{{ 9999999999999998.0 }}{{ 5e-324 }}{{ 1.7976931348623157e308 }}",
     "{{ 3 > 2 and 'yes' or 'no' }}", "{{ not none }}{{ not '' }}{{ not [] }}", "{{ 1 in [1.0] }}{{ true in [1] }}{{ '1' in [1] }}",
     "{{ (1, 2) == (1, 2) }}{{ (1, 2) == [1, 2] }}{{ [1, 2] < [1, 3] }}{{ 'abc' < 'abd' }}{{ 'Z' < 'a' }}",
     "{{ {'a': 1} == {'a': 1} }}{{ {'a': 1, 'b': 2} == {'b': 2, 'a': 1} }}{{ none == none }}{{ none == 0 }}{{ false == 0 }}",
     "{{ 'a' 'b' \"c\" }}", "{{ [1, 2, 3][1:] }}{{ [1, 2, 3][:-1] }}{{ [1, 2, 3][::-2] }}{{ 'hello'[::2] }}{{ 'hello'[-3:] }}{{ 'hello'[10:] }}{{ 'héllo wörld'[3:8] }}",
     "{{ x[0] }}{{ x[-1] }}{{ x.0 }}", "{{ d.a.b }}{{ d['a']['b'] }}{{ d.a['b'] }}{{ d['a'].b }}",
     "{{ (1) }}{{ (1,) }}{{ () }}{{ (1, 'a', none) }}", "{{ [] }}{{ {} }}{{ [[]] }}{{ [{}] }}",
     "{{ 'a' if false }}|{{ 'a' if false else 'b' if false else 'c' }}", "{{ 1 if 1 else 2 if 2 else 3 }}",
     "{{ x|length > 2 and x[0] == 1 }}", "{{ -x[0] }}{{ - 3|abs }}{{ (-3)|abs }}",
     "{{ 'abc'|upper|lower|length }}", "{{ [3,1,2]|sort|first }}{{ [3,1,2]|sort(reverse=true)|join(',') }}",
     "{{ 10 / 4 * 2 }}{{ 10 // 4 * 2 }}{{ 2 * 3 ** 2 }}{{ (2 * 3) ** 2 }}", "{{ 1 < 2 == 2 }}{{ 1 == 1 != 2 }}",
     "{{ 'x' ~ 1 + 2 }}", "{{ 'x' ~ [1] }}{{ 'x' ~ {'a': 'b'} }}{{ 'x' ~ 1.0 }}",
     "{{ true and none }}|{{ false or none }}|{{ 0 or false }}", "{{ 'a' * 3 }}{{ 3 * 'a' }}{{ [1] * 2 }}{{ 'a' * 0 }}{{ 'a' * -1 }}",
     "{{ 9223372036854775807 }}", "{{ 2 ** 62 }}", "{{ 5 / 0 }}", "{{ 5 // 0 }}", "{{ 5 % 0 }}", "{{ 1.0 / 0 }}",
     "{{ [1,2] + (3,) }}", "{{ 'a' - 'b' }}", "{{ none + 1 }}", "{{ [1] < 'a' }}", "{{ {} < {} }}",
     "{{ x[10] }}|{{ x['k'] }}|{{ 'abc'[5] }}|{{ none.x }}|{{ none['x'] }}|{{ 5.x }}",
     "{{ d.get('a').b }}{{ d.get('zz', {}).b }}", "{{ d.items()|list|length }}{{ d.keys()|first }}",
     "{{ x|sum }}{{ x|sum(start=10) }}{{ [0.5, 1]|sum }}", "{{ [1.5, 2]|max }}{{ ['b', 'A', 'c']|max }}{{ ['b', 'A', 'c']|min }}{{ ['b', 'A', 'c']|max(case_sensitive=true) }}{{ []|max }}",
     "{{ x is sequence }}{{ d is mapping }}{{ 'a' is sequence }}{{ 1 is sequence }}{{ none is iterable }}{{ x is iterable }}",
     "{{ 1 is number }}{{ 1.5 is number }}{{ '1' is number }}{{ true is number }}{{ true is integer }}{{ 1 is boolean }}",
     "{{ x is defined }}{{ x.foo is defined }}{{ d.a is defined }}{{ d.zz is undefined }}{{ d['a'] is not none }}",
     "{{ 'abc' is lower }}{{ 'ABC' is upper }}{{ 'aBc' is lower }}{{ '123' is lower }}",
     "{{ 10 is divisibleby(3) }}{{ 9 is divisibleby(3) }}{{ 3 is odd }}{{ 2 is even }}{{ 2 is eq(2) }}{{ 2 is ne(3) }}{{ 2 is lt(3) }}{{ 2 is ge 2 }}{{ 1 is in([1]) }}",
     "{{ x is sameas x }}{{ none is sameas none }}{{ true is sameas true }}{{ 1 is sameas 1 }}",
     "{{ range is callable }}{{ x is callable }}{{ 'upper' is filter }}{{ 'odd' is test }}{{ 'nope' is filter }}",
    ]
    out += [("expr%d" % i, t, {"x": [1, 2, 3], "d": {"a": {"b": "B"}}}) for i, t in enumerate(exprs)]

    filters = [
     "{{ '  a b  '|trim }}|{{ 'xxaxx'|trim('x') }}|{{ 5|trim }}|{{ none|trim }}",
     "{{ s|title }}|{{ s|capitalize }}|{{ s|upper }}|{{ s|lower }}|{{ s|length }}|{{ s|wordcount }}|{{ s|reverse }}",
     "{{ 'hello-world foo(bar)[baz]<q>'|title }}|{{ \"they're bill's\"|title }}|{{ \"they're bill's\".title() }}|{{ 'ABC def'.capitalize() }}",
     "{{ 'a,b'|replace(',', ';') }}{{ 'aaa'|replace('a', 'b', 2) }}{{ 'abc'|replace('', '-') }}{{ 5|replace('5', 'five') }}",
     "{{ x|join('-') }}{{ x|join }}{{ d|join(',') }}{{ 'abc'|join('.') }}{{ msgs|join(',', attribute='role') }}",
     "{{ x|first }}{{ x|last }}{{ 'abc'|first }}{{ 'abc'|last }}{{ d|first }}{{ []|first }}",
     "{{ x|list }}{{ 'ab'|list }}{{ d|list }}{{ d|items|list }}{{ nothing|list }}{{ nothing|items|list }}",
     "{{ '3'|int }}{{ ' -3 '|int }}{{ '3.9'|int }}{{ 'x'|int(7) }}{{ none|int }}{{ true|int }}{{ '1e3'|int }}{{ '0x10'|int }}{{ '1_000'|int }}{{ ''|int }}",
     "{{ '3'|float }}{{ '3.25'|float }}{{ 'x'|float }}{{ 'x'|float(1.5) }}{{ 4|float }}{{ ' 2.5 '|float }}{{ 'inf'|float }}{{ 'nan'|float }}",
     "{{ 3.14159|round(2) }}{{ 3.5|round }}{{ 4.5|round }}{{ 2.5|round(0, 'floor') }}{{ 2.1|round(0, 'ceil') }}{{ 7|round }}{{ 1.005|round(2) }}{{ -2.5|round }}",
     "{{ x|map('string')|join('|') }}{{ msgs|map(attribute='role')|join }}{{ msgs|map(attribute='x.y', default='-')|join }}",
     "{{ msgs|selectattr('role', 'equalto', 'user')|list|length }}{{ msgs|selectattr('role', '==', 'user')|list|length }}{{ msgs|rejectattr('content')|list|length }}{{ msgs|selectattr('content', 'defined')|map(attribute='content')|join }}",
     "{{ x|select('odd')|list }}{{ x|select('gt', 1)|list }}{{ x|select('in', [1, 3])|list }}{{ [0, 1, '', 'a', none]|select|list }}{{ [0, 1, '', 'a', none]|reject|list }}",
     "{{ ['b', 'a', 'C']|sort }}{{ ['b', 'a', 'C']|sort(case_sensitive=true) }}{{ msgs|sort(attribute='role')|map(attribute='content')|join }}{{ [3, 1, 2]|sort(true) }}",
     "{{ ['a', 'A', 'b', 'a']|unique|list }}{{ ['a', 'A', 'b']|unique(case_sensitive=true)|list }}",
     "{{ {'b': 1, 'A': 2, 'c': 0}|dictsort }}{{ {'b': 1, 'A': 2, 'c': 0}|dictsort(by='value') }}{{ {'b': 1, 'a': 2}|dictsort(reverse=true) }}",
     "{{ x|batch(2)|list }}{{ x|batch(2, 'x')|list }}", "{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb\\n\\nc'|indent(2, true) }}|{{ 'a\\nb\\n\\nc'|indent(2, blank=true) }}|{{ 'a\\nb'|indent('> ') }}",
     "{{ 'abc'|center(9) }}|{{ 'abcd'|center(9) }}|{{ 'abc'|center(2) }}", "{{ '<a href=\"x\">&\\'</a>'|e }}{{ '<b>'|safe }}{{ '<b>'|escape }}",
     "{{ d|attr('a') }}{{ 'abc'|attr('upper') is defined }}", "{{ '%s-%d'|format('a', 3) }}{{ '%5.2f|%-4s|%04d|%x|%%'|format(3.14159, 'ab', 7, 255) }}{{ '%r'|format('a') }}",
     "{{ x|tojson }}{{ x|tojson(indent=1) }}{{ 'a\\u2028b'|tojson }}{{ '\\x7f\\x00'|tojson }}{{ 1.5|tojson }}{{ -0.0|tojson }}{{ (1, 2)|tojson }}",
     "{{ d|tojson(indent='\\t') }}", "{{ msgs|tojson(separators=(',', ':')) }}", "{{ {'b': 1, 'a': {'d': 1, 'c': 2}}|tojson(sort_keys=true, indent=2) }}",
     "{{ {1: 'a', 2.5: 'b', true: 'c', none: 'd'}|tojson }}", "{{ nothing|tojson }}", "{{ x|tojson(2) }}", "{{ 'é😀'|tojson(true) }}",
     "{{ x|string }}{{ d|string }}{{ none|string }}{{ nothing|string }}|", "{{ x|count }}{{ 'abc'|count }}{{ d|length }}{{ nothing|length }}{{ 5|length }}",
     "{{ x|abs }}", "{{ -5|abs }}{{ -5.5|abs }}{{ true|abs }}", "{{ x|reverse|list }}{{ 'héllo'|reverse }}{{ d|reverse|list }}",
     "{{ x|default('d') }}{{ nothing|default('d') }}{{ none|default('d') }}{{ none|default('d', true) }}{{ 0|default('d', boolean=true) }}{{ nothing|d }}|",
    ]
    ctx = {"x": [1, 2, 3], "d": {"a": 1, "b": 2}, "s": "hello wORLD  foo", "msgs": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}, {"role": "user"}]}
    out += [("filter%d" % i, t, ctx) for i, t in enumerate(filters)]

    methods = [
     "{{ s.split() }}{{ s.split(' ') }}{{ s.split('o', 1) }}{{ s.rsplit(None, 1) }}{{ s.rsplit('o', 1) }}{{ '  '.split() }}{{ ''.split(',') }}{{ 'a  b'.split(' ') }}",
     "{{ '  a b c  '.split(None, 1) }}{{ '  a b c  '.rsplit(None, 1) }}{{ 'a,b,c'.rsplit(',') }}{{ 'a,b,c'.split(',', 0) }}{{ 'a\\tb\\nc'.split() }}",
     "{{ s.strip() }}|{{ s.strip('h') }}|{{ s.lstrip('leh') }}|{{ s.rstrip('o ') }}|{{ '\\n\\nx\\n'.strip('\\n') }}|{{ 'xyx'.strip('x') }}",
     "{{ s.startswith('hel') }}{{ s.startswith(('x', 'h')) }}{{ s.endswith('foo') }}{{ s.endswith('') }}{{ ''.startswith('') }}",
     "{{ s.find('o') }}{{ s.find('zz') }}{{ s.rfind('o') }}{{ s.count('o') }}{{ 'héllo'.find('l') }}{{ s.index('w') }}",
     "{{ s.replace('o', '0') }}{{ s.replace('o', '0', 1) }}{{ s.upper() }}{{ s.lower() }}{{ s.title() }}{{ s.capitalize() }}{{ s.swapcase() }}",
     "{{ ', '.join(['a', 'b']) }}{{ ''.join('abc') }}{{ '-'.join(d) }}", "{{ ','.join([1, 2]) }}",
     "{{ '{} and {}'.format('a', 'b') }}{{ '{1}{0}'.format('a', 'b') }}{{ '{x}!'.format(x=5) }}{{ '{{}}{}'.format(1) }}",
     "{{ '123'.isdigit() }}{{ '12a'.isdigit() }}{{ 'abc'.isalpha() }}{{ 'ab1'.isalnum() }}{{ '  '.isspace() }}{{ ''.isspace() }}{{ 'AB'.isupper() }}{{ 'ab'.islower() }}{{ 'A1'.isupper() }}",
     "{{ 'a\\nb\\r\\nc'.splitlines() }}{{ ''.splitlines() }}{{ 'a\\n'.splitlines() }}",
     "{{ d.get('a') }}{{ d.get('zz') }}{{ d.get('zz', 0) }}{{ d.keys()|list }}{{ d.values()|list }}{{ d.items()|list }}",
     "{{ x.count(1) }}{{ x.index(2) }}", "{{ s.nonexistent }}|{{ s.nonexistent is defined }}", "{{ s.nonexistent() }}",
     "{{ 'ß'.upper() }}{{ 'İ'.lower()|length }}{{ 'ǆ'.title() }}{{ 'ﬁ'.upper() }}",
    ]
    out += [("method%d" % i, t, ctx) for i, t in enumerate(methods)]

    stmts = [
     "{% for a, b in [(1, 2), (3, 4)] %}{{ a }}{{ b }}{% endfor %}",
     "{% for a, b in [(1, 2, 3)] %}{{ a }}{% endfor %}",
     "{% for k, v in d|dictsort %}{{ k }}{{ v }}{% endfor %}",
     "{% for x in x if x is odd %}{{ loop.index }}:{{ x }}{{ loop.last }}{% endfor %}",
     "{% for i in x %}{% for j in x %}{% if j == 2 %}{% break %}{% endif %}{{ i }}{{ j }}{% endfor %}{% endfor %}",
     "{% for i in x %}{% if i == 2 %}{% continue %}{% endif %}{{ loop.index }}{% else %}E{% endfor %}",
     "{% for i in [] %}{% else %}{% for j in [1] %}{{ j }}{% endfor %}{% endfor %}",
     "{% set x = 5 %}{{ x }}{% for i in [1] %}{% set x = 6 %}{{ x }}{% endfor %}{{ x }}",
     "{% set ns = namespace(a=1) %}{% set ns.b = 2 %}{{ ns.a }}{{ ns.b }}{{ ns.c is defined }}",
     "{% set ns = namespace(d) %}{{ ns.a }}", "{% set ns = namespace() %}{% for i in x %}{% set ns.last = i %}{% endfor %}{{ ns.last }}",
     "{% set d2 = dict(a=1, b=2) %}{{ d2 }}{{ dict(d, c=3) }}",
     "{% set a = 1 %}{% set b = a + 1 %}{% set a = b * 10 %}{{ a }}{{ b }}",
     "{% set t = (1, 2) %}{% set a, b = t %}{{ a + b }}", "{% set a, b = [1, 2, 3] %}",
     "{% set x %}{{ 'a' }}b{% endset %}{{ x }}{{ x|length }}", "{% set x | upper %}abc{% endset %}{{ x }}", "{% set x | trim | upper %}  abc  {% endset %}[{{ x }}]",
     "{% macro m(a, b=2, c='x') %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1) }}{{ m(1, 3) }}{{ m(1, c='y') }}{{ m() }}",
     "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(b=1) }}",
     "{% macro outer() %}{% macro inner() %}in{% endmacro %}[{{ inner() }}]{% endmacro %}{{ outer() }}",
     "{% macro m() %}{{ x }}{% endmacro %}{% for x in [7] %}{{ m() }}{% endfor %}",
     "{% macro m(n) %}{% if n > 0 %}{{ n }}{{ m(n - 1) }}{% endif %}{% endmacro %}{{ m(5) }}",
     "{% if x %}{% set y = 1 %}{% endif %}{{ y }}",
     "{% for i in [1] %}{% set y = 1 %}{% endfor %}{{ y is defined }}",
     "{% with a = 1 %}{% set b = 2 %}{{ a }}{{ b }}{% endwith %}{{ b is defined }}",
     "{% filter trim %}   x   {% endfilter %}|{% filter replace('a', 'b') %}aaa{% endfilter %}",
     "{{ loop is defined }}{% for i in [1] %}{{ loop is defined }}{% endfor %}",
     "{% for i in [1, 2, 3] %}{{ loop.previtem is defined }}{{ loop.nextitem|default('-') }}{% endfor %}",
     "{% for i in 'ab' %}{% for j in 'cd' %}{{ loop.index }}{% endfor %}{{ loop.index }}{% endfor %}",
     "{% for m in msgs %}{{ loop.index0 }}{{ m.role[0] }}{% endfor %}",
     "{% for k in d %}{{ k }}{% endfor %}{% for k, v in d.items() %}{{ k }}={{ v }}{% endfor %}",
     "{% for x in 5 %}{% endfor %}", "{% for x in none %}{% endfor %}",
     "{% if x is defined and x|length > 0 and x[0] is number %}ok{% endif %}",
     "{% if not x %}a{% elif x|length == 3 %}b{% endif %}",
     "{% set items = [] %}{% for i in x %}{% set items = items + [i * 2] %}{% endfor %}{{ items }}",
     "{% set ns = namespace(items=[]) %}{% for i in x %}{% set ns.items = ns.items + [i * 2] %}{% endfor %}{{ ns.items }}",
     "{{ range(5)|list }}{{ range(2, 5)|list }}{{ range(5, 2, -1)|list }}{{ range(0, 10, 3)|list }}",
     "{% for i in range(3) %}{{ i }}{% endfor %}", "{{ range(x|length)|list }}",
     "{{ raise_exception('boom') if false else 'fine' }}",
     "{% if x %}{{ raise_exception('x is ' ~ x) }}{% endif %}",
     "{{ 'abc' is string and 'abc' is not mapping }}",
     "{% set content = 'a</think>\\n\\nb' %}{{ content.split('</think>')[-1].lstrip('\\n') }}|{{ content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}",
     "{%- for m in msgs -%}{{- m.role -}}{%- endfor -%}",
     "{% generation %}x{% endgeneration %}",
     "{% for i in x %}{% endfor %}{{ i }}",
     "{% set x.y = 1 %}",
     "{% break %}", "{% endfor %}", "{% else %}", "{% if %}{% endif %}", "{% for in x %}{% endfor %}", "{{ }}", "{% set %}", "{{ x y }}", "{{ x | }}", "{{ 1 is }}",
     "{% macro m(a=1, b) %}{% endmacro %}", "{{ f(*x) }}", "{{ 'a' if }}", "{{ x[1:2:3:4] }}", "{{ [1, 2}}", "{% set x = [1, 2 %}",
     "{{ x.1 }}{{ x[0:1][0] }}", "{% if true %}{% elif %}{% endif %}", "{{ 'unterminated }}", "{{ x | default }}", "{{ 1.5.x }}",
    ]
    out += [("stmt%d" % i, t, ctx) for i, t in enumerate(stmts)]

    return out


def random_cases(n_ws=400, n_expr=400):
    """Seeded random templates: whitespace control/trim/lstrip combinations
    of tags, comments, raw blocks; and random expressions (precedence,
    arithmetic, comparisons, printing). (name, template, context)"""
    import random
    R = random.Random(7)
    out = []

    def ws():
        return R.choice(["", " ", "  ", "\n", " \n ", "\n\n", "\t", " \t\n", "x", "ab ", "\n  ", "  \n", "\r\n", "\u00a0"])

    def mod():
        return R.choice(["", "", "-", "+"])

    def tag(body, l=None, r=None):
        l = mod() if l is None else l
        r = R.choice(["", "", "-", "+"]) if r is None else r
        return "{%" + l + R.choice([" ", "  ", "\n"]) + body + R.choice([" ", ""]) + r + "%}"

    def piece(depth):
        k = R.randrange(7)
        if k == 1:
            return "{{" + R.choice(["", "-", "+"]) + " 'v' " + R.choice(["", "", "-"]) + "}}"
        if k == 2:
            return "{#" + mod() + " c " + R.choice(["", "-", "+"]) + "#}"
        if k == 3 and depth < 3:
            return (tag("if true") + seq(depth + 1) +
                    (tag("else") + seq(depth + 1) if R.random() < 0.3 else "") + tag("endif"))
        if k == 4 and depth < 3:
            return tag("for i in [1, 2]") + seq(depth + 1) + tag("endfor")
        if k == 5:
            return tag("set x = 1")
        if k == 6 and depth < 2:
            return tag("raw") + ws() + "{{ raw }}" + ws() + tag("endraw", r=R.choice(["", "-"]))
        return ws()

    def seq(depth):
        return "".join(piece(depth) for _ in range(R.randrange(1, 6)))

    for i in range(n_ws):
        out.append(("ws_rand%d" % i, seq(0) + R.choice(["", "\n", "\n\n", " "]), {}))

    R = random.Random(11)
    atoms = ["1", "2", "0", "-3", "2.5", "0.1", "1e3", "'a'", "'bc'", "''", "true", "false", "none", "x",
             "y", "s", "l", "d", "[1, 2]", "(1, 'a')", "{'k': 1}", "nothing", "l[0]", "d.k", "s[1:]",
             "l|length", "s|upper", "x is odd", "l[-1]", "1.5e-7", "10", "-0.0", "7", "3"]
    ops = ["+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", ">", "<=", ">=", "and", "or",
           "in", "not in"]

    def expr(d):
        if d <= 0 or R.random() < 0.3:
            return R.choice(atoms)
        k = R.randrange(6)
        if k < 3:
            return expr(d - 1) + " " + R.choice(ops) + " " + expr(d - 1)
        if k == 3:
            return "(" + expr(d - 1) + ")"
        if k == 4:
            return R.choice(["not ", "-", "+"]) + expr(d - 1)
        return expr(d - 1) + " if " + expr(d - 1) + " else " + expr(d - 1)

    ctx = {"x": 5, "y": 2.5, "s": "h\u00e9llo", "l": [3, 1, 2], "d": {"k": "v"}}
    for i in range(n_expr):
        out.append(("expr_rand%d" % i, "{{ " + expr(3) + " }}", ctx))
    return out


def random_filter_cases(compile_fn, n=500):
    """Seeded random filter chains. Jinja's map/select/unique/batch/items/
    reverse return lazy generators whose repr holds a memory address (and
    whose errors are deferred); a case is kept only when it renders the same
    with those filters made eager, so no expectation depends on that."""
    import random
    R = random.Random(5)
    vals = ["s", "l", "d", "msgs", "n", "f", "'  Mixed Case-text (x) '", "[3, 'a', 1]",
            "['b', 'A', 'c', 'a']", "none", "nothing", "''", "[]", "{}", "'a\\nb\\n\\nc'", "t",
            "[[1, 2], [3]]", "'1,2,3'", "'42'", "'-3.5'", "true"]
    filters = ["trim", "upper", "lower", "title", "capitalize", "length", "count", "string", "list",
               "first", "last", "reverse", "sort", "unique", "sum", "min", "max", "join", "join(', ')",
               "join('|', attribute='role')", "default('D')", "default('D', true)", "int", "float", "abs",
               "round", "round(1)", "tojson", "tojson(indent=2)", "items", "dictsort", "batch(2)",
               "map('upper')", "map(attribute='role')", "map(attribute='content', default='-')", "select",
               "reject", "select('odd')", "selectattr('role', 'eq', 'user')", "rejectattr('content')",
               "replace('a', 'X')", "indent(2)", "indent(2, true)", "center(12)", "wordcount", "e", "safe",
               "first|upper", "sort(reverse=true)", "sort(attribute='role')", "unique(case_sensitive=true)",
               "min(attribute='role')", "trim('x')", "attr('upper')", "length > 2", "string|length"]
    tails = ["", "|list", "|join(',')", "|tojson", "|string", "|length"]
    ctx = {"s": "  Hello, World! ", "l": [5, 3, 8, 1], "d": {"b": 2, "a": 1, "C": 3},
           "msgs": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""},
                    {"role": "User", "content": "x"}],
           "n": -7, "f": 2.675, "t": "\u00c9COLE na\u00efve"}

    def render(src):
        try:
            return "ok", compile_fn(src).render(**ctx)
        except Exception as e:
            return "err", type(e).__name__

    lazy = ["map", "select", "reject", "selectattr", "rejectattr", "unique", "batch", "items", "reverse"]
    class Opaque(list):   # eager, but printed like a generator: exposes repr-dependence
        def __repr__(self):
            return "<g>"
        __str__ = __repr__

    out = []
    while len(out) < n:
        chain = "|".join(R.choice(filters) for _ in range(R.randrange(1, 4)))
        src = "{{ " + R.choice(vals) + "|" + chain + R.choice(tails) + " }}"
        a = render(src)
        if a[0] == "ok" and " at 0x" in a[1]:
            continue
        if a[0] == "ok" and ("<bound method" in a[1] or "<built-in" in a[1]):
            continue
        flt = compile_fn("").environment.filters
        saved = {k: flt[k] for k in lazy}
        variants = []
        for wrap in (list, Opaque):
            try:
                for k in lazy:
                    f = saved[k]
                    eager = (lambda f: lambda *x, **kw: (lambda r: r if isinstance(r, str) else wrap(r))(f(*x, **kw)))(f)
                    if hasattr(f, "jinja_pass_arg"):
                        eager.jinja_pass_arg = f.jinja_pass_arg
                    flt[k] = eager
                variants.append(render(src))
            finally:
                flt.update(saved)
        if a == variants[0] == variants[1]:
            out.append(("filter_rand%d" % len(out), src, ctx))
    return out


def norm(ctx):
    """JSON round trip: the fixture context exactly as C will parse it."""
    return json.loads(json.dumps(ctx, ensure_ascii=False))


def render_micro(compile_fn, cases=MICRO):
    out = []
    for name, src, ctx in cases:
        case = {"name": name, "template_name": "micro", "template": src, "context": ctx}
        try:
            case["expected"] = compile_fn(src).render(**norm(ctx))
        except RecursionError:
            case["expected_error"] = "RecursionError"
        except Exception as e:  # recorded: the C side must fail too
            case["expected_error"] = type(e).__name__ + ": " + str(e)
        out.append(case)
    return out


def load_tokenizer(d):
    import transformers
    try:
        return transformers.AutoTokenizer.from_pretrained(d), "AutoTokenizer"
    except Exception as e:
        print("AutoTokenizer failed for", d, ":", repr(e)[:300])
    cfg = json.load(open(os.path.join(d, "tokenizer_config.json")))
    cfg = {k: v for k, v in cfg.items() if k not in ("tokenizer_class", "added_tokens_decoder", "auto_map")}
    return (transformers.PreTrainedTokenizerFast(
        tokenizer_file=os.path.join(d, "tokenizer.json"), **cfg), "PreTrainedTokenizerFast")


def real_cases(tokdir, name, cases, compile_fn, work):
    d = os.path.join(work, name)
    os.makedirs(d, exist_ok=True)
    src = os.path.join(tokdir, name)
    for f in os.listdir(src):
        if f.endswith(".gz"):
            with gzip.open(os.path.join(src, f)) as fi, open(os.path.join(d, f[:-3]), "wb") as fo:
                shutil.copyfileobj(fi, fo)
        else:
            shutil.copy(os.path.join(src, f), d)
    tmpl = json.load(open(os.path.join(d, "tokenizer_config.json")))["chat_template"]
    tok, how = load_tokenizer(d)
    print(name, "loaded via", how, type(tok).__name__)
    specials = {k: (v if isinstance(v, (str, list)) else str(v))
                for k, v in tok.special_tokens_map.items()}
    out = []
    for cname, msgs, tools, agp, kw in cases:
        call = {"messages": msgs, "tools": tools, "add_generation_prompt": agp, "kwargs": kw}
        ctx = dict(specials)
        ctx.update({"messages": msgs, "tools": tools, "documents": None,
                    "add_generation_prompt": agp})
        ctx.update(kw)
        case = {"name": cname, "template_name": name, "call": call, "context": norm(ctx)}
        try:
            case["expected"] = tok.apply_chat_template(
                msgs, tools=tools, add_generation_prompt=agp, tokenize=False,
                chat_template=tmpl, **kw)
        except Exception as e:
            case["expected_error"] = type(e).__name__ + ": " + str(e)
        # self-consistency: the recorded context reproduces the render
        try:
            direct = compile_fn(tmpl).render(**case["context"])
        except Exception as e:
            direct = "ERROR " + type(e).__name__
        if "expected" in case and direct != case["expected"]:
            print("WARNING", name, cname, "context does not reproduce apply_chat_template")
            case["context_mismatch"] = True
        out.append(case)
        print(name, cname, "ok" if "expected" in case else case["expected_error"][:80])
    return out


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    compile_fn, how = jinja_env()
    print("environment:", how)
    if "--extra-only" in sys.argv:
        # no device needed: jinja2 as transformers configures it (same 3.1.x)
        os.makedirs(args[0], exist_ok=True)
        cases = render_micro(compile_fn, extra_cases() + random_cases() + random_filter_cases(compile_fn))
        # Python complex results (negative ** fractional) are out of scope
        cases = [c for c in cases if not c.get("expected", "").endswith("j)")]
        json.dump({"meta": {"generator": how}, "cases": cases},
                  open(os.path.join(args[0], "extra.json"), "w"), ensure_ascii=False, indent=1)
        return
    if "--micro-only" in sys.argv:
        outdir = args[0]
    else:
        tokdir, outdir = args
    os.makedirs(outdir, exist_ok=True)
    meta = {"generator": how}
    try:
        import transformers
        import jinja2
        meta.update(transformers=transformers.__version__, jinja2=jinja2.__version__)
    except Exception:
        pass
    micro = render_micro(compile_fn)
    json.dump({"meta": meta, "cases": micro}, open(os.path.join(outdir, "micro.json"), "w"),
              ensure_ascii=False, indent=1)
    if "--micro-only" in sys.argv:
        return
    work = "/tmp/tmpl_work"
    for name, cases in (("qwen3", qwen3_cases()), ("llama3", llama3_cases()),
                        ("gemma3", gemma3_cases())):
        try:
            res = real_cases(tokdir, name, cases, compile_fn, work)
        except Exception as e:
            import traceback
            traceback.print_exc()
            res = [{"name": "load_failed", "error": repr(e)}]
        json.dump({"meta": meta, "cases": res}, open(os.path.join(outdir, name + ".json"), "w"),
                  ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
