"""The five real agents: how each is installed, configured, started and read back, and the
tool vocabulary the scripted model uses to drive it.

Every client runs unmodified; only its base URL (and a fake key) points it at our endpoint.
Facts about each client (flags, pitfalls) come from ../shared/CLIENTS.md.
"""

import json
import os
import subprocess
from pathlib import Path

CACHE = Path(os.environ.get("LW_AGENT_CACHE", "/tmp/lw-agents"))

TASK = "Fix the failing test in this repository."

# The scratch repository every client works in: a bug in add() and a test that shows it.
CALC_PY = '''def add(a, b):
    return a - b  # bug


def mul(a, b):
    return a * b
'''
TEST_PY = '''import sys
from calc import add, mul


def main():
    assert mul(2, 3) == 6
    assert add(2, 2) == 4, "add(2, 2) returned %r" % add(2, 2)
    print("all tests passed")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print("FAILED: test_calc.py::test_add - AssertionError:", e)
        sys.exit(1)
'''

# Lines the scripted edits swap. BUGGY and SAME_BUG behave alike (the test keeps failing the
# same way), so an edit between them and its revert make no progress. FIXED fixes the bug.
BUGGY = "    return a - b  # bug"
SAME_BUG = "    return -(b - a)  # bug"
FIXED = "    return a + b"
# A second real change for the control run: a new function after mul().
MUL = "    return a * b"
MUL_AND_SUB = "    return a * b\n\n\ndef sub(a, b):\n    return a - b"


def make_repo(path: Path):
    """A fresh git repository with the buggy calculator."""
    subprocess.run(["rm", "-rf", str(path)], check=True)
    path.mkdir(parents=True)
    (path / "calc.py").write_text(CALC_PY)
    (path / "test_calc.py").write_text(TEST_PY)
    (path / "README.md").write_text("# calc\nA tiny calculator.\n")
    git = ["git", "-C", str(path), "-c", "user.email=e2e@example.invalid", "-c", "user.name=e2e"]
    subprocess.run(git[:3] + ["init", "-q", "-b", "main"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "init"], check=True)


def npm_install(directory: Path, package: str, version: str):
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(directory),
                    f"{package}@{version}"], check=True, stdout=subprocess.DEVNULL)


def jsonl(text: str):
    """Parses the JSON lines of a client's output, skipping anything else."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


class Client:
    """One agent. Subclasses give the tool vocabulary and how to run and read it."""
    name = ""
    api = ""  # the wire API it speaks, for the report
    # Tool-less side requests the client sends per run (title, router...).
    side_requests = 0
    # Speaks its model API over a WebSocket (Codex), not request by request.
    websocket = False
    # Takes its base URL from the variables `loopwarden run` sets (Codex: from `run`'s
    # `-c` overrides), so that it runs under `run` unchanged.
    base_url_from_env = True

    def installed(self) -> bool:
        raise NotImplementedError

    def install(self):
        raise NotImplementedError

    # -- tool vocabulary: each returns one scripted tool call
    def read(self, repo: Path) -> dict:
        raise NotImplementedError

    def run_test(self, repo: Path) -> dict:
        raise NotImplementedError

    def edit(self, repo: Path, old: str, new: str) -> dict:
        raise NotImplementedError

    def final(self, text: str) -> dict:
        """The scripted turn that ends the run with `text` as the agent's last message."""
        return {"text": text}

    # -- running
    def command(self, repo: Path, home: Path, base_url: str, run_dir: Path):
        """Returns (argv, extra environment)."""
        raise NotImplementedError

    def last_message(self, stdout: str, run_dir: Path) -> str:
        raise NotImplementedError

    def stopped_cleanly(self, stdout: str, run_dir: Path) -> bool:
        """Whether the client reports a normal end (beyond its exit status)."""
        return True


