"""Chat templates are untrusted code: they must render real templates and refuse escapes."""

from __future__ import annotations

from datetime import datetime

import pytest

from llmserve.models.chat_template import ChatTemplate, ChatTemplateError

MSGS = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",  # the classic escape to os / subprocess
    "{{ ''.__class__ }}",  # even a harmless-looking probe fails loudly
    "{{ messages|attr('__class__') }}",
    "{{ cycler.__init__.__globals__.os }}",
    "{{ raise_exception.__globals__ }}",
    "{% set x = messages.append({'role': 'system'}) %}",  # templates may not mutate the request
    "{% set ns = namespace(__class__=1) %}",
    "{{ 'A' * 100000000 }}",  # memory bomb
    "{{ [0] * 10 * 10000000 }}",
    "{{ 2 ** 1000000 }}",  # CPU/memory bomb
    "{{ ('{0.__class__}').format(messages) }}",
    "{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
    "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxxxx{% endfor %}{% endfor %}",
])
def test_malicious_templates_raise_instead_of_running(source):
    with pytest.raises(ChatTemplateError, match="forbidden"):
        ChatTemplate(source).render(MSGS)


def test_messages_are_not_mutated():
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{% set _ = messages[0].update({'content': 'pwned'}) %}").render(msgs)
    assert msgs == [{"role": "user", "content": "hi"}]


def test_template_errors_are_chat_template_errors():
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(ChatTemplateError, match="Only user and assistant roles"):
        ChatTemplate("{{ raise_exception('Only user and assistant roles are supported') }}").render(MSGS)
    with pytest.raises(ChatTemplateError, match="failed"):
        ChatTemplate("{{ messages[0]['content'] + 1 }}").render(MSGS)


def test_transformers_helpers_and_options():
    src = (
        "{%- set ns = namespace(n=0) -%}\n"
        "{% for m in messages %}\n"
        "  {% if loop.index > 1 %}{% break %}{% endif %}\n"
        "  {% set ns.n = ns.n + 1 %}\n"
        "{{ m|tojson }}\n"
        "{% endfor %}\n"
        "{% generation %}n={{ ns.n }} {{ strftime_now('%Y') }}{% endgeneration %}"
    )
    out = ChatTemplate(src).render([{"role": "user", "content": "é ü <b>"}, {"role": "user", "content": "x"}])
    assert out == f'{{"role": "user", "content": "é ü <b>"}}\nn=1 {datetime.now().year}'


def test_variables_reach_the_template():
    tpl = ChatTemplate("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"
                       "{% if tools %}{{ tools|length }} tools{% endif %}{% if add_generation_prompt %}>{% endif %}")
    assert tpl.render(MSGS, bos_token="<s>") == "<s>hi>"
    assert tpl.render(MSGS, add_generation_prompt=False, tools=[{"name": "f"}]) == "hi1 tools"
