"""Authoring mistakes in a task file are one line naming the file and line, never a traceback; a duplicate task_id
is refused (it would silently double-count a task in admission and pass@k)."""
import pytest

from helpers import make_dist, run_cli

PLUGIN = '''
from pathlib import Path
import envhub
from envhub import EnvSpec, Response, TextEnv
from envhub.task import load_jsonl

class Env(TextEnv):
    blocking = False
    def start(self, task): return "say ok"
    def respond(self, action): return Response(done=True, artifacts={{"answer": action.text}})

@envhub.hookimpl
def envhub_register(registry):
    registry.register(EnvSpec(id="{id}", env=Env, tasks=lambda split: load_jsonl(Path(__file__).with_suffix(".jsonl")),
                              verifier=lambda t, a: a["answer"] == "ok", golden=lambda t, m: "ok"))
'''


@pytest.fixture
def site(tmp_path):
    for name, lines in (("bad_json", ['{"task_id": "a"}', '', '{"task_id": "b",}']),
                        ("dup_id", ['{"task_id": "a"}', '{"task_id": "b"}', '{"task_id": "a"}']),
                        ("no_id", ['{"task_id": "a"}', '{"question": "?"}'])):
        env_id = name.replace("_", "-")
        make_dist(tmp_path, f"plugin-{env_id}", {env_id: f"plugin_{name}"}, {f"plugin_{name}": PLUGIN.format(id=env_id)})
        (tmp_path / f"plugin_{name}.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path


@pytest.mark.parametrize("env_id, says", [
    ("bad-json", "plugin_bad_json.jsonl:3: not valid JSON"),
    ("dup-id", "plugin_dup_id.jsonl:3: duplicate task_id 'a' (first at line 1)"),
    ("no-id", "plugin_no_id.jsonl:2: every task needs a non-empty string task_id"),
])
@pytest.mark.parametrize("command", [["validate"], ["rollout", "--tokenizer", "tiny"]])
@pytest.mark.slow
def test_bad_task_file_is_one_line_naming_file_and_line(site, env_id, says, command):
    r = run_cli(command[0], env_id, *command[1:], site=site)
    assert r.returncode == 1 and says in r.stderr, r.stdout + r.stderr
    assert "Traceback" not in r.stderr


def test_duplicate_ids_built_in_code_are_refused(tmp_path):
    make_dist(tmp_path, "plugin-dup-code", {"dup-code": "plugin_dup_code"}, {"plugin_dup_code": PLUGIN.format(
        id="dup-code").replace('load_jsonl(Path(__file__).with_suffix(".jsonl"))',
                               '[{"task_id": "x"}, {"task_id": "x"}]')})
    r = run_cli("validate", "dup-code", site=tmp_path)
    assert r.returncode == 1 and "duplicate task_id 'x'" in r.stderr, r.stdout + r.stderr