class Claude(Client):
    name, api = "claude", "anthropic messages (SSE)"
    version = os.environ.get("CLAUDE_VERSION", "latest")
    home = CACHE / "claude"
    # The npm wrapper's postinstall needs node 22; the native binary it would link works as is.
    binary = home / "node_modules/@anthropic-ai/claude-code-linux-x64/claude"

    def installed(self):
        return self.binary.exists()

    def install(self):
        npm_install(self.home, "@anthropic-ai/claude-code", self.version)

    def read(self, repo):
        return {"name": "Read", "arguments": {"file_path": f"{repo}/calc.py"}}

    def run_test(self, repo):
        return {"name": "Bash", "arguments": {"command": "python3 test_calc.py", "description": "Run the tests"}}

    def edit(self, repo, old, new):
        return {"name": "Edit", "arguments": {"file_path": f"{repo}/calc.py", "old_string": old, "new_string": new}}

    def command(self, repo, home, base_url, run_dir):
        env = {"ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": "sk-ant-api03-FAKE-e2e-key-0000",
               "IS_SANDBOX": "1",  # lets --dangerously-skip-permissions run as root
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
               "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1"}
        argv = [str(self.binary), "-p", TASK, "--dangerously-skip-permissions",
                "--output-format", "stream-json", "--verbose"]
        return argv, env

    def last_message(self, stdout, run_dir):
        results = [e for e in jsonl(stdout) if e.get("type") == "result"]
        return results[-1].get("result", "") if results else ""

    def stopped_cleanly(self, stdout, run_dir):
        results = [e for e in jsonl(stdout) if e.get("type") == "result"]
        return bool(results) and not results[-1].get("is_error")


class Codex(Client):
    # Codex's default transport for a provider that supports it: the Responses API over a
    # WebSocket (`GET /v1/responses` upgraded), HTTP only as its fallback.
    name, api = "codex", "openai responses (WebSocket)"
    websocket = True
    version = os.environ.get("CODEX_VERSION", "latest")
    home = CACHE / "codex"
    binary = home / "node_modules/.bin/codex"
    # A slug from Codex's catalogue: unknown slugs lose the apply_patch tool.
    model = os.environ.get("CODEX_MODEL", "gpt-5.5")

    def installed(self):
        return self.binary.exists()

    def install(self):
        npm_install(self.home, "@openai/codex", self.version)

    def read(self, repo):
        return {"name": "exec_command", "arguments": {"cmd": "cat calc.py", "workdir": str(repo)}}

    def run_test(self, repo):
        return {"name": "exec_command", "arguments": {"cmd": "python3 test_calc.py", "workdir": str(repo)}}

    def edit(self, repo, old, new):
        # apply_patch is a freeform (custom) tool: the call carries the patch as raw input.
        removed = "".join(f"-{line}\n" for line in old.split("\n"))
        added = "".join(f"+{line}\n" for line in new.split("\n"))
        patch = f"*** Begin Patch\n*** Update File: calc.py\n@@\n{removed}{added}*** End Patch\n"
        return {"name": "apply_patch", "input": patch}

    def command(self, repo, home, base_url, run_dir):
        codex_home = home / ".codex"
        codex_home.mkdir(parents=True, exist_ok=True)
        (codex_home / "config.toml").write_text(
            f'model = "{self.model}"\nmodel_provider = "e2e"\n\n'
            f'[model_providers.e2e]\nname = "e2e"\nbase_url = "{base_url}/v1"\n'
            'env_key = "E2E_API_KEY"\nwire_api = "responses"\nsupports_websockets = true\n\n'
            '[analytics]\nenabled = false\n')
        env = {"CODEX_HOME": str(codex_home), "E2E_API_KEY": "sk-proj-FAKE-e2e-key-0000"}
        argv = [str(self.binary), "exec", "--json", "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox", TASK]
        return argv, env

    def _events(self, stdout):
        return jsonl(stdout)

    def last_message(self, stdout, run_dir):
        texts = [e["item"].get("text", "") for e in self._events(stdout)
                 if e.get("type") == "item.completed" and e.get("item", {}).get("type") == "agent_message"]
        return texts[-1] if texts else ""

    def stopped_cleanly(self, stdout, run_dir):
        return any(e.get("type") == "turn.completed" for e in self._events(stdout))


