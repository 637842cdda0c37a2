"""`agentrl engine launch-sglang` with a token: SGLang's --api-key travels in a private --config file, never on a
server's command line; a host beyond loopback needs a token."""

from __future__ import annotations

import os
import stat
import textwrap

import pytest
import yaml

from agentrl.auth import TOKEN_ENV
from agentrl.cli import main
from agentrl.inference.launcher import (
    LaunchArgsError,
    SGLangLaunchSpec,
    launch_sglang_servers,
    sglang_server_commands,
    write_api_key_config,
)
from agentrl.services import free_port

TOKEN = "sglang-key-5f2a"


@pytest.fixture(autouse=True)
def no_env_token(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "sglang.token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


def test_every_server_gets_the_config_file_before_the_extra_flags():
    spec = SGLangLaunchSpec(model_path="/models/qwen", num_servers=2, api_key_config="/secret/api_key.yaml",
                            extra_args=["--log-level", "warning"])
    for _env, cmd in sglang_server_commands(spec):
        assert cmd[-4:] == ["--config", "/secret/api_key.yaml", "--log-level", "warning"]
    assert all("--config" not in cmd for _, cmd in sglang_server_commands(SGLangLaunchSpec(model_path="m")))


@pytest.mark.parametrize("token", [TOKEN, "123", "true", "0x1F", "#tok:en", "'quoted\"", "null", "a\\b"])
def test_the_config_file_is_private_and_reads_back_as_the_token_string(tmp_path, token):
    path = write_api_key_config(token, tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.suffix == ".yaml"  # SGLang wants .yaml / .yml
    # SGLang's ConfigArgumentMerger: yaml.safe_load, then `--<key> str(value)` for each entry
    assert yaml.safe_load(path.read_text()) == {"api-key": token}


def test_dry_run_shows_the_config_placeholder_and_never_the_token(token_file, capsys):
    assert main(["engine", "launch-sglang", "--model", "/models/qwen", "--num-servers", "2", "--host", "0.0.0.0",
                 "--token-file", str(token_file), "--dry-run", "--", "--log-level", "warning"]) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert len(lines) == 3 and lines[2].startswith("# API_KEY_CONFIG: a file of mode 600")
    assert all("--host 0.0.0.0 " in line and "--config API_KEY_CONFIG --log-level warning" in line
               for line in lines[:2])
    assert TOKEN not in out


def test_the_token_may_come_from_the_environment(monkeypatch, capsys):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    assert main(["engine", "launch-sglang", "--model", "m", "--host", "10.0.0.5", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "--config API_KEY_CONFIG" in out and TOKEN not in out


def test_a_host_beyond_loopback_without_a_token_is_refused_in_one_line(capsys):
    assert main(["engine", "launch-sglang", "--model", "m", "--host", "0.0.0.0", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: agentrl engine launch-sglang on host 0.0.0.0 would accept")
    assert "--token-file" in err[0]


@pytest.mark.parametrize("flag", ["--api-key", "--api-key=abc", "--config", "--admin-api-key"])
def test_a_key_after_the_double_dash_clashes_with_the_token(token_file, capsys, flag):
    assert main(["engine", "launch-sglang", "--model", "m", "--token-file", str(token_file), "--dry-run", "--",
                 flag, "x.yaml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {flag} after -- clashes with the token")


FAKE_SGLANG = textwrap.dedent("""
    # Stands in for `python -m sglang.launch_server`: reads --config like SGLang 0.5.23 (YAML keys become flags),
    # records the api key it got, and answers /health.
    import argparse, http.server, json, os, sys, yaml
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int)
    parser.add_argument("--api-key")
    argv = sys.argv[1:]
    if "--config" in argv:
        i = argv.index("--config")
        merged = [x for k, v in yaml.safe_load(open(argv[i + 1])).items() for x in (f"--{k}", str(v))]
        argv = merged + argv[:i] + argv[i + 2:]
    args, _ = parser.parse_known_args(argv)
    with open(os.environ["FAKE_SGLANG_OUT"] + f".{args.port}", "w") as f:
        json.dump({"api_key": args.api_key, "cmdline": open(f"/proc/{os.getpid()}/cmdline").read()}, f)

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *a):
            pass

    http.server.HTTPServer(("127.0.0.1", args.port), Health).serve_forever()
""")


def test_launched_servers_get_the_key_without_it_on_their_command_line(tmp_path, monkeypatch):
    import json

    fake = tmp_path / "fake" / "sglang"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "launch_server.py").write_text(FAKE_SGLANG)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("FAKE_SGLANG_OUT", str(tmp_path / "seen"))
    port = free_port()
    spec = SGLangLaunchSpec(model_path="m", base_port=port, mem_fraction_static=None, enable_memory_saver=False)
    with launch_sglang_servers(spec, health_timeout_s=60, token=TOKEN) as servers:
        seen = json.loads((tmp_path / f"seen.{port}").read_text())
        config = servers.spec.api_key_config
        assert config is not None and not os.path.exists(os.path.dirname(config))  # removed once healthy
        ps = open(f"/proc/{servers.procs[0].pid}/cmdline").read()
    assert seen["api_key"] == TOKEN
    assert TOKEN not in seen["cmdline"] and TOKEN not in ps and "--config" in ps

    with pytest.raises(LaunchArgsError, match="--api-key after -- clashes"):
        with launch_sglang_servers(SGLangLaunchSpec(model_path="m", extra_args=["--api-key", "k"]), token=TOKEN):
            pass
