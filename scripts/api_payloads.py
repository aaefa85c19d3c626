#!/usr/bin/env python3
"""OpenAI Responses and Gemini request bodies for the load scripts, derived from the bench
harness's OpenAI Chat payloads: the same conversation (system prompt, task, tool calls and
their results, tools) in the shape Codex CLI sends to /v1/responses and Gemini CLI to
generateContent, so each API's request path can be driven at the harness's sizes.

    scripts/api_payloads.py PAYLOAD_DIR

reads PAYLOAD_DIR/openai_{8k,200k,2m}[_stream].json and writes responses_*.json and
gemini_*.json beside them. A Gemini body does not say whether it streams (the URL does):
gemini_*_stream.json is the same body, named for the load that sends it to
streamGenerateContent.
"""
import json
import os
import sys


def responses_body(chat):
    """A Chat Completions request as a Responses request, item for item."""
    items = []
    instructions = None
    for m in chat["messages"]:
        role = m["role"]
        if role == "system":
            instructions = m["content"]
        elif role == "tool":
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"],
                          "output": m["content"]})
        else:
            if m.get("content"):
                kind = "output_text" if role == "assistant" else "input_text"
                items.append({"type": "message", "role": role,
                              "content": [{"type": kind, "text": m["content"]}]})
            for call in m.get("tool_calls") or []:
                items.append({"type": "function_call", "call_id": call["id"],
                              "name": call["function"]["name"],
                              "arguments": call["function"]["arguments"]})
    body = {"model": "bench-gpt", "instructions": instructions, "input": items,
            "tools": [{"type": "function", **t["function"]} for t in chat.get("tools", [])],
            "tool_choice": "auto", "parallel_tool_calls": True, "store": False,
            "stream": bool(chat.get("stream"))}
    return body


def gemini_body(chat):
    """A Chat Completions request as a generateContent request: assistant turns are the
    model's, tool results go back as the user's functionResponse parts."""
    names = {}
    contents = []
    system = None
    for m in chat["messages"]:
        role = m["role"]
        if role == "system":
            system = {"parts": [{"text": m["content"]}]}
            continue
        if role == "tool":
            part = {"functionResponse": {"id": m["tool_call_id"],
                                         "name": names.get(m["tool_call_id"], "tool"),
                                         "response": {"output": m["content"]}}}
            # Results of one turn's calls travel together, as Gemini CLI sends them.
            if contents and contents[-1]["role"] == "user" and \
                    "functionResponse" in contents[-1]["parts"][0]:
                contents[-1]["parts"].append(part)
            else:
                contents.append({"role": "user", "parts": [part]})
            continue
        parts = [{"text": m["content"]}] if m.get("content") else []
        for call in m.get("tool_calls") or []:
            names[call["id"]] = call["function"]["name"]
            parts.append({"functionCall": {"id": call["id"], "name": call["function"]["name"],
                                           "args": json.loads(call["function"]["arguments"])}})
        contents.append({"role": "model" if role == "assistant" else "user", "parts": parts})
    return {"contents": contents, "systemInstruction": system,
            "tools": [{"functionDeclarations": [
                {"name": t["function"]["name"], "description": t["function"].get("description", ""),
                 "parametersJsonSchema": t["function"].get("parameters", {})}
                for t in chat.get("tools", [])]}],
            "generationConfig": {"temperature": 0.2, "maxOutputTokens": 4096}}


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    d = sys.argv[1]
    made = 0
    for size in ("8k", "200k", "2m"):
        for suffix in ("", "_stream"):
            src = os.path.join(d, f"openai_{size}{suffix}.json")
            if not os.path.exists(src):
                continue
            with open(src) as f:
                chat = json.load(f)
            for api, convert in (("responses", responses_body), ("gemini", gemini_body)):
                with open(os.path.join(d, f"{api}_{size}{suffix}.json"), "w") as f:
                    json.dump(convert(chat), f, separators=(",", ":"))
                made += 1
    if made == 0:
        sys.exit(f"api_payloads: no openai_*.json in {d}")


if __name__ == "__main__":
    main()
