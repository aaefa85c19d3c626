#!/usr/bin/env python3
"""Request bodies for the load scripts (scripts/bench.sh, scripts/build_pgo.sh): a coding
agent's conversation (a system prompt, tools, a task, then turns of tool calls and their
results: files read, commands run, edits) grown to 8.8 KB, 209 KB and 2 MB, in the four
APIs, plain and streamed.

    scripts/bench_payloads.py PAYLOAD_DIR

writes openai_{8k,200k,2m}[_stream].json (Chat Completions) and anthropic_*.json
(Messages), then, through scripts/api_payloads.py, responses_*.json and gemini_*.json with
the same conversations. Deterministic: the same files every time.
"""
import json
import os
import random
import sys

SIZES = {"8k": 8_800, "200k": 209_000, "2m": 2_000_000}

SYSTEM = ("You are a coding agent working in a Rust repository. Use the tools to read files, "
          "run commands and edit code. Keep going until the task is done, then say so.")
TASK = ("The SSE handler drops the last event when the upstream closes the stream early. "
        "Find the cause, fix it, and make sure `cargo test sse` passes.")
TOOLS = [
    ("read_file", "Read a file of the repository.",
     {"path": {"type": "string", "description": "Path from the repository root."}}),
    ("bash", "Run a shell command in the repository and return its output.",
     {"command": {"type": "string", "description": "The command line."}}),
    ("edit_file", "Replace a piece of text in a file.",
     {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}}),
]
FILES = ["src/sse/handlers.rs", "src/sse/framing.rs", "src/proxy/stream.rs", "src/lib.rs",
         "tests/sse_close.rs", "src/upstream/client.rs"]


def code(rng, lines):
    """Lines that look like Rust source."""
    out = []
    for i in range(lines):
        kind = rng.randrange(6)
        name = f"{rng.choice(['frame', 'event', 'buf', 'chunk', 'state', 'pending'])}_{rng.randrange(99)}"
        if kind == 0:
            out.append(f"fn handle_{name}(input: &[u8], state: &mut State) -> Result<usize, Error> {{")
        elif kind == 1:
            out.append(f"    let {name} = decode_line(&input[{i}..], state.offset + {rng.randrange(4096)})?;")
        elif kind == 2:
            out.append(f"    if {name}.is_empty() {{ return Ok(state.flush({rng.randrange(16)})); }}")
        elif kind == 3:
            out.append(f"    // {rng.choice(['keep', 'drop', 'hold', 'emit'])} the {name} until the boundary")
        elif kind == 4:
            out.append(f"    state.events.push(Event::from({name}));")
        else:
            out.append("}")
    return "\n".join(out)


def command_output(rng, lines):
    out = []
    for _ in range(lines):
        t = f"sse::tests::case_{rng.randrange(999)}"
        out.append(f"test {t} ... {'ok' if rng.random() < 0.85 else 'FAILED'}")
    out.append(f"test result: FAILED. {rng.randrange(40, 60)} passed; {rng.randrange(1, 4)} failed")
    return "\n".join(out)


def conversation(target, stream):
    """The Chat Completions body of about `target` bytes."""
    rng = random.Random(target)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    body = {"model": "bench-gpt", "messages": messages, "stream": stream,
            "tools": [{"type": "function", "function": {
                "name": name, "description": desc,
                "parameters": {"type": "object", "properties": props, "required": list(props)}}}
                for name, desc, props in TOOLS]}
    if stream:
        body["stream_options"] = {"include_usage": True}
    step = 0
    # Each turn's result is a slice of the remaining room, so a small body gets a few short
    # turns and a large one many long ones.
    while len(json.dumps(body)) < target:
        room = target - len(json.dumps(body))
        lines = max(3, min(400, room // 160))
        step += 1
        call_id = f"call_{step:04d}"
        kind = step % 3
        if kind == 1:
            name, args = "read_file", {"path": rng.choice(FILES)}
            result = code(rng, lines)
        elif kind == 2:
            name, args = "bash", {"command": "cargo test sse 2>&1 | tail -n 60"}
            result = command_output(rng, lines)
        else:
            name = "edit_file"
            args = {"path": rng.choice(FILES), "old": code(rng, 2), "new": code(rng, 3)}
            result = "The file was edited."
        messages.append({"role": "assistant", "content": f"Step {step}: {name}.",
                         "tool_calls": [{"id": call_id, "type": "function",
                                         "function": {"name": name, "arguments": json.dumps(args)}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
    return body


def anthropic_body(chat):
    """The same conversation as a Messages request."""
    messages = []
    for m in chat["messages"][1:]:
        if m["role"] == "tool":
            block = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}
            if messages and messages[-1]["role"] == "user" and messages[-1]["content"][0]["type"] == "tool_result":
                messages[-1]["content"].append(block)
            else:
                messages.append({"role": "user", "content": [block]})
        elif m["role"] == "assistant":
            content = [{"type": "text", "text": m["content"]}] if m.get("content") else []
            content += [{"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                         "input": json.loads(c["function"]["arguments"])} for c in m.get("tool_calls", [])]
            messages.append({"role": "assistant", "content": content})
        else:
            messages.append({"role": "user", "content": [{"type": "text", "text": m["content"]}]})
    return {"model": "bench-claude", "max_tokens": 4096, "stream": chat["stream"],
            "system": [{"type": "text", "text": chat["messages"][0]["content"]}],
            "messages": messages,
            "tools": [{"name": t["function"]["name"], "description": t["function"]["description"],
                       "input_schema": t["function"]["parameters"]} for t in chat["tools"]]}


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    d = sys.argv[1]
    os.makedirs(d, exist_ok=True)
    for size, target in SIZES.items():
        for suffix, stream in (("", False), ("_stream", True)):
            chat = conversation(target, stream)
            for api, body in (("openai", chat), ("anthropic", anthropic_body(chat))):
                with open(os.path.join(d, f"{api}_{size}{suffix}.json"), "w") as f:
                    json.dump(body, f, separators=(",", ":"))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import api_payloads
    sys.argv = [sys.argv[0], d]
    api_payloads.main()


if __name__ == "__main__":
    main()
