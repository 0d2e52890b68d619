"""A chat request's messages to prompt ids through the model's chat template, tool turns included.

Contract: `encode_chat(target, messages, tools, uses_tools)` returns token ids, or raises BadRequest
with one line when the request has tool turns (an assistant's `tool_calls`, a `role: tool` answer,
a `tools` list) that the model's template does not render: sending them through a template that
ignores them would answer a different conversation than the client sent.
"""

from __future__ import annotations

from specpipe.serve.openai_api import BadRequest


def encode_chat(target, messages: list[dict], tools: list[dict] | None, uses_tools: bool) -> list[int]:
    if not uses_tools and not tools:
        return target.encode_messages(messages)
    template = getattr(target.tokenizer, "chat_template", None) or ""
    needs = []
    if any("tool_calls" in m for m in messages):
        needs.append("tool_calls")
    if any(m["role"] == "tool" for m in messages):
        needs.append("tool")
    if tools:
        needs.append("tools")
    missing = [n for n in needs if n not in template]  # a template that renders them names them
    if missing:
        raise BadRequest(
            f"{target.info.name}'s chat template does not render {' / '.join(missing)}: "
            "send the tool turns as plain user / assistant text, or serve a model whose template supports tools"
        )
    try:
        ids = target.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True)
    except Exception as exc:  # the template's own refusal (a jinja exception), not a server fault
        raise BadRequest(f"the chat template refused these messages: {str(exc).splitlines()[0]}") from None
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)
