# Renders the chat-template cases of chat_template_test.cpp with Jinja itself (Debian's
# python3-jinja2, set up as transformers sets it up: trim_blocks, lstrip_blocks, loop controls,
# its tojson and raise_exception) and prints them with their expected text as JSON. Usage:
# /usr/bin/python3 tests/tokenize/chat_template_cases.py | python3 -m json.tool --indent 1 \
#   > tests/tokenize/chat_template_cases.json
import json, jinja2, jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
def raise_exception(m): raise jinja2.exceptions.TemplateError(m)
def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
msgs = [{"role": "system", "content": "You are kind."}, {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "  Hello!  "}, {"role": "user", "content": "2+2?"}]
cases = {
 "chatml": ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}", {"messages": msgs[1:], "add_generation_prompt": True}),
 "llama3": ("{{- bos_token }}\n{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content']|trim %}\n    {%- set messages = messages[1:] %}\n{%- else %}\n    {%- set system_message = \"\" %}\n{%- endif %}\n{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n{{- system_message }}\n{{- \"<|eot_id|>\" }}\n{%- for message in messages %}\n    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n{%- endif %}\n", {"messages": msgs, "add_generation_prompt": True, "bos_token": "<|begin_of_text|>"}),
 "zephyr": ("{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}", {"messages": msgs, "add_generation_prompt": True, "eos_token": "</s>"}),
 "features": ("{% set ns = namespace(n=0, last='') %}{% for m in messages if m.role != 'system' %}{% set ns.n = ns.n + 1 %}{{ loop.index }}/{{ loop.length }}:{{ m.content[::-1] }}|{{ m.content[1:4] }}|{{ m.role|upper }}{% if not loop.last %}, {% endif %}{% if m.content.startswith('2') %}{% break %}{% endif %}{% endfor %}\n  {#- comment #}\n n={{ ns.n }} {{ messages|length }} {{ (messages|last).content|tojson }} {{ {'a': [1, 2.5, none, true], 'b': 'x'}|tojson }} {{ [1, 'a', none] }} {{ 7 // 2 }} {{ -7 % 3 }} {{ 'x' ~ 3 ~ 1.0 }} {{ 'yes' if x is not defined else 'no' }} {{ tools|default('none') }} {{ 'a,b,,c'.split(',') }} {{ ' pad '.strip() }}{% for k, v in {'p': 1, 'q': 2}.items() %} {{ k }}={{ v }}{% endfor %}\n{%- if true -%}\n   tight\n{%- endif %}\n  {% if true %}\n    lstripped\n  {% endif %}\nend {{ messages[0].missing is defined }}", {"messages": msgs}),
}
out = {}
for name, (src, ctx) in cases.items():
    out[name] = {"template": src, "context": ctx, "expected": env.from_string(src).render(**ctx)}
print(json.dumps(out, ensure_ascii=False))
