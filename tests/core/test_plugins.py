"""Plugin discovery through real entry points: lazy, collision-safe, tolerant of broken plugins."""
import pytest

from helpers import make_dist, run_cli, run_py

GOOD = '''
import envhub
from envhub import EnvSpec, Response, TextEnv

class Env(TextEnv):
    blocking = False
    def start(self, task): return "say ok"
    def respond(self, action): return Response(done=True, artifacts={{"answer": action.text}})

@envhub.hookimpl
def envhub_register(registry):
    registry.register(EnvSpec(id="{id}", env=Env, tasks=lambda split: [{{"task_id": "a"}}],
                              verifier=lambda t, a: a["answer"] == "ok", golden=lambda t, m: "ok"))
'''


@pytest.fixture
def site(tmp_path):
    make_dist(tmp_path, "plugin-good", {"good-env": "plugin_good"}, {"plugin_good": GOOD.format(id="good-env")})
    make_dist(tmp_path, "plugin-broken", {"broken-env": "plugin_broken"},
              {"plugin_broken": "raise ImportError('this plugin needs a package that is not installed')"})
    return tmp_path


def test_lazy_discovery_imports_only_the_requested_plugin(site):
    r = run_py("""
        import sys, envhub
        assert 'good-env' in envhub.list_envs() and 'broken-env' in envhub.list_envs()
        assert 'plugin_good' not in sys.modules and 'plugin_broken' not in sys.modules
        spec = envhub.get_spec('good-env')
        assert spec.distribution == 'plugin-good', spec.distribution
        assert 'plugin_broken' not in sys.modules and 'envhub_countdown' not in sys.modules
        assert 'torch' not in sys.modules and 'datasets' not in sys.modules
        print('ok')
    """, site)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_import_envhub_imports_no_heavy_or_plugin_module():
    r = run_py("""
        import sys, envhub
        heavy = [m for m in sys.modules if m.split('.')[0] in
                 ('torch', 'transformers', 'vllm', 'openrlhf', 'verl', 'datasets', 'envhub_countdown', 'envhub_swe_gym')]
        print(heavy)
        assert not heavy
    """)
    assert r.returncode == 0, r.stdout + r.stderr


def test_broken_plugin_is_reported_not_fatal(site):
    r = run_py("""
        import envhub
        from envhub.plugins import PluginError, default_hub
        try:
            envhub.get_spec('broken-env')
        except PluginError as e:
            print('ERR', e)
        print(envhub.get_spec('good-env').id)
        hub = default_hub(); hub.load_all(); print(sorted(hub.errors))
    """, site)
    assert r.returncode == 0, r.stderr
    assert "ERR plugin for 'broken-env' failed to load: plugin-broken (plugin_broken): ImportError: this plugin needs" in r.stdout
    assert "good-env" in r.stdout and "['broken-env']" in r.stdout


def test_broken_plugin_does_not_stop_validate_of_another(site):
    r = run_cli("validate", "good-env", site=site)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1/1 tasks admitted" in r.stdout


def test_two_distributions_claiming_one_id_is_an_error_naming_both(site):
    make_dist(site, "plugin-impostor", {"good-env": "plugin_impostor"}, {"plugin_impostor": GOOD.format(id="good-env")})
    r = run_py("""
        import envhub
        try:
            envhub.get_spec('good-env')
        except Exception as e:
            print(type(e).__name__, e)
    """, site)
    assert "PluginCollision" in r.stdout and "plugin-good" in r.stdout and "plugin-impostor" in r.stdout, r.stdout + r.stderr


@pytest.mark.slow
def test_unknown_id_suggests_close_names(site):
    r = run_py("""
        import envhub
        try:
            envhub.get_spec('good-evn')
        except KeyError as e:
            print(e)
    """, site)
    assert "Did you mean: good-env" in r.stdout, r.stdout + r.stderr


def test_installed_plugins_are_gymnasium_ids(site):
    r = run_py("""
        import gymnasium, envhub
        env = gymnasium.make('envhub/good-env-v0')
        env.reset(seed=0)
        print(env.step('ok')[1])
    """, site)
    assert r.returncode == 0 and r.stdout.strip() == "1.0", r.stdout + r.stderr


def test_a_plugin_that_fails_to_import_is_logged_with_its_names(tmp_path, monkeypatch, caplog):
    """One warning per broken plugin: its id, distribution, module and the error, in the text and as fields."""
    import importlib.metadata as md

    from envhub.plugins import Hub, PluginError

    make_dist(tmp_path, "plugin-broken-log", {"broken-log-env": "plugin_broken_log"},
              {"plugin_broken_log": "raise ImportError('needs a package that is not installed')"})
    monkeypatch.syspath_prepend(str(tmp_path))
    eps = [ep for d in md.distributions(path=[str(tmp_path)]) for ep in d.entry_points if ep.group == "envhub"]
    hub = Hub(entry_points=eps)
    with caplog.at_level("WARNING", logger="envhub"):
        for _ in range(2):  # asked twice, imported (and logged) once
            with pytest.raises(PluginError):
                hub.get("broken-log-env")
    records = [r for r in caplog.records if getattr(r, "plugin", None) == "broken-log-env"]
    assert len(records) == 1, caplog.text
    r = records[0]
    assert (r.distribution, r.plugin_module) == ("plugin-broken-log", "plugin_broken_log")
    assert r.error == "ImportError: needs a package that is not installed" and r.levelname == "WARNING"
    assert "broken-log-env" in r.getMessage() and "plugin-broken-log" in r.getMessage() and r.error in r.getMessage()
    assert r.exc_info and r.exc_info[0] is ImportError


def test_a_plugin_whose_runtime_hook_raises_is_logged_and_the_others_still_count(caplog):
    import types

    import envhub
    from envhub.plugins import default_hub
    from envhub.sandbox.runtimes import _plugin_runtimes

    class FakeRuntime:  # only looked up, never started
        pass

    broken, good = types.ModuleType("broken_runtimes"), types.ModuleType("good_runtimes")
    broken.envhub_sandbox_runtimes = envhub.hookimpl(lambda: 1 / 0)
    good.envhub_sandbox_runtimes = envhub.hookimpl(lambda: {"fake": FakeRuntime})
    pm = default_hub().pm
    pm.register(good, name="test:good_runtimes")
    pm.register(broken, name="test:broken_runtimes")
    try:
        with caplog.at_level("WARNING", logger="envhub"):
            found = _plugin_runtimes()
    finally:
        pm.unregister(broken)
        pm.unregister(good)
    assert found.get("fake") is FakeRuntime
    records = [r for r in caplog.records if getattr(r, "plugin", None) == "test:broken_runtimes"]
    assert len(records) == 1 and records[0].error == "ZeroDivisionError: division by zero", caplog.text
    assert "test:broken_runtimes" in records[0].getMessage() and records[0].hook == "envhub_sandbox_runtimes"