class Gemini(Client):
    name, api = "gemini", "gemini streamGenerateContent (SSE)"
    version = os.environ.get("GEMINI_VERSION", "latest")
    home = CACHE / "gemini"
    script_js = home / "node_modules/@google/gemini-cli/bundle/gemini.js"
    side_requests = 1  # the model router's generateContent call before the prompt

    def installed(self):
        return self.script_js.exists()

    def install(self):
        npm_install(self.home, "@google/gemini-cli", self.version)

    def read(self, repo):
        return {"name": "read_file", "arguments": {"file_path": f"{repo}/calc.py"}}

    def run_test(self, repo):
        return {"name": "run_shell_command",
                "arguments": {"command": "python3 test_calc.py", "description": "Run the tests"}}

    def edit(self, repo, old, new):
        return {"name": "replace", "arguments": {"file_path": f"{repo}/calc.py", "instruction": "change add()",
                                                 "old_string": old, "new_string": new}}

    def command(self, repo, home, base_url, run_dir):
        settings = home / ".gemini"
        settings.mkdir(parents=True, exist_ok=True)
        # With only GOOGLE_GEMINI_BASE_URL the CLI picks the "gateway" auth type, which -p
        # rejects; pinning the API-key type keeps the base URL override.
        (settings / "settings.json").write_text(json.dumps({
            "privacy": {"usageStatisticsEnabled": False}, "telemetry": {"enabled": False},
            "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
            "security": {"auth": {"selectedType": "gemini-api-key"}}}))
        env = {"GEMINI_API_KEY": "FAKE-e2e-gemini-key-0000", "GOOGLE_GEMINI_BASE_URL": base_url,
               "GEMINI_CLI_TRUST_WORKSPACE": "true"}
        argv = ["node", str(self.script_js), "-p", TASK, "--yolo", "--output-format", "stream-json"]
        return argv, env

    def last_message(self, stdout, run_dir):
        # Assistant text arrives as deltas; the last message is the text after the last tool use.
        text = ""
        for e in jsonl(stdout):
            if e.get("type") == "tool_use":
                text = ""
            elif e.get("type") == "message" and e.get("role") == "assistant":
                text += e.get("content", "")
        return text

    def stopped_cleanly(self, stdout, run_dir):
        results = [e for e in jsonl(stdout) if e.get("type") == "result"]
        return bool(results) and results[-1].get("status") == "success"


class Opencode(Client):
    name, api = "opencode", "openai chat completions (SSE)"
    version = os.environ.get("OPENCODE_VERSION", "latest")
    home = CACHE / "opencode"
    binary = home / "node_modules/opencode-linux-x64/bin/opencode"
    side_requests = 1  # the title request
    base_url_from_env = False  # opencode.json's options.baseURL

    def installed(self):
        return self.binary.exists()

    def install(self):
        npm_install(self.home, "opencode-ai", self.version)

    def read(self, repo):
        return {"name": "read", "arguments": {"filePath": f"{repo}/calc.py"}}

    def run_test(self, repo):
        return {"name": "bash", "arguments": {"command": "python3 test_calc.py", "description": "Run the tests"}}

    def edit(self, repo, old, new):
        return {"name": "edit", "arguments": {"filePath": f"{repo}/calc.py", "oldString": old, "newString": new}}

    def command(self, repo, home, base_url, run_dir):
        config = {"$schema": "https://opencode.ai/config.json",
                  "provider": {"e2e": {"npm": "@ai-sdk/openai-compatible", "name": "e2e",
                                       "options": {"baseURL": f"{base_url}/v1", "apiKey": "sk-FAKE-e2e-key-0000"},
                                       "models": {"e2e-model": {"name": "e2e-model", "tool_call": True}}}},
                  "model": "e2e/e2e-model", "small_model": "e2e/e2e-model",
                  "autoupdate": False, "share": "disabled"}
        env = {"XDG_CONFIG_HOME": str(home / ".config"), "XDG_DATA_HOME": str(home / ".local/share"),
               "XDG_CACHE_HOME": str(home / ".cache"), "XDG_STATE_HOME": str(home / ".local/state"),
               "OPENCODE_CONFIG_CONTENT": json.dumps(config),
               "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1",
               "OPENCODE_DISABLE_SHARE": "1", "OPENCODE_DISABLE_LSP_DOWNLOAD": "1"}
        argv = [str(self.binary), "run", "--format", "json", "--auto", TASK]
        return argv, env

    def last_message(self, stdout, run_dir):
        texts = [e.get("part", {}).get("text", "") for e in jsonl(stdout) if e.get("type") == "text"]
        return texts[-1] if texts else ""

    def stopped_cleanly(self, stdout, run_dir):
        finishes = [e.get("part", {}).get("reason") for e in jsonl(stdout) if e.get("type") == "step_finish"]
        return bool(finishes) and finishes[-1] == "stop"


class MiniSweAgent(Client):
    name, api = "mini-swe-agent", "openai chat completions (JSON)"
    version = os.environ.get("MSWE_VERSION", "")  # e.g. "==2.4.6"; empty: latest
    venv = CACHE / "mswe-venv"
    binary = venv / "bin/mini"
    model = os.environ.get("MSWE_MODEL", "openai/gpt-4.1-mini")
    SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"

    def installed(self):
        if not self.binary.exists():
            return False
        # litellm imports the optional `mcp` package whenever a request carries tools.
        return subprocess.run([str(self.venv / "bin/python"), "-c", "import mcp"],
                              capture_output=True).returncode == 0

    def install(self):
        subprocess.run(["python3", "-m", "venv", str(self.venv)], check=True)
        subprocess.run([str(self.venv / "bin/pip"), "install", "-q", f"mini-swe-agent{self.version}",
                        "mcp>=2.2.0,<3"], check=True)

    def _bash(self, command):
        return {"name": "bash", "arguments": {"command": command}}

    def read(self, repo):
        return self._bash("cat calc.py")

    def run_test(self, repo):
        return self._bash("python3 test_calc.py")

    def edit(self, repo, old, new):
        script = f"import pathlib; p = pathlib.Path('calc.py'); p.write_text(p.read_text().replace({old!r}, {new!r}))"
        return self._bash(f'python3 -c "{script}"')

    def final(self, text):
        # mini-swe-agent rejects a reply without a tool call; it ends on its submit command,
        # and what the command prints after the marker line is its final output.
        return {"tool_calls": [self._bash(f"echo {self.SUBMIT} && echo {json.dumps(text)}")]}

    def command(self, repo, home, base_url, run_dir):
        env = {"MSWEA_GLOBAL_CONFIG_DIR": str(home / "mswea"), "MSWEA_CONFIGURED": "true",
               "MSWEA_COST_TRACKING": "ignore_errors", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
               "LITELLM_TELEMETRY": "False", "OPENAI_API_KEY": "sk-proj-FAKE-e2e-key-0000",
               "OPENAI_BASE_URL": f"{base_url}/v1", "OPENAI_API_BASE": f"{base_url}/v1"}
        argv = [str(self.binary), "-m", self.model, "-y", "--exit-immediately",
                "-o", str(run_dir / "traj.json"), "-t", TASK]
        return argv, env

    def _traj(self, run_dir):
        try:
            return json.loads((run_dir / "traj.json").read_text())
        except (OSError, json.JSONDecodeError):
            return {}

    def last_message(self, stdout, run_dir):
        info = self._traj(run_dir).get("info", {})
        return (info.get("submission") or "").strip()

    def stopped_cleanly(self, stdout, run_dir):
        return self._traj(run_dir).get("info", {}).get("exit_status") == "Submitted"


ALL = [Claude(), Codex(), Gemini(), Opencode(), MiniSweAgent()]
BY_NAME = {c.name: c for c in ALL}
